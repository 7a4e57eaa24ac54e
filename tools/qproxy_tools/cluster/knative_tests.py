"""Knative Serving's own end-to-end tests, built from the serving module at
the cluster's release, against Knative's Go queue-proxy and against qproxy
on the cluster scripts/cluster starts.

  tests/cluster/knative [--serving v0.50.0|v0.42.2] [--tests named|all|REGEX]
                        [--only go|qproxy] [--packages P,...] [--parallel N] [--merge] [--keep]

--tests named (the default) runs the tests that exercise the queue-proxy
most (NAMED below); all runs every test of test/conformance/api/v1,
test/conformance/runtime, test/e2e and the e2e packages Knative's CI runs
apart after a setting of their own (FEATURES) but those SKIPPED names; a
regular expression runs the tests it matches. Each test runs with the Go
queue-proxy first, then with qproxy; the run fails if a test passes with
the Go queue-proxy and not with qproxy, or, with --only, if a test fails.
A package whose binary cannot list its tests fails the run.

The results, test by test, go to target/cluster/knative-<release>.md (a
table) and .json (--merge updates the last ones, for a rerun of a few);
each package's output to
target/cluster/knative-<release>-<image>-<package>.log. A full run
(--tests all, both queue-proxies, every package) is also recorded in
tests/cluster/results/knative-<release>.json, with the commit it ran, the
day and the serving module's version.

  tests/cluster/knative --table

prints one table of every release's recorded run, with why a test is
skipped or fails with both queue-proxies (EXPLAINED below): the table of
tests/cluster/results/README.md.
"""

import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
import time

from .. import ROOT, arguments
from ..commands import PhaseError, run, wait_until
from ..kubectl import CLUSTER, Kubectl
from ..progress import Progress
from ..repository import git
from ..services import image as built_image
from ..services import service
from . import build, knative
from .node import Node

OUT = os.path.join(ROOT, "target", "cluster")
# Each release's last full run (--tests all, both queue-proxies, every
# package), kept in the repository with the commit it ran.
RECORDS = os.path.join(ROOT, "tests", "cluster", "results")
NAMESPACE = "serving-tests"

say = Progress("knative tests")
kubectl = Kubectl.through_cluster()

# Knative's test packages, by the short name the results use.
PACKAGES = {
    "conformance/api/v1": "./test/conformance/api/v1",
    "conformance/runtime": "./test/conformance/runtime",
    "e2e": "./test/e2e",
    "e2e/initscale": "./test/e2e/initscale",
    "e2e/initcontainers": "./test/e2e/initcontainers",
    "e2e/multicontainerprobing": "./test/e2e/multicontainerprobing",
}


HELLO = built_image("helloworld")

# Packages Knative's CI runs apart, each after a setting of its own
# (test/e2e-tests.sh): the ConfigMap, its values, and a Service the webhook
# refuses until it has them, which proves the hand-off instead of Knative
# CI's 30 s sleep. The setting is put back after the package.
FEATURES = {
    "e2e/initscale": (
        "config-autoscaler",
        {"allow-zero-initial-scale": "true"},
        service("feature-proof", NAMESPACE, {"containers": [HELLO]}, {"autoscaling.knative.dev/initial-scale": "0"}),
    ),
    "e2e/initcontainers": (
        "config-features",
        {"kubernetes.podspec-init-containers": "Enabled"},
        service("feature-proof", NAMESPACE, {"containers": [HELLO], "initContainers": [HELLO]}),
    ),
    "e2e/multicontainerprobing": (
        "config-features",
        {"multi-container-probing": "Enabled"},
        service(
            "feature-proof",
            NAMESPACE,
            {
                "containers": [
                    {**HELLO, "name": "serving", "ports": [{"containerPort": 8080}]},
                    {**HELLO, "name": "sidecar", "readinessProbe": {"tcpSocket": {"port": 8081}}},
                ]
            },
        ),
    ),
}

