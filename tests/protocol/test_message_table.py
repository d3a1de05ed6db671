"""The one table of message types: every number PROTOCOL.md assigns, keyed
by the class's own ``TYPE``, and the sets derived from it as the spec lists them."""

from __future__ import annotations

from tasknet.protocol import connection, messages
from tasknet.protocol.messages import LEGACY_TYPES, MESSAGE_TYPES, PRE_LOGIN_TYPES


def test_the_table_is_keyed_by_each_classs_type_number() -> None:
    assert sorted(MESSAGE_TYPES) == list(range(18))
    for number, row in MESSAGE_TYPES.items():
        assert row.cls.TYPE == number


def test_the_derived_sets_are_the_spec_ones() -> None:
    # PROTOCOL.md: types 0-9 are the frozen legacy ones; before login only
    # Identity, Login, LoginResult, Heartbeat, Error, Goodbye and Hello.
    assert LEGACY_TYPES == frozenset(range(10))
    assert PRE_LOGIN_TYPES == frozenset({0, 1, 2, 3, 8, 9, 10})
    assert connection.PRE_LOGIN_TYPES is PRE_LOGIN_TYPES
    # NodeChallenge and SiteProof: v2 only, after LoginResult only.
    for number in (14, 15, 16, 17):
        assert MESSAGE_TYPES[number].legacy_fields is None
        assert number not in PRE_LOGIN_TYPES


def test_the_strict_reader_refuses_every_v2_only_type() -> None:
    for number, row in MESSAGE_TYPES.items():
        if row.legacy_fields is None:
            try:
                messages.decode(number, b"{}", strict=True)
            except messages.UnknownMessageType:
                continue
            raise AssertionError(f"type {number} decoded by the legacy reader")
