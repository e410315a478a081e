"""What reaches a terminal: no file the model wrote and no string a service sent may act on it.

:func:`controller.text.visible` writes every control, format and bidirectional
character as an escape (never as itself, never dropped); every text the CLI prints passes
it, local and remote; ``--json`` is ASCII JSON. Validation flags the added lines that hold
such characters (the change set, the record, ``show``, the evidence, a failed job's text).
Attacked with a real job under runc and gVisor that writes erase-line, cursor-up, carriage
return, OSC title and clipboard writes, clear-screen, U+202E and the C1 CSI, and with a
hostile service on loopback that puts them in every string it serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import unicodedata
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker
import pytest

from controller.changes.changeset import MAX_CONTROL_LINES, ControlLine
from controller.changes.rules import check_diff, control_lines
from controller.changes.tree import MemoryTree
from controller.jobs.records import JobStore
from controller.text import escape, flag_text, hidden_characters, visible
from tests.support.git import make_diff
from tests.support.jobs import FILES, README, call, make_repo

ROOT = Path(__file__).resolve().parent.parent

ATTACKS = {
    "erase line": ("\x1b[2K", "\\x1b[2K"),
    "cursor up": ("\x1b[1A", "\\x1b[1A"),
    "carriage return": ("\r", "\\x0d"),
    "OSC 0 title": ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
    "OSC 52 clipboard": ("\x1b]52;c;cm0gLXJmIH4=\x07", "\\x1b]52;c;cm0gLXJmIH4=\\x07"),
    "clear screen": ("\x1b[2J", "\\x1b[2J"),
    "right-to-left override": ("\u202e", "\\u202e"),
    "C1 CSI": ("\x9b31m", "\\x9b31m"),
    "OSC with ST": ("\x1b]8;;http://x\x1b\\", "\\x1b]8;;http://x\\x1b\\"),
    "DEL and NUL": ("\x7f\x00", "\\x7f\\x00"),
    "line separator": ("\u2028", "\\u2028"),
    "zero width space": ("\u200b", "\\u200b"),
    "byte order mark": ("\ufeff", "\\ufeff"),
    "not UTF-8 (surrogateescape)": ("\udc9b", "\\udc9b"),
    "tag character": ("\U000e0041", "\\U000e0041"),
    "Hangul filler": ("\u3164", "\\u3164"),
}
SHOWN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def is_safe(text: str) -> bool:
    """No character a terminal acts on or hides (by the Unicode database, not by the rule
    under test): only newline and tab of the controls."""
    return not any(unicodedata.category(ch) in SHOWN_CATEGORIES and ch not in "\n\t" for ch in text)


def terminal_safe(raw: bytes) -> str:
    """``raw`` as UTF-8 (it must be) after checking it holds no ESC, C0 (but newline and
    tab), DEL, C1 or bidi control; the text."""
    assert not any(b < 0x20 and b not in b"\n\t" for b in raw), raw[:400]
    assert b"\x7f" not in raw
    text = raw.decode("utf-8")  # strict: a lone surrogate could not have been written
    assert is_safe(text), [escape(ch) for ch in text if not is_safe(ch)]
    return text


def raw_patchbox(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``python3 -m controller ARGS`` with the output as bytes (text mode would turn a
    carriage return into a newline)."""
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        capture_output=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        timeout=300,
        check=False,
    )


# --- the rule, as a table --------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "shown"), list(ATTACKS.values()), ids=list(ATTACKS))
def test_each_attack_is_shown_as_an_escape(raw: str, shown: str) -> None:
    text = f"before {raw} after"
    assert visible(text) == f"before {shown} after"
    assert is_safe(visible(text))
    assert visible(visible(text)) == visible(text)


