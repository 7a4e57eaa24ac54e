"""The node's processes, supervised: each started in the node's network
namespace and cgroup, its output in a log and its pid in a file, found
alive or not, its command line read back, stopped, and started again when
its configuration changed."""

import os
import signal
import subprocess
import time

from ..commands import PhaseError, wait_until
from . import cgroups
from .node_config import NETNS_PATH, RUN

# Where the pid of each of the node's processes is kept.
PIDS = os.path.join(RUN, "pids")


class Supervisor:
    """The processes whose logs are in `logs` (<name>.log) and whose pids
    are in `pids` (a file per name)."""

    def __init__(self, logs, pids=PIDS):
        self.logs, self.pids = logs, pids

    def log(self, name):
        return os.path.join(self.logs, name + ".log")

    @staticmethod
    def command(args):
        """The command line that runs `args` in the node's network
        namespace (nsenter execs it in place: the pid is the process's)."""
        return ["nsenter", f"--net={NETNS_PATH}", "--"] + args

    def start(self, name, args, env=None):
        """Starts one of the node's processes in its network namespace and
        cgroup, in a session of its own (it outlives scripts/cluster), its
        output in logs/<name>.log and its pid in RUN/pids."""
        os.makedirs(self.logs, exist_ok=True)
        os.makedirs(self.pids, exist_ok=True)
        log = open(self.log(name), "ab")
        log.write(("$ " + " ".join(args) + "\n").encode())
        log.flush()
        process = subprocess.Popen(
            self.command(args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=lambda: cgroups.join_system(os.getpid()),
        )
        log.close()
        with open(os.path.join(self.pids, name), "w") as f:
            f.write(str(process.pid))
        return process

    def alive(self, name):
        pid = self.pid(name)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # A zombie has exited: nothing reaps the node's processes but init.
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def pid(self, name):
        try:
            with open(os.path.join(self.pids, name)) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def stop(self, name, timeout=30):
        """Stops one of the node's processes (SIGTERM, then SIGKILL), and
        returns once it is gone."""
        pid = self.pid(name)
        if pid is None or not self.alive(name):
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.alive(name) and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.alive(name):
            os.kill(pid, signal.SIGKILL)
            wait_until(f"{name} gone after SIGKILL", lambda: not self.alive(name), 30, log=self.log(name))

    def arguments(self, name):
        """The command line the process `name` runs with (nsenter execs
        it in place), or None if it cannot be read: not running, or
        reading as empty, as it does while the process is still in exec
        (before the kernel has set its arguments) or has exited."""
        try:
            with open(f"/proc/{self.pid(name)}/cmdline", "rb") as f:
                raw = f.read()
        except (OSError, TypeError):
            return None
        return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] or None

    def started(self, name, args, check, what, timeout=120, changed=False):
        """Starts the process `name` unless it runs (again if its
        configuration `changed` or it runs with other arguments), and waits
        until `check` says it serves; fails at once, naming its log, if it
        exits meanwhile."""
        if changed or (self.alive(name) and self.arguments(name) not in (None, [str(a) for a in args])):
            self.stop(name)
        if not self.alive(name):
            self.start(name, args)

        def ready():
            if not self.alive(name):
                raise PhaseError(f"{name} exited", self.log(name))
            return check()

        wait_until(what, ready, timeout, log=self.log(name))
