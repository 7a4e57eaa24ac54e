"""The node's network namespace: made with the node's address and the
service range routed to it and no route out, the kernel's bridge
netfilter it needs, and removed with what runs in it."""

import os
import signal

from ..commands import PhaseError, run
from .host import pids_in_netns
from .node_config import NETNS, NETNS_PATH, NODE_IP, SERVICE_CIDR

# What the node's network needs set in the namespace.
SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    # Pod to service to a pod on the same bridge: the answer is
    # bridged, and must cross netfilter to be un-NATed.
    "net.bridge.bridge-nf-call-iptables": "1",
    "net.bridge.bridge-nf-call-ip6tables": "1",
    "net.ipv4.conf.all.route_localnet": "1",
}


def commands():
    """The commands that make the namespace, in order: loopback, the
    node's address on an interface of its own (one end of a veth pair whose
    other end is idle, so that no kernel module for dummy interfaces is
    needed), the service range routed to it (kube-proxy's rules catch it on
    the way out), everything else unreachable, and SYSCTLS."""
    ns = ["ip", "-n", NETNS]
    return [
        ["ip", "netns", "add", NETNS],
        ns + ["link", "set", "lo", "up"],
        ns + ["link", "add", "node0", "type", "veth", "peer", "name", "node0-idle"],
        ns + ["addr", "add", f"{NODE_IP}/24", "dev", "node0"],
        ns + ["link", "set", "node0-idle", "up"],
        ns + ["link", "set", "node0", "up"],
        ns + ["route", "add", SERVICE_CIDR, "dev", "node0", "src", NODE_IP],
        # No route out: a connection to anywhere else fails at once.
        ns + ["route", "add", "unreachable", "default"],
    ] + [["ip", "netns", "exec", NETNS, "sysctl", "-q", "-w", f"{key}={value}"] for key, value in SYSCTLS.items()]


def make(log):
    """Makes the namespace (`commands`), each command's output in `log`."""
    for argv in commands():
        run(argv, log=log)


def check_bridge_netfilter(log, bridge="/proc/sys/net/bridge"):
    """Loads br_netfilter if the kernel lacks it (`bridge` missing), and
    refuses a kernel without it: pods could not reach services on their
    own bridge."""
    if not os.path.isdir(bridge):
        run(["modprobe", "br_netfilter"], log=log, check=False)
        if not os.path.isdir(bridge):
            raise PhaseError(
                "the kernel has no bridge netfilter (br_netfilter): pods could not reach services on their own bridge",
                log,
            )


def kill_processes():
    """SIGKILLs what is left in the namespace."""
    for pid in pids_in_netns(NETNS_PATH):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove(log):
    """Removes the namespace, if there is one."""
    if os.path.exists(NETNS_PATH):
        run(["ip", "netns", "del", NETNS], log=log, check=False)
