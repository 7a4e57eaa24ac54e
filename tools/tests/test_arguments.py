from qproxy_tools import arguments

DOC = """What the command does, in one paragraph.

    command [--flag]

More about it.
"""


def test_the_help_is_the_docstring():
    parser = arguments.parser("scripts/thing", DOC)
    assert parser.prog == "scripts/thing"
    assert parser.description == "What the command does, in one paragraph."
    # The rest as written, its indentation kept.
    assert parser.epilog == "    command [--flag]\n\nMore about it."
    assert "    command [--flag]" in parser.format_help()


def test_a_one_paragraph_docstring_has_no_epilog():
    assert arguments.parser("x", "Only this.\n").epilog is None
