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
import statistics
import subprocess
import sys

from .. import ROOT, arguments, plotting, services
from ..cluster import build, knative
from ..cluster.host import CGROUP_FS
from ..cluster.node_config import CGROUP
from ..commands import PhaseError, wait_until
from ..kubectl import CLUSTER, Kubectl
from ..progress import Progress
from .loads import parse_wrk

NAMESPACE = "qproxy-bench"
CPUACCT = os.path.join(CGROUP_FS, "cpuacct", CGROUP, "kubepods")
IMAGES = ("go", "qproxy")

say = Progress("bench")
kubectl = Kubectl.through_cluster()


def cluster(*args, check=True):
    """scripts/cluster VERB ARGS, what it printed."""
    done = subprocess.run([CLUSTER, *args], text=True, capture_output=True)
    if check and done.returncode != 0:
        raise PhaseError(f"scripts/cluster {' '.join(args[:4])}: {done.stderr.strip()}")
    return done.stdout


def service(name, annotations, image="helloworld"):
    return services.service(name, NAMESPACE, {"containers": [services.image(image)]}, annotations)


def ready(name):
    svc = kubectl.json("-n", NAMESPACE, "get", "ksvc", name, check=False)
    if not svc:
        return None
    status = svc.get("status", {})
    if status.get("observedGeneration") != svc["metadata"].get("generation"):
        return None
    if any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])):
        return status
    return None


def the_pod(revision, queue_image):
    """The revision's one running pod, once it runs `queue_image` and is
    Ready (and no other pod is left): its IP and its containers' IDs."""

    def found():
        pods = kubectl.json("-n", NAMESPACE, "get", "pods", "-l", f"serving.knative.dev/revision={revision}")["items"]
        if len(pods) != 1 or pods[0]["metadata"].get("deletionTimestamp"):
            return None
        pod = pods[0]
        images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
        if images.get("queue-proxy") != queue_image:
            return None
        statuses = pod["status"].get("containerStatuses", [])
        if len(statuses) != 2 or not all(s.get("ready") for s in statuses):
            return None
        return {
            "ip": pod["status"]["podIP"],
            "containers": {s["name"]: s["containerID"].split("://", 1)[1] for s in statuses},
        }

    return wait_until(f"the pod of {revision} with {queue_image}", found, 300)


def activator():
    pods = [
        p
        for p in kubectl.json("-n", "knative-serving", "get", "pods", "-l", "app=activator")["items"]
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    if len(pods) != 1:
        raise PhaseError(f"{len(pods)} running activators, expected one")
    statuses = pods[0]["status"]["containerStatuses"]
    ip = kubectl.json("-n", "knative-serving", "get", "service", "activator-service")
    return ip["spec"]["clusterIP"], statuses[0]["containerID"].split("://", 1)[1]


def cgroup_of(container):
    for folder, dirs, _ in os.walk(CPUACCT):
        if container in dirs:
            return os.path.join(folder, container)
    raise PhaseError(f"no cgroup for container {container} under {CPUACCT}")


def cpu_ns(cgroup):
    with open(os.path.join(cgroup, "cpuacct.usage")) as f:
        return int(f.read())


def wrk(url, connections, seconds, headers=()):
    flags = [a for h in headers for a in ("-H", h)]
    return parse_wrk(cluster("run", "--", "wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", *flags, url))


def measure(url, args, cgroups, headers=()):
    before = {k: cpu_ns(v) for k, v in cgroups.items()}
    result = wrk(url, args.connections, args.seconds, headers)
    for k, v in cgroups.items():
        result[f"cpu_us_{k}"] = (cpu_ns(v) - before[k]) / 1000 / max(result["requests"], 1)
    return result


def throughput(args, rounds):
    kubectl.apply(
        service("hello", {"autoscaling.knative.dev/min-scale": "1", "autoscaling.knative.dev/max-scale": "1"})
    )
    status = wait_until("the Service hello Ready", lambda: ready("hello"), 300)
    revision = status["latestReadyRevisionName"]
    host = f"hello.{NAMESPACE}.svc.cluster.local"
    for r in range(args.rounds):
        order = IMAGES if r % 2 == 0 else IMAGES[::-1]
        for image in order:
            queue_image = cluster("use", image).strip().splitlines()[-1]
            pod = the_pod(revision, queue_image)
            act_ip, act_container = activator()
            cgroups = {
                "app": cgroup_of(pod["containers"]["user-container"]),
                "qp": cgroup_of(pod["containers"]["queue-proxy"]),
                "activator": cgroup_of(act_container),
            }
            paths = [
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
            for path, url, headers in paths:
                result = measure(url, args, cgroups, headers)
                result.update(round=r + 1, image=image, path=path)
                rounds.append(result)
                say(
                    f"round {r + 1}, {image}, {path}: {result['rps']:,.0f} req/s, p90 {result['p90'] * 1e3:.2f} ms, "
                    f"app {result['cpu_us_app']:.0f} µs, queue-proxy {result['cpu_us_qp']:.0f} µs, "
                    f"activator {result['cpu_us_activator']:.0f} µs per request, {result['errors']} errors"
                )
    kubectl("-n", NAMESPACE, "delete", "ksvc", "hello", "--wait=false")


def first_byte(host):
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
    ).split()
    if len(out) != 2:
        return 0, None
    return int(out[0]), float(out[1])


def pods_of(name):
    return kubectl.json("-n", NAMESPACE, "get", "pods", "-l", f"serving.knative.dev/service={name}")["items"]


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
                queue_image = cluster("use", image).strip().splitlines()[-1]
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
                    ran = {
                        c["image"] for p in pods_of(name) for c in p["spec"]["containers"] if c["name"] == "queue-proxy"
                    }
                    if ran != {queue_image}:
                        raise PhaseError(f"{name}'s pod runs {ran or 'nothing'}, not {queue_image}")
                    tries.append({"image": image, "service": name, "code": code, "seconds": seconds})
                    say(f"cold start, {image}, {name}: {code} after {seconds or 0:.2f} s")
                    kubectl("-n", NAMESPACE, "delete", "ksvc", name, "--wait=false")
    finally:
        value = before.get("data", {}).get("allow-zero-initial-scale")
        kubectl.merge_configmap("knative-serving", "config-autoscaler", {"allow-zero-initial-scale": value})


def median(values):
    return statistics.median(values) if values else None


def p90(values):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))] if values else None


