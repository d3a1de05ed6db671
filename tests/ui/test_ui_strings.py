"""The web UI's words: app.js keeps one table per language (``STRINGS.zh``
and ``STRINGS.en``); both have the same keys, and every key the page asks
for (``t("key")`` in app.js, ``data-i18n*`` in index.html) is in them."""

from __future__ import annotations

import re
from pathlib import Path

import tasknet.site.web

STATIC = Path(tasknet.site.web.__file__).parent / "static"
# A table entry: `key: "text"`, first in its line or after a comma.
_ENTRY = re.compile(r'(?:^|,|\{)\s*([A-Za-z0-9_]+): "', re.M)


def _tables() -> dict[str, set[str]]:
    source = (STATIC / "app.js").read_text(encoding="utf-8")
    zh_at = source.index("    zh: {")
    en_at = source.index("    en: {")
    end = source.index("  var state = {")
    return {
        "zh": set(_ENTRY.findall(source[zh_at:en_at])),
        "en": set(_ENTRY.findall(source[en_at:end])),
    }


def test_both_languages_have_the_same_words() -> None:
    tables = _tables()
    assert len(tables["en"]) > 200, "the table was not found where expected"
    assert tables["zh"] - tables["en"] == set()
    assert tables["en"] - tables["zh"] == set()


def test_every_word_asked_for_is_in_the_tables() -> None:
    known = _tables()["en"]
    app = (STATIC / "app.js").read_text(encoding="utf-8")
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    asked = set(re.findall(r'\bt\("([A-Za-z0-9_]+)"', app))
    asked |= set(re.findall(r'data-i18n(?:-label|-placeholder)?="([A-Za-z0-9_]+)"', html))
    assert "bulkLinks" in asked and "download" in asked
    assert asked - known == set()
