"""The web UI's status label table equals ``tasknet.status.LABELS``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import tasknet.site.web
from tasknet.status import LABELS, TaskStatus

STATIC = Path(tasknet.site.web.__file__).parent / "static"
_BLOCK = re.compile(r"/\* BEGIN STATUS LABELS \*/(.*?)/\* END STATUS LABELS \*/", re.S)


def _js_labels() -> dict[str, dict[str, str]]:
    source = (STATIC / "status-labels.js").read_text(encoding="utf-8")
    blocks = _BLOCK.findall(source)
    assert len(blocks) == 1, "status-labels.js must hold exactly one marked JSON block"
    table = json.loads(blocks[0])
    assert isinstance(table, dict)
    return table


def test_js_table_matches_python_labels_exactly() -> None:
    expected = {status.value: {"zh": label.zh, "en": label.en} for status, label in LABELS.items()}
    assert _js_labels() == expected


def test_every_display_key_has_a_label() -> None:
    assert set(_js_labels()) == {s.value for s in TaskStatus}


def test_page_loads_the_label_table_before_the_app() -> None:
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    labels_at = html.index('src="status-labels.js"')
    app_at = html.index('src="app.js"')
    assert labels_at < app_at
