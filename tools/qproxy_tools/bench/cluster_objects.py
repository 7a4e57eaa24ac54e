"""The Kubernetes objects the cluster benchmark makes and reads, through
kubectl (`scripts/cluster run`): its Knative Services, their readiness, a
revision's pod and the activator."""

from .. import services
from ..commands import PhaseError, wait_until
from ..kubectl import Kubectl

NAMESPACE = "qproxy-bench"

kubectl = Kubectl.through_cluster()


def service(name, annotations, image="helloworld"):
    """A Knative Service of `image` in the benchmark's namespace."""
    return services.service(name, NAMESPACE, {"containers": [services.image(image)]}, annotations)


def ready(name):
    """The Service `name`'s status once Ready (`ready_status`), else None."""
    return ready_status(kubectl.json("-n", NAMESPACE, "get", "ksvc", name, check=False))


def ready_status(svc):
    """A Service's status, if it is Ready for its latest generation; None
    otherwise (or for no Service)."""
    if not svc:
        return None
    status = svc.get("status", {})
    if status.get("observedGeneration") != svc["metadata"].get("generation"):
        return None
    if any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])):
        return status
    return None


def container_id(status):
    """A container status's ID without its runtime's scheme."""
    return status["containerID"].split("://", 1)[1]


def the_pod(revision, queue_image):
    """The revision's one running pod, once it runs `queue_image` and is
    Ready (and no other pod is left): its IP and its containers' IDs."""

    def found():
        pods = kubectl.json("-n", NAMESPACE, "get", "pods", "-l", f"serving.knative.dev/revision={revision}")["items"]
        return pod_facts(pods, queue_image)

    return wait_until(f"the pod of {revision} with {queue_image}", found, 300)


def pod_facts(pods, queue_image):
    """`the_pod`'s answer from a revision's `pods`: its IP and its
    containers' IDs, if it is the one pod, not being deleted, runs
    `queue_image` as its queue-proxy and both its containers are ready;
    None otherwise."""
    if len(pods) != 1 or pods[0]["metadata"].get("deletionTimestamp"):
        return None
    pod = pods[0]
    images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
    if images.get("queue-proxy") != queue_image:
        return None
    statuses = pod["status"].get("containerStatuses", [])
    if len(statuses) != 2 or not all(s.get("ready") for s in statuses):
        return None
    return {"ip": pod["status"]["podIP"], "containers": {s["name"]: container_id(s) for s in statuses}}


def activator():
    """The activator's Service IP and its one running pod's container ID."""
    pods = kubectl.json("-n", "knative-serving", "get", "pods", "-l", "app=activator")["items"]
    running = running_pods(pods)
    if len(running) != 1:
        raise PhaseError(f"{len(running)} running activators, expected one")
    svc = kubectl.json("-n", "knative-serving", "get", "service", "activator-service")
    return svc["spec"]["clusterIP"], container_id(running[0]["status"]["containerStatuses"][0])


def running_pods(pods):
    """The pods Running and not being deleted."""
    return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def pods_of(name):
    """The pods of the Service `name`."""
    return kubectl.json("-n", NAMESPACE, "get", "pods", "-l", f"serving.knative.dev/service={name}")["items"]


def queue_images(pods):
    """The queue-proxy images `pods` run."""
    return {c["image"] for p in pods for c in p["spec"]["containers"] if c["name"] == "queue-proxy"}
