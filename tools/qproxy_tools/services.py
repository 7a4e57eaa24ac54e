"""The Knative Services the scripts create, as kubectl reads them."""

import json


def service(name, namespace, spec, annotations=None):
    """A Knative Service `name` in `namespace`, its revision template's
    `spec` (containers, init containers) and annotations, as JSON."""
    return json.dumps(
        {
            "apiVersion": "serving.knative.dev/v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"metadata": {"annotations": annotations or {}}, "spec": spec}},
        }
    )


def image(name, tag="e2e"):
    """One container of an image the cluster built (Knative's test images
    go by the tag its e2e tests ask for)."""
    return {"image": f"ko.local/{name}:{tag}"}
