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
import subprocess
import time

from . import build, util

NETNS = "qproxy-cluster"
NETNS_PATH = f"/run/netns/{NETNS}"
NODE_NAME = "qproxy-node"
# The node's address, on an interface of its own in the namespace; the API
# server, the kubelet and CoreDNS listen on it. Pods reach it through their
# bridge's gateway.
NODE_IP = "10.77.0.1"
POD_CIDR = "10.244.0.0/16"
BRIDGE_IP = "10.244.0.1"
SERVICE_CIDR = "10.96.0.0/16"
API_SERVICE_IP = "10.96.0.1"
CLUSTER_DOMAIN = "cluster.local"
API_SERVER = f"https://{NODE_IP}:6443"

# Where the node keeps its state (etcd, images, pods' volumes) and its
# sockets; both are removed by `down`. Short paths: unix sockets live there.
STATE = "/var/lib/qproxy-cluster"
RUN = "/run/qproxy-cluster"
# The cgroup (in every v1 hierarchy) the node's processes and its pods live
# in: `system` for the processes started here, `kubepods` for the kubelet's.
CGROUP = "qproxy-cluster"
CGROUP_FS = "/sys/fs/cgroup"

SANDBOX_IMAGE = f"ko.local/pause:{build.PAUSE}"
# The node's programs, in the machine's cache.
BIN = os.path.join(build.CACHE, "bin")


