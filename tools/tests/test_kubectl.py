import json
import os

import pytest

from qproxy_tools import ROOT
from qproxy_tools.commands import PhaseError
from qproxy_tools.kubectl import Kubectl

# A stand-in for kubectl: prints each argument on a line, then, when one of
# them is "-", what came on stdin; with `-o json` last, a JSON object of its
# arguments; fails with two lines on stderr when an argument is "fail", and
# silently with "quiet-fail".
STAND_IN = """#!/bin/sh
for a in "$@"; do
  case "$a" in
    fail) echo "something went wrong" >&2; echo "error: pods \\"x\\" not found" >&2; exit 3 ;;
    quiet-fail) exit 4 ;;
  esac
done
prev=; last=
for a in "$@"; do prev=$last; last=$a; done
if [ "$prev $last" = "-o json" ]; then
  printf '{"args": "%s", "count": %d}\\n' "$*" $#
  exit 0
fi
printf '%s\\n' "$@"
for a in "$@"; do
  if [ "$a" = "-" ]; then echo "--- stdin"; cat; fi
done
"""


@pytest.fixture
def stand_in(tmp_path):
    path = tmp_path / "kubectl"
    path.write_text(STAND_IN)
    path.chmod(0o755)
    return str(path)


def lines(out):
    return out.splitlines()


def test_arguments_follow_the_fixed_argv_in_order(stand_in):
    kubectl = Kubectl([stand_in, "--kubeconfig", "/k/config"])
    out = kubectl("-n", "default", "get", "pods", 3)
    assert lines(out) == ["--kubeconfig", "/k/config", "-n", "default", "get", "pods", "3"]


def test_the_argv_is_copied(stand_in):
    argv = [stand_in]
    kubectl = Kubectl(argv)
    argv.append("extra")
    assert lines(kubectl("get")) == ["get"]


def test_stdin_is_given_to_kubectl(stand_in):
    out = Kubectl([stand_in])("create", "-f", "-", stdin="kind: Namespace\nname: x\n")
    assert lines(out) == ["create", "-f", "-", "--- stdin", "kind: Namespace", "name: x"]


def test_a_failure_raises_with_the_last_line_of_stderr(stand_in):
    with pytest.raises(PhaseError) as caught:
        Kubectl([stand_in])("get", "pods", "x", "fail", "more")
    assert str(caught.value) == 'kubectl get pods x fail: error: pods "x" not found'
    assert caught.value.log is None


def test_a_failure_without_stderr_says_the_exit_status(stand_in):
    with pytest.raises(PhaseError, match=r"^kubectl quiet-fail: exit status 4$"):
        Kubectl([stand_in])("quiet-fail")


def test_a_failure_unchecked_returns_none(stand_in):
    assert Kubectl([stand_in])("get", "fail", check=False) is None


def test_an_empty_output_is_not_a_failure(tmp_path):
    path = tmp_path / "silent"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    assert Kubectl([str(path)])("delete", "pod", "x", check=False) == ""
    assert Kubectl([str(path)]).ok("delete", "pod", "x")


def test_ok_says_whether_the_command_succeeds(stand_in):
    kubectl = Kubectl([stand_in])
    assert kubectl.ok("get", "pods") is True
    assert kubectl.ok("get", "fail") is False


def test_ok_passes_stdin(stand_in, tmp_path):
    log = tmp_path / "kubectl.log"
    assert Kubectl([stand_in], log).ok("apply", "-f", "-", stdin="the manifest")
    assert "--- stdin\nthe manifest" in log.read_text()


def test_json_appends_output_json_and_decodes(stand_in):
    found = Kubectl([stand_in, "--kubeconfig", "k"]).json("get", "pods")
    assert found == {"args": "--kubeconfig k get pods -o json", "count": 6}


def test_json_unchecked_failure_is_none(stand_in):
    assert Kubectl([stand_in]).json("get", "fail", check=False) is None


def test_json_checked_failure_raises(stand_in):
    with pytest.raises(PhaseError):
        Kubectl([stand_in]).json("get", "fail")


def test_apply_sends_the_manifest_on_stdin(stand_in):
    manifest = '{"kind": "Service"}'
    out = Kubectl([stand_in]).apply(manifest)
    assert lines(out) == ["apply", "-f", "-", "--- stdin", manifest]


def test_merge_configmap_passes_a_json_merge_patch_of_data(stand_in):
    out = Kubectl([stand_in]).merge_configmap("knative-serving", "config-features", {"a": "Enabled", "b": None})
    args = lines(out)
    assert args[:-1] == ["-n", "knative-serving", "patch", "configmap", "config-features", "--type", "merge", "-p"]
    assert json.loads(args[-1]) == {"data": {"a": "Enabled", "b": None}}
    assert '"b": null' in args[-1]


def test_merge_configmap_unchecked_failure_is_none(stand_in):
    assert Kubectl([stand_in]).merge_configmap("fail", "x", {}, check=False) is None


def test_the_log_gets_each_call_and_its_output(stand_in, tmp_path):
    log = tmp_path / "kubectl.log"
    kubectl = Kubectl([stand_in, "--kubeconfig", "k"], log)
    kubectl("get", "pods")
    kubectl("get", "fail", check=False)
    assert log.read_text() == (
        "$ kubectl get pods\n--kubeconfig\nk\nget\npods\n"
        '$ kubectl get fail\nsomething went wrong\nerror: pods "x" not found\n'
    )


def test_a_failure_carries_the_log(stand_in, tmp_path):
    log = tmp_path / "kubectl.log"
    with pytest.raises(PhaseError) as caught:
        Kubectl([stand_in], log)("fail")
    assert caught.value.log == log


def test_on_node_runs_the_binary_with_its_kubeconfig():
    kubectl = Kubectl.on_node("/cache/bin/kubectl", "/build/kubeconfig", log="/logs/k.log")
    assert kubectl.argv == ["/cache/bin/kubectl", "--kubeconfig", "/build/kubeconfig"]
    assert kubectl.log == "/logs/k.log"


def test_through_cluster_runs_kubectl_through_scripts_cluster():
    kubectl = Kubectl.through_cluster()
    assert kubectl.argv == [os.path.join(ROOT, "scripts", "cluster"), "run", "--", "kubectl"]
    assert os.path.isfile(kubectl.argv[0])
    assert kubectl.log is None
