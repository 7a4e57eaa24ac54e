"""The node's cgroups: the v1 hierarchies it needs, its cgroup (and
`system` below it, for its own processes) made in each, a process put
into them, and the tree killed and removed."""

import os

from ..commands import PhaseError
from .host import CGROUP_FS, cgroup_controllers, kill_cgroup_tree, remove_cgroup_tree
from .node_config import CGROUP

# The v1 controllers the kubelet and containerd need.
NEEDED = ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer")


def check(root=CGROUP_FS, controllers=None):
    """Refuses a machine whose cgroups are v2 alone, or that lacks one of
    the v1 hierarchies the node needs."""
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        raise PhaseError(
            "/sys/fs/cgroup is a cgroup v2 hierarchy: the cluster's kubelet and containerd are set up "
            "for v1 cgroups (hybrid or v1 alone), as on the machines it is made for"
        )
    have = cgroup_controllers() if controllers is None else controllers
    missing = [c for c in NEEDED if c not in have]
    if missing:
        raise PhaseError(f"no v1 cgroup hierarchy for {', '.join(missing)} under {root}")


def make(root=CGROUP_FS, controllers=None):
    """The node's cgroup and its `system` in every hierarchy; cpuset's
    given their parent's CPUs and memory nodes, since its children start
    with none."""
    for controller in cgroup_controllers() if controllers is None else controllers:
        for sub in ("", "system"):
            os.makedirs(os.path.join(root, controller, CGROUP, sub), exist_ok=True)
    cpuset = os.path.join(root, "cpuset")
    if os.path.isdir(cpuset):
        for sub in (CGROUP, os.path.join(CGROUP, "system")):
            for key in ("cpuset.cpus", "cpuset.mems"):
                parent = os.path.dirname(os.path.join(cpuset, sub))
                with open(os.path.join(parent, key)) as f:
                    value = f.read().strip()
                with open(os.path.join(cpuset, sub, key), "w") as f:
                    f.write(value)


def join_system(pid, root=CGROUP_FS, controllers=None):
    """Moves the process `pid` into the node's `system` cgroup of every
    hierarchy."""
    for controller in cgroup_controllers() if controllers is None else controllers:
        with open(os.path.join(root, controller, CGROUP, "system", "cgroup.procs"), "w") as f:
            f.write(str(pid))


def kill():
    """Kills every process in the node's cgroup tree (pods, shims, the
    node's own processes)."""
    kill_cgroup_tree(CGROUP)


def remove():
    """Removes the node's cgroup tree, once empty."""
    remove_cgroup_tree(CGROUP)
