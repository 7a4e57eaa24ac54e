//! The `Date` header's value, formatted once a second per thread.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

thread_local! {
    /// The current second, formatted as an HTTP date, and that second.
    static DATE_NOW: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
}

/// Appends the time now as an HTTP date, formatted once a second.
pub(crate) fn http_date(dst: &mut Vec<u8>) {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE_NOW.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != second || cached.1.is_empty() {
            *cached = (second, httpdate::fmt_http_date(now));
        }
        dst.extend_from_slice(cached.1.as_bytes());
    });
}
