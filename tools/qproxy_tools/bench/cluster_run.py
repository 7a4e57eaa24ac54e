"""Commands the cluster benchmark runs through scripts/cluster: its verbs,
and wrk and curl in the cluster's network namespace (`run --`), with what
they print read."""

import subprocess

from ..cluster import knative
from ..commands import PhaseError
from ..kubectl import CLUSTER
from .loads import parse_wrk, wrk_argv


def cluster(*args, check=True):
    """scripts/cluster VERB ARGS, what it printed."""
    done = subprocess.run([CLUSTER, *args], text=True, capture_output=True)
    if check and done.returncode != 0:
        raise PhaseError(f"scripts/cluster {' '.join(args[:4])}: {done.stderr.strip()}")
    return done.stdout


def use(image):
    """`scripts/cluster use IMAGE` (qproxy or go): the queue-proxy image
    the revisions then run, its last line."""
    return cluster("use", image).strip().splitlines()[-1]


def wrk(url, connections, seconds, headers=()):
    """wrk from inside the cluster, two threads: what its report says."""
    return parse_wrk(cluster("run", "--", *wrk_argv("wrk", url, connections, seconds, threads=2, headers=headers)))


def first_byte(host):
    """One request to `host` through the ingress: (status, seconds to the
    first byte), (0, None) if curl said nothing readable."""
    out = cluster(
        "run",
        "--",
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{time_starttransfer}",
        "--max-time",
        "120",
        "-H",
        f"Host: {host}",
        f"http://{knative.INGRESS_IP}/",
        check=False,
    )
    return parse_first_byte(out)


def parse_first_byte(out):
    """curl's `%{http_code} %{time_starttransfer}`: (status, seconds), or
    (0, None) for anything else."""
    out = out.split()
    if len(out) != 2:
        return 0, None
    return int(out[0]), float(out[1])
