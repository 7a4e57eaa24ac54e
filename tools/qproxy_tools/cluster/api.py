"""The node's API server as a client sees it (a component's certificate),
and the health endpoints of the node's processes."""

import json
import os
import ssl
import urllib.error
import urllib.request

from .node_config import API_SERVER, NODE_NAME


class ApiClient:
    """GETs from the API server, as one of the users whose certificates
    are in `pki`."""

    def __init__(self, pki):
        self.pki = pki

    def get(self, path, user="admin", timeout=5):
        """GETs `path` from the API server as `user`; returns (status, body)."""
        context = ssl.create_default_context(cafile=os.path.join(self.pki, "ca.crt"))
        context.load_cert_chain(os.path.join(self.pki, user + ".crt"), os.path.join(self.pki, user + ".key"))
        try:
            with urllib.request.urlopen(API_SERVER + path, context=context, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def node_ready(self):
        """Whether the API server has the node Ready."""
        status, body = self.get(f"/api/v1/nodes/{NODE_NAME}")
        return status == 200 and node_ready(body)


def node_ready(body):
    """Whether a Node object (its JSON) has the condition Ready true."""
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
