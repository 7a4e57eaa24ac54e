"""Knative Serving and its ingress on the node: the release's own YAML,
assembled from the serving module's config/ as Knative's release script
assembles it, with the locally built images; Traefik with its Knative and
Gateway API providers; Prometheus, scraping every revision's queue-proxy;
and the queue-proxy image switch."""

import glob
import json
import os
import re
import time

from .. import ROOT
from ..commands import PhaseError, wait_until
from ..progress import Progress
from .build import PROMETHEUS, TRAEFIK

say = Progress("cluster")

INGRESS_CLASS = "traefik.ingress.networking.knative.dev"
# The domain Knative gives routes; nothing resolves it, clients send it as
# the Host to the ingress.
DOMAIN = "example.com"
# Traefik's Services get fixed addresses, so that tests and Knative's e2e
# tests (--ingressendpoint) can be told them.
INGRESS_IP = "10.96.0.80"
INGRESS_LOCAL_IP = "10.96.0.81"
# Prometheus' Service, fixed as well, for the dashboard's tests.
PROMETHEUS_IP = "10.96.0.90"
# How often Prometheus scrapes each queue-proxy.
SCRAPE_INTERVAL = "5s"

# Files of the serving repository that are symlinks into vendor/ and so are
# missing from its module zip: (module, path in it).
VENDORED = {
    "300-imagecache.yaml": ("knative.dev/caching", "config/image.yaml"),
    "300-resources/certificate.yaml": ("knative.dev/networking", "config/certificate.yaml"),
    "300-resources/domain-claim.yaml": ("knative.dev/networking", "config/domain-claim.yaml"),
    "300-resources/ingress.yaml": ("knative.dev/networking", "config/ingress.yaml"),
    "300-resources/serverlessservice.yaml": ("knative.dev/networking", "config/serverlessservice.yaml"),
    "configmaps/network.yaml": ("knative.dev/networking", "config/config-network.yaml"),
}


