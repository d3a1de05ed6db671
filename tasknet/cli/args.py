"""What the tools share: parsing their arguments, printing untrusted text.

argparse checks required arguments before it looks for ones it does not
know, so ``tasknet-admin --bogus`` answered "the following arguments are
required: --db, COMMAND" and never named ``--bogus``.  :func:`parse` looks
first: an option no parser of the command (nor any of its subcommands)
knows is refused as argparse itself words it, "unrecognized arguments:
--bogus", with the usage and exit status 2.

A listing prints text others wrote (a task's name is the upstream's title,
an error is the upstream's words): :func:`printable` shows its control
characters escaped, so a name holding ``ESC[2J``, an OSC title or a newline
cannot clear the operator's terminal or forge a line (issue 38).
:func:`printable_json` does the same to a JSON document.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator, Sequence

__all__ = ["parse", "printable", "printable_json", "unknown_options"]

# C0 controls (tab and newline included: they forge columns and lines), DEL,
# C1 controls (0x9b is a one-byte CSI to some terminals), and the Unicode
# line separators and bidirectional controls (they reorder or break what is
# shown).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
# The same inside a JSON document, less what JSON already escapes (C0).
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _hex(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def printable(value: object) -> str:
    """``str(value)`` with its control characters shown as ``\\xNN`` or
    ``\\uNNNN``: safe to print to a terminal."""
    return _UNSAFE.sub(_hex, str(value))


def printable_json(document: str) -> str:
    """A JSON text with the control characters JSON leaves raw (DEL, C1,
    the line separators and bidirectional controls) escaped as ``\\uNNNN``:
    the same document to a JSON reader, safe on a terminal."""
    return _UNSAFE_IN_JSON.sub(_json_escape, document)


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
