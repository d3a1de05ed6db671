"""Issue 38, Build 3: an out-of-range keyset cursor is a 400 on both backends.

Before: ``GET /api/tasks?order=size&after=99999999999999999999~1`` (also
``-9…`` and ``order=status``) answered 500 on SQLite (``OverflowError``
binding the key, a critical traceback per request) and 200 on PostgreSQL.
Now every order's ``after`` is parsed to values both engines bind, and a key
outside a signed 64-bit integer is refused with a clear message."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
import treq

from tasknet.site.storage import views
from tasknet.upstream.testing import start_upstream
from tests.site.helpers import SiteWithUsers, running_site, site_options

_TOO_BIG = "99999999999999999999"


@pytest.mark.parametrize("order", [views.Order.SIZE, views.Order.STATUS])
def test_an_integer_key_outside_64_bits_is_refused(order: views.Order) -> None:
    for key in (str(2**63), str(-(2**63) - 1), _TOO_BIG, "-" + _TOO_BIG):
        with pytest.raises(ValueError, match="between"):
            views.parse_cursor(order, f"{key}~1")
    assert views.parse_cursor(order, f"{2**63 - 1}~1") == (2**63 - 1, 1)
    assert views.parse_cursor(order, f"{-(2**63)}~1") == (-(2**63), 1)


@pytest_twisted.ensureDeferred
async def test_http_out_of_range_cursors_are_400(db_target: str) -> None:
    upstream = await start_upstream()
    try:
        async with running_site(site_options(db_target, upstream.base_url, "--demo")) as site:
            users = SiteWithUsers(site, db_target, upstream)
            auth = {"Authorization": [f"Bearer {users.alice}"]}

            async def get(query: str) -> tuple[int, Any]:
                response = await treq.get(
                    f"{site.base_url}/api/tasks?{query}", headers=auth, pool=site.pool
                )
                return response.code, await treq.json_content(response)

            refused = [f"{key}~1" for key in (_TOO_BIG, "-" + _TOO_BIG, "x")]
            cases = {
                views.Order.SIZE: [*refused, "1.5~1"],
                views.Order.STATUS: refused,
                views.Order.PROGRESS: [*refused[2:], "1e999~1", "nan~1"],
                views.Order.GID: [_TOO_BIG, "-1", "0~0"],
                views.Order.NEWEST: ["x~" + _TOO_BIG, "~1", "no-gid"],
                views.Order.OLDEST: ["x~-1"],
            }
            for order, afters in cases.items():
                for after in afters:
                    code, document = await get(f"order={order.value}&after={after}")
                    assert code == 400, (order, after, document)
                    assert document["error"]["code"] == "invalid_request"
            # The bounds themselves are a page (empty: no task is there).
            for order in (views.Order.SIZE, views.Order.STATUS):
                for key in (str(2**63 - 1), str(-(2**63))):
                    code, document = await get(f"order={order.value}&after={key}~1")
                    assert code == 200, (order, key, document)
            code, document = await get(f"order=progress&after={_TOO_BIG}~1")
            assert code == 200, document  # a real number: no bound needed
    finally:
        await upstream.stop()
