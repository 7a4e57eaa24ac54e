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

/// Why the kernel's version rules it out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// Older than [`MIN_VERSION`].
    #[error(
        "kernel {major}.{minor} is older than {}.{}, the first whose sockops and sk_msg \
         programs can read a network namespace's cookie",
        MIN_VERSION.0,
        MIN_VERSION.1
    )]
    TooOld {
        /// The kernel's major version.
        major: u32,
        /// The kernel's minor version.
        minor: u32,
    },
    /// The release string has no version in it.
    #[error("cannot read the kernel's version from {release:?}")]
    Unreadable {
        /// The release string, as read.
        release: String,
    },
}

/// Whether `release` is new enough; the reason when it is not.
pub fn check(release: &str) -> Result<(), KernelError> {
    match version(release) {
        Some(v) if v >= MIN_VERSION => Ok(()),
        Some((major, minor)) => Err(KernelError::TooOld { major, minor }),
        None => Err(KernelError::Unreadable {
            release: release.to_owned(),
        }),
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

    #[test]
    fn reasons_read_as_they_always_have() {
        assert_eq!(
            check("5.10.200").unwrap_err().to_string(),
            "kernel 5.10 is older than 5.15, the first whose sockops and sk_msg programs can \
             read a network namespace's cookie"
        );
        assert_eq!(
            check("garbage").unwrap_err().to_string(),
            r#"cannot read the kernel's version from "garbage""#
        );
    }
}
