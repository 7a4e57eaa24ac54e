from qproxy_tools import fuzz_corpus

# A merge control file as libFuzzer writes it: the inputs, smallest first,
# then per input the features and the edges it reached first; the last
# input's run never finished.
CONTROL = """4
0
corpus/a
corpus/b
corpus/c
corpus/d
STARTED 0 10
FT 0 1 2 3
COV 0 10 11 12
DONE 0
STARTED 1 20
FT 1 4
COV 1 13
DONE 1
STARTED 2 30
FT 2
COV 2
DONE 2
STARTED 3 40
"""


def test_each_input_is_credited_with_the_edges_it_reached_first():
    assert fuzz_corpus.credits(CONTROL) == {"corpus/a": 3, "corpus/b": 1, "corpus/c": 0}


def test_the_inputs_that_reached_most_are_kept_within_the_budget():
    reached = {"x": 1, "y": 5, "z": 5, "w": 0}
    assert fuzz_corpus.choose(reached, 2) == ["y", "z"]
    # None that reached nothing, however large the budget.
    assert fuzz_corpus.choose(reached, 10) == ["y", "z", "x"]


def test_the_targets_are_the_fuzz_targets_files():
    targets = fuzz_corpus.targets()
    assert "connection" in targets and "app_answer" in targets
    assert targets == sorted(targets)