# The tests that exercise the queue-proxy most: its probes, headers,
# timeouts, breaker, drain, request log, statistics, and the protocols it
# carries.
NAMED = [
    "TestProbeRuntime",
    "TestProbeRuntimeAfterStartup",
    "TestMustHaveHeadersSet",
    "TestShouldHaveHeadersSet",
    "TestProtocols",
    "TestRevisionTimeout",
    "TestSingleConcurrency",
    "TestDestroyPodInflight",
    "TestDestroyPodTimely",
    "TestDestroyPodWithRequests",
    "TestWebSocket",
    "TestWebSocketViaActivator",
    "TestWebSocketGracefulShutdown",
    "TestWebSocketWithTimeout",
    "TestRequestLogs",
    "TestActivatorOverload",
    "TestTargetBurstCapacity",
    "TestFastScaleToZero",
    "TestReadinessAlternatePort",
    "TestReadinessPathAndQuery",
    "TestReadinessGRPCProbe",
    "TestGRPCUnaryPing",
    "TestGRPCStreamingPing",
    "TestGRPCUnaryPingViaActivator",
    "TestGRPCStreamingPingViaActivator",
    "TestHelloHTTP2WithPortNameH2C",
    "TestHelloWorld",
    "TestQueueSideCarResourceLimit",
    "TestMultiContainerReadiness",
    "TestMultiContainerReadinessDifferentProbeTypes",
    "TestMultiContainerProbeStartFailingAfterReady",
]

# Tests never run here, and why.
SKIPPED = {
    "TestEgressTraffic": "it asks an app to reach www.google.com; nothing may leave this machine",
}

# Tests that fail with both queue-proxies on this cluster, and why: what
# the cluster lacks, never the queue-proxy.
EXPLAINED = {}

# What Knative's own CI sets before these tests (test/config/ytt/core in
# the serving module): the request log (TestRequestLogs reads it) and the
# deadline after which a revision that cannot start is failed.
CI_CONFIG = {
    "config-observability": (
        "overlay-config-observability.yaml",
        ("logging.request-log-template", "logging.enable-request-log", "logging.enable-probe-request-log"),
    ),
    "config-deployment": ("overlay-config-deployment.yaml", ("progress-deadline",)),
}

# Resources the tests expect (test/config of the serving module).
TEST_RESOURCES = ("cluster-resources.yaml", "test-resources.yaml", "resource-quota/resource-quota.yaml")


def serving_source(builder, release):
    """The serving module's source at `release`, as its wrapper under
    cluster/serving resolves it."""
    return builder.module_dir("knative.dev/serving", release, f"serving/{release}")


def build_tests(source, release):
    """Each package's test binary (`go test -c -tags e2e`), built as
    Knative builds them: in the serving module itself, with its own go.mod
    and go.sum, which must not change (-mod=readonly; named, it also keeps
    Go from reading the vendor/modules.txt an older module's zip carries
    without the vendored code). Rebuilt only when missing."""
    folder = os.path.join(OUT, "knative-tests", release)
    os.makedirs(folder, exist_ok=True)
    log = os.path.join(OUT, "logs", f"knative-tests-{release}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    binaries = {}
    for name, package in PACKAGES.items():
        out = os.path.join(folder, name.replace("/", "-") + ".test")
        binaries[name] = out
        if os.path.exists(out):
            continue
        say(f"building Knative's {name} tests ({release}, Go module proxy)")
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false"}
        run(
            ["go", "test", "-c", "-tags", "e2e", "-trimpath", "-o", out + ".tmp", package], log=log, env=env, cwd=source
        )
        os.replace(out + ".tmp", out)
    return binaries


def overlay_values(path, keys):
    """The values of `keys` under `data:` in one of Knative's CI overlays
    (plain YAML scalars, single- or double-quoted)."""
    values = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"^  ([\w.-]+): (.*)$", line.rstrip("\n"))
            if not m or m.group(1) not in keys:
                continue
            raw = m.group(2)
            if raw.startswith("'") and raw.endswith("'"):
                values[m.group(1)] = raw[1:-1].replace("''", "'")
            elif raw.startswith('"'):
                values[m.group(1)] = json.loads(raw)
            else:
                values[m.group(1)] = raw
    missing = [k for k in keys if k not in values]
    if missing:
        raise PhaseError(f"{path}: no {', '.join(missing)}")
    return values


