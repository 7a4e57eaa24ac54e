"""Routes apps behind one host by path prefix, for Gateway API and for Istio.

Reads a short list of Knative Services (name, namespace, path prefix) and the
host they share, and writes two kustomize components:

  gateway-api/  one HTTPRoute per app on your Gateway: it matches the prefix,
                strips it (URLRewrite ReplacePrefixMatch), sets the Host
                Knative's ingress routes the app by, and sends the request to
                Knative's gateway Service; plus the ReferenceGrant that lets
                the routes reach that Service across namespaces.
  istio/        one VirtualService on Istio's gateway with one route per app,
                longest prefix first, doing the same with rewrite.uri and
                rewrite.authority.

Usage: generate.py [APPS_FILE] [--out DIR]

APPS_FILE defaults to apps.conf next to this script, DIR to this script's
folder. The file has one setting or app per line; '#' starts a comment:

  host           apps.example.com                        # the shared host
  gateway        gateway-system/public                   # Gateway API: your Gateway (ns/name[/section])
  ingress        istio-system/knative-local-gateway:80   # Knative's gateway Service (ns/name:port)
  domain         svc.cluster.local                       # Knative's domain for the apps' hosts
  istio-gateway  knative-serving/knative-ingress-gateway # Istio: the Gateway serving host (ns/name)
  istio-namespace knative-serving                        # Istio: where the VirtualService lives
  app            search default /search                  # name, namespace, path prefix
  app            login  default /login

Each app's Host becomes <name>.<namespace>.<domain>: with the default domain
and ingress, Knative's cluster-local gateway, which answers for every Knative
Service, cluster-local or not.
"""

import argparse
import os
import re
import sys

from . import ROOT

HERE = os.path.join(ROOT, "knative-overlay", "components", "path-routing")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Path characters that need no quoting in YAML or escaping in a URL.
PREFIX = re.compile(r"^/([A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*)?$")

DEFAULTS = {
    "domain": "svc.cluster.local",
    "ingress": "istio-system/knative-local-gateway:80",
    "istio-gateway": "knative-serving/knative-ingress-gateway",
    "istio-namespace": "knative-serving",
}
REQUIRED = ("host", "gateway")


class ConfError(Exception):
    pass


def parse(text, source):
    settings = dict(DEFAULTS)
    apps = []
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}:{number}"
        key, args = words[0], words[1:]
        if key == "app":
            if len(args) != 3:
                raise ConfError(f"{where}: app takes a name, a namespace and a path prefix")
            name, namespace, prefix = args
            for what, value in (("name", name), ("namespace", namespace)):
                if not DNS_LABEL.match(value) or len(value) > 63:
                    raise ConfError(f"{where}: app {what} {value!r} is not a DNS label")
            if not PREFIX.match(prefix):
                raise ConfError(
                    f"{where}: path prefix {prefix!r} must start with '/', not end with one, "
                    "and hold only letters, digits and . _ ~ -"
                )
            for other in apps:
                if other["prefix"] == prefix:
                    raise ConfError(f"{where}: path prefix {prefix} is already routed to {other['name']}")
                if (other["name"], other["namespace"]) == (name, namespace):
                    raise ConfError(f"{where}: app {namespace}/{name} is listed twice")
            apps.append({"name": name, "namespace": namespace, "prefix": prefix})
        elif key in REQUIRED or key in DEFAULTS:
            if len(args) != 1:
                raise ConfError(f"{where}: {key} takes one value")
            settings[key] = args[0]
        else:
            raise ConfError(f"{where}: unknown setting {key!r}")
    for key in REQUIRED:
        if key not in settings:
            raise ConfError(f"{source}: no {key} line")
    if not apps:
        raise ConfError(f"{source}: no app line")
    if not DNS_NAME.match(settings["host"]) or not DNS_NAME.match(settings["domain"]):
        raise ConfError(f"{source}: host and domain must be DNS names")
    settings["gateway"] = split_ref(settings["gateway"], "gateway", source, section=True)
    settings["istio-gateway"] = split_ref(settings["istio-gateway"], "istio-gateway", source)
    ingress, _, port = settings["ingress"].rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfError(f"{source}: ingress must be namespace/name:port")
    settings["ingress"] = split_ref(ingress, "ingress", source) + (int(port),)
    if not DNS_LABEL.match(settings["istio-namespace"]):
        raise ConfError(f"{source}: istio-namespace must be a DNS label")
    return settings, apps


def split_ref(value, key, source, section=False):
    parts = value.split("/")
    if len(parts) not in ((2, 3) if section else (2,)) or not all(DNS_LABEL.match(p) for p in parts):
        form = "namespace/name[/section]" if section else "namespace/name"
        raise ConfError(f"{source}: {key} must be {form}")
    return tuple(parts) + ((None,) if section and len(parts) == 2 else ())


def app_host(app, settings):
    return f"{app['name']}.{app['namespace']}.{settings['domain']}"


