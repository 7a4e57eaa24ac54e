import os

import pytest

from qproxy_tools.commands import PhaseError, run, wait_until

# ---- run ---------------------------------------------------------------------


def test_run_returns_stdout_alone_when_capturing():
    assert run(["sh", "-c", "echo out; echo err >&2"], capture=True) == "out\n"


def test_run_passes_text_input_on_stdin():
    assert run(["cat"], input="hello\n", capture=True) == "hello\n"


def test_run_passes_bytes_input_on_stdin():
    assert run(["cat"], input=b"bytes", capture=True) == "bytes"


def test_run_turns_every_argument_into_text(tmp_path):
    assert run(["sh", "-c", 'echo "$0 $1"', 5, tmp_path], capture=True) == f"5 {tmp_path}\n"


def test_run_uses_cwd_and_env(tmp_path):
    env = {"PATH": os.environ["PATH"], "WHAT": "given"}
    assert run(["sh", "-c", 'echo "$WHAT $(pwd)"'], cwd=tmp_path, env=env, capture=True) == f"given {tmp_path}\n"


def test_run_appends_the_command_and_its_output_to_the_log(tmp_path):
    log = tmp_path / "step.log"
    log.write_text("earlier\n")
    assert run(["sh", "-c", "echo out; echo err >&2"], log=log) == 0
    assert log.read_text() == "earlier\n$ sh -c echo out; echo err >&2\nout\nerr\n"


def test_run_appends_each_call_to_the_same_log(tmp_path):
    log = tmp_path / "step.log"
    run(["echo", "one"], log=log)
    run(["echo", "two"], log=log)
    assert log.read_text() == "$ echo one\none\n$ echo two\ntwo\n"


def test_a_failing_command_raises_naming_it_and_carrying_the_log(tmp_path):
    log = tmp_path / "step.log"
    with pytest.raises(PhaseError) as caught:
        run(["sh", "-c", "echo why >&2; exit 3"], log=log)
    assert str(caught.value) == "sh -c echo why >&2; exit 3 exited 3"
    assert caught.value.log == log
    assert log.read_text().endswith("why\n")


def test_a_failing_command_names_only_its_first_three_arguments():
    with pytest.raises(PhaseError, match=r"^sh -c exit 4 exited 4$"):
        run(["sh", "-c", "exit 4", "ignored", "too"], capture=True)


def test_a_failing_captured_command_says_its_last_stderr_line():
    with pytest.raises(PhaseError) as caught:
        run(["sh", "-c", "echo first >&2; echo second >&2; exit 5"], capture=True)
    assert str(caught.value).endswith("exited 5: second")
    assert caught.value.log is None


def test_a_failing_command_unchecked_returns_its_exit_status(tmp_path):
    assert run(["sh", "-c", "exit 7"], check=False) == 7
    assert run(["sh", "-c", "exit 7"], log=tmp_path / "log", check=False) == 7


def test_a_failing_command_unchecked_and_captured_returns_its_output():
    assert run(["sh", "-c", "echo partial; exit 1"], check=False, capture=True) == "partial\n"


# ---- wait_until --------------------------------------------------------------


def sequence(*values):
    """A condition returning `values` in turn (an exception is raised), and
    the count of its calls."""
    calls = []

    def condition():
        value = values[len(calls)]
        calls.append(value)
        if isinstance(value, BaseException):
            raise value
        return value

    return condition, calls


def test_wait_until_returns_the_first_true_value():
    condition, calls = sequence(0, None, "", [], "found", "later")
    assert wait_until("something", condition, 5, interval=0.001) == "found"
    assert len(calls) == 5


def test_wait_until_returns_at_once_when_already_true():
    condition, calls = sequence({"ready": True})
    assert wait_until("something", condition, 5, interval=10) == {"ready": True}
    assert len(calls) == 1


def test_wait_until_raises_naming_what_was_awaited_after_the_timeout(tmp_path):
    log = tmp_path / "wait.log"
    with pytest.raises(PhaseError) as caught:
        wait_until("the API server answering", lambda: False, 0.3, log=log, interval=0.01)
    assert str(caught.value).startswith("the API server answering: not within")
    assert "last:" not in str(caught.value)
    assert caught.value.log == log


def test_wait_until_retries_a_condition_that_raises():
    condition, calls = sequence(ValueError("not yet"), OSError("still not"), 42)
    assert wait_until("something", condition, 5, interval=0.001) == 42
    assert len(calls) == 3


def test_wait_until_says_the_conditions_last_error_after_the_timeout():
    def condition():
        raise ValueError("connection refused")

    with pytest.raises(PhaseError, match=r"\(last: connection refused\)$"):
        wait_until("the kubelet", condition, 0.3, interval=0.01)


def test_wait_until_lets_a_phase_error_through_at_once():
    condition, calls = sequence(PhaseError("the node died", "node.log"), True)
    with pytest.raises(PhaseError) as caught:
        wait_until("something", condition, 0.3, interval=0.001)
    assert str(caught.value) == "the node died"
    assert caught.value.log == "node.log"
    assert len(calls) == 1
