"""The node: its network namespace, certificates, configuration, and the
processes that make it a Kubernetes (etcd, the control plane, containerd,
the kubelet, kube-proxy, CoreDNS), started and stopped.

Everything runs as processes on this machine, in one network namespace with
no route out of it: the pod and service ranges below exist only inside it.
Processes share the machine's mount namespace (the kubelet's volume mounts
must be seen by containerd's), under two folders of their own.

`Node` puts together what each part manages: the namespace (`netns`), the
folders (`folders`), the cgroups (`cgroups`), the certificates (`pki`),
the processes (`supervisor`), the API server (`api`) and the Kubernetes
they make (`components`).
"""

import os

from ..kubectl import Kubectl
from . import cgroups, components, folders, netns
from .api import ApiClient
from .node_config import BIN, RUN
from .pki import Pki
from .supervisor import Supervisor


class Node:
    """The node, all of it: its files, its processes and its API server.
    Its programs are in the machine's cache (BIN, kept across `down` and
    shared by every clone); `build` is target/cluster, and under it `logs`,
    `pki` and the kubeconfigs of one `up` (removed by `down`, but for the
    logs)."""

    def __init__(self, build):
        self.build = build
        self.bin = BIN
        self.logs = os.path.join(build, "logs")
        self.pki = os.path.join(build, "pki")
        self.etc = os.path.join(build, "etc")
        self.kubeconfig = os.path.join(build, "kubeconfig")
        self.certificates = Pki(self.pki, self.etc, self.kubeconfig)
        self.processes = Supervisor(self.logs)
        self.api_client = ApiClient(self.pki)

    def kube(self, component):
        return os.path.join(self.bin, component)

    def ctr(self):
        """containerd's own client, in the namespace the kubelet's pods use."""
        return [self.kube("ctr"), "--address", f"{RUN}/containerd/containerd.sock", "-n", "k8s.io"]

    def kubectl(self, log=None):
        """The node's kubectl, for a caller inside its network namespace."""
        return Kubectl.on_node(self.kube("kubectl"), self.kubeconfig, log)

    def log(self, name):
        return self.processes.log(name)

    def check_machine(self):
        """Refuses, with what is missing, a machine the node cannot run on:
        it drives v1 cgroups (hybrid or v1 alone) and needs the bridge's
        netfilter hooks for pods to reach services on the same bridge."""
        cgroups.check()
        netns.check_bridge_netfilter(self.log("network"))

    def make_netns(self):
        netns.make(self.log("network"))

    def make_folders(self):
        folders.make(self.log("mounts"))

    def make_cgroups(self):
        cgroups.make()

    def make_pki(self):
        self.certificates.make(self.log("pki"))

    def write_kubeconfig(self, user):
        self.certificates.write_kubeconfig(user)

    def kubeconfig_of(self, user):
        return self.certificates.kubeconfig_of(user)

    # ---- processes ---------------------------------------------------------------

    def start(self, name, args, env=None):
        return self.processes.start(name, args, env)

    def alive(self, name):
        return self.processes.alive(name)

    def pid(self, name):
        return self.processes.pid(name)

    def stop(self, name, timeout=30):
        self.processes.stop(name, timeout)

    def arguments(self, name):
        return self.processes.arguments(name)

    def started(self, name, args, check, what, timeout=120, changed=False):
        self.processes.started(name, args, check, what, timeout, changed)

    def start_control_plane(self):
        components.start_control_plane(self)

    def start_kubelet(self):
        components.start_kubelet(self)

    # ---- the API server ------------------------------------------------------------

    def api(self, path, user="admin", timeout=5):
        """GETs `path` from the API server as `user`; returns (status, body)."""
        return self.api_client.get(path, user, timeout)

    def ready(self):
        """Whether the API server has the node Ready."""
        return self.api_client.node_ready()

    # ---- teardown --------------------------------------------------------------

    def teardown(self):
        """Removes what any `up` made, finished or not: every process in the
        node's cgroup (pods, shims, the node's own processes), the pods'
        mounts, the cgroups, the network namespace, and STATE and RUN. Safe
        to run when nothing is there."""
        log = self.log("down") if os.path.isdir(self.logs) else None
        cgroups.kill()
        # Anything left in the namespace that is not in the cgroup (a
        # process moved out of it, or started by hand with `run`).
        netns.kill_processes()
        folders.unmount(log)
        cgroups.remove()
        netns.remove(log)
        folders.remove(log)
        self.certificates.remove()
