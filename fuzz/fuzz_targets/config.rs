//! The environment contract: Knative's default environment of either
//! generation, changed by the input's lines (`NAME=VALUE` sets, a bare
//! name removes), read as the binary reads it. It must never panic, and a
//! rejection names the variable at fault on one line.

#![no_main]

use libfuzzer_sys::fuzz_target;
use qproxy::Config;
use qproxy_fuzz::{apply_lines, defaults, generation};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let mut vars = defaults(generation(selector));
    apply_lines(&mut vars, text);
    match Config::from_vars(&vars) {
        Ok(config) => {
            let _ = config.upstream_idle_connections();
            if let Some(Ok(template)) = config.observability.request_log().template() {
                let _ = template;
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(e.variable()),
                "{message:?} names no variable"
            );
            assert!(!message.contains('\n'), "{message:?} is more than one line");
        }
    }
});