def summary(rounds, tries):
    lines = [
        "| queue-proxy | path | req/s | p50 ms | p90 ms | p99 ms | app µs/req | queue-proxy µs/req | "
        "activator µs/req | queue-proxy ÷ app CPU | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for image in IMAGES:
        for path in ("app", "qp", "activator"):
            rs = [r for r in rounds if r["image"] == image and r["path"] == path]
            if not rs:
                continue
            m = {
                k: median([r[k] for r in rs])
                for k in ("rps", "p50", "p90", "p99", "cpu_us_app", "cpu_us_qp", "cpu_us_activator")
            }
            ratio = m["cpu_us_qp"] / m["cpu_us_app"] if m["cpu_us_app"] and path != "app" else None
            lines.append(
                f"| {image} | {path} | {m['rps']:,.0f} | {m['p50'] * 1e3:.2f} | {m['p90'] * 1e3:.2f} | "
                f"{m['p99'] * 1e3:.2f} | {m['cpu_us_app']:.0f} | "
                f"{m['cpu_us_qp']:.0f} | {m['cpu_us_activator']:.0f} | "
                f"{'' if ratio is None else f'{ratio:.2f}'} | {sum(r['errors'] for r in rs)} |"
            )
    lines += ["", "| queue-proxy | cold starts | median s | p90 s | not 200 |", "|---|---|---|---|---|"]
    for image in IMAGES:
        ts = [t for t in tries if t["image"] == image]
        if ts:
            secs = [t["seconds"] for t in ts if t["seconds"] is not None]
            lines.append(
                f"| {image} | {len(ts)} | {median(secs):.2f} | {p90(secs):.2f} | {sum(t['code'] != 200 for t in ts)} |"
            )
    return "\n".join(lines) + "\n"


def pictures(out, rounds, tries):
    plt = plotting.pyplot()

    colours = {"go": "#8c8c8c", "qproxy": "#d9622b"}
    paths = ("app", "qp", "activator")
    labels = {"app": "app port", "qp": "queue-proxy", "activator": "activator,\nqueue-proxy"}

    def med(image, path, key):
        return median([r[key] for r in rounds if r["image"] == image and r["path"] == path]) or 0

    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    panels = (
        ("requests per second", paths, lambda i, p: med(i, p, "rps")),
        ("p90 latency (ms)", paths, lambda i, p: med(i, p, "p90") * 1e3),
        (
            "queue-proxy CPU ÷ app CPU, per request",
            paths[1:],
            lambda i, p: med(i, p, "cpu_us_qp") / max(med(i, p, "cpu_us_app"), 1e-9),
        ),
    )
    for ax, (title, shown, value) in zip(axes, panels, strict=False):
        for i, image in enumerate(IMAGES):
            ax.bar(
                [x + (i - 0.5) * 0.38 for x in range(len(shown))],
                [value(image, p) for p in shown],
                0.38,
                label=image,
                color=colours[image],
            )
        ax.set_xticks(range(len(shown)), [labels[p] for p in shown], fontsize=8)
        ax.set_title(title, fontsize=10)
    axes[2].axhline(1, color="black", linewidth=0.8, linestyle="--")
    axes[0].legend()
    fig.suptitle("helloworld, one pod, 70 connections (median of the rounds)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.svg"), metadata={"Date": None})
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    data = [[t["seconds"] for t in tries if t["image"] == image and t["seconds"] is not None] for image in IMAGES]
    box = ax.boxplot(data, patch_artist=True, tick_labels=list(IMAGES), medianprops={"color": "black"})
    for i, (patch, image) in enumerate(zip(box["boxes"], IMAGES, strict=False)):
        patch.set_facecolor(colours[image])
        patch.set_alpha(0.5)
        # Every try, spread sideways so that equal times stay visible.
        ax.scatter(
            [i + 1 + 0.15 * ((k % 5) - 2) / 2 for k in range(len(data[i]))],
            data[i],
            s=12,
            color=colours[image],
            zorder=3,
        )
    ax.set_ylabel("first request to first byte (s)")
    ax.set_title("cold start from zero, through Traefik and the activator")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "coldstart.svg"), metadata={"Date": None})
    plt.close(fig)


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
    pictures(out, rounds, tries)
    print(table)
