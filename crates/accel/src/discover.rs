//! Finding the qproxies to accelerate: every process under a cgroup whose
//! name is qproxy's, with its network namespace and the app's port.
//!
//! The processes come from the cgroup tree itself (each `cgroup.procs`
//! under the given directory, as the agent's PID namespace numbers them:
//! the DaemonSet runs with the host's), so the cgroup namespace the agent
//! runs in does not matter. The app's port is the sidecar's `USER_PORT`,
//! and its Knative namespace `SERVING_NAMESPACE`, both read from the
//! process's environment as Knative sets it.

use std::{
    fs, io,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};

/// A qproxy found under the cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sidecar {
    /// Its process.
    pub pid: u32,
    /// The inode of its network namespace (`/proc/PID/ns/net`).
    pub netns_inode: u64,
    /// The app's port (`USER_PORT`).
    pub user_port: u16,
    /// Its Knative namespace (`SERVING_NAMESPACE`), when set.
    pub namespace: Option<String>,
}

/// Walks `cgroup` and the cgroups below it, giving `visit` each one's
/// directory and `cgroup.procs` until it returns `false`. A cgroup below
/// `cgroup` removed while the tree is walked is skipped; an unreadable
/// `cgroup` is an error.
fn walk(cgroup: &Path, mut visit: impl FnMut(&Path, &str) -> bool) -> io::Result<()> {
    let mut dirs = vec![cgroup.to_owned()];
    while let Some(dir) = dirs.pop() {
        let procs = match fs::read_to_string(dir.join("cgroup.procs")) {
            Ok(procs) => procs,
            Err(e) if e.kind() == io::ErrorKind::NotFound && dir != cgroup => continue,
            Err(e) => return Err(e),
        };
        if !visit(&dir, &procs) {
            return Ok(());
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(entry.path());
            }
        }
    }
    Ok(())
}

/// The process IDs in one `cgroup.procs`.
fn procs(list: &str) -> impl Iterator<Item = u32> + '_ {
    list.lines().filter_map(|l| l.trim().parse().ok())
}

/// Every process in `cgroup` and the cgroups below it.
pub fn pids_under(cgroup: &Path) -> io::Result<Vec<u32>> {
    let mut pids = Vec::new();
    walk(cgroup, |_, list| {
        pids.extend(procs(list));
        true
    })?;
    Ok(pids)
}

/// The cgroup of `pid` in the tree under `cgroup` (found by its
/// `cgroup.procs`, so whatever cgroup namespace the caller is in), or
/// `None` when it is not in that tree.
pub fn cgroup_of(cgroup: &Path, pid: u32) -> Option<PathBuf> {
    let mut found = None;
    walk(cgroup, |dir, list| {
        if procs(list).any(|p| p == pid) {
            found = Some(dir.to_owned());
        }
        found.is_none()
    })
    .ok()?;
    found
}

/// The process `pid` as a sidecar to accelerate: `None` when it is not a
/// qproxy (`/proc/PID/comm` is not `name`, or it has gone); an error when
/// it is one but cannot be read (reading another user's environment needs
/// `CAP_SYS_PTRACE` and `CAP_DAC_READ_SEARCH`), or has no `USER_PORT`.
pub fn sidecar(proc: &Path, pid: u32, name: &str) -> io::Result<Option<Sidecar>> {
    let dir = proc.join(pid.to_string());
    let Ok(comm) = fs::read_to_string(dir.join("comm")) else {
        return Ok(None);
    };
    if comm.trim_end() != name {
        return Ok(None);
    }
    let environ = fs::read(dir.join("environ"))?;
    let var = |key: &str| {
        environ.split(|b| *b == 0).find_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            kv.strip_prefix(key)?.strip_prefix('=').map(str::to_owned)
        })
    };
    let user_port = var("USER_PORT")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no valid USER_PORT"))?;
    let netns_inode = fs::metadata(dir.join("ns/net"))?.ino();
    Ok(Some(Sidecar {
        pid,
        netns_inode,
        user_port,
        namespace: var("SERVING_NAMESPACE"),
    }))
}

/// The cookie of process `pid`'s network namespace: that of a socket it
/// holds, borrowed for a moment with `pidfd_getfd` (Linux 5.6; needs
/// `CAP_SYS_PTRACE` over the process).
pub fn netns_cookie(proc: &Path, pid: u32) -> io::Result<u64> {
    let raw = i32::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let pid_t = Pid::from_raw(raw).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let pidfd = pidfd_open(pid_t, PidfdFlags::empty())?;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the process holds no socket");
    for entry in fs::read_dir(proc.join(pid.to_string()).join("fd"))?.flatten() {
        let Ok(target) = fs::read_link(entry.path()) else {
            continue;
        };
        if !target.to_string_lossy().starts_with("socket:") {
            continue;
        }
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        match pidfd_getfd(pidfd.as_fd(), fd, PidfdGetfdFlags::empty()) {
            Ok(socket) => return crate::sys::netns_cookie(socket),
            Err(e) => last = e.into(),
        }
    }
    Err(last)
}
