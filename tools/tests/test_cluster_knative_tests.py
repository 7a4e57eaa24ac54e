import datetime
import io
import os
import re
import subprocess

import pytest

from qproxy_tools import repository
from qproxy_tools.cluster import build, knative_tests
from qproxy_tools.cluster.knative_tests import (
    NAMED,
    combined_table,
    listed,
    overlay_values,
    parse,
    record,
    selection,
    tally,
    verdict,
)
from qproxy_tools.commands import PhaseError

CURRENT, CLASSIC = build.SERVINGS[0], build.SERVINGS[-1]


def parse_text(tmp_path, text):
    log = tmp_path / "go-test.log"
    log.write_text(text)
    return parse(str(log))


# ---- parse -------------------------------------------------------------------


def test_parse_reads_pass_fail_and_skip(tmp_path):
    results = parse_text(
        tmp_path,
        "=== RUN   TestA\n"
        "--- PASS: TestA (0.01s)\n"
        "=== RUN   TestB\n"
        "    b_test.go:10: got 500\n"
        "--- FAIL: TestB (1.50s)\n"
        "=== RUN   TestC\n"
        "--- SKIP: TestC (0.00s)\n"
        "FAIL\n",
    )
    assert results == {
        "TestA": {"result": "pass", "seconds": 0.01},
        "TestB": {"result": "fail", "seconds": 1.5},
        "TestC": {"result": "skip", "seconds": 0.0},
    }


def test_parse_gives_a_skip_the_tests_last_logged_line(tmp_path):
    results = parse_text(
        tmp_path,
        "=== RUN   TestC\n"
        "    c_test.go:5: looking at the cluster\n"
        "    c_test.go:7: Skipping: the feature is disabled\n"
        "--- SKIP: TestC (0.00s)\n",
    )
    assert results["TestC"] == {"result": "skip", "seconds": 0.0, "why": "Skipping: the feature is disabled"}


def test_parse_gives_no_why_to_a_failure(tmp_path):
    results = parse_text(tmp_path, "=== RUN   TestB\n    b_test.go:1: boom\n--- FAIL: TestB (2.00s)\n")
    assert results["TestB"] == {"result": "fail", "seconds": 2.0}


def test_parse_takes_why_from_the_skipped_test_among_parallel_ones(tmp_path):
    results = parse_text(
        tmp_path,
        "=== RUN   TestP\n"
        "=== PAUSE TestP\n"
        "=== RUN   TestQ\n"
        "=== PAUSE TestQ\n"
        "=== CONT  TestP\n"
        "=== CONT  TestQ\n"
        "=== NAME  TestP\n"
        "    p_test.go:3: P's reason\n"
        "=== NAME  TestQ\n"
        "    q_test.go:9: Q's own line\n"
        "--- SKIP: TestP (0.10s)\n"
        "--- PASS: TestQ (0.20s)\n",
    )
    assert results["TestP"]["why"] == "P's reason"
    assert results["TestQ"] == {"result": "pass", "seconds": 0.2}


def test_parse_counts_subtests_for_their_test_only(tmp_path):
    results = parse_text(
        tmp_path,
        "=== RUN   TestD\n"
        "=== RUN   TestD/http1\n"
        "=== RUN   TestD/h2c\n"
        "    --- PASS: TestD/http1 (0.01s)\n"
        "    --- SKIP: TestD/h2c (0.00s)\n"
        "--- PASS: TestD (0.20s)\n",
    )
    assert results == {"TestD": {"result": "pass", "seconds": 0.2}}


def test_parse_does_not_take_an_indented_result_as_the_tests(tmp_path):
    results = parse_text(
        tmp_path,
        "=== RUN   TestE\n"
        "=== RUN   TestE/sub\n"
        "    --- PASS: TestE/sub (0.10s)\n"
        "    --- PASS: TestE (0.10s)\n"
        "panic: test timed out after 90m0s\n",
    )
    assert results == {"TestE": {"result": "timeout", "seconds": None}}


def test_parse_takes_a_test_cut_by_the_timeout_as_timeout(tmp_path):
    results = parse_text(
        tmp_path,
        "=== RUN   TestA\n"
        "--- PASS: TestA (0.01s)\n"
        "=== RUN   TestLong\n"
        "    long_test.go:3: waiting for the revision\n"
        "panic: test timed out after 90m0s\n"
        "\trunning tests:\n"
        "\t\tTestLong (90m0s)\n",
    )
    assert results == {
        "TestA": {"result": "pass", "seconds": 0.01},
        "TestLong": {"result": "timeout", "seconds": None},
    }


