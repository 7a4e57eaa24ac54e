"""A single-node Kubernetes with Knative Serving on this machine, built from
the package registries, where qproxy is the queue-proxy of real pods.

  scripts/cluster up [--serving v0.50.0|v0.42.2]
      Builds what is missing (into /var/cache/qproxy-cluster, reused by
      later runs and other clones), starts
      etcd, the control plane, containerd, the kubelet, kube-proxy and
      CoreDNS in the network namespace qproxy-cluster (no route out of it),
      installs Knative Serving (current v0.50.0 by default, or classic
      v0.42.2), Traefik and Prometheus (scraping every revision's
      queue-proxy), with qproxy as queue-sidecar-image, and returns
      when Knative is ready. Its last line is KUBECONFIG=<path>. Run again,
      it keeps a cluster that is up and applies what changed; it first
      removes what a killed earlier run left.
  scripts/cluster build [--serving v0.50.0|v0.42.2]
      Builds what up needs but qproxy's image, and starts nothing (so that
      the build can run beside other work).
  scripts/cluster use qproxy|go
      Switches queue-sidecar-image between qproxy's image (built again if
      qproxy changed) and Knative's own queue-proxy of the same release, and
      waits until every revision's Deployment asks for it.
  scripts/cluster run -- CMD...
      Runs CMD in the cluster's network namespace, with KUBECONFIG set and
      the cache's bin (kubectl) first on the PATH.
  scripts/cluster status
      Says whether a cluster is up, with its Knative release and
      queue-proxy (exit status 0), or not (exit status 3).
  scripts/cluster down
      Removes everything up made but the builds: pods, containerd's shims
      and mounts, the pods' cgroups, the namespace, the processes.

Needs root, Go and Python 3 on Debian with v1 cgroups (hybrid or v1 alone);
installs runc, the CNI plugins, iptables, conntrack, openssl, gcc and
libc6-dev from Debian's packages when missing.
docs/cluster.md says what each piece is.
"""

import argparse
import json
import os
import sys
import tarfile
import time

from .. import ROOT, arguments, oci_image
from ..commands import PhaseError
from ..commands import run as run_command
from ..progress import Progress
from . import build, knative
from .host import setns, setns_fd
from .node import Node
from .node_config import NETNS_PATH, RUN, STATE

say = Progress("cluster")
BUILD = os.path.join(ROOT, "target", "cluster")
SERVING_FILE = os.path.join(RUN, "serving")
# What `run` tells the commands it runs about the cluster, as
# QPROXY_CLUSTER_* variables; written by `up` and `use`.
ENV_FILE = os.path.join(RUN, "env")


def save_env(**values):
    env = load_env()
    env.update({f"QPROXY_CLUSTER_{k.upper()}": v for k, v in values.items()})
    with open(ENV_FILE, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in sorted(env.items())))


def load_env():
    try:
        with open(ENV_FILE) as f:
            return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except OSError:
        return {}


def running(node):
    """Whether a cluster from an earlier `up` is running: every process of
    the node alive and the API server answering."""
    names = (
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "containerd",
        "kubelet",
        "kube-proxy",
        "coredns",
    )
    if not all(node.alive(n) for n in names) or not os.path.exists(node.kubeconfig):
        return False
    outside = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        setns(NETNS_PATH)
        return node.api("/readyz", timeout=5)[0] == 200
    except Exception:
        return False
    finally:
        setns_fd(outside)
        os.close(outside)


def installed_serving():
    try:
        with open(SERVING_FILE) as f:
            return f.read().strip()
    except OSError:
        return None


def import_images(node, images):
    """Imports image archives into containerd's Kubernetes namespace, each
    under the name given."""
    ctr = node.ctr()
    log = node.log("images")
    have = set(run_command(ctr + ["images", "ls", "-q"], capture=True).split())
    for archive, ref in images:
        stamp = archive + ".imported"
        if ref in have and os.path.exists(stamp) and os.path.getmtime(stamp) >= os.path.getmtime(archive):
            continue
        run_command(ctr + ["images", "import", archive], log=log)
        source, expected = archive_image(archive)
        if source != ref:
            run_command(ctr + ["images", "tag", "--force", source, ref], log=log)
        if expected:
            held = held_platforms(run_command(ctr + ["images", "ls", f"name=={ref}"], capture=True), ref)
            if held is None or sorted(held) != sorted(expected):
                raise PhaseError(f"containerd holds {ref} for {held}, not as the index of {expected}", log)
        with open(stamp, "w"):
            pass


def archive_image(archive):
    """The name an image archive gives its image, and the platforms its
    index lists (linux/arm64/v8), or [] for an archive of one image."""
    with tarfile.open(archive) as tar:
        top = json.load(tar.extractfile("index.json"))["manifests"][0]
        name = top["annotations"]["io.containerd.image.name"]
        if top["mediaType"] != oci_image.INDEX_TYPE:
            return name, []
        nested = json.load(tar.extractfile("blobs/sha256/" + top["digest"].split(":", 1)[1]))
    return name, [
        "/".join(filter(None, (m["platform"]["os"], m["platform"]["architecture"], m["platform"].get("variant"))))
        for m in nested["manifests"]
    ]


def held_platforms(listing, ref):
    """The platforms `ctr images ls` lists for `ref` when containerd holds
    it as an image index (one node then picks its own from it), or None."""
    for line in listing.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 5 and fields[0] == ref:
            if fields[1] != oci_image.INDEX_TYPE:
                return None
            # REF TYPE DIGEST SIZE (two fields) PLATFORMS LABELS
            return next((f.split(",") for f in fields[4:] if f.startswith("linux/")), [])
    return None


