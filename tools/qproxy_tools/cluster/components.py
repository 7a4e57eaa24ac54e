"""The Kubernetes the node runs: each of its processes' command line, and
their start in order (etcd, the control plane, containerd; then the
kubelet, kube-proxy and CoreDNS), each once the one it needs answers."""

import os
import subprocess

from .. import ROOT
from ..progress import Progress
from .api import http_ok, insecure_ok
from .node_config import (
    CLUSTER_DOMAIN,
    NODE_IP,
    NODE_NAME,
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


def etcd_args(kube):
    """etcd's command line: one member on loopback, its data in STATE."""
    return [
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
    ]


def apiserver_args(kube, pki):
    """The API server's: on the node's address, its certificates in `pki`."""
    return [
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
    ]


def controller_manager_args(kube, pki, kubeconfig):
    """The controller manager's, with the kubeconfig `kubeconfig`, signing
    with the CA in `pki`."""
    return [
        kube,
        "kube-controller-manager",
        "--kubeconfig",
        kubeconfig,
        "--authentication-kubeconfig",
        kubeconfig,
        "--authorization-kubeconfig",
        kubeconfig,
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
    ]


def scheduler_args(kube, kubeconfig):
    """The scheduler's, with the kubeconfig `kubeconfig`."""
    return [
        kube,
        "kube-scheduler",
        "--kubeconfig",
        kubeconfig,
        "--authentication-kubeconfig",
        kubeconfig,
        "--authorization-kubeconfig",
        kubeconfig,
        "--bind-address",
        "127.0.0.1",
        "--leader-elect=false",
        "--profiling=false",
    ]


def kubelet_args(kube, etc, kubeconfig):
    """The kubelet's: its configuration in `etc`, the kubeconfig `kubeconfig`."""
    return [
        kube,
        "kubelet",
        "--config",
        f"{etc}/kubelet.json",
        "--kubeconfig",
        kubeconfig,
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
    ]


def start_control_plane(node):
    """Starts etcd, the control plane and containerd, each once the one it
    needs answers; the caller is in the node's network namespace. Those
    already running are kept, unless their configuration changed."""
    kube = node.kube("kube")
    etc = node.etc
    started = node.started

    say("starting etcd")
    started("etcd", etcd_args(kube), lambda: http_ok("http://127.0.0.1:2379/health"), "etcd healthy")

    say("starting the control plane (API server, controller manager, scheduler)")
    started(
        "kube-apiserver",
        apiserver_args(kube, node.pki),
        lambda: node.api("/readyz")[0] == 200,
        "the API server ready",
    )
    started(
        "kube-controller-manager",
        controller_manager_args(kube, node.pki, node.kubeconfig_of("controller-manager")),
        lambda: insecure_ok("https://127.0.0.1:10257/healthz"),
        "the controller manager healthy",
    )
    started(
        "kube-scheduler",
        scheduler_args(kube, node.kubeconfig_of("scheduler")),
        lambda: insecure_ok("https://127.0.0.1:10259/healthz"),
        "the scheduler healthy",
    )

    say("starting containerd")
    changed = write(f"{etc}/containerd.toml", containerd_config(etc))
    changed |= write(f"{etc}/cni/10-qproxy-cluster.conflist", cni_config())
    started(
        "containerd",
        [node.kube("containerd"), "--config", f"{etc}/containerd.toml", "--log-level", "warn"],
        lambda: subprocess.run(node.ctr() + ["version"], capture_output=True).returncode == 0,
        "containerd answering",
        timeout=60,
        changed=changed,
    )


def start_kubelet(node):
    """The kubelet, kube-proxy and CoreDNS; returns when the node is Ready
    and cluster names resolve."""
    kube = node.kube("kube")
    etc = node.etc
    started = node.started

    say("starting the kubelet, kube-proxy and CoreDNS")
    changed = write(f"{etc}/kubelet.json", kubelet_config(node.pki))
    started(
        "kubelet",
        kubelet_args(kube, etc, node.kubeconfig_of("kubelet")),
        node.ready,
        "the node Ready",
        timeout=180,
        changed=changed,
    )
    changed = write(f"{etc}/kube-proxy.json", kube_proxy_config(node.kubeconfig_of("kube-proxy")))
    started(
        "kube-proxy",
        [kube, "kube-proxy", "--config", f"{etc}/kube-proxy.json"],
        lambda: http_ok("http://127.0.0.1:10256/healthz"),
        "kube-proxy healthy",
        changed=changed,
    )
    changed = write(f"{etc}/Corefile", corefile(node.kubeconfig_of("coredns")))
    node.kubectl(node.log("coredns"))("apply", "-f", os.path.join(ROOT, "cluster", "manifests", "coredns-rbac.yaml"))
    started(
        "coredns",
        [kube, "coredns", "-conf", f"{etc}/Corefile"],
        lambda: http_ok("http://127.0.0.1:8181/ready"),
        "CoreDNS ready",
        changed=changed,
    )