def test_parse_takes_a_test_cut_by_anything_else_as_aborted(tmp_path):
    results = parse_text(
        tmp_path,
        "=== RUN   TestX\n"
        "=== PAUSE TestX\n"
        "=== RUN   TestY\n"
        "panic: runtime error: index out of range [1] with length 1\n"
        "goroutine 7 [running]:\n",
    )
    assert results == {
        "TestX": {"result": "aborted", "seconds": None},
        "TestY": {"result": "aborted", "seconds": None},
    }


def test_parse_of_an_empty_log_is_empty(tmp_path):
    assert parse_text(tmp_path, "flag provided but not defined: -nope\n") == {}


# ---- selection ---------------------------------------------------------------


def test_selection_named_matches_exactly_the_named_tests():
    pattern = re.compile(selection("named"))
    assert all(pattern.search(name) for name in NAMED)
    assert not pattern.search("TestProbeRuntimeX")
    assert not pattern.search("XTestHelloWorld")
    assert not pattern.search("TestEgressTraffic")


def test_selection_all_matches_everything():
    assert selection("all") == "."


def test_selection_passes_a_regular_expression_through():
    assert selection("^TestWebSocket") == "^TestWebSocket"


# ---- overlay_values ----------------------------------------------------------

OVERLAY = """#@ load("@ytt:overlay", "overlay")
#@overlay/match by=system_configmap("config-observability"), expects=1
---
#@overlay/match-child-defaults missing_ok=True
data:
  logging.request-log-template: '{"method": "{{.Request.Method}}", "it''s": "quoted"}'
  logging.enable-request-log: "true"
  logging.enable-probe-request-log: "a \\"b\\" c"
  progress-deadline: 600s
  other: not asked for
"""


@pytest.fixture
def overlay(tmp_path):
    path = tmp_path / "overlay-config-observability.yaml"
    path.write_text(OVERLAY)
    return str(path)


def test_overlay_values_reads_a_single_quoted_value(overlay):
    values = overlay_values(overlay, ("logging.request-log-template",))
    assert values == {"logging.request-log-template": '{"method": "{{.Request.Method}}", "it\'s": "quoted"}'}


def test_overlay_values_reads_double_quoted_values(overlay):
    values = overlay_values(overlay, ("logging.enable-request-log", "logging.enable-probe-request-log"))
    assert values == {"logging.enable-request-log": "true", "logging.enable-probe-request-log": 'a "b" c'}


def test_overlay_values_reads_a_plain_value(overlay):
    assert overlay_values(overlay, ("progress-deadline",)) == {"progress-deadline": "600s"}


def test_overlay_values_returns_only_the_keys_asked_for(overlay):
    assert set(overlay_values(overlay, ("progress-deadline", "logging.enable-request-log"))) == {
        "progress-deadline",
        "logging.enable-request-log",
    }


def test_overlay_values_with_a_missing_key_raises_naming_it(overlay):
    with pytest.raises(PhaseError) as caught:
        overlay_values(overlay, ("progress-deadline", "no-such-key", "nor-this"))
    assert str(caught.value) == f"{overlay}: no no-such-key, nor-this"


# ---- verdict and tally -------------------------------------------------------

PASS = {"result": "pass", "seconds": 1.0}
FAIL = {"result": "fail", "seconds": 1.0}
SKIP = {"result": "skip", "seconds": 0.0, "why": "not here"}
TIMEOUT = {"result": "timeout", "seconds": None}
ABORTED = {"result": "aborted", "seconds": None}
BOTH = ["go", "qproxy"]


def test_verdict_fails_a_test_passing_with_go_and_failing_with_qproxy():
    out = io.StringIO()
    results = {"go": {"e2e:TestA": PASS, "e2e:TestB": PASS}, "qproxy": {"e2e:TestA": PASS, "e2e:TestB": FAIL}}
    assert verdict(results, BOTH, out) == 1
    assert out.getvalue() == "DIFFERENT: e2e:TestB: passes with the Go queue-proxy, fail with qproxy\n"


