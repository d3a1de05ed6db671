"""The spec's golden vectors (tests/data/protocol_vectors.json), loaded once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "data" / "protocol_vectors.json").read_text("utf-8")
)


def frame(case: dict[str, Any]) -> bytes:
    return bytes.fromhex(case["frame_hex"])


def case_id(case: dict[str, Any]) -> str:
    return str(case.get("name") or case.get("why"))
