"""kubectl, one way for every script: started either as the cluster's own
binary with its kubeconfig (scripts/cluster, inside the cluster's network
namespace) or through `scripts/cluster run --` (from outside it)."""

import json
import os
import subprocess

from . import ROOT
from .commands import PhaseError

CLUSTER = os.path.join(ROOT, "scripts", "cluster")


class Kubectl:
    """kubectl with a fixed way to start it (`argv`). A call returns what
    kubectl printed; a failure raises PhaseError with kubectl's last line,
    or, with `check=False`, returns None. With a `log`, every call and its
    output are appended to it."""

    def __init__(self, argv, log=None):
        self.argv = list(argv)
        self.log = log

    @classmethod
    def on_node(cls, binary, kubeconfig, log=None):
        """The node's kubectl, from inside the cluster's network namespace."""
        return cls([binary, "--kubeconfig", kubeconfig], log)

    @classmethod
    def through_cluster(cls, log=None):
        """kubectl through `scripts/cluster run`, from anywhere on the machine."""
        return cls([CLUSTER, "run", "--", "kubectl"], log)

    def __call__(self, *args, stdin=None, check=True):
        done = subprocess.run(self.argv + [str(a) for a in args], input=stdin, text=True, capture_output=True)
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"$ kubectl {' '.join(map(str, args))}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            if not check:
                return None
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise PhaseError(f"kubectl {' '.join(map(str, args[:4]))}: {last}", self.log)
        return done.stdout

    def ok(self, *args, stdin=None):
        """Whether the command succeeds (for waits)."""
        return self(*args, stdin=stdin, check=False) is not None

    def json(self, *args, check=True):
        """`kubectl ARGS -o json`, decoded (None when it fails and not `check`)."""
        out = self(*args, "-o", "json", check=check)
        return None if out is None else json.loads(out)

    def apply(self, manifest, check=True):
        """Applies a manifest given as text (JSON or YAML)."""
        return self("apply", "-f", "-", stdin=manifest, check=check)

    def merge_configmap(self, namespace, name, data, check=True):
        """Merges `data` into a ConfigMap's data (a None value removes the key)."""
        return self(
            "-n",
            namespace,
            "patch",
            "configmap",
            name,
            "--type",
            "merge",
            "-p",
            json.dumps({"data": data}),
            check=check,
        )
