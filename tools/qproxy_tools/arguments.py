"""Command lines: each command's help is its module's docstring."""

import argparse


def parser(prog, doc):
    """An argument parser for the command at `prog` whose help is `doc`: its
    first paragraph as the description, the rest, as written, after the
    options."""
    first, _, rest = doc.strip("\n").partition("\n\n")
    return argparse.ArgumentParser(
        prog=prog, description=first, epilog=rest or None, formatter_class=argparse.RawDescriptionHelpFormatter
    )
