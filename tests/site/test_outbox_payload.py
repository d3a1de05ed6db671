"""The outbox payload text (orjson, with json as the fallback), on a real SQLite file."""

from __future__ import annotations

import json
import sqlite3

from tasknet.site.storage import outbox, views
from tasknet.site.storage.engine.database import run_read, run_write
from tests.site_protocol.harness import add_task, add_user


def test_payload_is_the_compact_json_of_the_task_view(conn: sqlite3.Connection) -> None:
    uid, _ = add_user(conn, "alice")
    add_task(conn, 7, uid, node_id="n1")
    run_write(conn, lambda c: c.execute("UPDATE gallery SET name = ? WHERE gid = 7", ("画集 1",)))
    run_write(conn, lambda c: outbox.enqueue_task_changes(c, [7]))
    (text,) = conn.execute(
        "SELECT payload FROM notification_outbox ORDER BY id DESC LIMIT 1"
    ).fetchone()
    view = run_read(conn, views.task_view, 7)
    assert json.loads(text) == {"type": "task", "task": view}
    # Compact, keys in the view's order, non-ASCII as UTF-8 (not \\u escapes).
    assert text == json.dumps(
        {"type": "task", "task": view}, separators=(",", ":"), ensure_ascii=False
    )


def test_payload_falls_back_to_json_where_orjson_refuses() -> None:
    big = {"type": "task", "task": {"gid": 2**70}}  # orjson: beyond 64 bits
    assert outbox._payload(big) == '{"type":"task","task":{"gid":1180591620717411303424}}'
    lone = {"type": "task", "task": {"name": "\ud800"}}  # orjson: not UTF-8
    assert json.loads(outbox._payload(lone)) == lone
