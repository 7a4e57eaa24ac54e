import json
import os
import tomllib

import pytest

from qproxy_tools.cluster import node_config
from qproxy_tools.cluster.build import PAUSE
from qproxy_tools.cluster.node_config import (
    BRIDGE_IP,
    CLUSTER_DOMAIN,
    NODE_IP,
    NODE_NAME,
    POD_CIDR,
    RUN,
    STATE,
    cni_config,
    containerd_config,
    corefile,
    kube_proxy_config,
    kubelet_config,
    write,
)

# ---- containerd --------------------------------------------------------------


@pytest.fixture
def containerd():
    return tomllib.loads(containerd_config("/build/etc"))


def test_containerd_config_is_version_3_toml(containerd):
    assert containerd["version"] == 3


def test_containerd_keeps_its_state_under_state_and_run(containerd):
    assert containerd["root"] == f"{STATE}/containerd"
    assert containerd["state"] == f"{RUN}/containerd"


def test_containerd_listens_on_a_socket_under_run(containerd):
    assert containerd["grpc"]["address"] == f"{RUN}/containerd/containerd.sock"
    assert containerd["ttrpc"]["address"] == f"{RUN}/containerd/containerd.sock.ttrpc"


def test_containerd_reads_cni_confs_under_etc(containerd):
    cni = containerd["plugins"]["io.containerd.cri.v1.runtime"]["cni"]
    assert cni["conf_dir"] == "/build/etc/cni"
    assert cni["bin_dirs"] == ["/usr/lib/cni"]


def test_containerd_pins_the_local_pause_image_as_sandbox(containerd):
    images = containerd["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == f"ko.local/pause:{PAUSE}"
    assert node_config.SANDBOX_IMAGE == f"ko.local/pause:{PAUSE}"


def test_containerd_runs_runc_with_cgroupfs(containerd):
    runc = containerd["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"]["SystemdCgroup"] is False
    assert runc["options"]["Root"] == f"{RUN}/runc"


def test_containerd_disables_the_tracing_and_unusable_snapshotters(containerd):
    disabled = containerd["disabled_plugins"]
    assert "io.containerd.tracing.processor.v1.otlp" in disabled
    assert "io.containerd.snapshotter.v1.btrfs" in disabled
    assert containerd["plugins"]["io.containerd.cri.v1.images"]["snapshotter"] == "overlayfs"
    assert "io.containerd.snapshotter.v1.overlayfs" not in disabled


# ---- CNI ---------------------------------------------------------------------


def test_cni_config_is_a_bridge_then_portmap():
    config = cni_config()
    assert config["cniVersion"] == "1.0.0"
    assert [p["type"] for p in config["plugins"]] == ["bridge", "portmap"]
    assert config["plugins"][1]["capabilities"] == {"portMappings": True}


def test_cni_bridge_is_the_pods_gateway_in_the_pod_cidr():
    bridge = cni_config()["plugins"][0]
    assert bridge["isGateway"] is True
    assert bridge["ipam"]["type"] == "host-local"
    assert bridge["ipam"]["ranges"] == [[{"subnet": POD_CIDR, "gateway": BRIDGE_IP}]]
    assert bridge["ipam"]["dataDir"] == f"{STATE}/cni"


def test_cni_config_is_json():
    assert json.loads(json.dumps(cni_config())) == cni_config()


# ---- kubelet -----------------------------------------------------------------


def test_kubelet_reads_its_certificates_under_pki():
    config = kubelet_config("/build/pki")
    assert config["authentication"]["x509"]["clientCAFile"] == "/build/pki/ca.crt"
    assert config["tlsCertFile"] == "/build/pki/kubelet-serving.crt"
    assert config["tlsPrivateKeyFile"] == "/build/pki/kubelet-serving.key"


def test_kubelet_drives_cgroupfs():
    config = kubelet_config("/pki")
    assert config["kind"] == "KubeletConfiguration"
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == "/" + node_config.CGROUP


def test_kubelet_points_pods_at_the_nodes_dns():
    config = kubelet_config("/pki")
    assert config["clusterDNS"] == [NODE_IP]
    assert config["clusterDomain"] == CLUSTER_DOMAIN
    assert config["address"] == NODE_IP


def test_kubelet_talks_to_containerds_socket():
    containerd = tomllib.loads(containerd_config("/etc"))
    assert kubelet_config("/pki")["containerRuntimeEndpoint"] == "unix://" + containerd["grpc"]["address"]


# ---- kube-proxy and CoreDNS --------------------------------------------------


def test_kube_proxy_uses_its_kubeconfig_and_the_pod_cidr():
    config = kube_proxy_config("/build/kube-proxy.kubeconfig")
    assert config["kind"] == "KubeProxyConfiguration"
    assert config["clientConnection"] == {"kubeconfig": "/build/kube-proxy.kubeconfig"}
    assert config["clusterCIDR"] == POD_CIDR == cni_config()["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]
    assert config["mode"] == "iptables"
    assert config["hostnameOverride"] == NODE_NAME
    assert config["bindAddress"] == NODE_IP


def test_kube_proxy_leaves_conntrack_alone():
    assert kube_proxy_config("/k")["conntrack"]["maxPerCore"] == 0


def test_corefile_binds_the_node_address_and_reads_its_kubeconfig():
    text = corefile("/build/coredns.kubeconfig")
    assert f"    bind {NODE_IP}\n" in text
    assert "        kubeconfig /build/coredns.kubeconfig\n" in text
    assert f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n" in text
    assert text.startswith(".:53 {\n")
    assert text.count("{") == text.count("}") == 2


def test_corefile_has_no_upstream():
    assert "forward" not in corefile("/k")


# ---- write -------------------------------------------------------------------


def test_write_creates_a_missing_file_and_its_folders(tmp_path):
    path = tmp_path / "etc" / "cni" / "10-bridge.conflist"
    assert write(str(path), "text") is True
    assert path.read_text() == "text"


def test_write_writes_a_dict_as_json(tmp_path):
    path = tmp_path / "kubelet.json"
    assert write(str(path), {"a": [1, None]}) is True
    assert json.loads(path.read_text()) == {"a": [1, None]}


def test_write_leaves_a_file_that_already_says_the_same(tmp_path):
    path = tmp_path / "config.json"
    assert write(str(path), {"k": "v"}) is True
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert write(str(path), {"k": "v"}) is False
    assert path.stat().st_mtime_ns == 1_000_000_000


def test_write_rewrites_a_file_that_differs(tmp_path):
    path = tmp_path / "Corefile"
    path.write_text("old")
    assert write(str(path), "new") is True
    assert path.read_text() == "new"
    assert write(str(path), "new") is False


def test_write_takes_a_path_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert write("kube-proxy.json", {"a": 1}) is True
    assert json.loads((tmp_path / "kube-proxy.json").read_text()) == {"a": 1}
