import json
import os
import shutil
import subprocess

import pytest

from qproxy_tools.bench import contenders


def nginx_conf(tmp_path, tls=True):
    certs = tmp_path / "certs"
    tls_text = contenders.config("nginx-tls.conf").format(tls_port=18443, certs=certs) if tls else ""
    return contenders.config("nginx.conf").format(
        tmp=tmp_path, port=18080, h2_port=18081, app=18082, tls=tls_text, connections=4096, files=20000
    )


def haproxy_cfg(tmp_path, tls=True, splice=""):
    pem = tmp_path / "tls.pem"
    tls_text = contenders.config("haproxy-tls.cfg").format(tls_port=18443, pem=pem) if tls else ""
    return contenders.config("haproxy.cfg").format(
        port=18080, h2_port=18081, app=18082, tls=tls_text, splice=splice, connections=4096, files=20000
    )


def envoy_yaml(tmp_path, tls=True):
    tls_text = contenders.config("envoy-tls.yaml").format(tls_port=18443, certs=tmp_path) if tls else ""
    return contenders.config("envoy.yaml").format(port=18080, app=18082, tls=tls_text)


def test_every_configuration_takes_its_fields(tmp_path):
    # A field the harness does not fill in would raise KeyError here.
    for text in (nginx_conf(tmp_path), haproxy_cfg(tmp_path), envoy_yaml(tmp_path)):
        assert "18080" in text and "18082" in text
        assert "18443" in text


def test_nginx_proxies_to_the_app_kept_alive(tmp_path):
    text = nginx_conf(tmp_path, tls=False)
    assert "upstream app { server 127.0.0.1:18082; keepalive 128; }" in text
    assert "listen 127.0.0.1:18081 http2;" in text
    assert "worker_processes 1;" in text


def test_nginx_and_envoy_pass_a_tunnels_upgrade(tmp_path):
    text = nginx_conf(tmp_path, tls=False)
    tunnel = next(line for line in text.splitlines() if "location /tunnel" in line)
    assert "proxy_set_header Upgrade $http_upgrade;" in tunnel
    assert 'proxy_set_header Connection "upgrade";' in tunnel
    assert "upgrade_configs: [{ upgrade_type: websocket }]" in envoy_yaml(tmp_path, tls=False)


def test_haproxy_splice_adds_splice_auto(tmp_path):
    assert "option splice-auto" not in haproxy_cfg(tmp_path, tls=False)
    assert "    option splice-auto\n" in haproxy_cfg(tmp_path, tls=False, splice="    option splice-auto")


def test_haproxy_sends_grpc_over_h2c(tmp_path):
    text = haproxy_cfg(tmp_path, tls=False)
    assert "nbthread 1" in text
    assert "use_backend app_h2c if { req.hdr(content-type) -m beg application/grpc }" in text
    assert "server app 127.0.0.1:18082 proto h2" in text


@pytest.mark.skipif(not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")), reason="nginx not installed")
def test_nginx_accepts_its_configuration(tmp_path):
    (tmp_path / "nginx.conf").write_text(nginx_conf(tmp_path, tls=False))
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    done = subprocess.run([nginx, "-t", "-c", tmp_path / "nginx.conf", "-p", tmp_path], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(not (shutil.which("haproxy") or os.path.exists("/usr/sbin/haproxy")), reason="no haproxy")
def test_haproxy_accepts_its_configuration(tmp_path):
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    for splice in ("", "    option splice-auto"):
        (tmp_path / "haproxy.cfg").write_text(haproxy_cfg(tmp_path, tls=False, splice=splice))
        done = subprocess.run([haproxy, "-c", "-f", tmp_path / "haproxy.cfg"], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_knative_env_is_a_default_revisions_on_the_harness_ports():
    env = contenders.knative_env(user_port=8080, main_port=8012, cc=10, metrics=False)
    assert env["USER_PORT"] == "8080"
    assert env["QUEUE_SERVING_PORT"] == "8012"
    assert env["CONTAINER_CONCURRENCY"] == "10"
    assert env["SERVING_REQUEST_METRICS_BACKEND"] == ""
    probe = json.loads(env["SERVING_READINESS_PROBE"])
    assert probe == {"tcpSocket": {"port": 8080, "host": "127.0.0.1"}, "successThreshold": 1}
    # The classic generation's variables, as the Go queue-proxy v0.42.2 reads them.
    assert "SERVING_NAMESPACE" in env
    assert contenders.knative_env(8080, 8012)["SERVING_REQUEST_METRICS_BACKEND"] == "prometheus"


def test_nginx_and_haproxy_take_the_connections_asked_for(tmp_path):
    nginx = contenders.config("nginx.conf").format(
        tmp=tmp_path, port=1, h2_port=2, app=3, tls="", connections=19000, files=20000
    )
    assert "worker_rlimit_nofile 20000;" in nginx
    assert "events { worker_connections 19000; }" in nginx
    haproxy = contenders.config("haproxy.cfg").format(
        port=1, h2_port=2, app=3, tls="", splice="", connections=19000, files=20000
    )
    assert "    maxconn 19000\n    ulimit-n 20000\n" in haproxy
    assert contenders.descriptor_cap() > 0


def test_haproxy_is_set_to_take_what_its_descriptors_allow():
    cap = contenders.descriptor_cap()
    assert contenders.Contender("haproxy", {}, "unpinned", connections=10**7).capacity() == (cap - 100) // 2
    assert contenders.Contender("haproxy", {}, "unpinned", connections=100).capacity() == 100
    assert contenders.Contender("nginx", {}, "unpinned", connections=19000).capacity() == 19000