def test_text_stays_as_it_is() -> None:
    """Letters of every script, right-to-left ones included, emoji with their variation
    selectors, no-break and other visible spaces, tab and newline are text."""
    text = (
        "plain ASCII ~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./\ttab\n"
        "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627 \u65e5\u672c\u8a9e "
        "caf\u00e9 na\u0131ve \u2764\ufe0f \U0001f600 \u00a0nbsp \u2013 \u201cq\u201d\n"
    )
    assert visible(text) == text
    assert hidden_characters(text) == []


def test_every_control_format_and_separator_character_is_escaped() -> None:
    """By the Unicode database of this interpreter: every Cc (but newline and tab), Cf, Cs,
    Zl and Zp code point, the Hangul fillers and the Egyptian format controls Unicode 15
    adds are escaped, none passed or dropped; every other code point (unassigned ones too)
    is left as it is, alone or among the others."""
    fillers = {"\u115f", "\u1160", "\u3164", "\uffa0"}
    fillers |= {chr(c) for c in range(0x13430, 0x13440)}  # format controls (Unicode 15)

    def expected(ch: str) -> str:
        shown = unicodedata.category(ch) in SHOWN_CATEGORIES and ch not in "\n\t"
        return escape(ch) if shown or ch in fillers else ch

    every = [chr(code) for code in range(0x110000)]
    wrong = [f"U+{ord(ch):04X}" for ch in every if visible(ch) != expected(ch)]
    assert wrong == []
    assert visible("".join(every)) == "".join(map(expected, every))
    assert hidden_characters("".join(every)) == [escape(ch) for ch in every if expected(ch) != ch]


def test_the_escapes() -> None:
    assert [escape(c) for c in "\x00\x1b\x9b\u202e\U000e0041"] == [
        "\\x00",
        "\\x1b",
        "\\x9b",
        "\\u202e",
        "\\U000e0041",
    ]
    assert hidden_characters("a\x1bb\x1b\u202ec\r") == ["\\x1b", "\\u202e", "\\x0d"]


# --- validation flags ------------------------------------------------------------------------

HOSTILE_LINES = [f"line {name}: {raw}text" for name, (raw, _) in ATTACKS.items()]


def test_validation_flags_the_added_lines_that_hold_them(tmp_path: Path) -> None:
    before = {"f.txt": "a\nb\nc\n", "crlf.txt": "one\r\ntwo\r\n"}
    body = "\n".join(h for h in HOSTILE_LINES if not {"\udc9b", "\x00"} & set(h))  # a text diff
    after = {
        "f.txt": f"a\x1b[2K\nb\n{body}\nc\n",
        "crlf.txt": "one\r\ntwo\r\nthree\r\n",  # a CR LF ending is not flagged
        "new.txt": "ok\nx\u202ey\n",
    }
    diff = make_diff(tmp_path, before, after)
    tree = MemoryTree({k: ("100644", v.encode()) for k, v in before.items()})
    changeset = check_diff(diff, tree).changeset
    flagged = {(c.path, c.line): c.characters for c in changeset.control_characters}
    count = len(HOSTILE_LINES) - 2
    assert flagged[("f.txt", 1)] == ["\\x1b"]
    assert [line for path, line in flagged if path == "f.txt"] == [1, *range(3, 3 + count)]
    assert flagged[("f.txt", 5)] == ["\\x0d"]
    assert flagged[("f.txt", 6)] == ["\\x1b", "\\x07"]
    assert flagged[("new.txt", 2)] == ["\\u202e"]
    assert not any(path == "crlf.txt" for path, _ in flagged)
    assert control_lines(diff) == changeset.control_characters


def test_removed_and_context_lines_are_not_flagged() -> None:
    before = {"f.txt": "a\x1b[2K\nb\u202e\nc\n"}
    diff = (
        "diff --git a/f.txt b/f.txt\n--- a/f.txt\n+++ b/f.txt\n"
        "@@ -1,3 +1,3 @@\n-a\x1b[2K\n+a\n b\u202e\n c\n"
    )
    tree = MemoryTree({"f.txt": ("100644", before["f.txt"].encode())})
    assert check_diff(diff, tree).changeset.control_characters == []


