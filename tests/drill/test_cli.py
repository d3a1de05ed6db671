"""`tasknet-drill` argument handling (the drills themselves: test_quick_set.py)."""

from __future__ import annotations

import pytest

from tasknet.cli.drill import main
from tasknet.drill.scenarios import QUICK, SCENARIOS


def test_list_names_every_scenario_and_marks_the_quick_set(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [f"S{i}" for i in range(1, 20)]
    assert [line.split()[0] for line in lines if line.endswith("(quick)")] == list(QUICK)
    assert set(QUICK) <= set(SCENARIOS)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["S99"], "unknown scenario(s) S99"),
        (["--repeat", "0", "S1"], "--repeat must be >= 1"),
        (["--repeat", "x"], "invalid int value"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
