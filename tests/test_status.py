import pytest

from tasknet.site import transitions
from tasknet.status import LABELS, OperationState, TaskStatus, display_status


def test_every_display_key_has_both_labels() -> None:
    assert set(LABELS) == set(TaskStatus)
    for status in TaskStatus:
        assert status.zh and status.en


@pytest.mark.parametrize(
    ("state", "code", "failed", "expected"),
    [
        ("RESERVED", None, False, "提交中"),
        ("SUBMITTING", None, False, "提交中"),
        ("SUBMITTED", None, False, "已提交"),
        ("SUBMITTED", 1, False, "下载中"),
        ("SUBMITTED", 2, False, "等待压缩"),
        ("SUBMITTED", 3, False, "压缩中"),
        ("SUBMITTED", 4, False, "下载完成"),
        ("UNKNOWN", 4, False, "提交未知"),
        ("DELETE_PENDING", 4, False, "待删除"),
        ("DELETE_PENDING", 4, True, "删除失败"),
        (None, 4, False, "下载完成"),
        (None, None, False, "已提交"),
    ],
)
def test_display_status(state, code, failed, expected) -> None:
    assert display_status(state, code, failed).zh == expected


def test_tombstone_has_no_display_status() -> None:
    with pytest.raises(ValueError):
        display_status(OperationState.DELETED, None)


def test_transition_table() -> None:
    transitions.check(None, "RESERVED")
    transitions.check("UNKNOWN", "SUBMITTED")
    with pytest.raises(transitions.IllegalTransition):
        transitions.check("UNKNOWN", "SUBMITTING")
    with pytest.raises(transitions.IllegalTransition):
        transitions.check("DELETED", "SUBMITTED")
