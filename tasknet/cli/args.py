"""What the tools' argument parsers share.

argparse checks required arguments before it looks for ones it does not
know, so ``tasknet-admin --bogus`` answered "the following arguments are
required: --db, COMMAND" and never named ``--bogus``.  :func:`parse` looks
first: an option no parser of the command (nor any of its subcommands)
knows is refused as argparse itself words it, "unrecognized arguments:
--bogus", with the usage and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence

__all__ = ["parse", "unknown_options"]


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def unknown_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """The options of ``argv`` that neither ``parser`` nor any of its
    subcommands knows (an unambiguous prefix of a known long option counts
    as known, as argparse allows it).  Stops at ``--``; a negative number
    is a value, not an option."""
    known = {option for p in _parsers(parser) for option in p._option_string_actions}
    unknown = []
    for arg in argv:
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-" or _is_number(arg):
            continue
        name = arg.split("=", 1)[0]
        if name in known:
            continue
        if name.startswith("--") and any(option.startswith(name) for option in known):
            continue
        unknown.append(name)
    return unknown


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, naming an unknown option first (the
    module doc)."""
    args = list(sys.argv[1:] if argv is None else argv)
    unknown = unknown_options(parser, args)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return parser.parse_args(args)
