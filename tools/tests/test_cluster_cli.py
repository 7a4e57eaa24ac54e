import os
import sys
from types import SimpleNamespace

import pytest

from qproxy_tools import oci_image
from qproxy_tools.cluster import build, cli, node_config
from qproxy_tools.commands import PhaseError

# `ctr images ls` as containerd prints it (digests shortened).
LISTING = "\n".join(
    [
        "REF                       TYPE                                       DIGEST          SIZE    PLATFORMS"
        "                  LABELS",
        "ko.local/qproxy:0.1.0-abc application/vnd.oci.image.index.v1+json    sha256:853aca52 5.2 MiB "
        "linux/amd64,linux/arm64/v8 io.cri-containerd.image=managed",
        "ko.local/helloworld:e2e   application/vnd.oci.image.manifest.v1+json sha256:0c1d7d1b 2.1 MiB "
        "linux/amd64                -",
    ]
)


def test_the_platforms_of_an_index_containerd_holds():
    assert cli.held_platforms(LISTING, "ko.local/qproxy:0.1.0-abc") == ["linux/amd64", "linux/arm64/v8"]
    # One image, not an index; and one containerd does not hold.
    assert cli.held_platforms(LISTING, "ko.local/helloworld:e2e") is None
    assert cli.held_platforms(LISTING, "ko.local/other:1") is None


def test_the_name_and_platforms_an_archive_gives(tmp_path):
    binaries = {}
    for arch in ("amd64", "arm64", "ppc64le"):
        path = tmp_path / arch
        path.write_bytes(b"\x7fELF")
        binaries[arch] = str(path)
    several = str(tmp_path / "index.tar")
    files, _ = oci_image.build_index(binaries, "qproxy", "qproxy:1.0", "1.0", 0)
    oci_image.write_archive(several, files, 0)
    assert cli.archive_image(several) == (
        "docker.io/library/qproxy:1.0",
        ["linux/amd64", "linux/arm64/v8", "linux/ppc64le"],
    )
    one = str(tmp_path / "one.tar")
    files, _ = oci_image.build_index({"amd64": binaries["amd64"]}, "qproxy", "qproxy:1.0", "1.0", 0)
    oci_image.write_archive(one, files, 0)
    assert cli.archive_image(one) == ("docker.io/library/qproxy:1.0", [])


def test_the_image_carries_this_machine_first_then_the_others_asked_for():
    assert build.image_platforms({})[0] == build.ARCH
    assert build.image_platforms({})[1:] == [a for a in ("arm64", "ppc64le") if a != build.ARCH]
    assert build.image_platforms({"QPROXY_MULTIARCH": ""}) == [build.ARCH]
    assert build.image_platforms({"QPROXY_MULTIARCH": f"{build.ARCH} arm64"}) == [build.ARCH] + (
        [] if build.ARCH == "arm64" else ["arm64"]
    )


def test_the_environment_run_passes_on_is_merged_and_kept_sorted(tmp_path, monkeypatch):
    env_file = tmp_path / "env"
    monkeypatch.setattr(cli, "ENV_FILE", str(env_file))
    assert cli.load_env() == {}
    cli.save_env(serving="v0.50.0", queue_image="q:1")
    cli.save_env(queue_image="q:2")
    assert env_file.read_text() == "QPROXY_CLUSTER_QUEUE_IMAGE=q:2\nQPROXY_CLUSTER_SERVING=v0.50.0\n"
    assert cli.load_env() == {"QPROXY_CLUSTER_QUEUE_IMAGE": "q:2", "QPROXY_CLUSTER_SERVING": "v0.50.0"}


def test_the_installed_serving_release(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "SERVING_FILE", str(tmp_path / "serving"))
    assert cli.installed_serving() is None
    (tmp_path / "serving").write_text("v0.42.2\n")
    assert cli.installed_serving() == "v0.42.2"


class FakeNode:
    def __init__(self, alive, kubeconfig, ctr=None, logs=None):
        self.alive_names, self.kubeconfig, self.ctr_argv, self.logs = alive, kubeconfig, ctr, logs

    def alive(self, name):
        return name in self.alive_names

    def ctr(self):
        return list(self.ctr_argv)

    def log(self, name):
        return os.path.join(self.logs, name + ".log")


def test_no_cluster_runs_when_a_process_is_dead_or_the_kubeconfig_is_missing(tmp_path, monkeypatch):
    def no_setns(path):
        raise AssertionError("the namespace is not entered")

    monkeypatch.setattr(cli, "setns", no_setns)
    assert not cli.running(FakeNode({"etcd"}, str(tmp_path / "kubeconfig")))
    every = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
    every |= {"containerd", "kubelet", "kube-proxy", "coredns"}
    assert not cli.running(FakeNode(every, str(tmp_path / "missing")))


# A stand-in for containerd's ctr: writes each call's arguments as a line
# of $CTR_LOG; `images ls -q` lists $CTR_HAVE, `images ls name==REF` the
# listing in $CTR_LISTING.
CTR = """#!/bin/sh
echo "$*" >> "$CTR_LOG"
case "$*" in
  *"images ls -q") printf '%s\\n' $CTR_HAVE ;;
  *"images ls name=="*) cat "$CTR_LISTING" ;;
esac
"""


