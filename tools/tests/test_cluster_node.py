import json
import os
import subprocess

import pytest

from qproxy_tools.cluster import api, cgroups, components, netns, node, node_config, pki, supervisor
from qproxy_tools.commands import PhaseError, wait_until


def test_the_namespace_has_the_node_address_the_service_route_and_no_way_out():
    commands = netns.commands()
    assert commands[0] == ["ip", "netns", "add", node_config.NETNS]
    ns = ["ip", "-n", node_config.NETNS]
    assert ns + ["addr", "add", f"{node_config.NODE_IP}/24", "dev", "node0"] in commands
    route = ns + ["route", "add", node_config.SERVICE_CIDR, "dev", "node0", "src", node_config.NODE_IP]
    assert route in commands
    # The default route is the last route: unreachable.
    assert commands.index(ns + ["route", "add", "unreachable", "default"]) == commands.index(route) + 1
    sysctls = [c[-1] for c in commands if "sysctl" in c]
    assert sysctls == [f"{k}={v}" for k, v in netns.SYSCTLS.items()]
    assert "net.bridge.bridge-nf-call-iptables=1" in sysctls


def test_making_the_namespace_runs_each_command_into_the_log(monkeypatch):
    ran = []
    monkeypatch.setattr(netns, "run", lambda argv, log: ran.append((argv, log)))
    netns.make("/logs/network.log")
    assert ran == [(c, "/logs/network.log") for c in netns.commands()]


def test_a_kernel_without_bridge_netfilter_is_refused(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(netns, "run", lambda argv, log, check: ran.append(argv))
    with pytest.raises(PhaseError, match="no bridge netfilter"):
        netns.check_bridge_netfilter("/l", str(tmp_path / "bridge"))
    assert ran == [["modprobe", "br_netfilter"]]
    ran.clear()
    netns.check_bridge_netfilter("/l", str(tmp_path))
    assert ran == []


def test_v1_cgroups_are_needed(tmp_path):
    cgroups.check(str(tmp_path), list(cgroups.NEEDED) + ["systemd"])
    with pytest.raises(PhaseError, match="no v1 cgroup hierarchy for freezer under"):
        cgroups.check(str(tmp_path), [c for c in cgroups.NEEDED if c != "freezer"])
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    with pytest.raises(PhaseError, match="cgroup v2 hierarchy"):
        cgroups.check(str(tmp_path), list(cgroups.NEEDED))


def test_the_nodes_cgroups_and_cpusets_inherit_their_parents_cpus(tmp_path):
    (tmp_path / "cpuset").mkdir()
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-1\n")
    (tmp_path / "cpuset" / "cpuset.mems").write_text("0\n")
    cgroups.make(str(tmp_path), ["cpuset", "memory"])
    own = tmp_path / "cpuset" / node_config.CGROUP
    assert (own / "cpuset.cpus").read_text() == "0-1"
    assert (own / "system" / "cpuset.cpus").read_text() == "0-1"
    assert (own / "system" / "cpuset.mems").read_text() == "0"
    assert (tmp_path / "memory" / node_config.CGROUP / "system").is_dir()
    cgroups.join_system(4242, str(tmp_path), ["cpuset", "memory"])
    assert (own / "system" / "cgroup.procs").read_text() == "4242"
    assert (tmp_path / "memory" / node_config.CGROUP / "system" / "cgroup.procs").read_text() == "4242"


def test_every_certificate_is_server_or_client_and_the_api_servers_names_its_service():
    certs = pki.certificates()
    assert {usage for *_, usage in certs.values()} == {"server", "client"}
    subject, dns, ips, usage = certs["apiserver"]
    assert usage == "server" and node_config.API_SERVICE_IP in ips and node_config.NODE_IP in ips
    assert f"kubernetes.default.svc.{node_config.CLUSTER_DOMAIN}" in dns
    assert certs["kubelet"][0] == f"/O=system:nodes/CN=system:node:{node_config.NODE_NAME}"
    assert set(pki.KUBECONFIG_USERS) <= set(certs)


def test_certificate_extensions():
    assert pki.extensions(["a"], ["10.0.0.1"], "server") == (
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:a,IP:10.0.0.1\n"
    )
    assert pki.extensions([], [], "client").endswith("extendedKeyUsage=clientAuth\n")


def test_a_kubeconfig_names_its_users_certificate():
    config = pki.kubeconfig("scheduler", "/p")
    assert config["clusters"][0]["cluster"] == {"server": node_config.API_SERVER, "certificate-authority": "/p/ca.crt"}
    assert config["users"] == [
        {"name": "scheduler", "user": {"client-certificate": "/p/scheduler.crt", "client-key": "/p/scheduler.key"}}
    ]
    assert config["current-context"] == "qproxy"


def test_the_pki_makes_what_is_missing_and_every_kubeconfig(monkeypatch, tmp_path):
    ran = []

    def fake_run(argv, log):
        ran.append(argv)
        out = argv[argv.index("-out") + 1]
        with open(out, "w"):
            pass

    monkeypatch.setattr(pki, "run", fake_run)
    folder, etc, admin = tmp_path / "pki", tmp_path / "etc", tmp_path / "kubeconfig"
    (folder).mkdir()
    (folder / "admin.crt").write_text("kept")
    p = pki.Pki(str(folder), str(etc), str(admin))
    p.make("/l")
    signed = [a[a.index("-out") + 1] for a in ran if a[1] == "x509"]
    assert len(signed) == len(pki.certificates()) - 1
    assert str(folder / "admin.crt") not in signed
    assert (folder / "admin.crt").read_text() == "kept"
    assert "subjectAltName=DNS:kubernetes" in (folder / "apiserver.ext").read_text()
    assert ran[0] == ["openssl", "genrsa", "-out", str(folder / "ca.key"), "2048"]
    # Admin's kubeconfig is the cluster's; the others stay in etc.
    assert json.loads(admin.read_text())["users"][0]["name"] == "admin"
    assert sorted(os.listdir(etc)) == sorted(f"{u}.kubeconfig" for u in pki.KUBECONFIG_USERS if u != "admin")
    ran.clear()
    p.make("/l")
    assert [a for a in ran if a[1] == "x509"] == []


def test_a_process_runs_in_the_nodes_namespace():
    assert supervisor.Supervisor.command(["kube", "etcd"]) == [
        "nsenter",
        f"--net={node_config.NETNS_PATH}",
        "--",
        "kube",
        "etcd",
    ]


@pytest.fixture
def child(tmp_path):
    """A process of this test's own, its pid in a pids folder."""
    p = subprocess.Popen(["sleep", "60"])
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "sleeper").write_text(str(p.pid))
    yield p
    p.kill()
    p.wait()


