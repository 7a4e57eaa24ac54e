"""What every phase of scripts/cluster shares: commands, waits, the
cluster's network namespace, and the errors that name a phase and its log."""

import ctypes
import os
import subprocess
import sys
import time

CLONE_NEWNET = 0x40000000


class PhaseError(Exception):
    """A phase failed: what failed, and the log that says why."""

    def __init__(self, message, log=None):
        super().__init__(message)
        self.log = log


def say(message):
    """One progress line, on stderr so that stdout stays for the result."""
    print(f"cluster: {message}", file=sys.stderr, flush=True)


def run(args, log=None, check=True, env=None, cwd=None, input=None, capture=False):
    """Runs a command to its end. Its output goes to `log` (a path, appended)
    when given, is returned when `capture`, and is shown otherwise. A failure
    raises PhaseError naming the command and the log."""
    stdout = None
    handle = None
    if capture:
        stdout = subprocess.PIPE
    elif log is not None:
        handle = open(log, "ab")
        handle.write(("$ " + " ".join(map(str, args)) + "\n").encode())
        handle.flush()
        stdout = handle
    try:
        done = subprocess.run(
            [str(a) for a in args],
            stdout=stdout,
            stderr=subprocess.PIPE if capture else (handle or None),
            env=env,
            cwd=cwd,
            input=input.encode() if isinstance(input, str) else input,
        )
    finally:
        if handle is not None:
            handle.close()
    if check and done.returncode != 0:
        detail = ""
        if capture and done.stderr:
            detail = ": " + done.stderr.decode(errors="replace").strip().splitlines()[-1]
        raise PhaseError(f"{' '.join(map(str, args[:3]))} exited {done.returncode}{detail}", log)
    if capture:
        return done.stdout.decode(errors="replace")
    return done.returncode


def wait_until(what, condition, timeout, log=None, interval=0.5):
    """Polls `condition` until it returns something true, and returns that;
    after `timeout` seconds raises PhaseError saying what was awaited."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except PhaseError:
            raise
        except Exception as error:  # a condition's failure is one more "not yet"
            last = error
        if time.monotonic() > deadline:
            why = f" (last: {last})" if last else ""
            raise PhaseError(f"{what}: not within {timeout:.0f} s{why}", log)
        time.sleep(interval)


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
