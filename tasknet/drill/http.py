"""The drill's HTTP client: the shared blocking JSON-over-HTTP helper of the
command-line tools (:mod:`tasknet.cli.jsonhttp`), under the name the drill
modules import it by."""

from __future__ import annotations

from tasknet.cli.jsonhttp import Reply, request

__all__ = ["Reply", "request"]
