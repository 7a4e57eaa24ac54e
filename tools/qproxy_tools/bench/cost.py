"""The proxy's cost while a load runs: its CPU time, instructions, system
calls and context switches per request, its peak memory, and its CPU
against the app's."""

import shutil
import signal
import subprocess

from .procs import TICK, cpu_ticks, machine_ticks, rss_kib


class Perf:
    """Counts a process's instructions, system calls and context switches
    while a load runs (tracepoints work in a VM; instructions may not)."""

    EVENTS = {"instructions": "instructions", "raw_syscalls:sys_enter": "syscalls", "context-switches": "switches"}

    def __init__(self, pids):
        self.proc = None
        if pids and shutil.which("perf"):
            events = [a for e in self.EVENTS for a in ("-e", e)]
            self.proc = subprocess.Popen(
                ["perf", "stat", "-x,", *events, "-p", ",".join(map(str, pids))],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )

    def stop(self):
        """{"instructions": n, "syscalls": n, "switches": n}, what was counted."""
        if not self.proc:
            return {}
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate()
        return self.parse(err)

    @classmethod
    def parse(cls, err):
        """The counts in what `perf stat -x,` wrote (value, unit, event, ...
        a line); an event it could not count (`<not supported>`) is left
        out."""
        counts = {}
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[0].isdigit():
                for event, key in cls.EVENTS.items():
                    if fields[2] == event or fields[2].startswith(event + ":"):
                        counts[key] = int(fields[0])
        return counts


def measured(contender, bins, load, args, app_pid):
    """Runs `load` against a started contender; adds the proxy's CPU, its
    instructions, system calls and context switches per request, and its
    CPU against the app's (the study's measure)."""
    pids = contender.pids()
    client_cpu = 1 if contender.variant == "pinned" else None
    before, app_before = cpu_ticks(pids), cpu_ticks([app_pid])
    steal_before, all_before = machine_ticks()
    perf = Perf(pids) if not args.smoke else None
    result = load(client_cpu)
    counts = perf.stop() if perf else {}
    steal_after, all_after = machine_ticks()
    result["steal"] = (steal_after - steal_before) / max(all_after - all_before, 1)
    ticks = cpu_ticks(pids) - before
    app_ticks = cpu_ticks([app_pid]) - app_before
    n = max(result["requests"], 1)
    result["cpu_us"] = ticks / TICK / n * 1e6 if pids else None
    result["cpu_s"] = ticks / TICK
    result["vs_app"] = ticks / app_ticks if pids and app_ticks else None
    for key in ("instructions", "syscalls", "switches"):
        result[key] = counts[key] / n if key in counts else None
    result["peak_rss"] = rss_kib(pids, "VmHWM:") / 1024 if pids else None
    return result
