"""TaskStatus: the one mapping of lifecycle states and node codes to display.

Everything that shows a task to a person (API ``status``/``statusText``, web UI,
webhook payloads, admin CLI) goes through :func:`display_status`; no other
module spells a label.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class OperationState(enum.StrEnum):
    """``task_operation.state`` values (LIFECYCLE.md, "States")."""

    RESERVED = "RESERVED"
    SUBMITTING = "SUBMITTING"
    SUBMITTED = "SUBMITTED"
    UNKNOWN = "UNKNOWN"
    DELETE_PENDING = "DELETE_PENDING"
    DELETED = "DELETED"


class NodeCode(enum.IntEnum):
    """Status codes a node reports (legacy codes, unchanged in v2)."""

    DOWNLOADING = 1
    WAITING_COMPRESSION = 2
    COMPRESSING = 3
    COMPLETED = 4


class Label(NamedTuple):
    zh: str
    en: str


class TaskStatus(enum.StrEnum):
    """Display keys, as the API's ``status`` field spells them."""

    SUBMITTING = "SUBMITTING"
    SUBMITTED = "SUBMITTED"
    DOWNLOADING = "DOWNLOADING"
    WAITING_COMPRESSION = "WAITING_COMPRESSION"
    COMPRESSING = "COMPRESSING"
    COMPLETED = "COMPLETED"
    SUBMIT_UNKNOWN = "SUBMIT_UNKNOWN"
    DELETE_PENDING = "DELETE_PENDING"
    DELETE_FAILED = "DELETE_FAILED"
    #: The task's generation was completed, and no node holds its archive any
    #: more (released, missing from an inventory, its node retired): DELIVERY.md.
    ARCHIVE_GONE = "ARCHIVE_GONE"

    @property
    def label(self) -> Label:
        return LABELS[self]

    @property
    def zh(self) -> str:
        return LABELS[self].zh

    @property
    def en(self) -> str:
        return LABELS[self].en


LABELS: dict[TaskStatus, Label] = {
    TaskStatus.SUBMITTING: Label("提交中", "Submitting"),
    TaskStatus.SUBMITTED: Label("已提交", "Submitted"),
    TaskStatus.DOWNLOADING: Label("下载中", "Downloading"),
    TaskStatus.WAITING_COMPRESSION: Label("等待压缩", "Waiting for compression"),
    TaskStatus.COMPRESSING: Label("压缩中", "Compressing"),
    TaskStatus.COMPLETED: Label("下载完成", "Download complete"),
    TaskStatus.SUBMIT_UNKNOWN: Label("提交未知", "Submission unknown"),
    TaskStatus.DELETE_PENDING: Label("待删除", "Delete pending"),
    TaskStatus.DELETE_FAILED: Label("删除失败", "Delete failed"),
    TaskStatus.ARCHIVE_GONE: Label("归档已失效", "Archive gone"),
}

NODE_CODE_STATUS: dict[NodeCode, TaskStatus] = {
    NodeCode.DOWNLOADING: TaskStatus.DOWNLOADING,
    NodeCode.WAITING_COMPRESSION: TaskStatus.WAITING_COMPRESSION,
    NodeCode.COMPRESSING: TaskStatus.COMPRESSING,
    NodeCode.COMPLETED: TaskStatus.COMPLETED,
}

_STATE_STATUS: dict[OperationState, TaskStatus] = {
    OperationState.RESERVED: TaskStatus.SUBMITTING,
    OperationState.SUBMITTING: TaskStatus.SUBMITTING,
    OperationState.UNKNOWN: TaskStatus.SUBMIT_UNKNOWN,
    OperationState.DELETE_PENDING: TaskStatus.DELETE_PENDING,
}


def status_words(status: TaskStatus | str | None) -> str:
    """A status as a person reads it in the tools, in the UI's words, both
    languages: ``下载完成 / Download complete``; a task that is gone (its
    ``DELETED`` tombstone, no status) is ``deleted``."""
    if status is None:
        return "deleted"
    label = TaskStatus(status).label
    return f"{label.zh} / {label.en}"


def display_status(
    state: OperationState | str | None,
    node_code: int | None,
    delete_failed: bool = False,
    queued: bool = False,
    archive_gone: bool = False,
) -> TaskStatus:
    """The display key of a task.

    ``state`` is the ``task_operation`` state, or ``None`` for a legacy row
    that has no operation yet; ``node_code`` is the last applied node status
    (``None`` or 0 before the first report).  A ``DELETED`` tombstone has no
    gallery row and so no display status: asking for one is a bug.
    ``queued``: the node holds the task but has not started it (a v2 entry's
    ``queued``, status 1): it is ``SUBMITTED``, not ``DOWNLOADING``.
    ``archive_gone``: the generation's archive is held by no node any more
    (``gallery.archive_gone_reason``); it outranks the node code, not a
    delete or an unsettled submission.
    """
    if state is not None:
        state = OperationState(state)
        if state is OperationState.DELETED:
            raise ValueError("a DELETED tombstone has no display status")
        if state is OperationState.DELETE_PENDING and delete_failed:
            return TaskStatus.DELETE_FAILED
        if state in _STATE_STATUS:
            return _STATE_STATUS[state]
    if archive_gone:
        return TaskStatus.ARCHIVE_GONE
    if node_code:
        if queued and node_code == NodeCode.DOWNLOADING:
            return TaskStatus.SUBMITTED
        return NODE_CODE_STATUS[NodeCode(node_code)]
    return TaskStatus.SUBMITTED