@pytest.fixture
def ctr(tmp_path, monkeypatch):
    path = tmp_path / "ctr"
    path.write_text(CTR)
    path.chmod(0o755)
    log = tmp_path / "ctr.log"
    monkeypatch.setenv("CTR_LOG", str(log))
    monkeypatch.setenv("CTR_HAVE", "")
    listing = tmp_path / "listing"
    listing.write_text(LISTING)
    monkeypatch.setenv("CTR_LISTING", str(listing))
    (tmp_path / "logs").mkdir()
    node = FakeNode(set(), "", [str(path), "-n", "k8s.io"], str(tmp_path / "logs"))
    return node, lambda: log.read_text().splitlines()


def index_archive(tmp_path, tag="qproxy:1.0"):
    binaries = {}
    for arch in ("amd64", "arm64"):
        path = tmp_path / arch
        path.write_bytes(b"\x7fELF")
        binaries[arch] = str(path)
    archive = str(tmp_path / "qproxy.tar")
    files, _ = oci_image.build_index(binaries, "qproxy", tag, "1.0", 0)
    oci_image.write_archive(archive, files, 0)
    return archive


def test_an_image_is_imported_tagged_and_checked_as_an_index(tmp_path, ctr, monkeypatch):
    node, calls = ctr
    ref = "ko.local/qproxy:0.1.0-abc"
    archive = index_archive(tmp_path)
    cli.import_images(node, [(archive, ref)])
    assert calls() == [
        "-n k8s.io images ls -q",
        f"-n k8s.io images import {archive}",
        f"-n k8s.io images tag --force docker.io/library/qproxy:1.0 {ref}",
        f"-n k8s.io images ls name=={ref}",
    ]
    assert os.path.exists(archive + ".imported")
    # Held and imported since the archive was made: not again.
    monkeypatch.setenv("CTR_HAVE", ref)
    (tmp_path / "ctr.log").write_text("")
    cli.import_images(node, [(archive, ref)])
    assert calls() == ["-n k8s.io images ls -q"]


def test_an_index_held_for_other_platforms_is_an_error(tmp_path, ctr):
    node, _ = ctr
    (tmp_path / "listing").write_text(LISTING.replace("linux/amd64,linux/arm64/v8", "linux/amd64"))
    archive = index_archive(tmp_path)
    with pytest.raises(PhaseError, match=r"containerd holds ko.local/qproxy:0.1.0-abc for \['linux/amd64'\]"):
        cli.import_images(node, [(archive, "ko.local/qproxy:0.1.0-abc")])
    assert not os.path.exists(archive + ".imported")


def test_run_needs_a_cluster_and_a_command(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "NETNS_PATH", str(tmp_path / "netns"))
    with pytest.raises(PhaseError, match="no cluster is up"):
        cli.run(SimpleNamespace(command=["--", "true"]))
    (tmp_path / "netns").write_text("")
    with pytest.raises(PhaseError, match="no command given"):
        cli.run(SimpleNamespace(command=["--"]))


def test_run_execs_the_command_in_the_namespace_with_the_clusters_environment(tmp_path, monkeypatch):
    netns = tmp_path / "netns"
    netns.write_text("")
    entered, execs = [], []
    monkeypatch.setattr(cli, "NETNS_PATH", str(netns))
    monkeypatch.setattr(cli, "setns", entered.append)
    monkeypatch.setattr(cli, "load_env", lambda: {"QPROXY_CLUSTER_SERVING": "v0.50.0"})
    monkeypatch.setattr(cli.os, "execvpe", lambda file, argv, env: execs.append((file, argv, env)))
    cli.run(SimpleNamespace(command=["--", "kubectl", "get", "pods"]))
    assert entered == [str(netns)]
    [(file, argv, env)] = execs
    assert (file, argv) == ("kubectl", ["kubectl", "get", "pods"])
    assert env["QPROXY_CLUSTER_SERVING"] == "v0.50.0"
    assert env["KUBECONFIG"] == os.path.join(cli.BUILD, "kubeconfig")
    assert env["PATH"].startswith(node_config.BIN + os.pathsep)


def test_the_command_needs_root(monkeypatch, capsys):
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sys, "argv", ["scripts/cluster", "status"])
    assert cli.main() == 1
    assert "needs root" in capsys.readouterr().err


def test_a_failed_verb_says_what_failed_and_its_log(monkeypatch, capsys):
    def failing(args):
        raise PhaseError("etcd exited", "/logs/etcd.log")

    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cli, "down", failing)
    monkeypatch.setattr(sys, "argv", ["scripts/cluster", "down"])
    assert cli.main() == 1
    assert capsys.readouterr().err == "scripts/cluster down: etcd exited; its log: /logs/etcd.log\n"


def test_status_says_down_with_exit_status_3(monkeypatch, capsys):
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cli, "running", lambda node: False)
    monkeypatch.setattr(sys, "argv", ["scripts/cluster", "status"])
    assert cli.main() == 3
    assert capsys.readouterr().out == "down\n"


def test_up_and_build_take_a_serving_release(monkeypatch):
    seen = []
    monkeypatch.setattr(cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cli, "build_only", lambda args: seen.append(args.serving))
    monkeypatch.setattr(sys, "argv", ["scripts/cluster", "build", "--serving", build.SERVINGS[-1]])
    assert cli.main() == 0
    monkeypatch.setattr(sys, "argv", ["scripts/cluster", "build"])
    assert cli.main() == 0
    assert seen == [build.SERVINGS[-1], build.SERVINGS[0]]
