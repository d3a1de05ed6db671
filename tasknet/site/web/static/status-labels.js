/* Display labels of the nine task status keys (API field `status`).
 *
 * This is a copy of tasknet/status.py LABELS for the browser; the test
 * tests/ui/test_status_labels.py parses the JSON between the markers below
 * and compares it with LABELS, so the two can never drift.  Keep the block
 * strict JSON (quoted keys, no trailing commas).
 */
window.TASKNET_STATUS_LABELS = Object.freeze(
/* BEGIN STATUS LABELS */
{
  "SUBMITTING": {"zh": "提交中", "en": "Submitting"},
  "SUBMITTED": {"zh": "已提交", "en": "Submitted"},
  "DOWNLOADING": {"zh": "下载中", "en": "Downloading"},
  "WAITING_COMPRESSION": {"zh": "等待压缩", "en": "Waiting for compression"},
  "COMPRESSING": {"zh": "压缩中", "en": "Compressing"},
  "COMPLETED": {"zh": "下载完成", "en": "Download complete"},
  "SUBMIT_UNKNOWN": {"zh": "提交未知", "en": "Submission unknown"},
  "DELETE_PENDING": {"zh": "待删除", "en": "Delete pending"},
  "DELETE_FAILED": {"zh": "删除失败", "en": "Delete failed"},
  "ARCHIVE_GONE": {"zh": "归档已失效", "en": "Archive gone"}
}
/* END STATUS LABELS */
);
