"""Commands run to their end, waits with a deadline, and the error that
names what failed and the log that says why."""

import subprocess
import time


class PhaseError(Exception):
    """A step failed: what failed, and the log that says why."""

    def __init__(self, message, log=None):
        super().__init__(message)
        self.log = log


def run(args, log=None, check=True, env=None, cwd=None, input=None, capture=False):
    """Runs a command to its end. Its output is returned when `capture`
    (and its error output's last line is in a failure's message), goes to
    `log` (a path, appended) when given, and is shown otherwise. A failure
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
        # A captured command's output is in the error, not in a log.
        raise PhaseError(f"{' '.join(map(str, args[:3]))} exited {done.returncode}{detail}", None if capture else log)
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
            last = None
        except PhaseError:
            raise
        except Exception as error:  # a condition's failure is one more "not yet"
            last = error
        if time.monotonic() > deadline:
            why = f" (last: {last})" if last else ""
            raise PhaseError(f"{what}: not within {timeout:g} s{why}", log)
        time.sleep(interval)
