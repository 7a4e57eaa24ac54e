import os
import socket
import subprocess

import pytest

from qproxy_tools.bench import procs


def test_pinning_prefixes_taskset_only_with_a_cpu():
    assert procs.pin(1, ["app", "-x"]) == ["taskset", "-c", "1", "app", "-x"]
    assert procs.pin(0, ["app"]) == ["taskset", "-c", "0", "app"]
    assert procs.pin(None, ["app"]) == ["app"]


def test_a_command_joins_its_cgroup_before_it_execs(tmp_path):
    argv = procs.in_cgroup(str(tmp_path), ["sh", "-c", "echo ran"])
    assert argv[:4] == ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(tmp_path)]
    # A folder stands in for the cgroup: the pid written is the command's own.
    done = subprocess.run(argv + ["$$"], capture_output=True, text=True, check=True)
    assert done.stdout == "ran\n"
    assert (tmp_path / "cgroup.procs").read_text().strip().isdigit()


def test_the_go_queue_proxy_gets_the_certificates_at_knatives_path():
    argv = procs.with_knative_certs("/certs", ["qp"])
    assert argv[:7] == ["unshare", "--mount", "--propagation", "private", "sh", "-c", argv[6]]
    assert "cp /certs/tls.crt /certs/tls.key /var/lib/knative/certs/" in argv[6]
    assert argv[6].endswith('exec "$@"')
    assert argv[7:] == ["sh", "qp"]


def test_cpu_and_memory_of_this_process():
    me = [os.getpid()]
    sum(range(200000))
    assert procs.cpu_ticks(me) >= 0
    assert procs.rss_kib(me) > 0
    assert procs.rss_kib(me, "VmHWM:") >= procs.rss_kib(me)
    steal, total = procs.machine_ticks()
    assert 0 <= steal <= total and total > 0


def test_a_process_that_is_gone_counts_nothing():
    # Above the kernel's largest pid (2^22): never a process.
    gone = [2**22 + 7]
    assert procs.cpu_ticks(gone) == 0
    assert procs.rss_kib(gone) == 0


def test_a_free_port_can_be_bound():
    port = procs.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_wait_for_returns_once_true_and_passes_over_os_errors(monkeypatch):
    monkeypatch.setattr(procs.time, "sleep", lambda s: None)
    answers = iter([OSError("refused"), False, True])

    def cond():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    procs.wait_for("the thing", cond)
    with pytest.raises(StopIteration):
        next(answers)


def test_wait_for_times_out_naming_what_it_waited_for():
    with pytest.raises(RuntimeError, match="timed out waiting for the app"):
        procs.wait_for("the app", lambda: True, timeout=0)


def test_the_app_must_say_hello(monkeypatch):
    monkeypatch.setattr(procs, "get", lambda port: (200, procs.HELLO))
    procs.check_app_answers(1)
    monkeypatch.setattr(procs, "get", lambda port: (200, b"other"))
    with pytest.raises(RuntimeError, match="wrong answer through port 1: 200 b'other'"):
        procs.check_app_answers(1)


def test_time_wait_connections_are_counted_from_ss(monkeypatch):
    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="a\nb\nc\n")

    monkeypatch.setattr(procs.subprocess, "run", fake_run)
    assert procs.time_wait_sockets() == 3
    assert calls == [["ss", "-Htan", "state", "time-wait"]]


def test_ports_settle_once_time_wait_is_below_the_bound(monkeypatch):
    counts = iter([5000, 1500, procs.TIME_WAIT_SETTLED])
    slept = []
    monkeypatch.setattr(procs, "time_wait_sockets", lambda: next(counts))
    monkeypatch.setattr(procs.time, "sleep", slept.append)
    procs.ports_settled()
    assert slept == [1, 1]


def test_ports_that_do_not_settle_are_an_error(monkeypatch):
    monkeypatch.setattr(procs, "time_wait_sockets", lambda: 5000)
    with pytest.raises(RuntimeError, match="5000 connections still in TIME-WAIT after -1 s"):
        procs.ports_settled(timeout=-1)


def test_stop_kills_the_session_and_reaps_it():
    p = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    procs.stop(p)
    assert p.returncode is not None
    # Stopping it again finds nothing to kill.
    procs.stop(p)


def test_the_app_is_started_pinned_on_its_port(monkeypatch):
    started = []

    class FakePopen:
        pid = 4321

        def __init__(self, argv, **kwargs):
            started.append((argv, kwargs))

    monkeypatch.setattr(procs.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(procs, "free_port", lambda: 18777)
    monkeypatch.setattr(procs, "get", lambda port: (200, procs.HELLO))
    p, port = procs.start_app({"app": "/app"}, "pinned")
    assert port == 18777 and p.pid == 4321
    argv, kwargs = started[0]
    assert argv == ["taskset", "-c", "1", "/app", "-addr", "127.0.0.1:18777"]
    assert kwargs["start_new_session"] is True
    procs.start_app({"app": "/app"}, "unpinned")
    assert started[1][0] == ["/app", "-addr", "127.0.0.1:18777"]
