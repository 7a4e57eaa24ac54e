import re

from qproxy_tools.bench import pages


def test_a_section_replaces_what_lies_between_its_markers():
    page = "# Results\n\nbefore\n<!-- b -->\nold\n<!-- e -->\nafter\n"
    assert pages.between_markers(page, "<!-- b -->\nnew\n<!-- e -->", "<!-- b -->", "<!-- e -->") == (
        "# Results\n\nbefore\n<!-- b -->\nnew\n<!-- e -->\nafter\n"
    )


def test_a_section_without_markers_goes_at_the_end():
    assert pages.between_markers("# Results\n", "<!-- b -->x<!-- e -->", "<!-- b -->", "<!-- e -->") == (
        "# Results\n\n<!-- b -->x<!-- e -->\n"
    )


def test_a_section_is_written_between_the_markers_of_its_page(tmp_path):
    page = tmp_path / "RESULTS.md"
    page.write_text("# Results\n<!-- b -->\nold\n<!-- e -->\ntail\n")
    pages.write_section(str(page), "<!-- b -->\nnew\n<!-- e -->", "<!-- b -->", "<!-- e -->")
    assert page.read_text() == "# Results\n<!-- b -->\nnew\n<!-- e -->\ntail\n"


def test_numbers_as_the_tables_show_them():
    assert pages.fmt(None) == "–"
    assert pages.fmt(1234.56) == "1,234.6"
    assert pages.fmt(3.5, " µs", 0) == "4 µs"


def test_the_facts_of_a_run_name_the_commit_and_a_changed_tree(monkeypatch):
    answers = {("rev-parse", "--short", "HEAD"): "abc1234", ("status", "--porcelain", "--untracked-files=no"): " M x"}
    monkeypatch.setattr(pages, "git", lambda *args: answers[args])
    facts = pages.run_facts()
    assert re.match(r"^\d{4}-\d\d-\d\d, commit abc1234 with uncommitted changes, \d+ vCPU .*, Linux \S+$", facts)
    answers[("status", "--porcelain", "--untracked-files=no")] = ""
    answers[("rev-parse", "--short", "HEAD")] = ""
    assert ", commit unknown, " in pages.run_facts()


def test_results_md_is_in_benches():
    assert pages.RESULTS.endswith("/benches/RESULTS.md")
    assert pages.RESULTS.startswith(pages.BENCHES)
