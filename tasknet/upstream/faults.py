"""Fault rules: which request gets which fault, validated, counted, seedable.

A rule is ``{"method", "path", "fault", "params", "times", "probability"}``.
``path`` is an ``fnmatch`` glob on the request path without the query (``*``
also matches ``/``); ``method`` is an HTTP method or ``*`` (default). The first
rule that matches, still has firings left (``times``) and wins its
``probability`` draw fires; a request gets at most one fault. Probability
draws come from the ``random.Random`` the table is given (the composition
root seeds it: ``--seed``); a reset rewinds it to the state it was given in,
so a drill replays the same sequence.

Faults act in one of two phases (see ``FaultRule.runs_handler``): *before* the
handler ran (nothing applied: ``drop_before``, ``missing``, ``reject``,
``error`` with ``charged: false``, and ``latency`` which then proceeds), or
*after* it ran and applied its side effect (``timeout``, ``commit_then_drop``,
``error`` with ``charged: true``, ``slow_body``, ``reset_mid_body``).
"""

from __future__ import annotations

import fnmatch
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

FAULT_KINDS = (
    "latency",
    "timeout",
    "commit_then_drop",
    "drop_before",
    "error",
    "reject",
    "slow_body",
    "reset_mid_body",
    "missing",
)

RULE_KEYS = frozenset({"method", "path", "fault", "params", "times", "probability"})


class FaultRuleError(ValueError):
    """A fault document or rule is malformed; the message says where and why."""


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# Per fault: param name -> (validator, description, default or _REQUIRED).
_REQUIRED = object()
_ParamSpec = tuple[Callable[[object], bool], str, object]
_PARAMS: dict[str, dict[str, _ParamSpec]] = {
    "latency": {"ms": (lambda v: _number(v) and 0 <= v <= 3_600_000, "0..3600000", _REQUIRED)},
    "timeout": {},
    "commit_then_drop": {},
    "drop_before": {},
    "error": {
        "status": (lambda v: _integer(v) and 400 <= v <= 599, "an integer 400..599", 500),
        "charged": (lambda v: isinstance(v, bool), "a boolean", False),
        # False: a proxy's HTML page instead of the JSON error body.
        "body": (lambda v: isinstance(v, bool), "a boolean", True),
    },
    "reject": {"status": (lambda v: _integer(v) and 400 <= v <= 499, "an integer 400..499", 403)},
    "slow_body": {"bytes_per_s": (lambda v: _number(v) and v > 0, "a number > 0", _REQUIRED)},
    "reset_mid_body": {
        "after_bytes": (lambda v: _integer(v) and v >= 0, "an integer >= 0", _REQUIRED)
    },
    "missing": {},
}

# Faults that answer (or drop) without running the handler, so nothing is applied.
_BEFORE_HANDLER = frozenset({"drop_before", "missing", "reject"})


@dataclass
class FaultRule:
    fault: str
    path: str = "*"
    method: str = "*"
    params: dict[str, Any] = field(default_factory=dict)
    times: int | None = None
    probability: float = 1.0
    fired: int = 0

    @property
    def runs_handler(self) -> bool:
        """Whether the request's handler (and its side effect) runs under this fault."""
        if self.fault == "error":
            return bool(self.params["charged"])
        return self.fault not in _BEFORE_HANDLER

    def exhausted(self) -> bool:
        return self.times is not None and self.fired >= self.times

    def matches(self, method: str, path: str) -> bool:
        return (self.method == "*" or self.method == method.upper()) and fnmatch.fnmatchcase(
            path, self.path
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "fault": self.fault,
            "params": dict(self.params),
            "times": self.times,
            "probability": self.probability,
            "fired": self.fired,
        }