class Node:
    """The node's files: its programs in the machine's cache
    (build.CACHE/bin, kept across `down` and shared by every clone);
    `build` is target/cluster, and under it `logs`, `pki` and the
    kubeconfigs of one `up` (removed by `down`, but for the logs)."""

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

    def log(self, name):
        return os.path.join(self.logs, name + ".log")

    # ---- what the machine must offer ---------------------------------------------

    def check_machine(self):
        """Refuses, with what is missing, a machine the node cannot run on:
        it drives v1 cgroups (hybrid or v1 alone) and needs the bridge's
        netfilter hooks for pods to reach services on the same bridge."""
        if os.path.exists(os.path.join(CGROUP_FS, "cgroup.controllers")):
            raise util.PhaseError(
                "/sys/fs/cgroup is a cgroup v2 hierarchy: the cluster's kubelet and containerd are set up "
                "for v1 cgroups (hybrid or v1 alone), as on the machines it is made for")
        missing = [c for c in ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer")
                   if c not in cgroup_controllers()]
        if missing:
            raise util.PhaseError(f"no v1 cgroup hierarchy for {', '.join(missing)} under {CGROUP_FS}")
        if not os.path.isdir("/proc/sys/net/bridge"):
            util.run(["modprobe", "br_netfilter"], log=self.log("network"), check=False)
            if not os.path.isdir("/proc/sys/net/bridge"):
                raise util.PhaseError(
                    "the kernel has no bridge netfilter (br_netfilter): pods could not reach services "
                    "on their own bridge", self.log("network"))

    # ---- the network namespace -------------------------------------------------

    def make_netns(self):
        """The node's network namespace: loopback, the node's address on an
        interface of its own (one end of a veth pair whose other end is
        idle, so that no kernel module for dummy interfaces is needed), the
        service range routed to it (kube-proxy's rules catch it on the way
        out), and everything else unreachable."""
        log = self.log("network")
        util.run(["ip", "netns", "add", NETNS], log=log)
        ns = ["ip", "-n", NETNS]
        util.run(ns + ["link", "set", "lo", "up"], log=log)
        util.run(ns + ["link", "add", "node0", "type", "veth", "peer", "name", "node0-idle"], log=log)
        util.run(ns + ["addr", "add", f"{NODE_IP}/24", "dev", "node0"], log=log)
        util.run(ns + ["link", "set", "node0-idle", "up"], log=log)
        util.run(ns + ["link", "set", "node0", "up"], log=log)
        util.run(ns + ["route", "add", SERVICE_CIDR, "dev", "node0", "src", NODE_IP], log=log)
        # No route out: a connection to anywhere else fails at once.
        util.run(ns + ["route", "add", "unreachable", "default"], log=log)
        sysctls = {
            "net.ipv4.ip_forward": "1",
            # Pod to service to a pod on the same bridge: the answer is
            # bridged, and must cross netfilter to be un-NATed.
            "net.bridge.bridge-nf-call-iptables": "1",
            "net.bridge.bridge-nf-call-ip6tables": "1",
            "net.ipv4.conf.all.route_localnet": "1",
        }
        for key, value in sysctls.items():
            util.run(["ip", "netns", "exec", NETNS, "sysctl", "-q", "-w", f"{key}={value}"], log=log)

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
            util.run(ssl + ["genrsa", "-out", p("ca.key"), "2048"], log=log)
            util.run(
                ssl + ["req", "-x509", "-new", "-key", p("ca.key"), "-days", "3650",
                       "-subj", "/CN=qproxy-cluster-ca", "-out", p("ca.crt")],
                log=log,
            )
        if not os.path.exists(p("sa.key")):
            util.run(ssl + ["genrsa", "-out", p("sa.key"), "2048"], log=log)
            util.run(ssl + ["rsa", "-in", p("sa.key"), "-pubout", "-out", p("sa.pub")], log=log)
        api_names = [
            "kubernetes", "kubernetes.default", "kubernetes.default.svc",
            f"kubernetes.default.svc.{CLUSTER_DOMAIN}", "localhost",
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
            util.run(ssl + ["genrsa", "-out", p(name + ".key"), "2048"], log=log)
            util.run(ssl + ["req", "-new", "-key", p(name + ".key"), "-subj", subject, "-out", p(name + ".csr")], log=log)
            util.run(
                ssl + ["x509", "-req", "-in", p(name + ".csr"), "-CA", p("ca.crt"), "-CAkey", p("ca.key"),
                       "-CAcreateserial", "-days", "3650", "-extfile", ext, "-out", p(name + ".crt")],
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
            "clusters": [{"name": "qproxy", "cluster": {
                "server": API_SERVER,
                "certificate-authority": os.path.join(self.pki, "ca.crt"),
            }}],
            "users": [{"name": user, "user": {
                "client-certificate": os.path.join(self.pki, user + ".crt"),
                "client-key": os.path.join(self.pki, user + ".key"),
            }}],
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
            util.wait_until(f"{name} gone after SIGKILL", lambda: not self.alive(name), 30, log=self.log(name))

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
                raise util.PhaseError(f"{name} exited", self.log(name))
            return check()

        util.wait_until(what, ready, timeout, log=self.log(name))

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
                util.run(["mount", "--bind", path, path], log=self.log("mounts"))
            util.run(["mount", "--make-rshared", path], log=self.log("mounts"))
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
            util.run(["ip", "netns", "del", NETNS], log=log, check=False)
        for path in (STATE, RUN):
            if mounts_below(path):
                raise util.PhaseError(f"{path} still has mounts below it; not removing it", log)
            subprocess.run(["rm", "-rf", "--one-file-system", path], check=False)
        for path in (self.pki, self.etc, self.kubeconfig):
            subprocess.run(["rm", "-rf", path], check=False)


def cgroup_controllers():
    """The v1 hierarchies this machine mounts (cpu, memory, ..., and the
    named systemd one), each a folder under /sys/fs/cgroup."""
    names = []
    for name in sorted(os.listdir(CGROUP_FS)):
        path = os.path.join(CGROUP_FS, name)
        if name != "unified" and os.path.isfile(os.path.join(path, "cgroup.procs")):
            names.append(name)
    return names


def all_cgroup_roots():
    roots = [os.path.join(CGROUP_FS, c) for c in cgroup_controllers()]
    unified = os.path.join(CGROUP_FS, "unified")
    if os.path.isfile(os.path.join(unified, "cgroup.procs")):
        roots.append(unified)
    return roots


def kill_cgroup_tree(name, timeout=60):
    """SIGKILLs every process in the cgroup `name` and below, in every
    hierarchy, until none is left (a dying shim may still fork)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = set()
        for root in all_cgroup_roots():
            top = os.path.join(root, name)
            for folder, _, files in os.walk(top):
                if "cgroup.procs" in files:
                    try:
                        with open(os.path.join(folder, "cgroup.procs")) as f:
                            pids.update(int(x) for x in f.read().split())
                    except OSError:
                        pass
        pids.discard(os.getpid())
        if not pids:
            return
        # A frozen cgroup would keep its processes from dying.
        for root in all_cgroup_roots():
            if os.path.basename(root) == "freezer":
                for folder, _, files in os.walk(os.path.join(root, name)):
                    if "freezer.state" in files:
                        try:
                            with open(os.path.join(folder, "freezer.state"), "w") as f:
                                f.write("THAWED")
                        except OSError:
                            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise util.PhaseError(f"processes {sorted(pids)[:10]} in cgroup {name} would not die")
        time.sleep(0.2)


def remove_cgroup_tree(name):
    for root in all_cgroup_roots():
        top = os.path.join(root, name)
        for folder, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(folder)
            except OSError:
                pass


def pids_in_netns(path):
    """The processes in the network namespace mounted at `path` (none when
    nothing is mounted there)."""
    if not is_mountpoint(path):
        return []
    try:
        st = os.stat(path)
        target = (st.st_dev, st.st_ino)
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                ns = os.stat(f"/proc/{entry}/ns/net")
                if (ns.st_dev, ns.st_ino) == target:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def mounts():
    """Mount points, from /proc/self/mountinfo, in mount order."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            points.append(point.encode().decode("unicode_escape"))
    return points


def mounts_below(path):
    path = path.rstrip("/")
    return [m for m in mounts() if m == path or m.startswith(path + "/")]


def is_mountpoint(path):
    return path.rstrip("/") in mounts()


def unmount_below(path, log):
    """Unmounts everything at and below `path`, the latest first; lazily if
    a mount is busy."""
    for _ in range(10):
        found = mounts_below(path)
        if not found:
            return
        for point in reversed(found):
            if subprocess.run(["umount", point], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True)
    remaining = mounts_below(path)
    if remaining:
        raise util.PhaseError(f"could not unmount {remaining[:5]}", log)


# ---- the node's processes, in the order they start ------------------------------


def containerd_config(node):
    """containerd 2's configuration: its folders under STATE and RUN, the
    kubelet's cgroupfs driver, Debian's runc and CNI plugins, the local pause
    image as the sandbox, and no plugin that would reach a registry or need
    a kernel feature this node lacks."""
    return f"""version = 3
root = "{STATE}/containerd"
state = "{RUN}/containerd"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{RUN}/containerd/containerd.sock"

[ttrpc]
  address = "{RUN}/containerd/containerd.sock.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{SANDBOX_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # Lowering an oom_score_adj needs CAP_SYS_RESOURCE, which this machine
  # does not give even root: no container goes below containerd's own.
  restrict_oom_score_adj = true
  enable_cdi = false
  enable_criu = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "/usr/sbin/runc"
      Root = "{RUN}/runc"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{node.etc}/cni"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
"""


def cni_config():
    """One bridge for every pod, addresses from host-local, and portmap for
    hostPort; the bridge is the pods' gateway into the node."""
    return {
        "cniVersion": "1.0.0",
        "name": "qproxy-cluster",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": BRIDGE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": f"{STATE}/cni",
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(node):
    pki = node.pki
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": f"{pki}/ca.crt"},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": f"{pki}/kubelet-serving.crt",
        "tlsPrivateKeyFile": f"{pki}/kubelet-serving.key",
        # This machine's cgroups are v1, driven through cgroupfs.
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP}",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{RUN}/containerd/containerd.sock",
        "clusterDNS": [NODE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        # The machine's own resolver is outside the namespace: pods with
        # dnsPolicy Default get none.
        "resolvConf": "",
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "maxPods": 250,
        # Images are imported, never pulled: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "localStorageCapacityIsolation": True,
        "containerLogMaxSize": "10Mi",
        "shutdownGracePeriod": "0s",
        # Its own score, which it could not lower (see containerd_config).
        "oomScoreAdj": 0,
    }


def kube_proxy_config(node):
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": node.kubeconfig_of("kube-proxy")},
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "bindAddress": NODE_IP,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "hostnameOverride": NODE_NAME,
        # The namespace's conntrack table is the machine's: leave its
        # sizes and timeouts alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "oomScoreAdj": 0,
    }


def corefile(node):
    """CoreDNS answers the cluster's names on the node's address, and
    nothing else: with no upstream, any other name is refused at once."""
    return f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:8180
    ready 127.0.0.1:8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {node.kubeconfig_of("coredns")}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loadbalance
}}
"""


def write(path, text):
    """Writes a configuration file unless it already says the same, and
    returns whether it changed: kube-proxy exits when its file is written
    to, and a process whose file changed is started again."""
    text = text if isinstance(text, str) else json.dumps(text, indent=2)
    try:
        with open(path) as f:
            if f.read() == text:
                return False
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return True


def api(node, path, user="admin", timeout=5):
    """GETs `path` from the API server as `user`; returns (status, body)."""
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=os.path.join(node.pki, "ca.crt"))
    context.load_cert_chain(os.path.join(node.pki, user + ".crt"), os.path.join(node.pki, user + ".key"))
    try:
        with urllib.request.urlopen(API_SERVER + path, context=context, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def http_ok(url, timeout=2):
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status == 200


def start_node(node):
    """Starts etcd, the control plane and containerd, each once the one it
    needs answers; the caller is in the node's network namespace. Those
    already running are kept, unless their configuration changed."""
    kube = node.kube("kube")
    etc = node.etc
    pki = node.pki
    started = node.started

    util.say("starting etcd")
    started(
        "etcd",
        [kube, "etcd", "--name", "qproxy", "--data-dir", f"{STATE}/etcd",
         "--listen-client-urls", "http://127.0.0.1:2379",
         "--advertise-client-urls", "http://127.0.0.1:2379",
         "--listen-peer-urls", "http://127.0.0.1:2380",
         "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
         "--initial-cluster", "qproxy=http://127.0.0.1:2380",
         # A throwaway cluster: its data need not survive a power cut.
         "--unsafe-no-fsync", "--log-level", "warn"],
        lambda: http_ok("http://127.0.0.1:2379/health"),
        "etcd healthy",
    )

    util.say("starting the control plane (API server, controller manager, scheduler)")
    started(
        "kube-apiserver",
        [kube, "kube-apiserver",
         "--etcd-servers", "http://127.0.0.1:2379",
         "--advertise-address", NODE_IP, "--bind-address", NODE_IP, "--secure-port", "6443",
         "--service-cluster-ip-range", SERVICE_CIDR,
         "--client-ca-file", f"{pki}/ca.crt",
         "--tls-cert-file", f"{pki}/apiserver.crt", "--tls-private-key-file", f"{pki}/apiserver.key",
         "--kubelet-client-certificate", f"{pki}/apiserver-kubelet-client.crt",
         "--kubelet-client-key", f"{pki}/apiserver-kubelet-client.key",
         # The node's name resolves nowhere (no route out, no upstream
         # resolver): logs, exec and port-forward go to its address.
         "--kubelet-preferred-address-types", "InternalIP",
         "--service-account-issuer", f"https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
         "--service-account-key-file", f"{pki}/sa.pub",
         "--service-account-signing-key-file", f"{pki}/sa.key",
         "--authorization-mode", "Node,RBAC",
         "--enable-admission-plugins", "NodeRestriction",
         "--allow-privileged=true",
         "--profiling=false",
         "--cert-dir", f"{STATE}/apiserver"],
        lambda: api(node, "/readyz")[0] == 200,
        "the API server ready",
    )
    started(
        "kube-controller-manager",
        [kube, "kube-controller-manager",
         "--kubeconfig", node.kubeconfig_of("controller-manager"),
         "--authentication-kubeconfig", node.kubeconfig_of("controller-manager"),
         "--authorization-kubeconfig", node.kubeconfig_of("controller-manager"),
         "--bind-address", "127.0.0.1",
         "--service-account-private-key-file", f"{pki}/sa.key",
         "--root-ca-file", f"{pki}/ca.crt",
         "--cluster-signing-cert-file", f"{pki}/ca.crt",
         "--cluster-signing-key-file", f"{pki}/ca.key",
         "--use-service-account-credentials=true",
         "--service-cluster-ip-range", SERVICE_CIDR,
         "--leader-elect=false",
         "--profiling=false"],
        lambda: _insecure_ok("https://127.0.0.1:10257/healthz"),
        "the controller manager healthy",
    )
    started(
        "kube-scheduler",
        [kube, "kube-scheduler",
         "--kubeconfig", node.kubeconfig_of("scheduler"),
         "--authentication-kubeconfig", node.kubeconfig_of("scheduler"),
         "--authorization-kubeconfig", node.kubeconfig_of("scheduler"),
         "--bind-address", "127.0.0.1",
         "--leader-elect=false",
         "--profiling=false"],
        lambda: _insecure_ok("https://127.0.0.1:10259/healthz"),
        "the scheduler healthy",
    )

    util.say("starting containerd")
    changed = write(f"{etc}/containerd.toml", containerd_config(node))
    changed |= write(f"{etc}/cni/10-qproxy-cluster.conflist", cni_config())
    started(
        "containerd",
        [node.kube("containerd"), "--config", f"{etc}/containerd.toml", "--log-level", "warn"],
        lambda: subprocess.run(node.ctr() + ["version"], capture_output=True).returncode == 0,
        "containerd answering",
        timeout=60,
        changed=changed,
    )


def _insecure_ok(url):
    """A component's own health endpoint, served with a certificate it made
    for itself."""
    import ssl
    import urllib.request

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, context=context, timeout=2) as r:
        return r.status == 200


def start_kubelet(node):
    """The kubelet, kube-proxy and CoreDNS; returns when the node is Ready
    and cluster names resolve."""
    kube = node.kube("kube")
    etc = node.etc
    started = node.started

    util.say("starting the kubelet, kube-proxy and CoreDNS")
    changed = write(f"{etc}/kubelet.json", kubelet_config(node))
    started(
        "kubelet",
        [kube, "kubelet",
         "--config", f"{etc}/kubelet.json",
         "--kubeconfig", node.kubeconfig_of("kubelet"),
         "--hostname-override", NODE_NAME,
         "--node-ip", NODE_IP,
         "--root-dir", f"{STATE}/kubelet",
         "--cert-dir", f"{STATE}/kubelet/pki",
         "--v", "1"],
        lambda: node_ready(node),
        "the node Ready",
        timeout=180,
        changed=changed,
    )
    changed = write(f"{etc}/kube-proxy.json", kube_proxy_config(node))
    started(
        "kube-proxy",
        [kube, "kube-proxy", "--config", f"{etc}/kube-proxy.json"],
        lambda: http_ok("http://127.0.0.1:10256/healthz"),
        "kube-proxy healthy",
        changed=changed,
    )
    changed = write(f"{etc}/Corefile", corefile(node))
    util.run(
        [node.kube("kubectl"), "--kubeconfig", node.kubeconfig, "apply", "-f",
         os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "manifests", "coredns-rbac.yaml")],
        log=node.log("coredns"),
    )
    started(
        "coredns",
        [kube, "coredns", "-conf", f"{etc}/Corefile"],
        lambda: http_ok("http://127.0.0.1:8181/ready"),
        "CoreDNS ready",
        changed=changed,
    )


def node_ready(node):
    status, body = api(node, f"/api/v1/nodes/{NODE_NAME}")
    if status != 200:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
