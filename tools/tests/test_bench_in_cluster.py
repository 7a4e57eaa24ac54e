import json
from types import SimpleNamespace

import pytest

from qproxy_tools.bench import cluster_objects, cluster_report, cluster_run, cpuacct, in_cluster
from qproxy_tools.cluster import knative
from qproxy_tools.commands import PhaseError

# A stand-in for scripts/cluster: writes its arguments, one a line, into
# $CLUSTER_ARGS, and prints $CLUSTER_OUT; fails, saying so on stderr, when
# its first argument is "fail".
STAND_IN = """#!/bin/sh
printf '%s\\n' "$@" > "$CLUSTER_ARGS"
if [ "$1" = fail ]; then echo "  no cluster is up  " >&2; exit 1; fi
printf '%b' "$CLUSTER_OUT"
"""

WRK = """Running 1s test @ http://10.244.0.5:8080/
  Latency Distribution
     50%    1.00ms
     90%    1.60ms
     99%    4.78ms
  1949 requests in 1.10s, 0.97MB read
Requests/sec:   1772.69
"""


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    path = tmp_path / "cluster"
    path.write_text(STAND_IN)
    path.chmod(0o755)
    monkeypatch.setattr(cluster_run, "CLUSTER", str(path))
    monkeypatch.setenv("CLUSTER_ARGS", str(tmp_path / "args"))
    monkeypatch.setenv("CLUSTER_OUT", "")

    def said(out=None):
        if out is not None:
            monkeypatch.setenv("CLUSTER_OUT", out)
        return lambda: (tmp_path / "args").read_text().splitlines()

    return said


def test_a_verb_returns_what_scripts_cluster_printed(cluster):
    args = cluster("up: fine\n")
    assert cluster_run.cluster("status") == "up: fine\n"
    assert args() == ["status"]


def test_a_failed_verb_raises_with_its_error(cluster):
    cluster()
    with pytest.raises(PhaseError, match=r"^scripts/cluster fail a b c: no cluster is up$"):
        cluster_run.cluster("fail", "a", "b", "c", "d")
    assert cluster_run.cluster("fail", check=False) == ""


def test_use_answers_the_image_on_the_last_line(cluster):
    args = cluster("building\nko.local/qproxy:0.1.0-abc\n")
    assert cluster_run.use("qproxy") == "ko.local/qproxy:0.1.0-abc"
    assert args() == ["use", "qproxy"]


def test_wrk_runs_in_the_cluster_on_two_threads(cluster):
    args = cluster(WRK)
    r = cluster_run.wrk("http://10.244.0.5:8080/", 70, 20, ("Host: h",))
    assert args() == [
        "run",
        "--",
        "wrk",
        "-t2",
        "-c70",
        "-d20s",
        "--latency",
        "-H",
        "Host: h",
        "http://10.244.0.5:8080/",
    ]
    assert r["requests"] == 1949 and r["p90"] == pytest.approx(1.6e-3)


def test_a_first_byte_through_the_ingress(cluster):
    args = cluster("200 1.234\n")
    assert cluster_run.first_byte("cold-1.qproxy-bench.example.com") == (200, 1.234)
    said = args()
    assert said[:2] == ["run", "--"] and said[2] == "curl"
    assert said[said.index("-H") + 1] == "Host: cold-1.qproxy-bench.example.com"
    assert said[-1] == f"http://{knative.INGRESS_IP}/"
    assert said[said.index("-w") + 1] == "%{http_code} %{time_starttransfer}"


def test_an_unreadable_first_byte():
    assert cluster_run.parse_first_byte("") == (0, None)
    assert cluster_run.parse_first_byte("curl: (7) failed\n") == (0, None)
    assert cluster_run.parse_first_byte("503 0.5") == (503, 0.5)


def svc(generation=2, observed=2, ready="True"):
    return {
        "metadata": {"generation": generation},
        "status": {
            "observedGeneration": observed,
            "conditions": [{"type": "Ready", "status": ready}],
            "latestReadyRevisionName": "hello-00001",
        },
    }


def test_a_service_is_ready_for_its_latest_generation_only():
    assert cluster_objects.ready_status(svc())["latestReadyRevisionName"] == "hello-00001"
    assert cluster_objects.ready_status(svc(observed=1)) is None
    assert cluster_objects.ready_status(svc(ready="False")) is None
    assert cluster_objects.ready_status(None) is None


def pod(queue="ko.local/qproxy:1", ready=(True, True), deleting=False, phase="Running"):
    meta = {"deletionTimestamp": "now"} if deleting else {}
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "user-container", "image": "hello"}, {"name": "queue-proxy", "image": queue}]},
        "status": {
            "phase": phase,
            "podIP": "10.244.0.9",
            "containerStatuses": [
                {"name": "user-container", "ready": ready[0], "containerID": "containerd://aaa"},
                {"name": "queue-proxy", "ready": ready[1], "containerID": "containerd://bbb"},
            ],
        },
    }


def test_the_revisions_pod_once_it_runs_the_image_and_is_ready():
    assert cluster_objects.pod_facts([pod()], "ko.local/qproxy:1") == {
        "ip": "10.244.0.9",
        "containers": {"user-container": "aaa", "queue-proxy": "bbb"},
    }
    assert cluster_objects.pod_facts([pod(queue="go")], "ko.local/qproxy:1") is None
    assert cluster_objects.pod_facts([pod(ready=(True, False))], "ko.local/qproxy:1") is None
    assert cluster_objects.pod_facts([pod(deleting=True)], "ko.local/qproxy:1") is None
    assert cluster_objects.pod_facts([pod(), pod()], "ko.local/qproxy:1") is None
    assert cluster_objects.pod_facts([], "ko.local/qproxy:1") is None


