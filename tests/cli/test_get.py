"""``tasknet-get`` against a scripted site and node over real HTTP
(tests/cli/archive_peer.py): resume after a kill, verification, names that
collide, parallel transfers, missing gids, plain output, exit codes, and the
token kept from the node.

Most tests call :func:`tasknet.cli.get.main` in this process (the peer runs
in threads); the ones about a killed process and output to a pipe start
``python -m tasknet.cli.get`` as a child.
"""

from __future__ import annotations

import hashlib
import os
import pty
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasknet import __version__
from tasknet.cli import get
from tests.cli.archive_peer import Archive, ArchivePeer, Script, running_peer
from tests.eventually import eventually_blocking

TOKEN = "tok-" + "s3cret" * 4


def _data(seed: int, size: int) -> bytes:
    """Bytes that differ at every offset between seeds (a wrong resume shows)."""
    block = hashlib.sha256(str(seed).encode()).digest()
    return (block * (size // len(block) + 1))[:size]


@pytest.fixture
def script() -> Script:
    return Script(token=TOKEN)


@pytest.fixture
def peer(script: Script) -> Iterator[ArchivePeer]:
    with running_peer(script) as running:
        yield running


@pytest.fixture(autouse=True)
def token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKNET_TOKEN", TOKEN)


def _run(
    peer: ArchivePeer, directory: Path, *argv: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    code = get.main(
        ["--site", peer.site_url, "-d", str(directory), "--read-timeout", "5", "--plain", *argv]
    )
    captured = capsys.readouterr()
    assert TOKEN not in captured.out + captured.err  # never printed
    return code, captured.out, captured.err


def _child(peer: ArchivePeer, directory: Path, *argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TASKNET_TOKEN": TOKEN}
    return subprocess.Popen(
        [sys.executable, "-m", "tasknet.cli.get", "--site", peer.site_url, "-d", str(directory)]
        + list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_resume_after_kill_mid_file(script: Script, peer: ArchivePeer, tmp_path: Path) -> None:
    data = _data(1, 3 * 1024 * 1024 + 17)
    script.archives[11] = Archive(11, "Big One", data)
    script.stall_at[11] = 1024 * 1024 + 5
    part = tmp_path / "Big One.zip.part"

    first = _child(peer, tmp_path, "11")
    try:
        eventually_blocking(
            lambda: part.exists() and part.stat().st_size == script.stall_at[11],
            what="the first megabyte written to the .part",
        )
    finally:
        first.kill()
        first.communicate()
    assert not (tmp_path / "Big One.zip").exists()
    del script.stall_at[11]

    second = _child(peer, tmp_path, "11")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, (out, err)
    final = tmp_path / "Big One.zip"
    assert hashlib.sha256(final.read_bytes()).hexdigest() == script.archives[11].sha256
    assert not part.exists()
    resumed = peer.requests("node", "/archives/11/")[-1]
    assert resumed.headers["Range"] == f"bytes={1024 * 1024 + 5}-"
    assert resumed.headers["If-Range"] == script.archives[11].etag
    assert "resuming at 1.0 MiB" in out
    assert "SHA-256 verified" in out


def test_digest_mismatch_leaves_no_file(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data(2, 100_000)
    script.archives[21] = Archive(21, "bad", data, served=_data(3, 100_000))

    code, out, err = _run(peer, tmp_path, "21", capsys=capsys)

    assert code == 1
    assert "failed 21: SHA-256 mismatch" in err
    assert "the partial file was deleted" in err
    assert list(tmp_path.iterdir()) == []


def test_resumed_part_of_other_bytes_is_fetched_again(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data(4, 200_000)
    script.archives[22] = Archive(22, "again", data)
    (tmp_path / "again.zip.part").write_bytes(_data(5, 50_000))  # not a prefix of it

    code, out, err = _run(peer, tmp_path, "22", capsys=capsys)

    assert code == 0, err
    assert (tmp_path / "again.zip").read_bytes() == data
    ranges = [s.headers.get("Range") for s in peer.requests("node", "/archives/22/")]
    assert ranges == ["bytes=50000-", None]
    assert "the resumed file did not verify" in out


def test_a_complete_part_is_checked_and_renamed_without_a_request(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data(24, 70_000)
    script.archives[24] = Archive(24, "complete", data)
    (tmp_path / "complete.zip.part").write_bytes(data)
    code, out, err = _run(peer, tmp_path, "24", capsys=capsys)
    assert code == 0, err
    assert (tmp_path / "complete.zip").read_bytes() == data
    assert not (tmp_path / "complete.zip.part").exists()
    assert peer.requests("node") == []


def test_whole_file_answer_to_a_range_restarts_from_zero(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data(6, 120_000)
    script.archives[23] = Archive(23, "whole", data)
    script.ignore_range.add(23)
    (tmp_path / "whole.zip.part").write_bytes(b"x" * 30_000)

    code, out, err = _run(peer, tmp_path, "23", capsys=capsys)

    assert code == 0, err
    assert (tmp_path / "whole.zip").read_bytes() == data
    assert len(peer.requests("node", "/archives/23/")) == 1


def test_name_collisions_never_overwrite(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same, other = _data(7, 5_000), _data(8, 5_000)
    script.archives[31] = Archive(31, "same", same)
    script.archives[32] = Archive(32, "taken", _data(9, 6_000))
    script.archives[33] = Archive(33, "both", _data(10, 6_000))
    (tmp_path / "same.zip").write_bytes(same)
    (tmp_path / "taken.zip").write_bytes(other)
    (tmp_path / "both.zip").write_bytes(other)
    (tmp_path / "both (33).zip").write_bytes(other)

    code, out, err = _run(peer, tmp_path, "31", "32", "33", capsys=capsys)

    assert code == 1
    assert "skip 31:" in out and "already there (SHA-256 matches)" in out
    assert (tmp_path / "taken.zip").read_bytes() == other
    assert (tmp_path / "taken (32).zip").read_bytes() == script.archives[32].data
    assert "failed 33: both.zip and both (33).zip both exist and differ" in err
    assert (tmp_path / "both.zip").read_bytes() == other
    assert (tmp_path / "both (33).zip").read_bytes() == other
    assert "3 archives: 1 saved, 1 already there, 1 failed" in err
    assert peer.requests("node", "/archives/31/") == []


def test_two_archives_of_one_name_in_one_run(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script.archives[42] = Archive(42, "Twin", _data(11, 3_000))
    script.archives[41] = Archive(41, "twin", _data(12, 3_000))

    code, _, err = _run(peer, tmp_path, "42", "41", "-j", "2", capsys=capsys)

    assert code == 0, err
    assert (tmp_path / "twin.zip").read_bytes() == script.archives[41].data
    assert (tmp_path / "Twin (42).zip").read_bytes() == script.archives[42].data


def test_j3_runs_three_transfers_at_once(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for gid in range(51, 57):
        script.archives[gid] = Archive(gid, f"a{gid}", _data(gid, 40_000))
    script.gate.clear()
    proc = _child(peer, tmp_path, "-j", "3", *(str(g) for g in range(51, 57)))
    try:
        eventually_blocking(lambda: peer.active == 3, what="three transfers held at once")
        assert len(peer.requests("node", "/archives/")) == 3
    finally:
        script.gate.set()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert peer.most_active == 3
    for gid in range(51, 57):
        assert (tmp_path / f"a{gid}.zip").read_bytes() == script.archives[gid].data


def test_missing_gids_are_named_with_why(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script.archives[61] = Archive(61, "fine", _data(61, 1_000))
    script.missing[62] = {"code": "archive_not_ready", "status": "DOWNLOADING"}
    script.missing[63] = {"code": "node_offline"}
    script.missing[64] = {"code": "archive_gone", "reason": "EXPIRED"}
    script.missing[65] = {"code": "archive_not_served"}

    code, out, err = _run(peer, tmp_path, "61", "62", "63", "64", "65", "66", capsys=capsys)

    assert code == 1
    assert (tmp_path / "fine.zip").exists()
    assert "failed 62: not ready: the task is not completed (status DOWNLOADING)" in err
    assert "failed 63: its node is offline; try again later [node_offline]" in err
    assert "failed 64: the archive is gone (reason EXPIRED) [archive_gone]" in err
    assert "failed 65: its node does not serve archives" in err
    assert "failed 66: no such task (or not yours) [not_found]" in err
    assert "6 archives: 1 saved, 0 already there, 5 failed" in err


def test_plain_lines_when_not_a_terminal(script: Script, peer: ArchivePeer, tmp_path: Path) -> None:
    script.archives[71] = Archive(71, "plain", _data(71, 10_000))
    proc = _child(peer, tmp_path, "71", "72")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    lines = out.splitlines()
    assert lines[0] == "FAILED 72: no such task (or not yours) [not_found]"
    assert lines[1] == "start 71 plain.zip (9.8 KiB)"
    assert lines[2].startswith(f"done 71: {tmp_path / 'plain.zip'} (9.8 KiB, SHA-256 verified)")
    assert len(lines) == 3
    assert "\x1b[" not in out + err  # no terminal control
    assert err.splitlines()[-2:] == [
        "2 archives: 1 saved, 0 already there, 1 failed",
        "  failed 72: no such task (or not yours) [not_found]",
    ]


def test_progress_bars_on_a_terminal(script: Script, peer: ArchivePeer, tmp_path: Path) -> None:
    script.archives[73] = Archive(73, "[Group] shown", _data(73, 300_000))
    leader, follower = pty.openpty()
    env = {**os.environ, "TASKNET_TOKEN": TOKEN, "COLUMNS": "120", "TERM": "xterm"}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tasknet.cli.get", "--site", peer.site_url]
            + ["-d", str(tmp_path), "73"],
            stdout=subprocess.PIPE,
            stderr=follower,
            env=env,
        )
        os.close(follower)
        shown = b""
        while True:  # read until the child closes its end (EIO on Linux)
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(leader)
    assert proc.returncode == 0
    text = shown.decode("utf-8", "replace")
    assert "total (1)" in text and "\x1b[" in text
    assert f"done 73: {tmp_path / '[Group] shown.zip'} (293.0 KiB, SHA-256 verified)" in text
    assert "300.0/300.0 kB" in text
    assert "1 archive: 1 saved, 0 already there, 0 failed" in text
    assert out == b""  # the plain lines are for a pipe; a terminal gets the bars


def test_what_the_servers_say_is_printed_without_control_characters(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script.missing[74] = {"code": "\x1b[2Jweird", "status": "\x1b]0;title\x07"}
    code, out, err = _run(peer, tmp_path, "74", capsys=capsys)
    assert code == 1
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "failed 74: \\x1b[2Jweird (status \\x1b]0;title\\x07)" in err


def test_token_goes_to_the_site_only(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script.archives[81] = Archive(81, "via node", _data(81, 2_000))
    assert _run(peer, tmp_path, "81", capsys=capsys)[0] == 0
    script.via = "site"
    script.archives[82] = Archive(82, "via site", _data(82, 2_000))
    assert _run(peer, tmp_path, "82", capsys=capsys)[0] == 0

    node_requests = peer.requests("node")
    assert node_requests and all("Authorization" not in s.headers for s in node_requests)
    for seen in peer.requests("site"):
        assert seen.headers["Authorization"] == f"Bearer {TOKEN}"
    assert peer.requests("site", "/api/tasks/82/archive")
    assert (tmp_path / "via site.zip").read_bytes() == script.archives[82].data


def test_expired_link_is_asked_for_again(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script.archives[91] = Archive(91, "expiring", _data(91, 4_000))
    script.expire_next.add(91)

    code, _, err = _run(peer, tmp_path, "91", capsys=capsys)

    assert code == 0, err
    assert len(peer.requests("site", "/api/tasks/archive-links")) == 2
    assert len(peer.requests("node", "/archives/91/")) == 2


def test_link_already_expired_is_renewed_before_use(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script.archives[92] = Archive(92, "stale", _data(92, 4_000))
    script.link_ttl = -1.0  # past by this machine's clock: renewed once, then the node decides
    code, _, err = _run(peer, tmp_path, "92", capsys=capsys)
    assert code == 0, err
    assert len(peer.requests("site", "/api/tasks/archive-links")) == 2
    assert len(peer.requests("node", "/archives/92/")) == 1


def test_link_the_node_keeps_refusing_fails(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script.archives[93] = Archive(93, "refused", _data(93, 4_000))
    script.expire_next.add(93)
    script.expire_always = True
    code, _, err = _run(peer, tmp_path, "93", capsys=capsys)
    assert code == 1
    assert "failed 93: the link expired [link_expired] (3 fresh links did not help)" in err
    assert len(peer.requests("node", "/archives/93/")) == 4
    assert not (tmp_path / "refused.zip").exists()


def test_a_busy_node_and_a_broken_connection_are_retried(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data(94, 600_000)
    script.archives[94] = Archive(94, "retried", data)
    script.busy[94] = 2
    script.stall_at[94] = 250_000
    peer.released.set()  # the stalled answer closes at once: a broken transfer
    code, _, err = _run(peer, tmp_path, "94", capsys=capsys)
    assert code == 0, err
    assert (tmp_path / "retried.zip").read_bytes() == data
    ranges = [s.headers.get("Range") for s in peer.requests("node", "/archives/94/")]
    assert ranges == [None, None, None, "bytes=250000-"]


def test_an_http_error_is_named_without_the_signature(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script.archives[95] = Archive(95, "broken", _data(95, 1_000))
    script.broken[95] = 500
    code, _, err = _run(peer, tmp_path, "95", capsys=capsys)
    assert code == 1
    assert f"failed 95: HTTP 500 from {peer.node_url}archives/95/op-95\n" in err
    assert "sig=" not in err
    assert list(tmp_path.iterdir()) == []


def test_legacy_archive_without_digest_checks_the_size(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script.archives[101] = Archive(101, "legacy", _data(101, 5_000), sha256=None)
    code, out, err = _run(peer, tmp_path, "101", capsys=capsys)
    assert code == 0, err
    assert "size verified; no SHA-256 recorded (a legacy node), content not verified" in out
    assert "If-Range" not in peer.requests("node")[0].headers


def test_completed_since_pages_and_filters(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for gid, owner, completed in [
        (111, "alice", "2026-12-02T10:00:00.000Z"),
        (112, "alice", "2026-11-20T10:00:00.000Z"),  # before --since
        (113, "bob", "2026-12-03T10:00:00.000Z"),  # an admin's list holds others'
        (114, "alice", "2026-12-04T10:00:00.000Z"),
    ]:
        script.archives[gid] = Archive(gid, f"c{gid}", _data(gid, 1_000))
        script.listed.append({"gid": gid, "owner": owner, "completedAt": completed})

    code, _, err = _run(peer, tmp_path, "--completed", "--since", "2026-12-01", capsys=capsys)

    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c111.zip", "c114.zip"]
    assert len(peer.requests("site", "/api/tasks?")) == 2  # two pages

    code, out, err = _run(peer, tmp_path, "--completed", "--all-users", capsys=capsys)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"c{g}.zip" for g in range(111, 115)]
    assert "4 archives: 2 saved, 2 already there, 0 failed" in err


def test_bad_usage_exits_2(
    peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    for argv, words in [
        (["1", "--completed"], "give GIDs or --completed"),
        ([], "give GIDs or --completed"),
        (["0"], "a gid is in 1..2147483647"),
        (["x"], "a gid is an integer"),
        (["1", "--since", "7d"], "--since and --all-users go with --completed"),
        (["--completed", "--since", "yesterday"], "not a date, a time or a duration"),
        (["1", "-j", "0"], "must be in 1..64"),
        (["1", "--bogus"], "unrecognized arguments: --bogus"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            get.main(["--site", peer.site_url, "-d", str(tmp_path), *argv])
        assert exit_.value.code == 2
        assert words in capsys.readouterr().err
    with pytest.raises(SystemExit):
        get.main(["--site", "ftp://x", "1"])
    assert "the site is an http(s) URL" in capsys.readouterr().err
    monkeypatch.delenv("TASKNET_TOKEN")
    with pytest.raises(SystemExit):
        get.main(["--site", peer.site_url, "1"])
    assert "no token: give --token-file F or set TASKNET_TOKEN" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        get.main(["--site", peer.site_url, "--token-file", str(tmp_path / "nope"), "1"])
    assert "cannot read --token-file" in capsys.readouterr().err
    assert peer.seen == []


def test_token_file_and_a_refused_token(
    script: Script, peer: ArchivePeer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script.archives[121] = Archive(121, "t", _data(121, 100))
    token_file = tmp_path / "token"
    token_file.write_text("wrong-token\n")
    code = get.main(["--site", peer.site_url, "--token-file", str(token_file), "121"])
    err = capsys.readouterr().err
    assert code == 1
    assert "tasknet-get: 401 unauthorized" in err and "wrong-token" not in err
    token_file.write_text(TOKEN + "\n")
    code = get.main(
        ["--site", peer.site_url, "--token-file", str(token_file), "-d", str(tmp_path), "121"]
    )
    assert code == 0
    assert peer.requests("site")[-1].headers["Authorization"] == f"Bearer {TOKEN}"


def test_site_unreachable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tasknet.process import free_port

    code = get.main(["--site", f"http://127.0.0.1:{free_port()}/", "-d", str(tmp_path), "1"])
    assert code == 1
    assert "tasknet-get: cannot reach the site: 127.0.0.1" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        get.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"tasknet-get {__version__}\n"


def test_interrupt_keeps_the_part(script: Script, peer: ArchivePeer, tmp_path: Path) -> None:
    data = _data(131, 2 * 1024 * 1024)
    script.archives[131] = Archive(131, "interrupted", data)
    script.stall_at[131] = 700_000
    part = tmp_path / "interrupted.zip.part"
    proc = _child(peer, tmp_path, "131")
    try:
        eventually_blocking(lambda: part.exists() and part.stat().st_size == 700_000)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "interrupted; partial files (*.zip.part) are kept" in err
    assert part.stat().st_size == 700_000


def test_safe_names() -> None:
    assert get.safe_name('a/b\\c:d*e?f"g<h>i|j', 1) == "a_b_c_d_e_f_g_h_i_j"
    assert get.safe_name("..", 7) == "7"
    assert get.safe_name("Title.zip", 7) == get.safe_name("Title", 7) == "Title"
    assert get.safe_name(".zip", 7) == "7"
    assert get.safe_name(" .hidden. ", 7) == "hidden"
    assert get.safe_name("tab\there\nnew", 7) == "tab here new"
    assert get.safe_name("evil\u202egpj.exe\x9b2J", 7) == "evil gpj.exe 2J"
    long = get.safe_name("漢" * 100, 7)
    assert len(long.encode()) <= get.MAX_NAME_BYTES and long == "漢" * 66
