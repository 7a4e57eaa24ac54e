"""What the cluster is made of, built from the package registries: the
Debian packages it runs with, its Go programs (each from a module under
cluster/ that pins it), and the images it runs, each packed without a
container engine (oci_image, as deploy/oci_image.py) and imported into containerd.

The programs and images go to the machine's cache (CACHE), not to a
clone's target/: like Go's own caches they serve every clone, and a clone
made afresh (CI's) builds none of them again. Each is remembered by a
stamp of what made it (its module's files and Go's version; the packer's
code and the binary): a later `up` builds again only what changed.
"""

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tarfile

from .. import ROOT, oci_image
from ..commands import PhaseError, run
from ..progress import Progress

say = Progress("cluster")

# The machine's cache of the cluster's programs and images.
CACHE = os.environ.get("QPROXY_CLUSTER_CACHE", "/var/cache/qproxy-cluster")

KUBERNETES = "v1.34.4"
CONTAINERD = "v2.2.9"
TRAEFIK = "v3.6.12"
# Prometheus 3.16.0 is its module's v0.316.0 (cluster/prometheus pins it).
PROMETHEUS = "v3.16.0"
# The Knative Serving releases the cluster can install: current (the
# default) and classic.
SERVINGS = ("v0.50.0", "v0.42.2")
PAUSE = "3.10"

# Debian packages: the command that shows each is there, and the package.
PACKAGES = {
    "runc": "runc",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "iptables": "iptables",
    "conntrack": "conntrack",
    "openssl": "openssl",
    "nsenter": "util-linux",
    "ip": "iproute2",
    "mount": "mount",
    "gcc": "gcc",
    "/usr/include/stdio.h": "libc6-dev",
    "strip": "binutils",
}
# The OCI name of this machine's architecture.
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def image_platforms(environ=os.environ):
    """The platforms of qproxy's image index: this machine's, then the
    other architectures scripts/test multiarch builds (QPROXY_MULTIARCH,
    arm64 and ppc64le by default; empty for this machine's alone). The
    node's containerd picks its own from the index, as a cluster with nodes
    of several architectures would."""
    others = environ.get("QPROXY_MULTIARCH", "arm64 ppc64le").split()
    return [ARCH] + [arch for arch in others if arch != ARCH]


def packages_missing():
    missing = []
    for what, package in PACKAGES.items():
        found = os.path.exists(what) if what.startswith("/") else shutil.which(what)
        if not found and package not in missing:
            missing.append(package)
    return missing