class FakeKubectl:
    """Answers `json` from a table of argument tuples, recording each."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def json(self, *args, check=True):
        self.calls.append(args)
        return self.answers.get(args)


def test_the_activator_is_its_one_running_pod_and_its_service(monkeypatch):
    pods = ("-n", "knative-serving", "get", "pods", "-l", "app=activator")
    service = ("-n", "knative-serving", "get", "service", "activator-service")
    kubectl = FakeKubectl({pods: {"items": [pod(), pod(deleting=True), pod(phase="Pending")]}, service: {}})
    kubectl.answers[service] = {"spec": {"clusterIP": "10.96.0.40"}}
    monkeypatch.setattr(cluster_objects, "kubectl", kubectl)
    assert cluster_objects.activator() == ("10.96.0.40", "aaa")
    kubectl.answers[pods] = {"items": [pod(), pod()]}
    with pytest.raises(PhaseError, match="2 running activators, expected one"):
        cluster_objects.activator()


def test_a_services_readiness_and_pods_are_read_in_the_benchmarks_namespace(monkeypatch):
    kubectl = FakeKubectl(
        {
            ("-n", "qproxy-bench", "get", "ksvc", "hello"): svc(),
            ("-n", "qproxy-bench", "get", "pods", "-l", "serving.knative.dev/service=cold-1"): {"items": [pod()]},
        }
    )
    monkeypatch.setattr(cluster_objects, "kubectl", kubectl)
    assert cluster_objects.ready("hello")["observedGeneration"] == 2
    assert cluster_objects.ready("other") is None
    assert cluster_objects.queue_images(cluster_objects.pods_of("cold-1")) == {"ko.local/qproxy:1"}


def test_a_service_is_made_in_the_benchmarks_namespace():
    manifest = json.loads(cluster_objects.service("hello", {"autoscaling.knative.dev/max-scale": "1"}))
    assert manifest["metadata"]["namespace"] == "qproxy-bench"
    assert manifest["metadata"]["name"] == "hello"
    text = json.dumps(manifest)
    assert '"autoscaling.knative.dev/max-scale": "1"' in text and "helloworld" in text


def test_a_containers_cgroup_and_its_cpu(tmp_path):
    folder = tmp_path / "burstable" / "pod1" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpuacct.usage").write_text("123456\n")
    assert cpuacct.cgroup_of("abc", str(tmp_path)) == str(folder)
    assert cpuacct.cpu_ns(str(folder)) == 123456
    with pytest.raises(PhaseError, match="no cgroup for container xyz"):
        cpuacct.cgroup_of("xyz", str(tmp_path))


def test_a_measurement_is_the_cpu_per_request_of_each_cgroup(monkeypatch):
    usage = {"a": iter([1000, 3001000]), "q": iter([0, 1000000])}
    monkeypatch.setattr(in_cluster, "cpu_ns", lambda cgroup: next(usage[cgroup]))
    monkeypatch.setattr(in_cluster, "wrk", lambda url, c, s, headers: {"requests": 1000, "url": url, "c": c})
    r = in_cluster.measure("http://x/", SimpleNamespace(connections=70, seconds=1), {"app": "a", "qp": "q"})
    assert r["cpu_us_app"] == pytest.approx(3.0) and r["cpu_us_qp"] == pytest.approx(1.0)
    assert (r["url"], r["c"]) == ("http://x/", 70)


def test_the_activator_path_carries_the_revisions_headers():
    targets = in_cluster.targets({"ip": "10.244.0.9"}, "10.96.0.40", "hello.qproxy-bench.svc.cluster.local", "hello-1")
    assert targets[:2] == [("app", "http://10.244.0.9:8080/", ()), ("qp", "http://10.244.0.9:8012/", ())]
    assert targets[2] == (
        "activator",
        "http://10.96.0.40:80/",
        (
            "Host: hello.qproxy-bench.svc.cluster.local",
            "Knative-Serving-Namespace: qproxy-bench",
            "Knative-Serving-Revision: hello-1",
        ),
    )


def result(image, path, rps, cpu_app=10.0, cpu_qp=5.0, errors=0):
    return dict(
        image=image,
        path=path,
        rps=rps,
        p50=0.001,
        p90=0.002,
        p99=0.004,
        cpu_us_app=cpu_app,
        cpu_us_qp=cpu_qp,
        cpu_us_activator=1.0,
        errors=errors,
    )


def test_the_summary_tables_take_medians_of_the_rounds():
    rounds = [
        result("go", "qp", 1000),
        result("go", "qp", 3000, errors=2),
        result("go", "qp", 2000),
        result("qproxy", "app", 5000),
    ]
    tries = [
        {"image": "qproxy", "code": 200, "seconds": 1.0},
        {"image": "qproxy", "code": 200, "seconds": 3.0},
        {"image": "qproxy", "code": 502, "seconds": None},
    ]
    text = cluster_report.summary(rounds, tries)
    assert "| go | qp | 2,000 | 1.00 | 2.00 | 4.00 | 10 | 5 | 1 | 0.50 | 2 |" in text
    # The app's own path has no queue-proxy ratio.
    assert "| qproxy | app | 5,000 | 1.00 | 2.00 | 4.00 | 10 | 5 | 1 |  | 0 |" in text
    assert "| go | app |" not in text
    assert "| qproxy | 3 | 2.00 | 3.00 | 1 |" in text
    assert "| go | 0 |" not in text
