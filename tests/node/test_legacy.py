"""``--protocol 1``: the faithful legacy node, and a v2 node meeting a legacy site."""

from __future__ import annotations

from pathlib import Path

import pytest_twisted

from tasknet.protocol.messages import DeleteResult, Error, Login, StatusReport
from tests.eventually import eventually
from tests.node.harness import logged_in_node, node_rows, running
from tests.node.site_peer import ScriptedSite

GID = 31337


def status_sent(site: ScriptedSite, gid: int, status: int) -> bool:
    return any(
        e.gid == gid and e.status == status
        for r in site.of_type(StatusReport)
        for e in r.gallery_tasks
    )


@pytest_twisted.ensureDeferred
async def test_legacy_node_against_a_v2_site(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data, protocol=1):
            site.legacy_download(GID, up.file_url(GID))
            await eventually(lambda: status_sent(site, GID, 4), what="status 4")
            # The old behaviour, on purpose: forgotten right after sending, no ACK.
            await eventually(lambda: not node_rows(data, "SELECT * FROM task"), what="drop")
            site.legacy_delete(GID)
            await eventually(lambda: site.of_type(DeleteResult), what="DeleteResult")
    assert site.of_type(DeleteResult) == [DeleteResult(GID, True, "")]
    assert max(site.frame_types) < 10, "a legacy node never sends a v2 type"
    assert site.acked == []
    assert node_rows(data, "SELECT action, protocol FROM received_command") == [
        ("DOWNLOAD", 1),
        ("DELETE", 1),
    ]
    assert node_rows(data, "SELECT * FROM in_flight_report") == []


@pytest_twisted.ensureDeferred
async def test_legacy_node_closes_on_an_unknown_field(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path) as (site, up):
        async with logged_in_node(site, data, protocol=1):
            connection = await site.logged_in()
            payload = (
                f'{{"gid":{GID},"token":"t","name":"n","url":"{up.file_url(GID)}","extra":1}}'
            ).encode()
            connection.send_raw(4, payload)
            await connection.closed
    [error] = site.of_type(Error)
    assert error.code == "bad_message"
    assert node_rows(data, "SELECT * FROM received_command") == []


@pytest_twisted.ensureDeferred
async def test_v2_node_on_a_legacy_site_uses_legacy_messages_only(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with running(tmp_path, legacy_site=True) as (site, up):
        async with logged_in_node(site, data, trust_legacy_site=True):
            site.legacy_download(GID, up.file_url(GID))
            await eventually(lambda: status_sent(site, GID, 4), what="status 4")
            site.legacy_delete(GID + 1)
            await eventually(lambda: site.of_type(DeleteResult), what="DeleteResult")
    after_login = site.frame_types[site.received.index(site.of_type(Login)[0]) + 1 :]
    assert after_login and max(after_login) < 10
    [result] = site.of_type(DeleteResult)
    assert result.gid == GID + 1 and result.success
