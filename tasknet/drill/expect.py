"""A scenario's own expectations, gathered as it runs into its ``E`` verdict
(each miss with its evidence and the step it happened in)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tasknet.cli.jsonhttp import Reply
from tasknet.drill.invariants import FAIL, PASS, Verdict


class Expect:
    """The scenario's own expectations: one ``E`` verdict, with evidence per miss."""

    def __init__(self, progress: Callable[[str], None] = lambda _: None) -> None:
        self.progress = progress
        self.failures: list[dict[str, Any]] = []
        self.passed: list[str] = []
        self.current = "setup"
        #: Measurements a scenario reports beside its verdict (S24-S26:
        #: recovery times and their parts), kept as the E verdict's evidence.
        self.figures: dict[str, Any] = {}

    def step(self, text: str) -> None:
        self.current = text
        self.progress(text)

    def that(self, ok: bool, what: str, **evidence: Any) -> bool:
        if ok:
            self.passed.append(what)
        else:
            self.failures.append({"what": what, "step": self.current, **evidence})
        return ok

    def equal(self, actual: Any, expected: Any, what: str, **evidence: Any) -> bool:
        return self.that(
            actual == expected, f"{what}: expected {expected!r}, got {actual!r}", **evidence
        )

    def status(self, reply: Reply, expected: int, what: str) -> bool:
        return self.that(
            reply.status == expected,
            f"{what}: expected HTTP {expected}, got {reply.brief()}",
        )

    def crashed(self, err: BaseException) -> None:
        self.failures.append(
            {"what": f"drill could not proceed: {err}", "step": self.current, "error": str(err)}
        )

    def verdict(self) -> Verdict:
        figures = [{"figures": self.figures}] if self.figures else []
        if self.failures:
            more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
            return Verdict("E", FAIL, self.failures[0]["what"] + more, self.failures + figures)
        return Verdict("E", PASS, f"{len(self.passed)} expectation(s) met", figures)
