"""Progress lines: on stderr, so that stdout stays for a command's
result, each after the name of what prints it."""

import sys


class Progress:
    """Prints `name: message` lines on stderr, flushed at once (a long step
    shows as it goes)."""

    def __init__(self, name, stream=None):
        self.name = name
        self.stream = stream

    def __call__(self, message):
        print(f"{self.name}: {message}", file=self.stream or sys.stderr, flush=True)
