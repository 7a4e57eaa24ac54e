"""The node's certificates and kubeconfigs: a cluster CA, what it signs
(the API server's and the kubelet's serving certificates, a client
certificate per component), the service account key pair, and a
kubeconfig per component."""

import json
import os
import subprocess

from ..commands import run
from .node_config import API_SERVER, API_SERVICE_IP, CLUSTER_DOMAIN, NODE_IP, NODE_NAME

# The components with a kubeconfig of their own (admin's is the
# cluster's KUBECONFIG).
KUBECONFIG_USERS = ("admin", "controller-manager", "scheduler", "kubelet", "kube-proxy", "coredns")


def certificates():
    """{name: (subject, DNS names, IP addresses, "server" or "client")} of
    every certificate the CA signs, each component its own user, as kubeadm
    makes them."""
    api_names = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
        "localhost",
    ]
    return {
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


def extensions(dns, ips, usage):
    """The X.509 extensions file of a certificate for `usage`, with the
    names `dns` and addresses `ips` as its subject's alternatives."""
    lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    lines.append("extendedKeyUsage=" + ("serverAuth" if usage == "server" else "clientAuth"))
    alt = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
    if alt:
        lines.append("subjectAltName=" + ",".join(alt))
    return "\n".join(lines) + "\n"


def kubeconfig(user, pki):
    """The kubeconfig of `user`, its certificate and key in `pki`."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "qproxy",
                "cluster": {
                    "server": API_SERVER,
                    "certificate-authority": os.path.join(pki, "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": os.path.join(pki, user + ".crt"),
                    "client-key": os.path.join(pki, user + ".key"),
                },
            }
        ],
        "contexts": [{"name": "qproxy", "context": {"cluster": "qproxy", "user": user}}],
        "current-context": "qproxy",
    }


class Pki:
    """The certificates in `folder`, the components' kubeconfigs in `etc`,
    admin's moved to `admin_kubeconfig`."""

    def __init__(self, folder, etc, admin_kubeconfig):
        self.folder, self.etc, self.admin_kubeconfig = folder, etc, admin_kubeconfig

    def path(self, name):
        return os.path.join(self.folder, name)

    def make(self, log):
        """Makes what is missing of the CA, the key pair and the
        certificates (openssl, its output in `log`), and writes every
        kubeconfig."""
        os.makedirs(self.folder, exist_ok=True)
        p = self.path
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
        for name, (subject, dns, ips, usage) in certificates().items():
            if os.path.exists(p(name + ".crt")):
                continue
            ext = p(name + ".ext")
            with open(ext, "w") as f:
                f.write(extensions(dns, ips, usage))
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
        for name in KUBECONFIG_USERS:
            self.write_kubeconfig(name)
        os.replace(self.kubeconfig_of("admin"), self.admin_kubeconfig)

    def write_kubeconfig(self, user):
        os.makedirs(self.etc, exist_ok=True)
        # JSON is YAML: every Kubernetes client reads it.
        with open(self.kubeconfig_of(user), "w") as f:
            json.dump(kubeconfig(user, self.folder), f, indent=2)

    def kubeconfig_of(self, user):
        return os.path.join(self.etc, user + ".kubeconfig")

    def remove(self):
        """Removes the certificates, the kubeconfigs and the admin's."""
        for path in (self.folder, self.etc, self.admin_kubeconfig):
            subprocess.run(["rm", "-rf", path], check=False)
