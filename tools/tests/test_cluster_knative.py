import os

import pytest

from qproxy_tools import ROOT
from qproxy_tools.cluster import knative
from qproxy_tools.cluster.knative import Knative, with_data
from qproxy_tools.cluster.node import Node
from qproxy_tools.commands import PhaseError

CONFIGMAP = """apiVersion: v1
kind: ConfigMap
metadata:
  name: config-network
  namespace: knative-serving
  annotations:
    knative.dev/example-checksum: "0123abcd"
data:
  _example: |
    ################################
    # This block is not actually functional configuration.
    #
    # data:
    #   ingress-class: "istio.ingress.networking.knative.dev"
    ingress-class: "istio.ingress.networking.knative.dev"
"""

# ---- with_data ---------------------------------------------------------------


def test_with_data_adds_the_values_first_under_data():
    text = with_data(CONFIGMAP, {"ingress-class": "traefik.ingress.networking.knative.dev"}, "configmaps/network.yaml")
    assert '\ndata:\n  "ingress-class": "traefik.ingress.networking.knative.dev"\n  _example: |\n' in text


def test_with_data_leaves_everything_else_as_it_was():
    text = with_data(CONFIGMAP, {"a": "1", "b": "2"}, "configmaps/x.yaml")
    assert text.replace('  "a": "1"\n  "b": "2"\n', "", 1) == CONFIGMAP


def test_with_data_writes_keys_and_values_as_json_scalars():
    text = with_data(CONFIGMAP, {"example.com": "", "n": 3, "on": True, 'say "hi"': "it's"}, "configmaps/domain.yaml")
    assert '\ndata:\n  "example.com": ""\n  "n": 3\n  "on": true\n  "say \\"hi\\"": "it\'s"\n  _example' in text


def test_with_data_without_a_data_block_raises():
    text = CONFIGMAP.replace("\ndata:\n", "\nbinaryData:\n")
    with pytest.raises(PhaseError, match=r"^config/core/configmaps/network\.yaml: expected one `data:` block$"):
        with_data(text, {"k": "v"}, "configmaps/network.yaml")


def test_with_data_with_two_data_blocks_raises():
    with pytest.raises(PhaseError, match="configmaps/two.yaml"):
        with_data(CONFIGMAP + "---\n" + CONFIGMAP, {"k": "v"}, "configmaps/two.yaml")


def test_with_data_ignores_data_indented_in_the_example():
    # "    # data:" in _example is not a block of its own.
    assert "\n    # data:\n" in CONFIGMAP
    assert with_data(CONFIGMAP, {"k": "v"}, "x").count('"k": "v"') == 1


# ---- overlay -----------------------------------------------------------------


def knative_in(tmp_path, serving="v0.50.0"):
    """A Knative whose output goes under tmp_path (overlay needs neither a
    builder nor a running node)."""
    return Knative(Node(str(tmp_path / "build")), None, serving)


@pytest.fixture
def core(tmp_path):
    path = tmp_path / "serving-core.yaml"
    path.write_text("# config/core/100-namespace.yaml\nkind: Namespace\n")
    return str(path)


def test_overlay_goes_under_the_releases_output(tmp_path, core):
    folder = knative_in(tmp_path).overlay(core, "ko.local/qproxy:abc")
    assert folder == str(tmp_path / "build" / "knative" / "v0.50.0" / "qproxy")
    assert sorted(os.listdir(folder)) == ["kustomization.yaml", "queue-sidecar-image.yaml", "serving-core.yaml"]


def test_overlay_kustomization_uses_the_local_serving_core(tmp_path, core):
    folder = knative_in(tmp_path).overlay(core, "ko.local/qproxy:abc")
    with open(os.path.join(ROOT, "knative-overlay", "base", "kustomization.yaml")) as f:
        original = f.read()
    with open(os.path.join(folder, "kustomization.yaml")) as f:
        text = f.read()
    assert "\n  - serving-core.yaml\n" in text
    assert "https://" not in text
    assert "serving-core.yaml" not in original.replace("/serving-core.yaml", "")
    # Only the URL changed.
    assert len(text.splitlines()) == len(original.splitlines())
    assert "\n  - path: queue-sidecar-image.yaml\n" in text