def test_verdict_fails_a_test_passing_with_go_and_missing_with_qproxy():
    out = io.StringIO()
    assert verdict({"go": {"e2e:TestA": PASS}, "qproxy": {}}, BOTH, out) == 1
    assert "e2e:TestA: passes with the Go queue-proxy, not run with qproxy" in out.getvalue()


def test_verdict_fails_a_test_passing_with_go_and_timing_out_with_qproxy():
    out = io.StringIO()
    assert verdict({"go": {"e2e:TestA": PASS}, "qproxy": {"e2e:TestA": TIMEOUT}}, BOTH, out) == 1


def test_verdict_passes_a_test_failing_with_both():
    out = io.StringIO()
    assert verdict({"go": {"e2e:TestA": FAIL}, "qproxy": {"e2e:TestA": FAIL}}, BOTH, out) == 0
    assert out.getvalue() == ""


def test_verdict_passes_a_test_failing_with_go_alone():
    out = io.StringIO()
    assert verdict({"go": {"e2e:TestA": FAIL}, "qproxy": {"e2e:TestA": PASS}}, BOTH, out) == 0


def test_verdict_passes_tests_passing_or_skipped_with_both():
    results = {"go": {"a:TestA": PASS, "a:TestS": SKIP}, "qproxy": {"a:TestA": PASS, "a:TestS": SKIP}}
    assert verdict(results, BOTH, io.StringIO()) == 0


@pytest.mark.parametrize("outcome", [FAIL, TIMEOUT, ABORTED])
def test_verdict_with_one_queue_proxy_fails_a_failed_test(outcome):
    out = io.StringIO()
    assert verdict({"qproxy": {"e2e:TestA": PASS, "e2e:TestB": outcome}}, ["qproxy"], out) == 1
    assert out.getvalue() == f"FAILED: e2e:TestB with qproxy: {outcome['result']}\n"


def test_verdict_with_one_queue_proxy_passes_passes_and_skips():
    out = io.StringIO()
    assert verdict({"go": {"e2e:TestA": PASS, "e2e:TestS": SKIP}}, ["go"], out) == 0
    assert out.getvalue() == ""


def test_verdict_with_one_queue_proxy_ignores_the_other():
    results = {"go": {"e2e:TestA": FAIL}, "qproxy": {"e2e:TestA": PASS}}
    assert verdict(results, ["qproxy"], io.StringIO()) == 0


@pytest.mark.parametrize("images", [BOTH, ["qproxy"]])
def test_verdict_fails_a_binary_that_never_ran(images):
    out = io.StringIO()
    results = {"go": {}, "qproxy": {"e2e/initscale:(e2e/initscale binary)": FAIL}}
    assert verdict(results, images, out) == 1
    assert out.getvalue() == (
        "BROKEN: e2e/initscale:(e2e/initscale binary) with qproxy: the binary ended before its first test\n"
    )


def test_verdict_prints_each_queue_proxys_counts(capsys):
    results = {
        "go": {"a:TestA": PASS, "a:TestB": PASS, "a:TestS": SKIP},
        "qproxy": {"a:TestA": PASS, "a:TestB": FAIL, "a:TestS": SKIP},
    }
    verdict(results, BOTH, io.StringIO())
    assert capsys.readouterr().out == "go: 2 pass, 1 skip\nqproxy: 1 fail, 1 pass, 1 skip\n"


def test_verdict_prints_counts_of_the_chosen_queue_proxy_only(capsys):
    verdict({"go": {"a:TestA": PASS}, "qproxy": {"a:TestA": PASS}}, ["qproxy"], io.StringIO())
    assert capsys.readouterr().out == "qproxy: 1 pass\n"


def test_tally_counts_each_outcome():
    assert tally({"a": PASS, "b": FAIL, "c": PASS, "d": TIMEOUT}) == {"pass": 2, "fail": 1, "timeout": 1}
    assert tally({}) == {}


# ---- combined_table ----------------------------------------------------------


def a_record(release, commit, date, results, dirty=False):
    return {
        "serving": release,
        "module": f"knative.dev/serving {release}",
        "commit": commit,
        "dirty": dirty,
        "date": date,
        "tests": "all",
        "results": results,
    }


