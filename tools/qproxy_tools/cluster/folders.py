"""The node's folders, STATE and RUN: made as shared mounts, and
unmounted and removed."""

import os
import subprocess

from ..commands import PhaseError, run
from .host import is_mountpoint, mounts_below, unmount_below
from .node_config import RUN, STATE

INOTIFY_INSTANCES = "/proc/sys/fs/inotify/max_user_instances"


def make(log):
    """STATE and RUN as shared mounts: the kubelet's volume mounts below
    them must propagate to containerd's and runc's view."""
    for path in (STATE, RUN):
        os.makedirs(path, exist_ok=True)
        if not is_mountpoint(path):
            run(["mount", "--bind", path, path], log=log)
        run(["mount", "--make-rshared", path], log=log)
    os.makedirs(os.path.join(STATE, "kubelet"), exist_ok=True)
    # The kubelet watches many files (every pod's volumes).
    with open(INOTIFY_INSTANCES) as f:
        if int(f.read()) < 1024:
            with open(INOTIFY_INSTANCES, "w") as g:
                g.write("1024")


def unmount(log):
    """Unmounts everything at and below STATE and RUN (the pods' mounts)."""
    unmount_below(STATE, log)
    unmount_below(RUN, log)


def remove(log):
    """Removes STATE and RUN, refusing one with a mount still below it."""
    for path in (STATE, RUN):
        if mounts_below(path):
            raise PhaseError(f"{path} still has mounts below it; not removing it", log)
        subprocess.run(["rm", "-rf", "--one-file-system", path], check=False)