def install_packages(log):
    missing = packages_missing()
    if not missing:
        return
    say(f"installing {' '.join(missing)} (Debian packages)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if run(["apt-get", "install", "-y", "-q"] + missing, log=log, check=False, env=env) != 0:
        run(["apt-get", "update", "-q"], log=log, env=env)
        run(["apt-get", "install", "-y", "-q"] + missing, log=log, env=env)


class Builder:
    def __init__(self, node):
        self.node = node
        self.build = node.build
        self.bin = node.bin
        self.images = os.path.join(CACHE, "images")
        self._go_version = None
        self.log = node.log("build")

    # ---- Go programs -------------------------------------------------------------

    def module(self, name):
        return os.path.join(ROOT, "cluster", name)

    def stamp(self, module, extra=""):
        digest = hashlib.sha256(extra.encode())
        for name in sorted(os.listdir(module)):
            path = os.path.join(module, name)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    digest.update(name.encode() + b"\0" + f.read())
        return digest.hexdigest()

    def go_build(self, what, module, packages, out, ldflags="", tags=""):
        """Builds `packages` of the module folder `module` (under cluster/)
        into `out` (a file for one package, a folder for several), with the
        build tags `tags` (comma-separated), unless the stamp of that module
        says it is already there."""
        folder = self.module(module)
        stamp_file = out.rstrip("/") + ".stamp"
        stamp = self.stamp(folder, " ".join(packages) + ldflags + tags + self.go_version())
        if os.path.exists(out) and os.path.exists(stamp_file):
            with open(stamp_file) as f:
                if f.read() == stamp:
                    return False
        say(f"building {what} (Go module proxy; the first time takes minutes)")
        os.makedirs(os.path.dirname(out.rstrip("/")), exist_ok=True)
        # The module's go.sum decides every version: -mod=readonly, Go's
        # default, fails rather than changing it.
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
        args = ["go", "build", "-trimpath", "-ldflags", ("-s -w " + ldflags).strip(), "-o", out]
        if tags:
            args += ["-tags", tags]
        args += packages
        run(args, log=self.log, env=env, cwd=folder)
        with open(stamp_file, "w") as f:
            f.write(stamp)
        return True

    def go_version(self):
        if self._go_version is None:
            self._go_version = run(["go", "env", "GOVERSION"], capture=True).strip()
        return self._go_version

    def build_all(self, serving):
        k = KUBERNETES.lstrip("v").split(".")
        version = "k8s.io/component-base/version"
        self.go_build(
            f"Kubernetes {KUBERNETES}, etcd, CoreDNS and kubectl (one binary)",
            "kube",
            ["."],
            os.path.join(self.bin, "kube"),
            ldflags=(
                f"-X {version}.gitVersion={KUBERNETES} -X {version}.gitMajor={k[0]} "
                f"-X {version}.gitMinor={k[1]} -X {version}.gitTreeState=clean "
                f"-X k8s.io/client-go/pkg/version.gitVersion={KUBERNETES}"
            ),
        )
        for name in (
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubelet",
            "kube-proxy",
            "kubectl",
            "etcd",
            "coredns",
        ):
            link = os.path.join(self.bin, name)
            if not os.path.islink(link):
                os.symlink("kube", link)
        self.go_build(
            f"containerd {CONTAINERD}",
            "containerd",
            [
                "github.com/containerd/containerd/v2/cmd/containerd",
                "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
                "github.com/containerd/containerd/v2/cmd/ctr",
            ],
            os.path.join(self.bin, "containerd.d") + "/",
            ldflags=f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD}",
        )
        for name in ("containerd", "containerd-shim-runc-v2", "ctr"):
            link = os.path.join(self.bin, name)
            if not os.path.islink(link):
                os.symlink(os.path.join("containerd.d", name), link)
        self.go_build(
            f"Traefik {TRAEFIK}",
            "traefik",
            ["github.com/traefik/traefik/v3/cmd/traefik"],
            os.path.join(self.bin, "traefik"),
            ldflags=f"-X github.com/traefik/traefik/v3/pkg/version.Version={TRAEFIK}",
        )
        self.go_build(
            f"Prometheus {PROMETHEUS} (its Kubernetes service discovery alone)",
            "prometheus",
            ["github.com/prometheus/prometheus/cmd/prometheus"],
            os.path.join(self.bin, "prometheus"),
            ldflags=f"-X github.com/prometheus/common/version.Version={PROMETHEUS.lstrip('v')}",
            tags="remove_all_sd,enable_kubernetes_sd",
        )
        self.go_build(
            f"Knative Serving {serving} and its test images",
            f"serving/{serving}",
            serving_packages(self.module(f"serving/{serving}")),
            os.path.join(self.bin, f"serving-{serving}") + "/",
        )
        self.build_pause()

    def build_pause(self):
        """The pods' sandbox: pause.c of the Kubernetes module, static."""
        out = os.path.join(self.bin, "pause")
        stamp = out + ".stamp"
        if os.path.exists(out) and os.path.exists(stamp):
            with open(stamp) as f:
                if f.read() == KUBERNETES:
                    return
        source = os.path.join(
            self.module_dir("k8s.io/kubernetes", KUBERNETES, "kube"), "build", "pause", "linux", "pause.c"
        )
        say("building the pause container (the Kubernetes module's pause.c)")
        run(["gcc", "-Os", "-static", "-o", out + ".tmp", source], log=self.log)
        run(["strip", out + ".tmp"], log=self.log)
        os.replace(out + ".tmp", out)
        with open(stamp, "w") as f:
            f.write(KUBERNETES)

    def module_dir(self, path, version, module):
        """The unpacked source of `path@version`, as the module `module`
        (under cluster/) resolves it."""
        out = run(["go", "mod", "download", "-json", f"{path}@{version}"], capture=True, cwd=self.module(module))
        return json.loads(out)["Dir"]

    def module_version(self, path, module):
        """The version of `path` the module `module` (under cluster/) selects."""
        out = run(["go", "list", "-m", "-json", path], capture=True, cwd=self.module(module))
        return json.loads(out)["Version"]

    # ---- images ------------------------------------------------------------------

    def image(self, name, tag, binary, entrypoint, user="65532", ko=False, folder=""):
        """Packs `binary` as the image `name:tag` (an archive under CACHE)
        unless the archive's stamp says it was packed from this binary by
        this code the same way; returns the archive's path and the image's
        name. `ko` lays it out as ko does for Knative's images:
        /ko-app/<name>, KO_DATA_PATH, a /tmp."""
        out = os.path.join(self.images, folder, f"{name}-{tag}.tar")
        ref = f"ko.local/{name}:{tag}"
        made = os.stat(binary)
        digest = hashlib.sha256(json.dumps([name, tag, entrypoint, user, ko, made.st_size, made.st_mtime_ns]).encode())
        for code in (__file__, oci_image.__file__):
            with open(code, "rb") as f:
                digest.update(f.read())
        stamp = digest.hexdigest()
        if os.path.exists(out) and os.path.exists(out + ".stamp"):
            with open(out + ".stamp") as f:
                if f.read() == stamp:
                    return out, ref
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(binary, "rb") as f:
            data = f.read()
        entries = oci_image.user_files() + [("tmp", None, 0o1777)]
        environment = []
        if ko:
            entries += [
                ("ko-app", None, 0o755),
                (entrypoint.lstrip("/"), data, 0o755),
                ("var", None, 0o755),
                ("var/run", None, 0o755),
                ("var/run/ko", None, 0o755),
            ]
            environment += ["KO_DATA_PATH=/var/run/ko", "PATH=/ko-app:/usr/local/bin:/usr/bin:/bin"]
        else:
            entries.append((entrypoint.lstrip("/"), data, 0o755))
        config = {"User": user, "Entrypoint": [entrypoint]}
        if environment:
            config["Env"] = environment
        labels = {"org.opencontainers.image.title": name, "org.opencontainers.image.version": tag}
        mtime = 0
        files, _ = oci_image.archive_files(entries, config, labels, ref, ARCH, mtime, "scripts/cluster")
        oci_image.write_archive(out, files, mtime)
        with open(out + ".stamp", "w") as f:
            f.write(stamp)
        return out, ref

    def cluster_images(self, serving):
        """Every image the cluster runs but qproxy's: (archive, name)."""
        images = [
            self.image("pause", PAUSE, os.path.join(self.bin, "pause"), "/pause", user="65535"),
            self.image("traefik", TRAEFIK, os.path.join(self.bin, "traefik"), "/traefik"),
            self.image("prometheus", PROMETHEUS, os.path.join(self.bin, "prometheus"), "/prometheus"),
        ]
        folder = os.path.join(self.bin, f"serving-{serving}")
        for name in sorted(os.listdir(folder)):
            component = name in ("activator", "autoscaler", "controller", "webhook", "queue")
            # Knative's test images go by the tag its e2e tests ask for.
            tag = serving if component else "e2e"
            images.append(self.image(name, tag, os.path.join(folder, name), f"/ko-app/{name}", ko=True, folder=serving))
        return images

    def qproxy_image(self):
        """qproxy's release image, an index of image_platforms() built by
        deploy/build-image.sh, and named after its digest, so that a changed
        qproxy is a new image (and new revisions) rather than the same name
        over other bytes."""
        platforms = image_platforms()
        for arch in platforms[1:]:
            run([os.path.join(ROOT, "scripts", "multiarch"), "--install", arch], log=self.log)
        listed = ",".join(f"linux/{arch}" for arch in platforms)
        say(f"building qproxy's image (deploy/build-image.sh --platforms {listed})")
        with open(self.log, "ab") as log:
            out = subprocess.run(
                [os.path.join(ROOT, "deploy", "build-image.sh"), "--platforms", listed],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        lines = out.stdout.decode().strip().splitlines()
        if out.returncode != 0 or not lines:
            raise PhaseError("deploy/build-image.sh failed", self.log)
        archive = os.path.join(ROOT, lines[-1])
        with tarfile.open(archive) as tar:
            index = json.load(tar.extractfile("index.json"))
        digest = index["manifests"][0]["digest"].split(":", 1)[1]
        # The archive names the image qproxy:<version>; containerd is told
        # this name as well.
        return archive, f"ko.local/qproxy:{read_version()}-{digest[:12]}"


def read_version():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        for line in f:
            if line.startswith("version = "):
                return line.split('"')[1]
    return "0"


def serving_packages(folder):
    """The packages a serving module's tools.go names."""
    packages = []
    with open(os.path.join(folder, "tools.go")) as f:
        for line in f:
            line = line.strip()
            if line.startswith('_ "knative.dev/'):
                packages.append(line.split('"')[1])
    return packages
