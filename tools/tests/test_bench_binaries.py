import os
import subprocess
from types import SimpleNamespace

import pytest

from qproxy_tools import ROOT
from qproxy_tools.bench import binaries


@pytest.fixture
def runs(monkeypatch):
    calls = []

    def fake_run(argv, cwd=None, **kwargs):
        calls.append((argv, cwd))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(binaries.subprocess, "run", fake_run)
    return calls


def test_a_given_qproxy_is_not_built(runs):
    assert binaries.qproxy("/tmp/qproxy") == "/tmp/qproxy"
    assert runs == []


def test_qproxy_is_built_release_from_the_workspace(runs):
    assert binaries.qproxy(None) == os.path.join(ROOT, "target", "release", "qproxy")
    assert runs == [(["cargo", "build", "--release", "-p", "qproxy", "--locked"], ROOT)]


def test_the_app_is_built_from_benches_app(runs):
    out = binaries.app()
    assert out == os.path.join(ROOT, "target", "bench", "app")
    assert runs == [(["go", "build", "-o", out, "."], os.path.join(ROOT, "benches", "app"))]


def test_the_tls_pair_is_ecdsa_p256_for_knatives_data_plane_name(runs, tmp_path):
    folder = str(tmp_path / "certs")
    assert binaries.make_certs(folder) == folder
    assert os.path.isdir(folder)
    [(argv, _)] = runs
    assert argv[:7] == ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    assert argv[argv.index("-keyout") + 1] == os.path.join(folder, "tls.key")
    assert argv[argv.index("-out") + 1] == os.path.join(folder, "tls.crt")
    assert argv[argv.index("-subj") + 1] == "/CN=data-plane.knative.dev"
    assert "subjectAltName=DNS:data-plane.knative.dev,DNS:kn-user-default" in argv


def args(**over):
    values = dict(
        qproxy_bin="/q",
        qproxy_env=["A=1"],
        base_bin=None,
        contenders=["direct", "qproxy"],
        loads=[1],
        instructions=0,
        smoke=True,
    )
    values.update(over)
    return SimpleNamespace(**values)


@pytest.fixture
def tools(monkeypatch, runs):
    asked = []

    def require(tools, who):
        asked.append((tools, who))
        return {t: f"/bin/{t}" for t in tools}

    monkeypatch.setattr(binaries, "require_tools", require)
    monkeypatch.setattr(binaries, "app", lambda: "/app")
    return asked


def test_load_1_needs_wrk_only(tools):
    bins = binaries.build(args())
    assert tools == [(["wrk"], "harness")]
    assert bins == {"qproxy": "/q", "qproxy-env": ["A=1"], "app": "/app", "wrk": "/bin/wrk"}


def test_every_contender_and_load_brings_its_tools(tools, monkeypatch, runs, tmp_path):
    monkeypatch.setattr(binaries, "envoy_bin", lambda: "/envoy")
    monkeypatch.setattr(binaries, "make_certs", lambda folder: "/certs")
    bins = binaries.build(
        args(contenders=["qproxy", "go-qp", "nginx", "haproxy", "envoy"], loads=[1, 3, 9], base_bin="/base")
    )
    assert tools == [(["wrk", "h2load", "openssl", "nginx", "haproxy"], "harness")]
    assert bins["qproxy-base"] == "/base" and bins["envoy"] == "/envoy" and bins["certs"] == "/certs"
    go_qp = os.path.join(ROOT, "target", "oracle", "queue-v0.42.2")
    assert bins["go-qp"] == go_qp
    assert ([os.path.join(ROOT, "tests", "oracle", "build.sh"), "v0.42.2", go_qp], None) in runs


def test_counting_instructions_needs_callgrind_and_the_grpc_request(tools, monkeypatch):
    written = {}

    class File:
        def __init__(self, path, mode):
            self.path = path

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, data):
            written[self.path] = data

    monkeypatch.setattr(binaries, "open", File, raising=False)
    bins = binaries.build(args(instructions=100, smoke=False, contenders=["qproxy"]))
    assert tools == [(["wrk", "h2load", "valgrind", "callgrind_control"], "harness")]
    # An empty HealthCheckRequest: a five-byte frame of length 0.
    assert written == {bins["grpc-request"]: bytes(5)}


def test_the_accelerator_needs_root(monkeypatch):
    monkeypatch.setattr(binaries.os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match="run as root"):
        binaries.accel_setup()
