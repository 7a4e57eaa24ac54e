//! The few system calls the agent makes that no safe wrapper offers.
#![allow(unsafe_code)]

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

use crate::maps::SockKey;

// SAFETY: SockKey is #[repr(C)], made of integers only, with no padding
// (its size is asserted in maps.rs): every bit pattern is a valid value.
unsafe impl aya::Pod for SockKey {}

/// The cookie of the network namespace a socket belongs to
/// (`SO_NETNS_COOKIE`, Linux 5.14): the number the BPF programs see from
/// `bpf_get_netns_cookie`.
pub(crate) fn netns_cookie(socket: impl AsFd) -> io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: the pointers are to a u64 and its length, both live for the
    // call; the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// Moves the calling thread into a new network namespace of its own.
pub(crate) fn unshare_netns() -> io::Result<()> {
    // SAFETY: only the network namespace is unshared, not the file
    // descriptor table: no thread can see a descriptor it does not share.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }?;
    Ok(())
}

/// Brings the loopback interface of the calling thread's network
/// namespace up, as a new namespace starts with it down.
pub(crate) fn loopback_up() -> io::Result<()> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| {
        // Binding needs no interface up; this only fails without IPv4.
        std::net::UdpSocket::bind("[::]:0")
    })?;
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write the ifreq we own.
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &raw mut req) != 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &raw mut req) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