def test_flags_are_bounded_and_a_diff_that_does_not_parse_has_none() -> None:
    lines = "".join(f"+x{i}\x1b\n" for i in range(MAX_CONTROL_LINES + 5))
    diff = (
        "diff --git a/n.txt b/n.txt\nnew file mode 100644\n--- /dev/null\n+++ b/n.txt\n"
        f"@@ -0,0 +1,{MAX_CONTROL_LINES + 5} @@\n{lines}"
    )
    found = control_lines(diff)
    assert len(found) == MAX_CONTROL_LINES
    assert found[-1] == ControlLine(path="n.txt", line=MAX_CONTROL_LINES, characters=["\\x1b"])
    assert control_lines("not a diff \x1b[2J\n") == []


def test_the_flag_text() -> None:
    flags = [{"path": "a.py", "line": 3, "characters": ["\\x1b", "\\u202e"]}]
    head = (
        "warning: 1 added line(s) hold control, format or bidi characters, shown in the diff "
        "as \\xNN or \\uNNNN escapes:"
    )
    assert flag_text(flags) == [head, "  a.py:3: \\x1b \\u202e"]
    assert flag_text([]) == []


# --- a real job ------------------------------------------------------------------------------


WRITTEN_ATTACKS = [
    "erase line",
    "cursor up",
    "carriage return",
    "OSC 0 title",
    "OSC 52 clipboard",
    "clear screen",
    "right-to-left override",
    "C1 CSI",
]
WRITTEN = [f"line {name}: {ATTACKS[name][0]}text" for name in WRITTEN_ATTACKS]
"""What the model writes into README.md, one attack a line (lines 2 to 9), then a line with
a CR LF ending (line 10, not flagged)."""
HIDE: dict[str, Any] = {
    "name": "replace_text",
    "arguments": {
        "path": "README.md",
        "oldText": README,
        "newText": README + "".join(f"{line}\n" for line in WRITTEN) + "crlf ending\r\n",
    },
}
FLAGGED_LINES = list(range(2, 2 + len(WRITTEN)))


def run_hiding_job(
    repo: Path, tmp_path: Path, runtime: str, checks: dict[str, Any]
) -> tuple[Any, str]:
    task = {
        "prompt": "Document the greeting.",
        "checks": checks,
        "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32},
    }
    (tmp_path / "task.json").write_text(json.dumps(task))
    (tmp_path / "calls.json").write_text(json.dumps({"turns": [[call("c1", HIDE)]]}))
    (tmp_path / "config.toml").write_text("spare_sandboxes = 0\n")
    args = ["--task", str(tmp_path / "task.json"), "--calls", str(tmp_path / "calls.json")]
    args += ["--config", str(tmp_path / "config.toml"), "--runtime", runtime]
    run = raw_patchbox("run", "--repo", str(repo), *args)
    listed = raw_patchbox("jobs", "--repo", str(repo), "--json")
    job_id = json.loads(listed.stdout)["jobs"][-1]["job_id"]
    return run, job_id


def assert_flagged(flags: list[dict[str, Any]]) -> None:
    assert [(f["path"], f["line"]) for f in flags] == [("README.md", n) for n in FLAGGED_LINES]
    assert flags[0]["characters"] == ["\\x1b"]
    assert flags[2]["characters"] == ["\\x0d"]
    assert flags[3]["characters"] == ["\\x1b", "\\x07"]
    assert flags[6]["characters"] == ["\\u202e"]
    assert flags[7]["characters"] == ["\\x9b"]