def test_overlay_patch_names_the_image(tmp_path, core):
    folder = knative_in(tmp_path).overlay(core, "ko.local/qproxy:abc")
    with open(os.path.join(folder, "queue-sidecar-image.yaml")) as f:
        patch = f.read()
    assert "  queue-sidecar-image: ko.local/qproxy:abc\n" in patch
    assert "registry.example.com" not in patch
    assert "name: config-deployment" in patch


def test_overlay_copies_the_release_core(tmp_path, core):
    folder = knative_in(tmp_path).overlay(core, "ko.local/qproxy:abc")
    with open(os.path.join(folder, "serving-core.yaml")) as f:
        assert f.read() == "# config/core/100-namespace.yaml\nkind: Namespace\n"


def fake_base(tmp_path, kustomization, patch):
    base = tmp_path / "root" / "knative-overlay" / "base"
    base.mkdir(parents=True)
    (base / "kustomization.yaml").write_text(kustomization)
    (base / "queue-sidecar-image.yaml").write_text(patch)
    return str(tmp_path / "root")


PATCH = "data:\n  queue-sidecar-image: registry.example.com/qproxy:0.1.0\n"
URL = "https://github.com/knative/serving/releases/download/knative-v{}/serving-core.yaml"


def test_overlay_refuses_a_kustomization_with_two_serving_cores(tmp_path, core, monkeypatch):
    kustomization = f"resources:\n  - {URL.format('1.15.2')}\n  - {URL.format('1.16.0')}\n"
    monkeypatch.setattr(knative, "ROOT", fake_base(tmp_path, kustomization, PATCH))
    with pytest.raises(PhaseError, match="expected one serving-core.yaml URL among its resources, found 2"):
        knative_in(tmp_path).overlay(core, "ko.local/qproxy:abc")


def test_overlay_refuses_a_kustomization_without_serving_core(tmp_path, core, monkeypatch):
    monkeypatch.setattr(knative, "ROOT", fake_base(tmp_path, "resources:\n  - other.yaml\n", PATCH))
    with pytest.raises(PhaseError, match="found 0"):
        knative_in(tmp_path).overlay(core, "ko.local/qproxy:abc")


def test_overlay_refuses_a_patch_without_the_placeholder(tmp_path, core, monkeypatch):
    kustomization = f"resources:\n  - {URL.format('1.15.2')}\n"
    root = fake_base(tmp_path, kustomization, "data:\n  queue-sidecar-image: somewhere/else:1\n")
    monkeypatch.setattr(knative, "ROOT", root)
    with pytest.raises(PhaseError, match="no longer names registry.example.com/qproxy:0.1.0"):
        knative_in(tmp_path).overlay(core, "ko.local/qproxy:abc")


def test_go_image_is_the_releases_own_queue_proxy(tmp_path):
    assert knative_in(tmp_path, "v0.42.2").go_image() == "ko.local/queue:v0.42.2"


# ---- Prometheus ------------------------------------------------------------------


def test_prometheus_is_applied_with_every_placeholder_filled(tmp_path):
    kn = knative_in(tmp_path)
    applied = []
    kn.kubectl = lambda *args: applied.append(args)
    kn.install_prometheus()
    ((verb, flag, path),) = applied
    assert (verb, flag) == ("apply", "-f")
    with open(path) as f:
        text = f.read()
    assert "${" not in text
    assert f"image: ko.local/prometheus:{knative.PROMETHEUS}" in text
    assert f"clusterIP: {knative.PROMETHEUS_IP}" in text
    # The queue-proxy's request-metrics port, by its name, of a revision's pod.
    assert "regex: .+;http-usermetric" in text
    assert f"scrape_interval: {knative.SCRAPE_INTERVAL}" in text


def test_traefik_is_applied_with_every_placeholder_filled(tmp_path):
    kn = knative_in(tmp_path)
    applied = []
    kn.kubectl = lambda *args: applied.append(args)
    kn.src = {"sigs.k8s.io/gateway-api": str(tmp_path / "no-crds")}
    kn.install_ingress()
    path = applied[-1][-1]
    with open(path) as f:
        text = f.read()
    assert "${" not in text
    assert f"clusterIP: {knative.INGRESS_IP}" in text and f"clusterIP: {knative.INGRESS_LOCAL_IP}" in text