def test_combined_table_has_a_run_line_per_release_and_a_row_per_test():
    records = {
        CURRENT: a_record(
            CURRENT,
            "0123456789abcdef",
            "2025-03-01",
            {
                "go": {"e2e:TestA": PASS, "e2e:TestS": {**SKIP, "why": "needs a GPU"}},
                "qproxy": {"e2e:TestA": FAIL, "e2e:TestS": {**SKIP, "why": "needs a GPU"}},
            },
        ),
        CLASSIC: a_record(
            CLASSIC,
            "fedcba9876543210",
            "2025-02-01",
            {"go": {"conformance/runtime:TestB": PASS}, "qproxy": {"conformance/runtime:TestB": PASS}},
            dirty=True,
        ),
    }
    assert combined_table(records) == (
        f"- current (knative.dev/serving {CURRENT}): run 2025-03-01 at 0123456789; "
        "Go: 1 pass, 1 skip; qproxy: 1 fail, 1 skip\n"
        f"- classic (knative.dev/serving {CLASSIC}): run 2025-02-01 at fedcba9876 (uncommitted changes); "
        "Go: 1 pass; qproxy: 1 pass\n"
        "\n"
        "| package | test | current, Go | current, qproxy | classic, Go | classic, qproxy | why |\n"
        "|---|---|---|---|---|---|---|\n"
        "| conformance/runtime | `TestB` | – | – | pass | pass |  |\n"
        "| e2e | `TestA` | pass | fail | – | – |  |\n"
        "| e2e | `TestS` | skip | skip | – | – | needs a GPU |\n"
    )


def test_combined_table_leaves_out_a_release_without_a_record():
    records = {CURRENT: None, CLASSIC: a_record(CLASSIC, "abc", "2025-01-01", {"go": {"e2e:TestA": PASS}})}
    table = combined_table(records)
    assert "current" not in table
    assert "| package | test | classic, Go | classic, qproxy | why |\n" in table
    assert "| e2e | `TestA` | pass | – |  |\n" in table


def test_combined_table_joins_different_whys_once_each():
    records = {
        CURRENT: a_record(
            CURRENT,
            "abc",
            "2025-01-01",
            {"go": {"e2e:TestS": {**SKIP, "why": "one"}}, "qproxy": {"e2e:TestS": {**SKIP, "why": "two"}}},
        ),
        CLASSIC: a_record(CLASSIC, "abc", "2025-01-01", {"go": {"e2e:TestS": {**SKIP, "why": "one"}}}),
    }
    assert combined_table(records).endswith("| e2e | `TestS` | skip | skip | skip | – | one; two |\n")


def test_combined_table_puts_an_explanation_first(monkeypatch):
    monkeypatch.setitem(knative_tests.EXPLAINED, "TestF", "the cluster has no IPv6")
    records = {CURRENT: a_record(CURRENT, "abc", "2025-01-01", {"go": {"e2e:TestF": {**FAIL, "why": "timeout"}}})}
    assert combined_table(records).endswith("| e2e | `TestF` | fail | – | the cluster has no IPv6; timeout |\n")


def test_combined_table_names_an_unknown_release_by_itself():
    records = {"v9.9.9": a_record("v9.9.9", "abc", "2025-01-01", {"go": {}})}
    assert combined_table(records).startswith("- v9.9.9 (knative.dev/serving v9.9.9): run 2025-01-01 at abc; Go: ; ")


# ---- record ------------------------------------------------------------------


def fake_git(monkeypatch, status, head="0123456789abcdef0123456789abcdef01234567"):
    calls = []

    def git(*args):
        calls.append(args)
        if args[0] == "status":
            return status
        if args == ("rev-parse", "HEAD"):
            return head
        raise AssertionError(f"unexpected git {args}")

    monkeypatch.setattr(knative_tests, "git", git)
    return calls


def test_record_has_the_run_and_its_commit(monkeypatch):
    fake_git(monkeypatch, "")
    results = {"go": {"e2e:TestA": PASS}}
    assert record(CURRENT, f"knative.dev/serving {CURRENT}", "all", results) == {
        "serving": CURRENT,
        "module": f"knative.dev/serving {CURRENT}",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "dirty": False,
        "date": datetime.date.today().isoformat(),
        "tests": "all",
        "results": results,
    }


