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
import subprocess
import threading
import unicodedata
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from controller.changes.changeset import MAX_CONTROL_LINES, ControlLine
from controller.changes.rules import check_diff, control_lines
from controller.changes.tree import MemoryTree
from controller.text import escape, flag_text, hidden_characters, visible
from tests.support.git import make_diff
from tests.support.jobs import make_repo
from tests.support.terminal import (
    ATTACKS,
    SHOWN_CATEGORIES,
    is_safe,
    raw_patchbox,
    terminal_safe,
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
    ("tool_call", {"turn": 2, "id": "c2", "name": "run_check", "ok": True, "verdict": EVIL}),
    ("check", {"id": EVIL, "status": EVIL, "duration_ms": EVIL}),
    (EVIL_NAME, {EVIL: EVIL}),
    ("state", {"state": "failed"}),
]


EVIL_DIFF = (
    "diff --git a/greet.py b/greet.py\n--- a/greet.py\n+++ b/greet.py\n@@ -1 +1,2 @@\n"
    " print('hi')\n"
    f"+x = 1  {EVIL}\n"
)


TEXT_DIFF = EVIL_DIFF.replace(EVIL, "\x1b[2K\u202e hidden")
"""A diff that parses: its flagged line is named."""


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
        elif path in {"/v1/jobs/evil-review/diff", "/v1/jobs/evil-other/diff"}:
            diff = EVIL_DIFF if "review" in path else TEXT_DIFF
            body = diff.encode("utf-8", "surrogateescape")
            self.send_response(200)
            self.send_header("Content-Type", "text/x-diff; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
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
        assert f"5 {visible(EVIL_NAME)} " in text
        assert f"3 tool_call turn 2 c2 run_check: {visible(EVIL)}" in text  # the verdict


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


def test_remote_show_diff_shows_a_hostile_diff_escaped_and_flags_it_itself(hostile: str) -> None:
    """The diff a service sends is shown with every control escaped, and flagged by this
    side (not by the service's say-so), in text; ``--json`` keeps it exact, as ASCII."""
    proc = remote(hostile, "show", "evil-review", "--diff")
    assert proc.returncode == 0, proc.stderr
    text = terminal_safe(proc.stdout)
    assert f"+x = 1  {visible(EVIL)}" in text
    assert "in the diff as downloaded:" in text
    # a NUL and a lone surrogate make it no diff: the characters are named, not the line
    assert "warning: the diff holds control, format or bidi characters: \\x1b" in text
    named = terminal_safe(remote(hostile, "show", "evil-other", "--diff").stdout)
    assert "in the diff as downloaded:\nwarning: 1 added line(s) hold control" in named
    assert "  greet.py:2: \\x1b \\u202e" in named
    exact = remote(hostile, "show", "evil-review", "--diff", "--json")
    assert exact.stdout.isascii()
    assert json.loads(exact.stdout)["diff"] == EVIL_DIFF


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
