"""What the node uses of this machine: its v1 cgroup hierarchies, its
mounts, and network namespaces entered and searched."""

import ctypes
import os
import re
import signal
import subprocess
import time

from ..commands import PhaseError

CGROUP_FS = "/sys/fs/cgroup"
CLONE_NEWNET = 0x40000000


def cgroup_controllers():
    """The v1 hierarchies this machine mounts (cpu, memory, ..., and the
    named systemd one), each a folder under /sys/fs/cgroup."""
    names = []
    for name in sorted(os.listdir(CGROUP_FS)):
        path = os.path.join(CGROUP_FS, name)
        if name != "unified" and os.path.isfile(os.path.join(path, "cgroup.procs")):
            names.append(name)
    return names


def all_cgroup_roots():
    roots = [os.path.join(CGROUP_FS, c) for c in cgroup_controllers()]
    unified = os.path.join(CGROUP_FS, "unified")
    if os.path.isfile(os.path.join(unified, "cgroup.procs")):
        roots.append(unified)
    return roots


def kill_cgroup_tree(name, timeout=60):
    """SIGKILLs every process in the cgroup `name` and below, in every
    hierarchy, until none is left (a dying shim may still fork)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = set()
        for root in all_cgroup_roots():
            top = os.path.join(root, name)
            for folder, _, files in os.walk(top):
                if "cgroup.procs" in files:
                    try:
                        with open(os.path.join(folder, "cgroup.procs")) as f:
                            pids.update(int(x) for x in f.read().split())
                    except OSError:
                        pass
        pids.discard(os.getpid())
        if not pids:
            return
        # A frozen cgroup would keep its processes from dying.
        for root in all_cgroup_roots():
            if os.path.basename(root) == "freezer":
                for folder, _, files in os.walk(os.path.join(root, name)):
                    if "freezer.state" in files:
                        try:
                            with open(os.path.join(folder, "freezer.state"), "w") as f:
                                f.write("THAWED")
                        except OSError:
                            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise PhaseError(f"processes {sorted(pids)[:10]} in cgroup {name} would not die")
        time.sleep(0.2)


def remove_cgroup_tree(name):
    for root in all_cgroup_roots():
        top = os.path.join(root, name)
        for folder, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(folder)
            except OSError:
                pass


def pids_in_netns(path):
    """The processes in the network namespace mounted at `path` (none when
    nothing is mounted there)."""
    if not is_mountpoint(path):
        return []
    try:
        st = os.stat(path)
        target = (st.st_dev, st.st_ino)
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                ns = os.stat(f"/proc/{entry}/ns/net")
                if (ns.st_dev, ns.st_ino) == target:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def mounts():
    """Mount points, from /proc/self/mountinfo, in mount order."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            # The kernel writes space, tab, newline and backslash as octal
            # escapes.
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            points.append(point)
    return points


def mounts_below(path):
    path = os.path.normpath(path)
    return [m for m in mounts() if m == path or m.startswith(path.rstrip("/") + "/")]


def is_mountpoint(path):
    return os.path.normpath(path) in mounts()


def unmount_below(path, log):
    """Unmounts everything at and below `path`, the latest first; lazily if
    a mount is busy."""
    for _ in range(10):
        found = mounts_below(path)
        if not found:
            return
        for point in reversed(found):
            if subprocess.run(["umount", point], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True)
    remaining = mounts_below(path)
    if remaining:
        raise PhaseError(f"could not unmount {remaining[:5]}", log)


def setns(path):
    """Moves this process (one thread) into the network namespace at `path`;
    the commands it starts from then on are in it too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        setns_fd(fd, path)
    finally:
        os.close(fd)


def setns_fd(fd, what="the network namespace"):
    """Moves this process into the network namespace open as `fd`."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise PhaseError(f"entering {what}: {os.strerror(errno)}")
