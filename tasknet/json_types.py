"""The types of JSON documents, declared once.

A document read from the network (``json.loads``) is a :data:`JsonValue`
and is narrowed by ``isinstance`` where it is parsed; a document the site
builds to send is a :data:`JsonObject` (or a ``TypedDict`` of its own, when
its keys are fixed).
"""

from __future__ import annotations

from typing import TypeAlias

#: Any JSON value, as ``json.loads`` gives it.
JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"
#: A JSON object, as ``json.loads`` gives it.
JsonObject: TypeAlias = "dict[str, JsonValue]"
