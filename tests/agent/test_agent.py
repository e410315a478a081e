"""The agent in a host subprocess over pipes (no Docker): protocol and tool basics."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.errors import ErrorCode, SandboxError, ToolError
from controller.paths import sandbox_image_dir
from controller.sandbox.local import LocalSandbox
from controller.sandbox.protocol import KIND_JSON, encode
from patchbox_agent import jail


def _tar(files: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = (modes or {}).get(name, 0o644)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def box(tmp_path: Path) -> Iterator[LocalSandbox]:
    ws = tmp_path / "ws"
    ws.mkdir()
    with LocalSandbox(ws) as sandbox:
        yield sandbox


def test_handshake_reports_the_protocol(box: LocalSandbox) -> None:
    assert box.hello.protocol == 1
    assert box.hello.uid == os.getuid()


def test_archive_then_list_and_read(box: LocalSandbox) -> None:
    data = _tar(
        {"a.txt": b"one\ntwo\nthree\n", "src/b.py": b"print(1)\n", "run.sh": b"#!/bin/sh\n"},
        {"run.sh": 0o755},
    )
    loaded = box.put_archive(data)
    assert loaded.entries == 3
    assert box.list_files().files == ["a.txt", "run.sh", "src/b.py"]
    assert box.list_files(glob="src/*").files == ["src/b.py"]
    part = box.read_file("a.txt", start=2, end=2)
    assert (part.content, part.start_line, part.end_line, part.total_lines) == ("two\n", 2, 2, 3)
    assert (box.workspace / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (box.workspace / "a.txt").stat().st_mode & 0o777 == 0o644


def test_list_is_bounded(box: LocalSandbox) -> None:
    box.put_archive(_tar({f"f{i:03}.txt": b"x" for i in range(30)}))
    res = box.list_files(max_results=10)
    assert len(res.files) == 10
    assert res.truncated is True


DENIED = ErrorCode.TOOL_PATH_DENIED
INVALID = ErrorCode.TOOL_PATH_INVALID
NOT_FOUND = ErrorCode.TOOL_FILE_NOT_FOUND
NOT_ALLOWED = (DENIED, "not allowed")
LINK = (DENIED, "not allowed: a symbolic link, which the tools do not follow")
MALFORMED = (INVALID, jail.MALFORMED)
NOT_TEXT = (DENIED, "not a text file the tools read (binary, not UTF-8, or a line over 1 MiB)")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("../outside.txt", (DENIED, "not allowed: '..' leaves the repository")),
        (
            "/etc/passwd",
            (INVALID, jail.ABSOLUTE),
        ),
        ("a/../../outside.txt", (DENIED, "not allowed: '..' leaves the repository")),
        (
            "sub\\..\\..\\outside.txt",
            (INVALID, MALFORMED[1] + ", backslashes or control characters"),
        ),
        ("a.txt\x00", (INVALID, MALFORMED[1] + ", backslashes or control characters")),
        ("", MALFORMED),
        (".", MALFORMED),
        ("sub", (DENIED, "a folder, not a file (list_files lists what it holds)")),
        ("missing.txt", (NOT_FOUND, "no such file")),
        ("sub/missing/deeper.txt", (NOT_FOUND, "no such file")),
        ("a.txt/inside", (NOT_FOUND, "no such file (a part of the path is a file, not a folder)")),
        ("link.txt", LINK),  # a symlink to a real file inside
        ("sub/escape", LINK),  # a symlink out of the workspace
        ("linkdir/a.txt", LINK),  # through a symlinked folder
        ("fifo", (DENIED, "not allowed: not a regular file")),
        (".git/config", NOT_ALLOWED),
        (".GIT/config", NOT_ALLOWED),
        (".env", NOT_ALLOWED),
        ("key.pem", NOT_ALLOWED),
        ("bin.dat", NOT_TEXT),  # not UTF-8 text
    ],
)
def test_read_denials_say_why(
    box: LocalSandbox, tmp_path: Path, path: str, expected: tuple[ErrorCode, str]
) -> None:
    ws = box.workspace
    (tmp_path / "outside.txt").write_text("secret\n")
    (ws / "a.txt").write_text("hello\n")
    (ws / "sub").mkdir()
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / ".GIT").mkdir()
    (ws / ".GIT" / "config").write_text("[core]\n")
    (ws / ".env").write_text("TOKEN=x\n")
    (ws / "key.pem").write_text("-----BEGIN-----\n")
    (ws / "bin.dat").write_bytes(b"\xff\xfe\x00\x01")
    (ws / "link.txt").symlink_to("a.txt")
    (ws / "linkdir").symlink_to("sub")
    (ws / "sub" / "a.txt").write_text("x\n")
    (ws / "sub" / "escape").symlink_to(tmp_path / "outside.txt")
    os.mkfifo(ws / "fifo")
    started = time.monotonic()
    with pytest.raises(ToolError) as info:
        box.read_file(path)
    assert (info.value.code, info.value.message) == expected
    assert time.monotonic() - started < 2, "a FIFO must not block the agent"
    assert box.read_file("a.txt").content == "hello\n"


PROTECTED = [".env", ".env.local", "key.pem", "id_rsa", ".git/config", "sub/.git/HEAD", ".netrc"]


@pytest.mark.parametrize("path", PROTECTED)
def test_a_protected_name_answers_the_same_whether_it_exists(box: LocalSandbox, path: str) -> None:
    """Reading, editing or finding a protected name tells nothing of whether it exists."""
    answers = []
    for exists in (False, True):
        if exists:
            target = box.workspace / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("SECRET=1\n")
        for call in (
            lambda: box.read_file(path),
            lambda: box.replace_text(path, "SECRET", "x"),
        ):
            with pytest.raises(ToolError) as info:
                call()
            answers.append((exists, info.value.code, info.value.message))
    assert [a[1:] for a in answers] == [(DENIED, "not allowed")] * 4


def test_protected_and_linked_files_are_not_listed(box: LocalSandbox, tmp_path: Path) -> None:
    ws = box.workspace
    (ws / "ok.py").write_text("x\n")
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ref\n")
    (ws / ".env.local").write_text("x\n")
    (ws / "id_rsa").write_text("x\n")
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outdir" / "secret.txt").write_text("x\n")
    (ws / "linkdir").symlink_to(tmp_path / "outdir")
    (ws / "link.py").symlink_to("ok.py")
    assert box.list_files().files == ["ok.py"]


def test_bad_arguments_are_retryable_errors(box: LocalSandbox) -> None:
    with pytest.raises(ToolError) as info:
        box.list_files(max_results=0)
    assert info.value.code is ErrorCode.TOOL_ARGUMENTS_INVALID
    with pytest.raises(ToolError) as info:
        box.session.call("no_such_op", {}, 5)
    assert info.value.code is ErrorCode.TOOL_ARGUMENTS_INVALID
    assert box.list_files().files == []


def test_run_reports_exit_status_and_output(box: LocalSandbox) -> None:
    ok = box.run([sys.executable, "-c", "print('hi')"], timeout=20)
    assert (ok.exit_code, ok.signal, ok.timed_out, ok.output) == (0, None, False, "hi\n")
    bad = box.run([sys.executable, "-c", "import sys; sys.exit(3)"], timeout=20)
    assert bad.exit_code == 3
    killed = box.run(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
        timeout=20,
    )
    assert (killed.exit_code, killed.signal) == (None, 15)
    missing = box.run(["/no/such/program"], timeout=20)
    assert missing.exit_code is None
    assert missing.spawn_error


def test_run_output_keeps_a_bounded_tail(box: LocalSandbox) -> None:
    res = box.run(
        [sys.executable, "-c", "print('x' * 100000 + 'END')"], timeout=20, output_limit=1000
    )
    assert res.output_bytes == 100004
    assert res.truncated is True
    assert len(res.output) == 1000
    assert res.output.endswith("END\n")


def test_run_timeout_kills_the_whole_process_group(box: LocalSandbox, tmp_path: Path) -> None:
    marker = tmp_path / "grandchild-alive"
    child = f"import time; time.sleep(3); open({str(marker)!r}, 'w')"
    script = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}])\ntime.sleep(60)\n"
    started = time.monotonic()
    res = box.run([sys.executable, "-c", script], timeout=1)
    assert res.timed_out is True
    assert res.signal == 9
    assert time.monotonic() - started < 5
    time.sleep(3.5)
    assert not marker.exists(), "the grandchild outlived the timeout"


def test_background_children_do_not_hold_the_call(box: LocalSandbox) -> None:
    started = time.monotonic()
    res = box.run(["sh", "-c", "sleep 30 & echo started"], timeout=20)
    assert res.exit_code == 0
    assert res.output == "started\n"
    assert time.monotonic() - started < 5


def test_a_process_that_closes_its_output_before_it_exits_is_not_killed(
    box: LocalSandbox,
) -> None:
    """The end of the output is not the end of the run: a process that closes its stdout
    and stderr first (coreutils do, at exit) and exits later reports its own exit."""
    script = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(0.5)\nos._exit(7)\n"
    res = box.run([sys.executable, "-c", script], timeout=20)
    assert (res.exit_code, res.signal, res.timed_out) == (7, None, False)
    assert res.duration_ms >= 500
    # one that never exits after closing its output ends at the deadline, as a timeout
    hung = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)\n"
    started = time.monotonic()
    res = box.run([sys.executable, "-c", hung], timeout=1)
    assert (res.timed_out, res.signal) == (True, 9)
    assert time.monotonic() - started < 5


def test_run_gets_only_the_given_environment(box: LocalSandbox) -> None:
    res = box.run(
        [sys.executable, "-c", "import os; print(sorted(os.environ))"], timeout=20, env={"A": "1"}
    )
    assert res.output.strip() in ("['A']", "['A', 'LC_CTYPE']")


def test_cancel_kills_a_running_process(box: LocalSandbox) -> None:
    import threading

    target = box.session.next_id
    timer = threading.Timer(0.5, box.session.cancel, args=(target,))
    timer.start()
    started = time.monotonic()
    res = box.run(["sleep", "30"], timeout=60)
    timer.join()
    assert res.cancelled is True
    assert res.signal == 9
    assert time.monotonic() - started < 5
    assert box.list_files().files == []  # the session is still usable


def _raw_agent(tmp_path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", "-B", str(sandbox_image_dir() / "agent.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={"PATCHBOX_WORKSPACE": str(tmp_path)},
    )


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", 0),  # clean end of input
        (b"garbage!", 3),
        (encode(KIND_JSON, b"[1]"), 3),
        (encode(KIND_JSON, b'{"id": 1, "op": "list_files", "args": {}}'), 3),  # no hello first
        (b"PB" + KIND_JSON + (100 * 1024 * 1024).to_bytes(4, "big"), 3),  # oversized
    ],
)
def test_agent_refuses_a_broken_controller_stream(tmp_path: Path, data: bytes, code: int) -> None:
    proc = _raw_agent(tmp_path)
    out, _ = proc.communicate(data, timeout=10)
    assert proc.returncode == code
    assert out == b""


def _hostile_tar(kind: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if kind == "symlink-write-through":
            link = tarfile.TarInfo("link")
            link.type = tarfile.SYMTYPE
            link.linkname = "../outside"
            tar.addfile(link)
            name = "link/owned.txt"
        else:
            name = {"dotdot": "../outside/owned.txt", "nested-dotdot": "a/../../outside/owned.txt"}[
                kind
            ]
        info = tarfile.TarInfo(name)
        info.size = 5
        tar.addfile(info, io.BytesIO(b"owned"))
    return buf.getvalue()


@pytest.mark.parametrize("extractor", ["gnu-tar", "python"])
@pytest.mark.parametrize("kind", ["dotdot", "nested-dotdot", "symlink-write-through"])
def test_hostile_archive_is_refused_and_writes_nothing_outside(
    tmp_path: Path, extractor: str, kind: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    env = {"PATCHBOX_AGENT_TAR": "python"} if extractor == "python" else {}
    with LocalSandbox(ws, env=env) as sandbox:
        with pytest.raises(SandboxError) as info:
            sandbox.put_archive(_hostile_tar(kind))
        assert info.value.code is ErrorCode.SANDBOX_FAILED
        assert "archive" in info.value.message
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("extractor", ["gnu-tar", "python"])
def test_both_extractors_give_the_same_tree(tmp_path: Path, extractor: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {"PATCHBOX_AGENT_TAR": "python"} if extractor == "python" else {}
    data = _tar(
        {"a/b/c.txt": b"x\r\ny", "\u00e9t\u00e9.md": b"", "bin/run": b"#!/bin/sh\n", "p": b"1"},
        {"bin/run": 0o775, "p": 0o664},
    )
    with LocalSandbox(ws, env=env) as sandbox:
        loaded = sandbox.put_archive(data)
        assert (loaded.entries, loaded.bytes) == (4, len(data))
    assert (ws / "a/b/c.txt").read_bytes() == b"x\r\ny"
    assert (ws / "\u00e9t\u00e9.md").read_bytes() == b""
    assert (ws / "bin/run").stat().st_mode & 0o777 == 0o755
    assert (ws / "p").stat().st_mode & 0o777 == 0o644


def test_gnu_tar_counts_names_without_a_memory_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``memfd_create`` is missing, tar's list of names goes to an unnamed temp file;
    the files get the time they were written, not the archive's (as with ``tarfile``)."""
    from patchbox_agent import extract

    if extract._gnu_tar() is None:
        pytest.skip("no GNU tar on this host")
    monkeypatch.delattr(os, "memfd_create", raising=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    data = _tar({"a.txt": b"one\n", "d/b.txt": b"two\n", "d/e/c.txt": b""})
    archive = tmp_path / "a.tar"
    archive.write_bytes(data)
    before = time.time() - 5
    fd = os.open(archive, os.O_RDONLY)
    root = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        stream = extract.FileStream(fd)
        assert extract.unpack(stream, str(ws), root) == 3
        assert stream.total == len(data)
    finally:
        os.close(fd)
        os.close(root)
    assert (ws / "d/e/c.txt").read_bytes() == b""
    assert (ws / "a.txt").stat().st_mtime >= before


def test_changes_sees_files_a_left_over_process_made_later(box: LocalSandbox) -> None:
    box.put_archive(_tar({"a.txt": b"one\n", "b.txt": b"two\n"}))
    assert box.changes().count == 0  # nothing written yet: no reference taken
    box.replace_text("a.txt", "one", "uno")
    res = box.run(
        [
            "sh",
            "-c",
            "setsid sh -c 'sleep 0.5; echo late > late.txt; rm b.txt' >/dev/null 2>&1 & sleep 0.2",
        ],
        timeout=10,
    )
    assert res.exit_code == 0
    assert box.list_files().files == ["a.txt", "b.txt"]  # listed before the late writes
    deadline = time.monotonic() + 10
    while not (box.workspace / "late.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    changes = box.changes()
    assert (changes.added, changes.removed, changes.modified) == (
        ["late.txt"],
        ["b.txt"],
        ["a.txt"],
    )
    assert changes.count == 3
    raw = box.read_raw("late.txt")
    assert (raw.kind, raw.size, raw.executable) == ("file", 5, False)


TRADITIONAL = (
    "--- a/a.txt\t2026-01-01 00:00:00\n+++ b/a.txt\t2026-01-01 00:00:01\n"
    "@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n"
    "--- /dev/null\n+++ b/src/new.py\n@@ -0,0 +1 @@\n+print(2)\n"
    "--- run.sh\n+++ /dev/null\n@@ -1 +0,0 @@\n-#!/bin/sh\n"
)


def test_apply_patch_takes_a_traditional_unified_diff(box: LocalSandbox) -> None:
    """What diff -u writes and patch -p1 takes: modify, create, and delete an executable
    file (its deleted file mode is the file's own)."""
    box.put_archive(_tar({"a.txt": b"one\ntwo\n", "run.sh": b"#!/bin/sh\n"}, {"run.sh": 0o755}))
    done = box.apply_patch(TRADITIONAL)
    assert [(f.path, f.kind, f.added, f.removed) for f in done.files] == [
        ("a.txt", "modify", 1, 1),
        ("src/new.py", "create", 1, 0),
        ("run.sh", "delete", 0, 1),
    ]
    ws = box.workspace
    assert (ws / "a.txt").read_text() == "one\nTWO\n"
    assert (ws / "src" / "new.py").read_text() == "print(2)\n"
    assert not (ws / "run.sh").exists()


@pytest.mark.parametrize(
    "patch",
    [
        "--- a/.env\n+++ b/.env\n@@ -1 +1 @@\n-TOKEN=x\n+TOKEN=y\n",
        "--- /dev/null\n+++ b/.env.local\n@@ -0,0 +1 @@\n+TOKEN=y\n",
        "--- a/../outside.txt\n+++ b/../outside.txt\n@@ -1 +1 @@\n-secret\n+owned\n",
        "--- /dev/null\n+++ /tmp/planted\n@@ -0,0 +1 @@\n+x\n",
        "--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-[core]\n+[x]\n",
        "--- a/a.txt\n+++ b/b.txt\n@@ -1 +1 @@\n-one\n+owned\n",
    ],
)
def test_a_hostile_traditional_diff_changes_nothing(
    box: LocalSandbox, tmp_path: Path, patch: str
) -> None:
    (tmp_path / "outside.txt").write_text("secret\n")
    box.put_archive(_tar({"a.txt": b"one\n", "b.txt": b"one\n", ".env": b"TOKEN=x\n"}))
    before = sorted((p.relative_to(box.workspace), p.read_bytes()) for p in _files(box.workspace))
    with pytest.raises(ToolError) as info:
        box.apply_patch(patch)
    assert info.value.code is ErrorCode.PATCH_REJECTED
    after = sorted((p.relative_to(box.workspace), p.read_bytes()) for p in _files(box.workspace))
    assert after == before
    assert (tmp_path / "outside.txt").read_text() == "secret\n"
    assert not Path("/tmp/planted").exists()


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]
