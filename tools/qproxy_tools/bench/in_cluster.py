"""The study's experiment in the cluster: a helloworld revision pinned to one
pod, 70 connections, the app reached directly, through Knative's Go
queue-proxy and through qproxy, each with and without the activator in the
path; then cold starts, from a request to a revision at zero to its first
byte, with each queue-proxy.

    benches/cluster.py [--rounds 3] [--seconds 20] [--connections 70] [--cold 20]
                       [--serving v0.50.0|v0.42.2] [--out DIR]
    benches/cluster.py --redraw [--out DIR]

Needs root and the cluster of scripts/cluster (brought up if it is not,
left as it was found). The paths measured, with the pod's queue-proxy set
to one image and then the other, alternating which goes first each round:

  app        wrk -> the pod's app port (8080)
  qp         wrk -> the pod's queue-proxy (8012) -> the app
  activator  wrk -> the activator (its Service, with the revision's
             headers, as an ingress sends them) -> the queue-proxy -> the app

CPU per request is read from the containers' cgroups (cpuacct), for the
app, the queue-proxy and the activator. Cold start: Services created at
zero (`initial-scale: 0`), each asked once through Traefik, --cold of
them with each queue-proxy, in alternating batches.

Writes results.json, a table (results.md) and two pictures
(throughput.svg, coldstart.svg) into --out (benches/cluster/ by default);
the pictures are drawn by matplotlib, installed from PyPI into
target/bench-venv when missing.
"""

import json
import os
import shutil
import subprocess
import sys

from .. import ROOT, arguments, plotting
from ..cluster import build, knative
from ..commands import PhaseError, wait_until
from ..kubectl import CLUSTER
from ..progress import Progress
from .cluster_objects import NAMESPACE, activator, kubectl, pods_of, queue_images, ready, service, the_pod
from .cluster_report import IMAGES, summary
from .cluster_run import first_byte, use, wrk
from .cpuacct import cgroup_of, cpu_ns
from .plots import cluster_pictures

say = Progress("bench")


def measure(url, args, cgroups, headers=()):
    """wrk against `url`, with the CPU each of `cgroups` used per request
    meanwhile (`cpu_us_<name>`)."""
    before = {k: cpu_ns(v) for k, v in cgroups.items()}
    result = wrk(url, args.connections, args.seconds, headers)
    for k, v in cgroups.items():
        result[f"cpu_us_{k}"] = (cpu_ns(v) - before[k]) / 1000 / max(result["requests"], 1)
    return result


def targets(pod, act_ip, host, revision):
    """(path, URL, headers) of each path measured: the pod's app port, its
    queue-proxy, and the activator with the revision's headers, as an
    ingress sends them."""
    return [
        ("app", f"http://{pod['ip']}:8080/", ()),
        ("qp", f"http://{pod['ip']}:8012/", ()),
        (
            "activator",
            f"http://{act_ip}:80/",
            (
                f"Host: {host}",
                f"Knative-Serving-Namespace: {NAMESPACE}",
                f"Knative-Serving-Revision: {revision}",
            ),
        ),
    ]


def throughput(args, rounds):
    """--rounds of every path with each queue-proxy, the one first that
    went second the round before, into `rounds`."""
    kubectl.apply(
        service("hello", {"autoscaling.knative.dev/min-scale": "1", "autoscaling.knative.dev/max-scale": "1"})
    )
    status = wait_until("the Service hello Ready", lambda: ready("hello"), 300)
    revision = status["latestReadyRevisionName"]
    host = f"hello.{NAMESPACE}.svc.cluster.local"
    for r in range(args.rounds):
        order = IMAGES if r % 2 == 0 else IMAGES[::-1]
        for image in order:
            queue_image = use(image)
            pod = the_pod(revision, queue_image)
            act_ip, act_container = activator()
            cgroups = {
                "app": cgroup_of(pod["containers"]["user-container"]),
                "qp": cgroup_of(pod["containers"]["queue-proxy"]),
                "activator": cgroup_of(act_container),
            }
            for path, url, headers in targets(pod, act_ip, host, revision):
                result = measure(url, args, cgroups, headers)
                result.update(round=r + 1, image=image, path=path)
                rounds.append(result)
                say(
                    f"round {r + 1}, {image}, {path}: {result['rps']:,.0f} req/s, p90 {result['p90'] * 1e3:.2f} ms, "
                    f"app {result['cpu_us_app']:.0f} µs, queue-proxy {result['cpu_us_qp']:.0f} µs, "
                    f"activator {result['cpu_us_activator']:.0f} µs per request, {result['errors']} errors"
                )
    kubectl("-n", NAMESPACE, "delete", "ksvc", "hello", "--wait=false")


