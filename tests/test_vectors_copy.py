"""tests/data/protocol_vectors.json must stay a byte-identical copy of the spec."""

from pathlib import Path

import pytest

HERE = Path(__file__).parent
COPY = HERE / "data" / "protocol_vectors.json"
SPEC = HERE.parent.parent / "shared" / "spec" / "vectors.json"


@pytest.mark.skipif(not SPEC.exists(), reason="../shared/spec is not beside this clone")
def test_protocol_vectors_copy_is_identical_to_spec() -> None:
    assert COPY.read_bytes() == SPEC.read_bytes()