class Knative:
    def __init__(self, node, builder, serving):
        self.node = node
        self.builder = builder
        self.serving = serving
        self.module = f"serving/{serving}"
        self.out = os.path.join(node.build, "knative", serving)
        self.log = node.log("knative")
        self.kubectl = node.kubectl(self.log)
        self.src = None

    def prepare(self):
        """Finds the sources the install reads (Knative's config/, the
        Gateway API's CRDs) in Go's module cache, downloading what is
        missing: done before entering the cluster's namespace, which has no
        route to the module proxy."""
        self.src = self.sources()
        gateway = self.builder.module_version("sigs.k8s.io/gateway-api", "traefik")
        self.src["sigs.k8s.io/gateway-api"] = self.builder.module_dir("sigs.k8s.io/gateway-api", gateway, "traefik")

    # ---- the release's YAML ----------------------------------------------------

    def sources(self):
        """The serving module's config/core, and its networking and caching
        modules', at the versions serving's go.mod names."""
        return {
            path: self.builder.module_dir(path, self.builder.module_version(path, self.module), self.module)
            for path in ("knative.dev/serving", "knative.dev/networking", "knative.dev/caching")
        }

    def release_yaml(self):
        """serving-crds.yaml and serving-core.yaml as a release has them
        (Knative's own queue-proxy in config-deployment), with ko.local
        images and the cluster's settings: the ingress class, the domain,
        and (current Knative) its components' and queue-proxies' request
        metrics in Prometheus form, as classic Knative has them by default.
        Returns their paths."""
        src = self.src
        core = os.path.join(src["knative.dev/serving"], "config", "core")

        def read(rel):
            if rel in VENDORED:
                module, path = VENDORED[rel]
                with open(os.path.join(src[module], path)) as f:
                    return f.read()
            with open(os.path.join(core, rel)) as f:
                return f.read()

        files = sorted(
            set(os.path.relpath(p, core) for p in glob.glob(os.path.join(core, "**", "*.yaml"), recursive=True))
            | set(VENDORED)
        )
        crds = [f for f in files if f.startswith("300-resources/") or f == "300-imagecache.yaml"]

        def images(text):
            return re.sub(
                r"ko://knative\.dev/serving/cmd/([\w-]+)",
                lambda m: f"ko.local/{m.group(1)}:{self.serving}",
                text,
            )

        settings = {
            "configmaps/network.yaml": {"ingress-class": INGRESS_CLASS},
            "configmaps/domain.yaml": {DOMAIN: ""},
        }
        if self.serving != "v0.42.2":
            settings["configmaps/observability.yaml"] = {
                "metrics-protocol": "prometheus",
                "request-metrics-protocol": "prometheus",
            }
        docs = []
        for rel in files:
            text = images(read(rel))
            if rel in settings:
                text = with_data(text, settings[rel], rel)
            docs.append(f"# config/core/{rel}\n{text.strip()}\n")
        os.makedirs(self.out, exist_ok=True)
        crd_path = os.path.join(self.out, "serving-crds.yaml")
        core_path = os.path.join(self.out, "serving-core.yaml")
        with open(crd_path, "w") as f:
            f.write("---\n".join(d for d, rel in zip(docs, files, strict=False) if rel in crds))
        with open(core_path, "w") as f:
            f.write("---\n".join(docs))
        return crd_path, core_path

    def go_image(self):
        """Knative's own queue-proxy of the installed release."""
        return f"ko.local/queue:{self.serving}"

    def overlay(self, core, image):
        """knative-overlay/base as an operator uses it: its kustomization
        and its patch of config-deployment, with this release's
        serving-core.yaml in place of the one it downloads and `image` in
        place of the patch's example. Returns its folder."""
        folder = os.path.join(self.out, "qproxy")
        os.makedirs(folder, exist_ok=True)
        base = os.path.join(ROOT, "knative-overlay", "base")
        with open(os.path.join(base, "kustomization.yaml")) as f:
            kustomization = f.read()
        urls = re.findall(r"^(\s*- )(https://\S+/serving-core\.yaml)$", kustomization, re.M)
        if len(urls) != 1:
            raise PhaseError(
                "knative-overlay/base/kustomization.yaml: expected one serving-core.yaml URL "
                f"among its resources, found {len(urls)}"
            )
        kustomization = kustomization.replace(urls[0][1], "serving-core.yaml")
        with open(os.path.join(base, "queue-sidecar-image.yaml")) as f:
            patch = f.read()
        placeholder = "registry.example.com/qproxy:0.1.0"
        if placeholder not in patch:
            raise PhaseError(f"knative-overlay/base/queue-sidecar-image.yaml no longer names {placeholder}")
        files = {
            "kustomization.yaml": kustomization,
            "queue-sidecar-image.yaml": patch.replace(placeholder, image),
        }
        with open(core) as f:
            files["serving-core.yaml"] = f.read()
        for name, text in files.items():
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)
        return folder

    # ---- install -----------------------------------------------------------------

    def install(self, queue_image):
        """Installs the release; with qproxy as the queue-proxy through
        knative-overlay/base (kubectl apply -k), with Knative's own by the
        release's serving-core.yaml alone."""
        say(f"installing Knative Serving {self.serving} (config/ of its module, local images)")
        crds, core = self.release_yaml()
        self.kubectl("apply", "-f", crds)
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s")
        if queue_image == self.go_image():
            self.kubectl("apply", "-f", core)
        else:
            self.kubectl("apply", "-k", self.overlay(core, queue_image))

    def install_ingress(self):
        say(f"installing Traefik {TRAEFIK} (Knative and Gateway API providers)")
        gateway = self.src["sigs.k8s.io/gateway-api"]
        for crd in sorted(glob.glob(os.path.join(gateway, "config", "crd", "standard", "*.yaml"))):
            self.kubectl("apply", "-f", crd)
        self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s")
        self.apply_manifest(
            "traefik.yaml",
            {
                "TRAEFIK_IMAGE": f"ko.local/traefik:{TRAEFIK}",
                "INGRESS_IP": INGRESS_IP,
                "INGRESS_LOCAL_IP": INGRESS_LOCAL_IP,
            },
        )

    def install_prometheus(self):
        say(f"installing Prometheus {PROMETHEUS} (scraping every revision's queue-proxy)")
        self.apply_manifest(
            "prometheus.yaml",
            {
                "PROMETHEUS_IMAGE": f"ko.local/prometheus:{PROMETHEUS}",
                "PROMETHEUS_IP": PROMETHEUS_IP,
                "SCRAPE_INTERVAL": SCRAPE_INTERVAL,
            },
        )

    def apply_manifest(self, name, values):
        """Applies cluster/manifests/<name> with each ${KEY} in it replaced
        by values[KEY], written first under the release's output."""
        with open(os.path.join(ROOT, "cluster", "manifests", name)) as f:
            text = f.read()
        for key, value in values.items():
            text = text.replace("${" + key + "}", value)
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, name)
        with open(path, "w") as f:
            f.write(text)
        self.kubectl("apply", "-f", path)

    def wait_ready(self, timeout=900):
        say("waiting for Knative, Traefik and Prometheus to be ready")
        deadline = time.monotonic() + timeout
        for namespace in ("knative-serving", "traefik", "monitoring"):
            wait_until(
                f"the Deployments of {namespace} available",
                lambda namespace=namespace: self.kubectl.ok(
                    "-n", namespace, "wait", "--for=condition=Available", "deployment", "--all", "--timeout=20s"
                ),
                max(10, deadline - time.monotonic()),
                log=self.log,
            )

    # ---- the queue-proxy image -----------------------------------------------------

    def current_image(self):
        """queue-sidecar-image as config-deployment has it now, if installed."""
        out = self.kubectl(
            "-n",
            "knative-serving",
            "get",
            "configmap",
            "config-deployment",
            "-o",
            "jsonpath={.data.queue-sidecar-image}",
            check=False,
        )
        return (out or "").strip() or None

    def use(self, image, timeout=300):
        """Sets queue-sidecar-image, and waits until every revision's
        Deployment asks for it (Knative recomputes them all)."""
        wait_until(
            "config-deployment patched (Knative's webhook answering)",
            lambda: (
                self.kubectl.merge_configmap(
                    "knative-serving", "config-deployment", {"queue-sidecar-image": image}, check=False
                )
                is not None
            ),
            120,
            log=self.log,
        )

        def rolled():
            found = self.kubectl.json("get", "deployments", "-A", "-l", "serving.knative.dev/revision", check=False)
            if not found:
                return False
            for item in found["items"]:
                if item["metadata"].get("deletionTimestamp"):
                    continue
                containers = item["spec"]["template"]["spec"]["containers"]
                if any(c["name"] == "queue-proxy" and c["image"] != image for c in containers):
                    return False
            return True

        wait_until("every revision's Deployment on the new queue-proxy", rolled, timeout, log=self.log)


def with_data(text, values, rel):
    """The ConfigMap `text` with `values` added under its `data:`, leaving
    the `_example` block (and so its checksum) as it is."""
    if text.count("\ndata:\n") != 1:
        raise PhaseError(f"config/core/{rel}: expected one `data:` block")
    lines = "".join(f"  {json.dumps(k)}: {json.dumps(v)}\n" for k, v in values.items())
    return text.replace("\ndata:\n", "\ndata:\n" + lines, 1)