def test_a_supervised_process_found_alive_and_its_command_line(tmp_path, child):
    s = supervisor.Supervisor(str(tmp_path / "logs"), str(tmp_path / "pids"))
    assert s.pid("sleeper") == child.pid
    assert s.alive("sleeper")
    # Popen returns before the child's exec has set its arguments.
    assert wait_until("sleep's arguments", lambda: s.arguments("sleeper"), 10, interval=0.01) == ["sleep", "60"]
    assert s.pid("other") is None and not s.alive("other") and s.arguments("other") is None
    assert s.log("etcd") == str(tmp_path / "logs" / "etcd.log")


def test_a_process_whose_arguments_read_empty_has_none(tmp_path):
    # A zombie's cmdline reads empty, as does one still in exec.
    p = subprocess.Popen(["true"])
    p_dir = tmp_path / "pids"
    p_dir.mkdir()
    (p_dir / "done").write_text(str(p.pid))
    s = supervisor.Supervisor(str(tmp_path / "logs"), str(p_dir))
    wait_until("true exited", lambda: open(f"/proc/{p.pid}/stat").read().split(") ")[1][0] == "Z", 10, interval=0.01)
    try:
        assert s.arguments("done") is None
    finally:
        p.wait()


def test_stopping_a_process_ends_it(tmp_path, child):
    s = supervisor.Supervisor(str(tmp_path / "logs"), str(tmp_path / "pids"))
    s.stop("sleeper")
    # It exited on SIGTERM: a zombie until reaped, which counts as gone.
    assert not s.alive("sleeper")
    assert child.wait() == -15
    s.stop("sleeper")


class Recorder(supervisor.Supervisor):
    """A supervisor whose processes are a dict of their arguments."""

    def __init__(self, running):
        super().__init__("/logs", "/pids")
        self.running, self.events = dict(running), []

    def alive(self, name):
        return name in self.running

    def arguments(self, name):
        return self.running.get(name)

    def stop(self, name, timeout=30):
        self.events.append(("stop", name))
        self.running.pop(name, None)

    def start(self, name, args, env=None):
        self.events.append(("start", name))
        self.running[name] = [str(a) for a in args]


def test_a_running_process_with_the_same_arguments_is_kept():
    s = Recorder({"etcd": ["kube", "etcd"]})
    s.started("etcd", ["kube", "etcd"], lambda: True, "etcd")
    assert s.events == []


def test_a_process_with_other_arguments_or_a_changed_configuration_starts_again():
    s = Recorder({"etcd": ["kube", "etcd", "--old"]})
    s.started("etcd", ["kube", "etcd"], lambda: True, "etcd")
    assert s.events == [("stop", "etcd"), ("start", "etcd")]
    s.events.clear()
    s.started("etcd", ["kube", "etcd"], lambda: True, "etcd", changed=True)
    assert s.events == [("stop", "etcd"), ("start", "etcd")]