def parse_rule(raw: object, where: str = "rule") -> FaultRule:
    """One rule from its JSON form; raises FaultRuleError naming the bad field."""
    if not isinstance(raw, Mapping):
        raise FaultRuleError(f"{where} must be an object")
    unknown = sorted(set(raw) - RULE_KEYS)
    if unknown:
        raise FaultRuleError(f"{where} has unknown keys {unknown}; allowed: {sorted(RULE_KEYS)}")
    fault = raw.get("fault")
    if fault not in _PARAMS:
        raise FaultRuleError(f"{where}.fault must be one of {list(FAULT_KINDS)}, got {fault!r}")
    method = raw.get("method", "*")
    if not isinstance(method, str) or not (method == "*" or method.isalpha()):
        raise FaultRuleError(f"{where}.method must be an HTTP method or '*', got {method!r}")
    path = raw.get("path", "*")
    if not isinstance(path, str) or not path.startswith(("/", "*")):
        raise FaultRuleError(f"{where}.path must be a glob starting with '/' or '*', got {path!r}")
    times = raw.get("times")
    if times is not None and not (_integer(times) and times >= 0):
        raise FaultRuleError(f"{where}.times must be null or an integer >= 0, got {times!r}")
    probability = raw.get("probability", 1.0)
    if not (_number(probability) and 0 <= probability <= 1):
        raise FaultRuleError(f"{where}.probability must be a number in 0..1, got {probability!r}")
    params = _parse_params(fault, raw.get("params", {}), where)
    return FaultRule(
        fault=fault,
        path=path,
        method=method.upper(),
        params=params,
        times=times,
        probability=float(probability),
    )


def _parse_params(fault: str, raw: object, where: str) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise FaultRuleError(f"{where}.params must be an object")
    spec = _PARAMS[fault]
    unknown = sorted(set(raw) - set(spec))
    if unknown:
        raise FaultRuleError(
            f"{where}.params has unknown keys {unknown} for fault {fault!r}; "
            f"allowed: {sorted(spec)}"
        )
    params: dict[str, Any] = {}
    for name, (valid, description, default) in spec.items():
        if name in raw:
            if not valid(raw[name]):
                raise FaultRuleError(
                    f"{where}.params.{name} must be {description}, got {raw[name]!r}"
                )
            params[name] = raw[name]
        elif default is _REQUIRED:
            raise FaultRuleError(f"{where}.params.{name} is required for fault {fault!r}")
        else:
            params[name] = default
    return params


def parse_rules(document: object) -> list[FaultRule]:
    """The rules of a ``{"rules": [...]}`` document; all or nothing."""
    if not isinstance(document, Mapping) or set(document) != {"rules"}:
        raise FaultRuleError('body must be an object {"rules": [rule, ...]}')
    rules = document["rules"]
    if not isinstance(rules, list):
        raise FaultRuleError('"rules" must be a list')
    return [parse_rule(raw, f"rules[{i}]") for i, raw in enumerate(rules)]


class FaultTable:
    """The active rules and the random source for their probabilities.

    ``rng`` is the table's own (it is rewound on ``reset``): never a
    ``random.Random`` something else draws from too."""

    def __init__(self, rng: random.Random) -> None:
        self._random = rng
        self._initial = rng.getstate()
        self.rules: list[FaultRule] = []
        self.fired_total = 0

    def replace(self, rules: list[FaultRule]) -> None:
        self.rules = list(rules)

    def clear(self) -> None:
        self.rules = []

    def reset(self) -> None:
        """Clear the rules and rewind the draws, so a drill replays the same ones."""
        self.rules = []
        self.fired_total = 0
        self._random.setstate(self._initial)

    def take(self, method: str, path: str) -> FaultRule | None:
        """The rule that fires for this request, counting its firing; None if none."""
        for rule in self.rules:
            if rule.exhausted() or not rule.matches(method, path):
                continue
            if rule.probability < 1.0 and self._random.random() >= rule.probability:
                continue
            rule.fired += 1
            self.fired_total += 1
            return rule
        return None

    def to_json(self) -> dict[str, Any]:
        return {"rules": [rule.to_json() for rule in self.rules]}