def up(args):
    node = Node(BUILD)
    os.makedirs(node.logs, exist_ok=True)
    started = time.monotonic()
    serving = args.serving
    node.check_machine()
    build.install_packages(node.log("packages"))

    keep = running(node) and installed_serving() == serving
    if not keep:
        if os.path.exists(RUN) or os.path.exists(STATE) or os.path.exists(NETNS_PATH):
            say("removing what an earlier run left")
        node.teardown()
        for name in os.listdir(node.logs):
            os.remove(os.path.join(node.logs, name))

    builder = build.Builder(node)
    builder.build_all(serving)
    images = builder.cluster_images(serving)
    qproxy_archive, qproxy_ref = builder.qproxy_image()
    kn = knative.Knative(node, builder, serving)
    kn.prepare()

    if not keep:
        say("making the node: network namespace, folders, cgroups, certificates")
        node.make_netns()
        node.make_folders()
        node.make_cgroups()
        node.make_pki()
    setns(NETNS_PATH)
    node.start_control_plane()
    say("importing images into containerd")
    import_images(node, images + [(qproxy_archive, qproxy_ref)])
    node.start_kubelet()

    kn.install_ingress()
    kn.install_prometheus()
    # A cluster kept from an earlier `up` keeps Knative's own queue-proxy if
    # it was switched to it; otherwise qproxy, as built now.
    current = kn.current_image() if keep else None
    kn.install(kn.go_image() if current == kn.go_image() else qproxy_ref)
    with open(SERVING_FILE, "w") as f:
        f.write(serving)
    save_env(
        serving=serving,
        qproxy_image=qproxy_ref,
        go_image=kn.go_image(),
        queue_image=kn.current_image() or "",
        serving_core=os.path.join(kn.out, "serving-core.yaml"),
        kubectl=node.kube("kubectl"),
        ingress=f"{knative.INGRESS_IP}:80",
        ingress_local=f"{knative.INGRESS_LOCAL_IP}:80",
        prometheus=f"{knative.PROMETHEUS_IP}:9090",
    )
    kn.wait_ready()
    say(f"ready in {time.monotonic() - started:.0f} s: Knative Serving {serving}, queue-proxy {kn.current_image()}")
    print(f"KUBECONFIG={node.kubeconfig}")


def build_only(args):
    node = Node(BUILD)
    os.makedirs(node.logs, exist_ok=True)
    build.install_packages(node.log("packages"))
    builder = build.Builder(node)
    builder.build_all(args.serving)
    builder.cluster_images(args.serving)
    say(
        f"built: Kubernetes {build.KUBERNETES}, containerd {build.CONTAINERD}, Traefik {build.TRAEFIK}, "
        f"Prometheus {build.PROMETHEUS}, Knative Serving {args.serving}"
    )


def use(args):
    node = Node(BUILD)
    serving = installed_serving()
    if not running(node) or serving is None:
        raise PhaseError("no cluster is up: run scripts/cluster up first")
    builder = build.Builder(node)
    kn = knative.Knative(node, builder, serving)
    if args.image == "qproxy":
        archive, ref = builder.qproxy_image()
        setns(NETNS_PATH)
        import_images(node, [(archive, ref)])
    else:
        ref = kn.go_image()
        setns(NETNS_PATH)
    say(f"queue-sidecar-image: {ref}")
    kn.use(ref)
    if args.image == "qproxy":
        save_env(qproxy_image=ref)
    save_env(queue_image=ref)
    print(ref)


def run(args):
    node = Node(BUILD)
    if not os.path.exists(NETNS_PATH):
        raise PhaseError("no cluster is up: run scripts/cluster up first")
    command = args.command
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise PhaseError("run: no command given (scripts/cluster run -- CMD...)")
    setns(NETNS_PATH)
    env = dict(os.environ)
    env.update(load_env())
    env["KUBECONFIG"] = node.kubeconfig
    env["PATH"] = node.bin + os.pathsep + env.get("PATH", "")
    os.execvpe(command[0], command, env)


def status(args):
    node = Node(BUILD)
    if not running(node):
        print("down")
        return 3
    env = load_env()
    print(
        f"up: Knative Serving {installed_serving()}, queue-proxy {env.get('QPROXY_CLUSTER_QUEUE_IMAGE', '?')}, "
        f"KUBECONFIG={node.kubeconfig}"
    )
    return 0


def down(args):
    node = Node(BUILD)
    say("stopping the cluster and removing what it made")
    node.teardown()
    say("down")


def main():
    parser = arguments.parser("scripts/cluster", __doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb, func, what in (
        ("up", up, "build what is missing, start the cluster, install Knative"),
        ("build", build_only, "build what up needs (but qproxy's image), start nothing"),
    ):
        p = verbs.add_parser(verb, help=what)
        p.add_argument(
            "--serving",
            choices=build.SERVINGS,
            default=build.SERVINGS[0],
            help="the Knative Serving release (default: %(default)s)",
        )
        p.set_defaults(func=func)
    p = verbs.add_parser("use", help="switch queue-sidecar-image")
    p.add_argument("image", choices=("qproxy", "go"))
    p.set_defaults(func=use)
    p = verbs.add_parser("run", help="run a command in the cluster's network namespace")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)
    p = verbs.add_parser("status", help="say whether a cluster is up")
    p.set_defaults(func=status)
    p = verbs.add_parser("down", help="remove the cluster")
    p.set_defaults(func=down)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("scripts/cluster: needs root (network namespaces, mounts, cgroups)", file=sys.stderr)
        return 1
    try:
        return args.func(args) or 0
    except PhaseError as error:
        where = f"; its log: {error.log}" if error.log else ""
        print(f"scripts/cluster {args.verb}: {error}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