def test_record_asks_git_for_tracked_changes_only(monkeypatch):
    calls = fake_git(monkeypatch, "")
    record(CURRENT, "m", "all", {})
    assert ("status", "--porcelain", "--untracked-files=no") in calls


def test_record_is_dirty_with_a_change_outside_the_results(monkeypatch):
    fake_git(monkeypatch, "M  tests/cluster/results/knative-v0.50.0.json\n M src/main.rs")
    assert record(CURRENT, "m", "all", {})["dirty"] is True


def test_record_is_clean_with_changes_under_the_results_alone(monkeypatch):
    fake_git(monkeypatch, "M  tests/cluster/results/knative-v0.50.0.json\n M tests/cluster/results/README.md")
    assert record(CURRENT, "m", "all", {})["dirty"] is False


def test_record_is_not_fooled_by_a_folder_named_like_the_results(monkeypatch):
    fake_git(monkeypatch, "M  tests/cluster/results-old/x.json")
    assert record(CURRENT, "m", "all", {})["dirty"] is True


def git_repository(path):
    def git(*args):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
            cwd=path,
            check=True,
            capture_output=True,
        )

    git("init", "-q")
    results = path / "tests" / "cluster" / "results"
    results.mkdir(parents=True)
    (results / "knative-v0.50.0.json").write_text("{}\n")
    git("add", ".")
    git("commit", "-q", "-m", "a record")
    return results


def test_record_is_clean_when_only_the_record_itself_is_rewritten(tmp_path, monkeypatch):
    results = git_repository(tmp_path)
    (results / "knative-v0.50.0.json").write_text('{"rewritten": true}\n')
    monkeypatch.setattr(repository, "ROOT", str(tmp_path))
    assert record(CURRENT, "m", "all", {})["dirty"] is False


def test_record_with_real_git_is_dirty_with_a_staged_change(tmp_path, monkeypatch):
    git_repository(tmp_path)
    (tmp_path / "tests" / "other.txt").write_text("x")
    subprocess.run(["git", "add", "tests/other.txt"], cwd=tmp_path, check=True)
    monkeypatch.setattr(repository, "ROOT", str(tmp_path))
    found = record(CURRENT, "m", "all", {})
    assert found["dirty"] is True
    assert len(found["commit"]) == 40


# ---- listed ------------------------------------------------------------------


def executable(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


LISTING = """#!/bin/sh
printf '%s\\n' "$@" > "$(dirname "$0")/args"
printf 'TestA\\nTestEgressTraffic\\nBenchmarkB\\nExampleC\\nFuzzD\\nTestE\\n'
"""


def test_listed_asks_the_binary_to_list_the_pattern(tmp_path):
    binary = executable(tmp_path, "e2e.test", LISTING)
    listed(binary, "^(TestA|TestE)$")
    assert (tmp_path / "args").read_text() == "-test.list\n^(TestA|TestE)$\n"


def test_listed_keeps_tests_and_drops_skipped_ones_and_others(tmp_path):
    binary = executable(tmp_path, "e2e.test", LISTING)
    assert "TestEgressTraffic" in knative_tests.SKIPPED
    assert listed(binary, ".") == ["TestA", "TestE"]


def test_listed_of_a_binary_listing_nothing_is_empty(tmp_path):
    assert listed(executable(tmp_path, "empty.test", "#!/bin/sh\nexit 0\n"), ".") == []


def test_listed_raises_when_the_binary_cannot_list(tmp_path):
    binary = executable(
        tmp_path, "broken.test", "#!/bin/sh\necho TestA\necho 'first' >&2\necho 'cannot read flags' >&2\nexit 2\n"
    )
    with pytest.raises(PhaseError, match=r"^broken\.test -test\.list: cannot read flags$"):
        listed(binary, ".")


def test_listed_raises_with_the_exit_status_when_the_binary_says_nothing(tmp_path):
    binary = executable(tmp_path, "silent.test", "#!/bin/sh\nexit 3\n")
    with pytest.raises(PhaseError, match=r"^silent\.test -test\.list: exit status 3$"):
        listed(binary, ".")


def test_the_committed_results_page_is_what_the_records_make():
    page = os.path.join(knative_tests.RECORDS, "README.md")
    if not os.path.exists(page):
        pytest.skip("no results recorded yet")
    with open(page) as f:
        assert f.read() == knative_tests.results_page(knative_tests.records())
