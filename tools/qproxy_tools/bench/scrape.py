"""A metric read from a process's Prometheus port: one value scraped, or
traced in a thread while a load runs."""

import threading
import time
import urllib.request


def metric_value(text, prefix):
    """The value of the first sample in a Prometheus exposition `text`
    whose line starts with `prefix` (a metric's name and its opening
    brace), as an integer; None if there is none."""
    for line in text.splitlines():
        if line.startswith(prefix):
            return int(float(line.rsplit(" ", 1)[1]))
    return None


def scrape(port, prefix):
    """`metric_value` of what 127.0.0.1:`port`/metrics serves now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        return metric_value(r.read().decode(), prefix)


class Trace(threading.Thread):
    """A metric, read every `interval` seconds (by `read`, `scrape` of the
    port by default) until stopped: (seconds since the start, value)
    points, a read that fails or finds nothing left out."""

    def __init__(self, port, prefix, interval=0.1, read=None):
        super().__init__(daemon=True)
        self.points, self.done, self.interval = [], threading.Event(), interval
        self.read = read or (lambda: scrape(port, prefix))

    def run(self):
        start = time.monotonic()
        while not self.done.wait(self.interval):
            try:
                value = self.read()
            except OSError:
                continue
            if value is not None:
                self.points.append((time.monotonic() - start, value))

    def stop(self):
        self.done.set()
        self.join()
        return self.points
