"""Deterministic metadata and archive bytes."""

from __future__ import annotations

import pytest

from tasknet.upstream import catalog


@pytest.mark.parametrize("gid", [1, 2, 42, 123456, 2**31])
def test_metadata_is_deterministic_and_in_range(gid: int) -> None:
    g = catalog.gallery(gid)
    catalog.gallery.cache_clear()
    assert catalog.gallery(gid) == g
    assert g.gid == gid
    assert catalog.MIN_SIZE <= g.size <= catalog.MAX_SIZE
    assert catalog.MIN_COST <= g.cost <= catalog.MAX_COST
    assert 10 <= g.pages <= 300
    assert str(gid) in g.title


def test_metadata_varies_between_gids() -> None:
    galleries = [catalog.gallery(gid) for gid in range(1, 200)]
    assert len({g.size for g in galleries}) > 150
    assert len({g.cost for g in galleries}) == catalog.MAX_COST - catalog.MIN_COST + 1
    assert any(any("\u3040" <= ch <= "\u9fff" for ch in g.title) for g in galleries)


@pytest.mark.parametrize("gid", [0, -1, 2**31 + 1, True, "7"])
def test_invalid_gid_is_refused(gid: object) -> None:
    with pytest.raises(catalog.InvalidGid):
        catalog.gallery(gid)  # type: ignore[arg-type]


def test_archive_bytes_have_the_metadata_size_and_are_not_trivial() -> None:
    data = catalog.archive_bytes(42)
    assert len(data) == catalog.gallery(42).size
    assert data != catalog.archive_bytes(43)[: len(data)]
    assert len(set(data[:4096])) > 200  # not zeros, not a short pattern
    # the period is not a power of two: a 64 KiB offset mix-up changes bytes
    assert data[:1024] != data[65536 : 65536 + 1024]


@pytest.mark.parametrize(
    ("start", "end"), [(0, 10), (65000, 70000), (65521, 131042), (100, 10**9), (5, 5)]
)
def test_slices_agree_with_the_whole(start: int, end: int) -> None:
    whole = catalog.archive_bytes(7)
    assert catalog.archive_slice(7, start, end) == whole[start:end]