def cold_starts(args, tries):
    """--cold first requests per queue-proxy to Services created at zero,
    in batches of half, alternating."""
    before = kubectl.json("-n", "knative-serving", "get", "configmap", "config-autoscaler")
    kubectl.merge_configmap("knative-serving", "config-autoscaler", {"allow-zero-initial-scale": "true"})
    try:
        batch = max(1, args.cold // 2)
        n = 0
        while any(sum(t["image"] == image for t in tries) < args.cold for image in IMAGES):
            for image in IMAGES:
                count = min(batch, args.cold - sum(t["image"] == image for t in tries))
                if count <= 0:
                    continue
                queue_image = use(image)
                names = []
                for _ in range(count):
                    n += 1
                    names.append(f"cold-{n}")
                    manifest = service(
                        names[-1],
                        {"autoscaling.knative.dev/initial-scale": "0", "autoscaling.knative.dev/max-scale": "1"},
                    )
                    # The webhook reads allow-zero-initial-scale from its own
                    # copy of the ConfigMap: until it has the change, it
                    # refuses the annotation.
                    wait_until(
                        f"the Service {names[-1]} accepted at zero",
                        lambda manifest=manifest: kubectl.apply(manifest, check=False),
                        120,
                    )
                for name in names:
                    wait_until(f"the Service {name} Ready at zero", lambda name=name: ready(name), 300)
                for name in names:
                    if pods_of(name):
                        raise PhaseError(f"{name} has a pod before its first request: not a cold start")
                    code, seconds = first_byte(f"{name}.{NAMESPACE}.{knative.DOMAIN}")
                    ran = queue_images(pods_of(name))
                    if ran != {queue_image}:
                        raise PhaseError(f"{name}'s pod runs {ran or 'nothing'}, not {queue_image}")
                    tries.append({"image": image, "service": name, "code": code, "seconds": seconds})
                    say(f"cold start, {image}, {name}: {code} after {seconds or 0:.2f} s")
                    kubectl("-n", NAMESPACE, "delete", "ksvc", name, "--wait=false")
    finally:
        value = before.get("data", {}).get("allow-zero-initial-scale")
        kubectl.merge_configmap("knative-serving", "config-autoscaler", {"allow-zero-initial-scale": value})


def main():
    try:
        return measure_and_write()
    except PhaseError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 1


def measure_and_write():
    ap = arguments.parser("benches/cluster.py", __doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--connections", type=int, default=70)
    ap.add_argument("--cold", type=int, default=20, help="cold starts per queue-proxy")
    ap.add_argument("--serving", choices=build.SERVINGS, default=build.SERVINGS[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "benches", "cluster"))
    ap.add_argument(
        "--redraw", action="store_true", help="measure nothing: the table and pictures again from --out's results.json"
    )
    args = ap.parse_args()
    if args.redraw:
        plotting.with_matplotlib(sys.argv[0], say)
        with open(os.path.join(args.out, "results.json")) as f:
            saved = json.load(f)
        return write(args.out, saved["rounds"], saved["cold"])
    if os.geteuid() != 0:
        raise SystemExit("bench: needs root (scripts/cluster)")
    if not shutil.which("wrk"):
        raise SystemExit("bench: wrk is missing (Debian's package wrk; scripts/test tools installs it)")
    plotting.with_matplotlib(sys.argv[0], say)
    was_up = subprocess.run([CLUSTER, "status"], stdout=subprocess.DEVNULL).returncode == 0
    if subprocess.run([CLUSTER, "up", "--serving", args.serving], stdout=subprocess.DEVNULL).returncode != 0:
        raise SystemExit(1)
    rounds, tries = [], []
    try:
        # A namespace of its own, fresh: nothing an earlier run left counts.
        kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=300s")
        kubectl("create", "namespace", NAMESPACE)
        throughput(args, rounds)
        cold_starts(args, tries)
    finally:
        if not was_up:
            subprocess.run([CLUSTER, "down"])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(
            {
                "serving": args.serving,
                "connections": args.connections,
                "seconds": args.seconds,
                "rounds": rounds,
                "cold": tries,
            },
            f,
            indent=1,
        )
    write(args.out, rounds, tries)


def write(out, rounds, tries):
    table = summary(rounds, tries)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(table)
    cluster_pictures(out, rounds, tries)
    print(table)
