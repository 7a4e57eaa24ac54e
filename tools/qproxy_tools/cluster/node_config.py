"""The node's addresses and folders, and the configuration of each of its
processes, as files they read."""

import json
import os

from .build import CACHE, PAUSE

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

SANDBOX_IMAGE = f"ko.local/pause:{PAUSE}"
# The node's programs, in the machine's cache.
BIN = os.path.join(CACHE, "bin")


def containerd_config(etc):
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
    conf_dir = "{etc}/cni"

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


def kubelet_config(pki):
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


def kube_proxy_config(kubeconfig):
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
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


def corefile(kubeconfig):
    """CoreDNS answers the cluster's names on the node's address, and
    nothing else: with no upstream, any other name is refused at once."""
    return f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:8180
    ready 127.0.0.1:8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
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
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return True
