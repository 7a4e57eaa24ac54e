"""The node: its network namespace, certificates, configuration, and the
processes that make it a Kubernetes (etcd, the control plane, containerd,
the kubelet, kube-proxy, CoreDNS), started and stopped.

Everything runs as processes on this machine, in one network namespace with
no route out of it: the pod and service ranges below exist only inside it.
Processes share the machine's mount namespace (the kubelet's volume mounts
must be seen by containerd's), under two folders of their own.
"""

import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request

from .. import ROOT
from ..commands import PhaseError, run, wait_until
from ..kubectl import Kubectl
from ..progress import Progress
from .host import (
    CGROUP_FS,
    cgroup_controllers,
    is_mountpoint,
    kill_cgroup_tree,
    mounts_below,
    pids_in_netns,
    remove_cgroup_tree,
    unmount_below,
)
from .node_config import (
    API_SERVER,
    API_SERVICE_IP,
    BIN,
    CGROUP,
    CLUSTER_DOMAIN,
    NETNS,
    NETNS_PATH,
    NODE_IP,
    NODE_NAME,
    RUN,
    SERVICE_CIDR,
    STATE,
    cni_config,
    containerd_config,
    corefile,
    kube_proxy_config,
    kubelet_config,
    write,
)

say = Progress("cluster")


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

    def kube(self, component):
        return os.path.join(self.bin, component)

    def ctr(self):
        """containerd's own client, in the namespace the kubelet's pods use."""
        return [self.kube("ctr"), "--address", f"{RUN}/containerd/containerd.sock", "-n", "k8s.io"]

    def kubectl(self, log=None):
        """The node's kubectl, for a caller inside its network namespace."""
        return Kubectl.on_node(self.kube("kubectl"), self.kubeconfig, log)

    def log(self, name):
        return os.path.join(self.logs, name + ".log")

    # ---- what the machine must offer ---------------------------------------------

    def check_machine(self):
        """Refuses, with what is missing, a machine the node cannot run on:
        it drives v1 cgroups (hybrid or v1 alone) and needs the bridge's
        netfilter hooks for pods to reach services on the same bridge."""
        if os.path.exists(os.path.join(CGROUP_FS, "cgroup.controllers")):
            raise PhaseError(
                "/sys/fs/cgroup is a cgroup v2 hierarchy: the cluster's kubelet and containerd are set up "
                "for v1 cgroups (hybrid or v1 alone), as on the machines it is made for"
            )
        missing = [
            c
            for c in ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer")
            if c not in cgroup_controllers()
        ]
        if missing:
            raise PhaseError(f"no v1 cgroup hierarchy for {', '.join(missing)} under {CGROUP_FS}")
        if not os.path.isdir("/proc/sys/net/bridge"):
            run(["modprobe", "br_netfilter"], log=self.log("network"), check=False)
            if not os.path.isdir("/proc/sys/net/bridge"):
                raise PhaseError(
                    "the kernel has no bridge netfilter (br_netfilter): pods could not reach services "
                    "on their own bridge",
                    self.log("network"),
                )

    # ---- the network namespace -------------------------------------------------

    def make_netns(self):
        """The node's network namespace: loopback, the node's address on an
        interface of its own (one end of a veth pair whose other end is
        idle, so that no kernel module for dummy interfaces is needed), the
        service range routed to it (kube-proxy's rules catch it on the way
        out), and everything else unreachable."""
        log = self.log("network")
        run(["ip", "netns", "add", NETNS], log=log)
        ns = ["ip", "-n", NETNS]
        run(ns + ["link", "set", "lo", "up"], log=log)
        run(ns + ["link", "add", "node0", "type", "veth", "peer", "name", "node0-idle"], log=log)
        run(ns + ["addr", "add", f"{NODE_IP}/24", "dev", "node0"], log=log)
        run(ns + ["link", "set", "node0-idle", "up"], log=log)
        run(ns + ["link", "set", "node0", "up"], log=log)
        run(ns + ["route", "add", SERVICE_CIDR, "dev", "node0", "src", NODE_IP], log=log)
        # No route out: a connection to anywhere else fails at once.
        run(ns + ["route", "add", "unreachable", "default"], log=log)
        sysctls = {
            "net.ipv4.ip_forward": "1",
            # Pod to service to a pod on the same bridge: the answer is
            # bridged, and must cross netfilter to be un-NATed.
            "net.bridge.bridge-nf-call-iptables": "1",
            "net.bridge.bridge-nf-call-ip6tables": "1",
            "net.ipv4.conf.all.route_localnet": "1",
        }
        for key, value in sysctls.items():
            run(["ip", "netns", "exec", NETNS, "sysctl", "-q", "-w", f"{key}={value}"], log=log)

    # ---- certificates and kubeconfigs ------------------------------------------

    def make_pki(self):
        """A cluster CA and what is signed by it: the API server's and the
        kubelet's serving certificates, one client certificate per
        component (each its own user, as kubeadm makes them), and the
        service account key pair."""
        os.makedirs(self.pki, exist_ok=True)
        log = self.log("pki")
        p = lambda name: os.path.join(self.pki, name)  # noqa: E731
        ssl = ["openssl"]
        if not os.path.exists(p("ca.crt")):
            run(ssl + ["genrsa", "-out", p("ca.key"), "2048"], log=log)
            run(
                ssl
                + [
                    "req",
                    "-x509",
                    "-new",
                    "-key",
                    p("ca.key"),
                    "-days",
                    "3650",
                    "-subj",
                    "/CN=qproxy-cluster-ca",
                    "-out",
                    p("ca.crt"),
                ],
                log=log,
            )
        if not os.path.exists(p("sa.key")):
            run(ssl + ["genrsa", "-out", p("sa.key"), "2048"], log=log)
            run(ssl + ["rsa", "-in", p("sa.key"), "-pubout", "-out", p("sa.pub")], log=log)
        api_names = [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
            "localhost",
        ]
        certs = {
            "apiserver": ("/CN=kube-apiserver", api_names, [API_SERVICE_IP, NODE_IP, "127.0.0.1"], "server"),
            "kubelet-serving": (f"/CN={NODE_NAME}", [NODE_NAME, "localhost"], [NODE_IP, "127.0.0.1"], "server"),
            "admin": ("/O=system:masters/CN=kubernetes-admin", [], [], "client"),
            "apiserver-kubelet-client": ("/O=system:masters/CN=kube-apiserver-kubelet-client", [], [], "client"),
            "controller-manager": ("/CN=system:kube-controller-manager", [], [], "client"),
            "scheduler": ("/CN=system:kube-scheduler", [], [], "client"),
            "kubelet": (f"/O=system:nodes/CN=system:node:{NODE_NAME}", [], [], "client"),
            "kube-proxy": ("/CN=system:kube-proxy", [], [], "client"),
            "coredns": ("/CN=system:coredns", [], [], "client"),
        }
        for name, (subject, dns, ips, usage) in certs.items():
            if os.path.exists(p(name + ".crt")):
                continue
            ext = p(name + ".ext")
            lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
            lines.append("extendedKeyUsage=" + ("serverAuth" if usage == "server" else "clientAuth"))
            alt = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
            if alt:
                lines.append("subjectAltName=" + ",".join(alt))
            with open(ext, "w") as f:
                f.write("\n".join(lines) + "\n")
            run(ssl + ["genrsa", "-out", p(name + ".key"), "2048"], log=log)
            run(ssl + ["req", "-new", "-key", p(name + ".key"), "-subj", subject, "-out", p(name + ".csr")], log=log)
            run(
                ssl
                + [
                    "x509",
                    "-req",
                    "-in",
                    p(name + ".csr"),
                    "-CA",
                    p("ca.crt"),
                    "-CAkey",
                    p("ca.key"),
                    "-CAcreateserial",
                    "-days",
                    "3650",
                    "-extfile",
                    ext,
                    "-out",
                    p(name + ".crt"),
                ],
                log=log,
            )
        for name in ("admin", "controller-manager", "scheduler", "kubelet", "kube-proxy", "coredns"):
            self.write_kubeconfig(name)
        os.replace(os.path.join(self.etc, "admin.kubeconfig"), self.kubeconfig)

    def write_kubeconfig(self, user):
        os.makedirs(self.etc, exist_ok=True)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "qproxy",
                    "cluster": {
                        "server": API_SERVER,
                        "certificate-authority": os.path.join(self.pki, "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate": os.path.join(self.pki, user + ".crt"),
                        "client-key": os.path.join(self.pki, user + ".key"),
                    },
                }
            ],
            "contexts": [{"name": "qproxy", "context": {"cluster": "qproxy", "user": user}}],
            "current-context": "qproxy",
        }
        # JSON is YAML: every Kubernetes client reads it.
        with open(os.path.join(self.etc, user + ".kubeconfig"), "w") as f:
            json.dump(config, f, indent=2)

    def kubeconfig_of(self, user):
        return os.path.join(self.etc, user + ".kubeconfig")

    # ---- processes ---------------------------------------------------------------

    def start(self, name, args, env=None):
        """Starts one of the node's processes in its network namespace and
        cgroup, in a session of its own (it outlives scripts/cluster), its
        output in logs/<name>.log and its pid in RUN/pids."""
        os.makedirs(self.logs, exist_ok=True)
        os.makedirs(os.path.join(RUN, "pids"), exist_ok=True)
        log = open(self.log(name), "ab")
        log.write(("$ " + " ".join(args) + "\n").encode())
        log.flush()

        def into_cgroup():
            pid = str(os.getpid())
            for controller in cgroup_controllers():
                with open(os.path.join(CGROUP_FS, controller, CGROUP, "system", "cgroup.procs"), "w") as f:
                    f.write(pid)

        process = subprocess.Popen(
            ["nsenter", f"--net={NETNS_PATH}", "--"] + args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=into_cgroup,
        )
        log.close()
        with open(os.path.join(RUN, "pids", name), "w") as f:
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
            with open(os.path.join(RUN, "pids", name)) as f:
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
        it in place), or None if it cannot be read."""
        try:
            with open(f"/proc/{self.pid(name)}/cmdline", "rb") as f:
                return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
        except (OSError, TypeError):
            return None

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

    def make_cgroups(self):
        for controller in cgroup_controllers():
            for sub in ("", "system"):
                os.makedirs(os.path.join(CGROUP_FS, controller, CGROUP, sub), exist_ok=True)
        # cpuset's children start with no CPUs and no memory nodes.
        cpuset = os.path.join(CGROUP_FS, "cpuset")
        if os.path.isdir(cpuset):
            for sub in (CGROUP, os.path.join(CGROUP, "system")):
                for key in ("cpuset.cpus", "cpuset.mems"):
                    parent = os.path.dirname(os.path.join(cpuset, sub))
                    with open(os.path.join(parent, key)) as f:
                        value = f.read().strip()
                    with open(os.path.join(cpuset, sub, key), "w") as f:
                        f.write(value)

    def make_folders(self):
        """STATE and RUN as shared mounts: the kubelet's volume mounts below
        them must propagate to containerd's and runc's view."""
        for path in (STATE, RUN):
            os.makedirs(path, exist_ok=True)
            if not is_mountpoint(path):
                run(["mount", "--bind", path, path], log=self.log("mounts"))
            run(["mount", "--make-rshared", path], log=self.log("mounts"))
        os.makedirs(os.path.join(STATE, "kubelet"), exist_ok=True)
        # The kubelet watches many files (every pod's volumes).
        with open("/proc/sys/fs/inotify/max_user_instances") as f:
            if int(f.read()) < 1024:
                with open("/proc/sys/fs/inotify/max_user_instances", "w") as g:
                    g.write("1024")

    # ---- teardown --------------------------------------------------------------

    def teardown(self):
        """Removes what any `up` made, finished or not: every process in the
        node's cgroup (pods, shims, the node's own processes), the pods'
        mounts, the cgroups, the network namespace, and STATE and RUN. Safe
        to run when nothing is there."""
        log = self.log("down") if os.path.isdir(self.logs) else None
        kill_cgroup_tree(CGROUP)
        # Anything left in the namespace that is not in the cgroup (a
        # process moved out of it, or started by hand with `run`).
        for pid in pids_in_netns(NETNS_PATH):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        unmount_below(STATE, log)
        unmount_below(RUN, log)
        remove_cgroup_tree(CGROUP)
        if os.path.exists(NETNS_PATH):
            run(["ip", "netns", "del", NETNS], log=log, check=False)
        for path in (STATE, RUN):
            if mounts_below(path):
                raise PhaseError(f"{path} still has mounts below it; not removing it", log)
            subprocess.run(["rm", "-rf", "--one-file-system", path], check=False)
        for path in (self.pki, self.etc, self.kubeconfig):
            subprocess.run(["rm", "-rf", path], check=False)

    # ---- the API server ------------------------------------------------------------

    def api(self, path, user="admin", timeout=5):
        """GETs `path` from the API server as `user`; returns (status, body)."""
        context = ssl.create_default_context(cafile=os.path.join(self.pki, "ca.crt"))
        context.load_cert_chain(os.path.join(self.pki, user + ".crt"), os.path.join(self.pki, user + ".key"))
        try:
            with urllib.request.urlopen(API_SERVER + path, context=context, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    # ---- the node's processes, in the order they start ---------------------------

    def start_control_plane(self):
        """Starts etcd, the control plane and containerd, each once the one it
        needs answers; the caller is in the node's network namespace. Those
        already running are kept, unless their configuration changed."""
        kube = self.kube("kube")
        etc = self.etc
        pki = self.pki
        started = self.started

        say("starting etcd")
        started(
            "etcd",
            [
                kube,
                "etcd",
                "--name",
                "qproxy",
                "--data-dir",
                f"{STATE}/etcd",
                "--listen-client-urls",
                "http://127.0.0.1:2379",
                "--advertise-client-urls",
                "http://127.0.0.1:2379",
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-cluster",
                "qproxy=http://127.0.0.1:2380",
                # A throwaway cluster: its data need not survive a power cut.
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
            lambda: http_ok("http://127.0.0.1:2379/health"),
            "etcd healthy",
        )

        say("starting the control plane (API server, controller manager, scheduler)")
        started(
            "kube-apiserver",
            [
                kube,
                "kube-apiserver",
                "--etcd-servers",
                "http://127.0.0.1:2379",
                "--advertise-address",
                NODE_IP,
                "--bind-address",
                NODE_IP,
                "--secure-port",
                "6443",
                "--service-cluster-ip-range",
                SERVICE_CIDR,
                "--client-ca-file",
                f"{pki}/ca.crt",
                "--tls-cert-file",
                f"{pki}/apiserver.crt",
                "--tls-private-key-file",
                f"{pki}/apiserver.key",
                "--kubelet-client-certificate",
                f"{pki}/apiserver-kubelet-client.crt",
                "--kubelet-client-key",
                f"{pki}/apiserver-kubelet-client.key",
                # The node's name resolves nowhere (no route out, no upstream
                # resolver): logs, exec and port-forward go to its address.
                "--kubelet-preferred-address-types",
                "InternalIP",
                "--service-account-issuer",
                f"https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
                "--service-account-key-file",
                f"{pki}/sa.pub",
                "--service-account-signing-key-file",
                f"{pki}/sa.key",
                "--authorization-mode",
                "Node,RBAC",
                "--enable-admission-plugins",
                "NodeRestriction",
                "--allow-privileged=true",
                "--profiling=false",
                "--cert-dir",
                f"{STATE}/apiserver",
            ],
            lambda: self.api("/readyz")[0] == 200,
            "the API server ready",
        )
        started(
            "kube-controller-manager",
            [
                kube,
                "kube-controller-manager",
                "--kubeconfig",
                self.kubeconfig_of("controller-manager"),
                "--authentication-kubeconfig",
                self.kubeconfig_of("controller-manager"),
                "--authorization-kubeconfig",
                self.kubeconfig_of("controller-manager"),
                "--bind-address",
                "127.0.0.1",
                "--service-account-private-key-file",
                f"{pki}/sa.key",
                "--root-ca-file",
                f"{pki}/ca.crt",
                "--cluster-signing-cert-file",
                f"{pki}/ca.crt",
                "--cluster-signing-key-file",
                f"{pki}/ca.key",
                "--use-service-account-credentials=true",
                "--service-cluster-ip-range",
                SERVICE_CIDR,
                "--leader-elect=false",
                "--profiling=false",
            ],
            lambda: insecure_ok("https://127.0.0.1:10257/healthz"),
            "the controller manager healthy",
        )
        started(
            "kube-scheduler",
            [
                kube,
                "kube-scheduler",
                "--kubeconfig",
                self.kubeconfig_of("scheduler"),
                "--authentication-kubeconfig",
                self.kubeconfig_of("scheduler"),
                "--authorization-kubeconfig",
                self.kubeconfig_of("scheduler"),
                "--bind-address",
                "127.0.0.1",
                "--leader-elect=false",
                "--profiling=false",
            ],
            lambda: insecure_ok("https://127.0.0.1:10259/healthz"),
            "the scheduler healthy",
        )

        say("starting containerd")
        changed = write(f"{etc}/containerd.toml", containerd_config(etc))
        changed |= write(f"{etc}/cni/10-qproxy-cluster.conflist", cni_config())
        started(
            "containerd",
            [self.kube("containerd"), "--config", f"{etc}/containerd.toml", "--log-level", "warn"],
            lambda: subprocess.run(self.ctr() + ["version"], capture_output=True).returncode == 0,
            "containerd answering",
            timeout=60,
            changed=changed,
        )

    def start_kubelet(self):
        """The kubelet, kube-proxy and CoreDNS; returns when the node is Ready
        and cluster names resolve."""
        kube = self.kube("kube")
        etc = self.etc
        started = self.started

        say("starting the kubelet, kube-proxy and CoreDNS")
        changed = write(f"{etc}/kubelet.json", kubelet_config(self.pki))
        started(
            "kubelet",
            [
                kube,
                "kubelet",
                "--config",
                f"{etc}/kubelet.json",
                "--kubeconfig",
                self.kubeconfig_of("kubelet"),
                "--hostname-override",
                NODE_NAME,
                "--node-ip",
                NODE_IP,
                "--root-dir",
                f"{STATE}/kubelet",
                "--cert-dir",
                f"{STATE}/kubelet/pki",
                "--v",
                "1",
            ],
            self.ready,
            "the node Ready",
            timeout=180,
            changed=changed,
        )
        changed = write(f"{etc}/kube-proxy.json", kube_proxy_config(self.kubeconfig_of("kube-proxy")))
        started(
            "kube-proxy",
            [kube, "kube-proxy", "--config", f"{etc}/kube-proxy.json"],
            lambda: http_ok("http://127.0.0.1:10256/healthz"),
            "kube-proxy healthy",
            changed=changed,
        )
        changed = write(f"{etc}/Corefile", corefile(self.kubeconfig_of("coredns")))
        self.kubectl(self.log("coredns"))(
            "apply", "-f", os.path.join(ROOT, "cluster", "manifests", "coredns-rbac.yaml")
        )
        started(
            "coredns",
            [kube, "coredns", "-conf", f"{etc}/Corefile"],
            lambda: http_ok("http://127.0.0.1:8181/ready"),
            "CoreDNS ready",
            changed=changed,
        )

    def ready(self):
        """Whether the API server has the node Ready."""
        status, body = self.api(f"/api/v1/nodes/{NODE_NAME}")
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def http_ok(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status == 200


def insecure_ok(url):
    """A component's own health endpoint, served with a certificate it made
    for itself."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, context=context, timeout=2) as r:
        return r.status == 200
