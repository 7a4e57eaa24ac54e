import json

from qproxy_tools.services import image, service


def test_a_service_is_a_knative_service_in_its_namespace():
    found = json.loads(service("hello", "serving-tests", {"containers": [{"image": "x"}]}))
    assert found == {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": "hello", "namespace": "serving-tests"},
        "spec": {"template": {"metadata": {"annotations": {}}, "spec": {"containers": [{"image": "x"}]}}},
    }


def test_a_service_carries_its_revision_annotations():
    annotations = {"autoscaling.knative.dev/initial-scale": "0"}
    found = json.loads(service("s", "ns", {"containers": []}, annotations))
    assert found["spec"]["template"]["metadata"]["annotations"] == annotations
    assert "annotations" not in found["metadata"]


def test_a_service_passes_its_spec_through_unchanged():
    spec = {
        "containers": [{"image": "a", "name": "serving", "ports": [{"containerPort": 8080}]}],
        "initContainers": [{"image": "b"}],
        "timeoutSeconds": 30,
    }
    assert json.loads(service("s", "ns", spec))["spec"]["template"]["spec"] == spec


def test_an_image_is_a_local_build_tagged_for_the_e2e_tests():
    assert image("helloworld") == {"image": "ko.local/helloworld:e2e"}


def test_an_image_takes_another_tag():
    assert image("queue", "v0.50.0") == {"image": "ko.local/queue:v0.50.0"}