def test_a_process_that_exits_while_awaited_fails_naming_its_log():
    s = Recorder({})

    def check():
        s.running.clear()
        return False

    with pytest.raises(PhaseError) as caught:
        s.started("kubelet", ["kube", "kubelet"], check, "the node Ready", timeout=5)
    assert str(caught.value) == "kubelet exited"
    assert caught.value.log == "/logs/kubelet.log"


def test_a_node_is_ready_by_its_condition():
    ready = {
        "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]}
    }
    assert api.node_ready(json.dumps(ready))
    ready["status"]["conditions"][1]["status"] = "Unknown"
    assert not api.node_ready(json.dumps(ready))
    assert not api.node_ready("{}")


def test_the_api_client_asks_for_the_nodes_object(monkeypatch):
    client = api.ApiClient("/p")
    asked = []
    monkeypatch.setattr(client, "get", lambda path: asked.append(path) or (404, ""))
    assert not client.node_ready()
    assert asked == [f"/api/v1/nodes/{node_config.NODE_NAME}"]


def test_the_components_command_lines_point_into_the_nodes_files():
    api_server = components.apiserver_args("/bin/kube", "/pki")
    assert api_server[:2] == ["/bin/kube", "kube-apiserver"]
    assert api_server[api_server.index("--tls-cert-file") + 1] == "/pki/apiserver.crt"
    assert api_server[api_server.index("--bind-address") + 1] == node_config.NODE_IP
    etcd = components.etcd_args("/bin/kube")
    assert etcd[etcd.index("--data-dir") + 1] == f"{node_config.STATE}/etcd"
    cm = components.controller_manager_args("/bin/kube", "/pki", "/etc/cm.kubeconfig")
    assert cm.count("/etc/cm.kubeconfig") == 3
    assert cm[cm.index("--cluster-signing-key-file") + 1] == "/pki/ca.key"
    assert components.scheduler_args("k", "/s").count("/s") == 3
    kubelet = components.kubelet_args("k", "/etc", "/etc/kubelet.kubeconfig")
    assert kubelet[kubelet.index("--config") + 1] == "/etc/kubelet.json"
    assert kubelet[kubelet.index("--hostname-override") + 1] == node_config.NODE_NAME


def test_the_node_is_its_parts_in_its_build_folder(tmp_path):
    n = node.Node(str(tmp_path))
    assert n.log("etcd") == str(tmp_path / "logs" / "etcd.log")
    assert n.kubeconfig_of("kubelet") == str(tmp_path / "etc" / "kubelet.kubeconfig")
    assert n.certificates.folder == n.pki == str(tmp_path / "pki")
    assert n.certificates.admin_kubeconfig == n.kubeconfig
    assert n.api_client.pki == n.pki
    assert n.ctr()[1:] == ["--address", f"{node_config.RUN}/containerd/containerd.sock", "-n", "k8s.io"]
    assert n.kubectl().argv == [os.path.join(node_config.BIN, "kubectl"), "--kubeconfig", n.kubeconfig]
    n.write_kubeconfig("scheduler")
    assert json.loads((tmp_path / "etc" / "scheduler.kubeconfig").read_text())["users"][0]["name"] == "scheduler"


def test_the_teardown_removes_the_parts_in_order(monkeypatch, tmp_path):
    done = []
    monkeypatch.setattr(node.cgroups, "kill", lambda: done.append("kill cgroups"))
    monkeypatch.setattr(node.netns, "kill_processes", lambda: done.append("kill netns"))
    monkeypatch.setattr(node.folders, "unmount", lambda log: done.append(("unmount", log)))
    monkeypatch.setattr(node.cgroups, "remove", lambda: done.append("remove cgroups"))
    monkeypatch.setattr(node.netns, "remove", lambda log: done.append(("remove netns", log)))
    monkeypatch.setattr(node.folders, "remove", lambda log: done.append(("remove folders", log)))
    n = node.Node(str(tmp_path))
    monkeypatch.setattr(n.certificates, "remove", lambda: done.append("remove pki"))
    n.teardown()
    assert done == [
        "kill cgroups",
        "kill netns",
        ("unmount", None),
        "remove cgroups",
        ("remove netns", None),
        ("remove folders", None),
        "remove pki",
    ]
    (tmp_path / "logs").mkdir()
    done.clear()
    n.teardown()
    assert done[2] == ("unmount", str(tmp_path / "logs" / "down.log"))


def test_the_machine_check_asks_cgroups_then_the_bridge(monkeypatch, tmp_path):
    done = []
    monkeypatch.setattr(node.cgroups, "check", lambda: done.append("cgroups"))
    monkeypatch.setattr(node.netns, "check_bridge_netfilter", lambda log: done.append(("bridge", log)))
    node.Node(str(tmp_path)).check_machine()
    assert done == ["cgroups", ("bridge", str(tmp_path / "logs" / "network.log"))]