def prepare(source):
    """Knative's test namespaces and resources, and the settings its CI
    makes before the tests."""
    say("applying test/config (namespaces, the conformance ConfigMap and Secret, the quota)")
    for name in TEST_RESOURCES:
        with open(os.path.join(source, "test", "config", name)) as f:
            kubectl.apply(f.read())
    for configmap, (overlay, keys) in CI_CONFIG.items():
        values = overlay_values(os.path.join(source, "test", "config", "ytt", "core", overlay), keys)
        kubectl.merge_configmap("knative-serving", configmap, values)


def selection(tests):
    if tests == "named":
        return "^(" + "|".join(NAMED) + ")$"
    if tests == "all":
        return "."
    return tests


RESULT = re.compile(r"^--- (PASS|FAIL|SKIP): (Test\w+) \(([\d.]+)s\)$")
STARTED = re.compile(r"^=== RUN   (Test\w+)$")
CURRENT = re.compile(r"^=== (?:RUN|CONT|NAME|PAUSE)\s+(Test\w+)")
LOGGED = re.compile(r"^    \w+\.go:\d+: (.*)$")


def parse(log):
    """Each top-level test's outcome in a `-test.v` log: pass, fail, skip
    (with the test's last line before it, which says why); for one that
    started and never ended, timeout when the binary's -test.timeout ended
    the run, aborted when something else did (another test's panic)."""
    results, started, timed_out = {}, [], False
    current, last_line = None, {}
    with open(log, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = RESULT.match(line)
            if m:
                result = {"result": m.group(1).lower(), "seconds": float(m.group(3))}
                if result["result"] == "skip" and m.group(2) in last_line:
                    result["why"] = last_line[m.group(2)]
                results[m.group(2)] = result
                continue
            m = CURRENT.match(line)
            if m:
                current = m.group(1)
                if STARTED.match(line):
                    started.append(current)
                continue
            m = LOGGED.match(line)
            if m and current:
                last_line[current] = m.group(1)
            elif line.startswith("panic: test timed out"):
                timed_out = True
    for name in started:
        results.setdefault(name, {"result": "timeout" if timed_out else "aborted", "seconds": None})
    return results


def run_package(binary, name, release, image, pattern, parallel, timeout):
    log = os.path.join(OUT, f"knative-{release}-{image}-{name.replace('/', '-')}.log")
    skip = "^(" + "|".join(SKIPPED) + ")$"
    flags = [
        "-test.v",
        f"-test.timeout={timeout}m",
        f"-test.parallel={parallel}",
        f"-test.run={pattern}",
        f"-test.skip={skip}",
        f"--ingressendpoint={knative.INGRESS_IP}",
        "--dockerrepo=ko.local",
        "--tag=e2e",
        f"--ingress-class={knative.INGRESS_CLASS}",
        "--disable-logstream",
        "--enable-beta",
    ]
    # Even with --ingressendpoint, Knative's spoofing client reads the
    # gateway Service and swaps a port it lists for that port's NodePort.
    # Traefik's Services list port 80 without a NodePort, so the client is
    # pointed at `default/kubernetes`, which lists only 443 (--https is
    # never set): port 80 goes to Traefik's address as it is.
    env = {
        **os.environ,
        "SYSTEM_NAMESPACE": "knative-serving",
        "GATEWAY_OVERRIDE": "kubernetes",
        "GATEWAY_NAMESPACE_OVERRIDE": "default",
    }
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env.pop(proxy, None)
    say(f"{image}: Knative's {name} tests (log: {os.path.relpath(log, ROOT)})")
    started = time.monotonic()
    with open(log, "w") as f:
        done = subprocess.run([CLUSTER, "run", "--", binary, *flags], stdout=f, stderr=subprocess.STDOUT, env=env)
    results = parse(log)
    # A binary that fails before its first test (a flag, TestMain, the
    # cluster's endpoint) has no result to show: that is a failure of its
    # own, never an empty pass.
    if done.returncode != 0 and not any(r["result"] != "pass" and r["result"] != "skip" for r in results.values()):
        results[f"({name} binary)"] = {"result": "fail", "seconds": None}
    say(
        f"{image}: {name}: {sum(r['result'] == 'pass' for r in results.values())} passed, "
        f"{sum(r['result'] == 'fail' for r in results.values())} failed, "
        f"{sum(r['result'] == 'skip' for r in results.values())} skipped in {time.monotonic() - started:.0f} s"
    )
    return results


def table(release, results, images):
    lines = [
        f"# Knative Serving {release}'s own tests: the Go queue-proxy and qproxy",
        "",
        "| package | test | " + " | ".join(images) + " |",
        "|---|---|" + "---|" * len(images),
    ]
    keys = sorted({k for image in images for k in results.get(image, {})})
    for key in keys:
        package, test = key.split(":", 1)
        cells = []
        for image in images:
            r = results.get(image, {}).get(key)
            cells.append(r["result"] if r else "not run")
        lines.append(f"| {package} | `{test}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def record_path(release):
    return os.path.join(RECORDS, f"knative-{release}.json")


def read_record(release):
    """A release's recorded full run, or None."""
    try:
        with open(record_path(release)) as f:
            return json.load(f)
    except OSError:
        return None


def records():
    """Every release's record, or None where it has none."""
    return {release: read_record(release) for release in build.SERVINGS}


def results_page(found):
    """tests/cluster/results/README.md: what the records are, then the
    table of them all."""
    return (
        "# Knative's own tests, with Go's queue-proxy and with qproxy\n\n"
        "The last full run of each Knative release on this project's cluster (`tests/cluster/knative --tests "
        "all`: every test of Knative's conformance and e2e packages that runs here, first with Knative's Go "
        "queue-proxy, then with qproxy), recorded in `knative-<release>.json` beside this page with the commit "
        "it ran, its day and the serving module's version. This page is `tests/cluster/knative --table`; "
        "`tools/tests` checks that it is. Why some of Knative's packages do not run here: "
        "[tests/cluster/README.md](../README.md#knatives-own-tests).\n\n" + combined_table(found)
    )


def combined_table(records):
    """One row per test, a column per release and queue-proxy, from each
    release's record; a last column says why a test is skipped (Knative's
    own words) or fails with both (EXPLAINED). Above it, the run each
    release's columns come from."""
    found = {release: record for release, record in records.items() if record}
    columns = [(release, image) for release in found for image in ("go", "qproxy")]
    generation = {build.SERVINGS[0]: "current", build.SERVINGS[-1]: "classic"}
    names = {"go": "Go", "qproxy": "qproxy"}
    lines = []
    for release, record in found.items():
        counts = "; ".join(
            f"{names[image]}: "
            + ", ".join(f"{n} {k}" for k, n in sorted(tally(record["results"].get(image, {})).items()))
            for image in ("go", "qproxy")
        )
        lines.append(
            f"- {generation.get(release, release)} ({record['module']}): run {record['date']} at "
            f"{record['commit'][:10]}{' (uncommitted changes)' if record.get('dirty') else ''}; {counts}"
        )
    lines += [
        "",
        "| package | test | "
        + " | ".join(f"{generation.get(release, release)}, {names[image]}" for release, image in columns)
        + " | why |",
        "|---|---|" + "---|" * len(columns) + "---|",
    ]
    keys = sorted({k for record in found.values() for by_image in record["results"].values() for k in by_image})
    for key in keys:
        package, test = key.split(":", 1)
        cells, why = [], []
        for release, image in columns:
            r = found[release]["results"].get(image, {}).get(key)
            cells.append(r["result"] if r else "–")
            if r and r.get("why") and r["why"] not in why:
                why.append(r["why"])
        if test in EXPLAINED:
            why.insert(0, EXPLAINED[test])
        lines.append(f"| {package} | `{test}` | " + " | ".join(cells) + " | " + "; ".join(why) + " |")
    return "\n".join(lines) + "\n"


def tally(results):
    """{outcome: how many tests had it}."""
    counts = {}
    for r in results.values():
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    return counts


def record(release, module, tests, results):
    """What a full run is recorded with: the commit it ran (and whether
    the tree had changes beside it), the day, the serving module's version."""
    changes = [
        line
        for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
        if not line[3:].startswith("tests/cluster/results/")
    ]
    return {
        "serving": release,
        "module": module,
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(changes),
        "date": datetime.date.today().isoformat(),
        "tests": tests,
        "results": results,
    }


def main():
    parser = arguments.parser("tests/cluster/knative", __doc__)
    parser.add_argument("--serving", choices=build.SERVINGS, default=build.SERVINGS[0])
    parser.add_argument("--tests", default="named", help="named, all, or a regular expression")
    parser.add_argument("--only", choices=("go", "qproxy"))
    parser.add_argument("--packages", default=",".join(PACKAGES), help="which of Knative's test packages")
    parser.add_argument("--parallel", type=int, default=4, help="tests at once within a package")
    parser.add_argument("--timeout", type=int, default=90, help="minutes per package and queue-proxy")
    parser.add_argument("--keep", action="store_true", help="leave the cluster up")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="update the release's last results with this run's instead of replacing them",
    )
    parser.add_argument("--table", action="store_true", help="print every release's recorded results as one table")
    args = parser.parse_args()
    if args.table:
        print(results_page(records()), end="")
        return 0
    if os.geteuid() != 0:
        print("tests/cluster/knative: needs root (scripts/cluster)", file=sys.stderr)
        return 1
    packages = [p for p in args.packages.split(",") if p]
    unknown = [p for p in packages if p not in PACKAGES]
    if unknown:
        print(
            f"tests/cluster/knative: unknown package {', '.join(unknown)} (one of {', '.join(PACKAGES)})",
            file=sys.stderr,
        )
        return 2

    builder = build.Builder(Node(OUT))
    try:
        source = serving_source(builder, args.serving)
        module = f"knative.dev/serving {builder.module_version('knative.dev/serving', f'serving/{args.serving}')}"
        binaries = build_tests(source, args.serving)
        pattern = selection(args.tests)
        # The packages with a test the selection names, listed once for
        # both queue-proxies; a list that cannot be read fails the run.
        chosen = [name for name in packages if listed(binaries[name], pattern)]
    except PhaseError as error:
        print(f"tests/cluster/knative: {error}" + (f"; its log: {error.log}" if error.log else ""), file=sys.stderr)
        return 1

    was_up = subprocess.run([CLUSTER, "status"], stdout=subprocess.DEVNULL).returncode == 0
    if subprocess.run([CLUSTER, "up", "--serving", args.serving], stdout=subprocess.DEVNULL).returncode != 0:
        return 1
    images = [args.only] if args.only else ["go", "qproxy"]
    results = {}
    try:
        prepare(source)
        for queue in images:
            use(queue)
            results[queue] = {}
            for name in chosen:
                with feature(name):
                    found = run_package(binaries[name], name, args.serving, queue, pattern, args.parallel, args.timeout)
                results[queue].update({f"{name}:{test}": r for test, r in found.items()})
    except PhaseError as error:
        print(f"tests/cluster/knative: {error}", file=sys.stderr)
        return 1
    finally:
        # What ran is kept, even when a later part could not run.
        path = os.path.join(OUT, f"knative-{args.serving}.json")
        if args.merge and os.path.exists(path):
            with open(path) as f:
                earlier = json.load(f)
            for queue, found in results.items():
                earlier.setdefault(queue, {}).update(found)
            results = earlier
        with open(path, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
        with open(os.path.join(OUT, f"knative-{args.serving}.md"), "w") as f:
            f.write(table(args.serving, results, images))
        if not (was_up or args.keep):
            subprocess.run([CLUSTER, "down"])
    full = args.tests == "all" and not args.only and not args.merge and packages == list(PACKAGES)
    if full and all(results.get(queue) for queue in images):
        os.makedirs(RECORDS, exist_ok=True)
        with open(record_path(args.serving), "w") as f:
            json.dump(record(args.serving, module, args.tests, results), f, indent=1, sort_keys=True)
            f.write("\n")
        say(f"recorded: {os.path.relpath(record_path(args.serving), ROOT)}")
    return verdict(results, images)


def listed(binary, pattern):
    """The tests of a package's binary that `pattern` selects and that
    are not SKIPPED (the binary lists them without running any). A binary
    that cannot list its tests is a failure, never an empty package."""
    done = subprocess.run([binary, "-test.list", pattern], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise PhaseError(f"{os.path.basename(binary)} -test.list: {last}")
    return [t for t in done.stdout.split() if t.startswith("Test") and t not in SKIPPED]


@contextlib.contextmanager
def feature(package):
    """The setting `package` needs (FEATURES), made and proven taken
    before it runs, and put back after."""
    if package not in FEATURES:
        yield
        return
    configmap, values, manifest = FEATURES[package]
    data = kubectl.json("-n", "knative-serving", "get", "configmap", configmap).get("data", {})
    before = {k: data.get(k) for k in values}

    def accepted():
        """Whether the webhook accepts the proof (a server-side dry run)."""
        return kubectl.ok("apply", "--dry-run=server", "-f", "-", stdin=manifest)

    # Whether the setting as it was lets the proof in: what to wait for
    # once it is put back.
    was_accepted = accepted()
    say(f"{package}: {configmap} {json.dumps(values)}")
    kubectl.merge_configmap("knative-serving", configmap, values)
    try:
        wait_until(f"the webhook taking {configmap}'s {', '.join(values)}", accepted, 120)
        yield
    finally:
        # A key that was absent is removed again (null in a merge patch).
        kubectl.merge_configmap("knative-serving", configmap, before)
        wait_until(
            f"the webhook putting back {configmap}'s {', '.join(values)}", lambda: accepted() == was_accepted, 120
        )


def use(queue):
    """Switches queue-sidecar-image, and proves the switch with a canary
    revision created after it: its pod must run the image."""
    done = subprocess.run([CLUSTER, "use", queue], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise PhaseError(f"scripts/cluster use {queue} failed")
    ref = done.stdout.strip().splitlines()[-1]
    canary = service("queue-proxy-canary", NAMESPACE, {"containers": [HELLO]})
    kubectl("-n", NAMESPACE, "delete", "ksvc", "queue-proxy-canary", "--ignore-not-found", "--wait=true")
    kubectl.apply(canary)
    kubectl("-n", NAMESPACE, "wait", "--for=condition=Ready", "ksvc/queue-proxy-canary", "--timeout=300s")
    images = kubectl(
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-l",
        "serving.knative.dev/service=queue-proxy-canary",
        "-o",
        "jsonpath={.items[*].spec.containers[?(@.name=='queue-proxy')].image}",
    )
    kubectl("-n", NAMESPACE, "delete", "ksvc", "queue-proxy-canary", "--wait=false")
    if ref not in images.split():
        raise PhaseError(f"a revision created after `scripts/cluster use {queue}` runs {images!r}, not {ref}")
    say(f"queue-proxy: {ref} (a new revision's pod runs it)")


# Outcomes that fail a test: it failed, the binary's timeout ended it, or
# something else ended its binary first.
FAILED = ("fail", "timeout", "aborted")


def verdict(results, images, out=sys.stderr):
    """The run's exit status: 1 when a test binary could not run at all;
    with both queue-proxies, when a test passes with the Go queue-proxy and
    not with qproxy; with one (--only), when any of its tests fails."""
    status = 0
    for queue in images:
        for key in sorted(results.get(queue, {})):
            if key.endswith("binary)"):
                print(f"BROKEN: {key} with {queue}: the binary ended before its first test", file=out)
                status = 1
    if len(images) == 2:
        for key, r in sorted(results.get("go", {}).items()):
            ours = results.get("qproxy", {}).get(key)
            if r["result"] == "pass" and (ours is None or ours["result"] != "pass"):
                print(
                    f"DIFFERENT: {key}: passes with the Go queue-proxy, {ours['result'] if ours else 'not run'} "
                    "with qproxy",
                    file=out,
                )
                status = 1
    else:
        for queue in images:
            for key, r in sorted(results.get(queue, {}).items()):
                if r["result"] in FAILED and not key.endswith("binary)"):
                    print(f"FAILED: {key} with {queue}: {r['result']}", file=out)
                    status = 1
    for queue in images:
        print(f"{queue}: " + ", ".join(f"{n} {k}" for k, n in sorted(tally(results.get(queue, {})).items())))
    return status
