"""Sizes and durations as options spell them (DELIVERY.md)."""

from __future__ import annotations

import pytest

from tasknet.units import parse_duration, parse_rate, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("1024", 1024),
        ("1kB", 1000),
        ("1KiB", 1024),
        ("50MB", 50_000_000),
        ("1GiB", 1 << 30),
        ("1.5 MiB", 1572864),
        ("2GB", 2_000_000_000),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_rates_take_a_per_second_suffix() -> None:
    assert parse_rate("50MB/s") == parse_rate("50MB") == 50_000_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [("600", 600), ("10m", 600), ("7d", 604800), ("1.5h", 5400), ("30s", 30), ("0", 0)],
)
def test_durations(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "1XB", "ten", "1e9", "1 GiB extra", "1w", "nan"])
def test_bad_spellings_say_what_was_expected(text: str) -> None:
    with pytest.raises(ValueError, match="must be a number"):
        parse_size(text)
    with pytest.raises(ValueError, match="must be a number"):
        parse_duration(text)