def by_prefix_length(apps):
    # Longest first, so that /api/v2 is tried before /api.
    return sorted(apps, key=lambda a: (-len(a["prefix"]), a["prefix"]))


def gateway_api(settings, apps, header):
    gw_ns, gw_name, section = settings["gateway"]
    ing_ns, ing_name, ing_port = settings["ingress"]
    docs = []
    for app in apps:
        parent = [f"    - name: {gw_name}", f"      namespace: {gw_ns}"]
        if section:
            parent.append(f"      sectionName: {section}")
        docs.append(
            "\n".join(
                [
                    "apiVersion: gateway.networking.k8s.io/v1",
                    "kind: HTTPRoute",
                    "metadata:",
                    f"  name: {app['name']}-path-routing",
                    f"  namespace: {app['namespace']}",
                    "spec:",
                    "  parentRefs:",
                    *parent,
                    "  hostnames:",
                    f"    - {settings['host']}",
                    "  rules:",
                    "    - matches:",
                    "        - path:",
                    "            type: PathPrefix",
                    f"            value: {app['prefix']}",
                    "      filters:",
                    "        - type: URLRewrite",
                    "          urlRewrite:",
                    f"            hostname: {app_host(app, settings)}",
                    "            path:",
                    "              type: ReplacePrefixMatch",
                    "              replacePrefixMatch: /",
                    "      backendRefs:",
                    f"        - name: {ing_name}",
                    f"          namespace: {ing_ns}",
                    f"          port: {ing_port}",
                ]
            )
        )
    namespaces = sorted({app["namespace"] for app in apps})
    docs.append(
        "\n".join(
            [
                "apiVersion: gateway.networking.k8s.io/v1beta1",
                "kind: ReferenceGrant",
                "metadata:",
                "  name: path-routing",
                f"  namespace: {ing_ns}",
                "spec:",
                "  from:",
                *[
                    line
                    for ns in namespaces
                    for line in (
                        "    - group: gateway.networking.k8s.io",
                        "      kind: HTTPRoute",
                        f"      namespace: {ns}",
                    )
                ],
                "  to:",
                '    - group: ""',
                "      kind: Service",
                f"      name: {ing_name}",
            ]
        )
    )
    return header + "---\n".join(doc + "\n" for doc in docs)


def istio(settings, apps, header):
    gw_ns, gw_name = settings["istio-gateway"]
    ing_ns, ing_name, ing_port = settings["ingress"]
    lines = [
        "apiVersion: networking.istio.io/v1",
        "kind: VirtualService",
        "metadata:",
        "  name: path-routing",
        f"  namespace: {settings['istio-namespace']}",
        "spec:",
        "  gateways:",
        f"    - {gw_ns}/{gw_name}",
        "  hosts:",
        f"    - {settings['host']}",
        "  http:",
    ]
    for app in by_prefix_length(apps):
        prefix = app["prefix"]
        lines += [f"    - name: {app['name']}-{app['namespace']}", "      match:"]
        if prefix == "/":
            lines += ["        - uri:", "            prefix: /"]
        else:
            # Istio's prefix is a string prefix and its rewrite replaces
            # exactly what matched: "/x/" and the exact "/x" both become "/",
            # and "/xy" is not this app's.
            lines += [
                "        - uri:",
                f"            prefix: {prefix}/",
                "        - uri:",
                f"            exact: {prefix}",
            ]
        lines += [
            "      rewrite:",
            "        uri: /",
            f"        authority: {app_host(app, settings)}",
            "      route:",
            "        - destination:",
            f"            host: {ing_name}.{ing_ns}.svc.cluster.local",
            "            port:",
            f"              number: {ing_port}",
        ]
    return header + "\n".join(lines) + "\n"


COMPONENT = """\
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
resources:
  - routes.yaml
"""


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="See the module's docstring, or knative-overlay/README.md, for the file's format.",
    )
    parser.add_argument("apps", nargs="?", default=os.path.join(HERE, "apps.conf"))
    parser.add_argument("--out", default=HERE, help="folder to write gateway-api/ and istio/ into")
    args = parser.parse_args()

    try:
        with open(args.apps, encoding="utf-8") as f:
            settings, apps = parse(f.read(), os.path.basename(args.apps))
    except (OSError, UnicodeDecodeError, ConfError) as err:
        print(f"generate.py: {err}", file=sys.stderr)
        return 1

    header = (
        f"# Generated by generate.py from {os.path.basename(args.apps)}; edit that file and\n"
        "# run generate.py again rather than editing this one.\n"
    )
    for flavour, render in (("gateway-api", gateway_api), ("istio", istio)):
        folder = os.path.join(args.out, flavour)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "kustomization.yaml"), "w", encoding="utf-8") as f:
            f.write(COMPONENT)
        with open(os.path.join(folder, "routes.yaml"), "w", encoding="utf-8") as f:
            f.write(render(settings, apps, header))
    return 0