@pytest.mark.docker
def test_show_diff_shows_what_the_model_hid_and_flags_it(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image  # the image is built once, before the job
    repo = make_repo(tmp_path / "greet", FILES)
    run, job_id = run_hiding_job(repo, tmp_path, runtime, {})
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    assert "warning: 8 added line(s) hold control" in terminal_safe(run.stdout)
    terminal_safe(run.stderr)
    shown = raw_patchbox("show", job_id, "--diff")
    assert shown.returncode == 0, shown.stderr
    text = terminal_safe(shown.stdout)
    terminal_safe(shown.stderr)
    assert f"job {job_id}: awaiting_review" in text
    for name in WRITTEN_ATTACKS:
        assert f"+line {name}: {ATTACKS[name][1]}text\n" in text, name
    assert "+crlf ending\\x0d\n" in text
    assert "warning: 8 added line(s) hold control, format or bidi characters" in text
    assert "  README.md:2: \\x1b\n" in text
    assert "  README.md:5: \\x1b \\x07\n" in text
    as_json = raw_patchbox("show", job_id, "--diff", "--json")
    assert as_json.returncode == 0
    assert as_json.stdout.isascii()
    data = json.loads(as_json.stdout)
    assert_flagged(data["control_characters"])
    assert "".join(f"{line}\n" for line in WRITTEN) in data["diff"].replace("\n+", "\n")
    folder = JobStore().folder(job_id)
    evidence = json.loads((folder / "evidence.json").read_text())
    assert_flagged(evidence["diff"]["control_characters"])
    stored = JobStore().load(job_id).model_dump(mode="json")  # the record, its log replayed
    assert_flagged(stored["control_characters"])
    patch = (folder / "diff.patch").read_bytes()
    assert b"\x1b]52;c;cm0gLXJmIH4=\x07" in patch  # the diff itself is kept byte for byte
    applied = raw_patchbox("apply", job_id)  # flagged, not refused: the reviewer decides
    assert applied.returncode == 0, applied.stderr
    assert (repo / "README.md").read_bytes() == HIDE["arguments"]["newText"].encode()


@pytest.mark.docker
def test_a_failed_job_says_so_in_its_failure_text(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    fail = {"argv": ["python3", "-c", "import sys; print('no'); sys.exit(1)"]}
    repo = make_repo(tmp_path / "greet", FILES)
    run, job_id = run_hiding_job(repo, tmp_path, "runc", {"fails": fail})
    assert run.returncode == 1, run.stderr
    text = terminal_safe(run.stdout)
    assert f"job {job_id}: failed" in text
    assert "error CHECK_FAILED" in text
    assert "warning: 8 added line(s) hold control, format or bidi characters" in text
    assert "  README.md:9: \\x9b\n" in text
    shown = raw_patchbox("show", job_id, "--diff")
    assert "+line C1 CSI: \\x9b31mtext\n" in terminal_safe(shown.stdout)


# --- a hostile service -----------------------------------------------------------------------

EVIL = "".join(raw for raw, _ in ATTACKS.values())
"""Every attack in one string (a lone surrogate included: JSON can carry one)."""
EVIL_NAME = "\x1b]0;evil\x07\u202e\x9b2J"
"""An event's type: no line break (the event stream's lines could not carry one)."""


def _view(job_id: str, status: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "status": status,
        "error": {"code": EVIL, "message": EVIL},
        "bundle": {"id": EVIL, "head": EVIL},
        "files": [{"path": EVIL, "change": EVIL, "added": EVIL, "removed": EVIL}],
        "control_characters": [{"path": EVIL, "line": EVIL, "characters": [EVIL]}],
        "checks": [{"id": EVIL, "status": EVIL, "exit_code": EVIL, "duration_ms": EVIL}],
        "tool_calls": [{"turn": EVIL, "id": EVIL, "name": EVIL, "ok": False, "error_code": EVIL}],
        "decision": {"reason": EVIL},
        "diff": EVIL,
        "evidence": EVIL,
    }


VIEWS = {"evil-review": _view(EVIL, "awaiting_review"), "evil-other": _view(EVIL, EVIL)}
JOBS = {
    "jobs": [
        {"job_id": EVIL, "status": EVIL, "repo": EVIL, "created": 0},
        {"job_id": EVIL, "status": EVIL, "bundle": {"id": EVIL}, "created": 1.5},
        {"job_id": EVIL, "status": EVIL, "bundle": EVIL, "repo": EVIL, "created": EVIL},
        EVIL,
    ]
}
EVENTS = [
    ("state", {"state": EVIL, "reason": EVIL, "error": {"code": EVIL, "message": EVIL}}),
    ("tool_call", {"turn": EVIL, "id": EVIL, "name": EVIL, "ok": False, "error_code": EVIL}),
    ("check", {"id": EVIL, "status": EVIL, "duration_ms": EVIL}),
    (EVIL_NAME, {EVIL: EVIL}),
    ("state", {"state": "failed"}),
]


class Hostile(BaseHTTPRequestHandler):
    """A service that answers every read with control sequences in every string."""

    def log_message(self, *_args: object) -> None:
        pass

    def _json(self, status: int, data: object) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path
        if path == "/v1/jobs":
            self._json(200, JOBS)
        elif path.endswith("/events"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for number, (kind, data) in enumerate(EVENTS, 1):
                block = f"id: {number}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"
                self.wfile.write(block.encode())
        elif path.removeprefix("/v1/jobs/") in VIEWS:
            self._json(200, VIEWS[path.removeprefix("/v1/jobs/")])
        else:
            self._json(409, {"error": {"code": "JOB_NOT_FINISHED", "message": EVIL}})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._json(202, {"job_id": "evil-review", "status": EVIL})


@pytest.fixture
def hostile() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def remote(url: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return raw_patchbox(
        "remote", *args, "--server", url, env={"PATCHBOX_TOKEN": "tok-terminal-4242"}
    )


@pytest.mark.parametrize(
    "command",
    [
        ("show", "evil-review"),
        ("show", "evil-other"),
        ("events", "evil-review"),
        ("jobs",),
    ],
    ids=" ".join,
)
def test_remote_text_output_holds_no_control_sequence(
    hostile: str, command: tuple[str, ...]
) -> None:
    proc = remote(hostile, *command)
    assert proc.returncode == 0, proc.stderr
    text = terminal_safe(proc.stdout)
    terminal_safe(proc.stderr)
    assert visible(EVIL) in text  # shown, every character of it, not dropped
    if command[0] == "show":
        assert f"{visible(EVIL)}:{visible(EVIL)}: {visible(EVIL)}" in text  # the flag line
    if command[0] == "events":
        assert f"4 {visible(EVIL_NAME)} " in text


@pytest.mark.parametrize(
    "command",
    [("show", "evil-review"), ("events", "evil-review"), ("jobs",)],
    ids=" ".join,
)
def test_remote_json_output_is_exact_ascii_json(hostile: str, command: tuple[str, ...]) -> None:
    proc = remote(hostile, *command, "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.isascii()
    terminal_safe(proc.stdout)
    lines = proc.stdout.decode().splitlines()
    if command[0] == "events":
        events = [json.loads(line) for line in lines]
        assert [(e["type"], e["data"]) for e in events] == EVENTS
    elif command[0] == "jobs":
        assert json.loads(proc.stdout) == JOBS
    else:
        assert json.loads(proc.stdout) == VIEWS["evil-review"]


def test_remote_submit_wait_and_a_refusal_hold_none(hostile: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "greet")
    (tmp_path / "task.json").write_text(json.dumps({"prompt": "x"}))
    waited = remote(
        hostile, "submit", "--repo", str(repo), "--task", str(tmp_path / "task.json"), "--wait"
    )
    terminal_safe(waited.stdout)
    progress = terminal_safe(waited.stderr)
    assert visible(EVIL) in progress  # the events, as they came
    refused = remote(hostile, "show", "evil-unknown")
    assert refused.returncode == 1
    assert refused.stdout == b""
    message = terminal_safe(refused.stderr)
    assert "JOB_NOT_FINISHED" in message
