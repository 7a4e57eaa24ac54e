"""The CPU time of the cluster's containers, from their v1 cpuacct
cgroups."""

import os

from ..cluster.host import CGROUP_FS
from ..cluster.node_config import CGROUP
from ..commands import PhaseError

CPUACCT = os.path.join(CGROUP_FS, "cpuacct", CGROUP, "kubepods")


def cgroup_of(container, root=None):
    """The cgroup folder of the container `container` (its ID), under
    `root` (the pods' cpuacct hierarchy by default)."""
    root = root or CPUACCT
    for folder, dirs, _ in os.walk(root):
        if container in dirs:
            return os.path.join(folder, container)
    raise PhaseError(f"no cgroup for container {container} under {root}")


def cpu_ns(cgroup):
    """The CPU time the cgroup's processes used so far, in nanoseconds."""
    with open(os.path.join(cgroup, "cpuacct.usage")) as f:
        return int(f.read())
