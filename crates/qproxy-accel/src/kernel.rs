//! The kernel gate's first half: the version. (The second is the
//! [`selftest`](crate::selftest).)

use std::fs;

/// The oldest kernel whose sockops and sk_msg programs can read the network
/// namespace's cookie (`bpf_get_netns_cookie`, Linux 5.15).
pub const MIN_VERSION: (u32, u32) = (5, 15);

/// The running kernel's release string (`uname -r`).
pub fn release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Major and minor version of a release string such as `6.1.0-27-amd64`.
pub fn version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether `release` is new enough; the reason when it is not.
pub fn check(release: &str) -> Result<(), String> {
    match version(release) {
        Some(v) if v >= MIN_VERSION => Ok(()),
        Some((major, minor)) => Err(format!(
            "kernel {major}.{minor} is older than {}.{}, the first whose sockops and sk_msg \
             programs can read a network namespace's cookie",
            MIN_VERSION.0, MIN_VERSION.1
        )),
        None => Err(format!("cannot read the kernel's version from {release:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(version("6.1.0-27-amd64"), Some((6, 1)));
        assert_eq!(version("6.18.44-fc-v509"), Some((6, 18)));
        assert_eq!(version("5.15.0+"), Some((5, 15)));
        assert!(check("5.15.0").is_ok());
        assert!(check("5.10.200").is_err());
        assert!(check("garbage").is_err());
    }
}
