"""What reaches a terminal: no file the model wrote and no string a service sent may act on it.

:func:`controller.tools.text.visible` writes every control, format and bidirectional
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

import pytest

from controller.tools.text import escape, hidden_characters, visible
from tests.support.jobs import make_repo

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
    """Letters of every script, right-to-left ones included, emoji with their selectors and
    joiners' neighbours, tab and newline are text."""
    text = (
        "plain ASCII ~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./\ttab\n"
        "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627 \u65e5\u672c\u8a9e "
        "caf\u00e9 na\u0131ve \u2764\ufe0f \U0001f600 \u00a0nbsp \u2013 \u201cq\u201d\n"
    )
    assert visible(text) == text
    assert hidden_characters(text) == []


def test_every_control_format_and_separator_character_is_escaped() -> None:
    """By the Unicode database of this interpreter: every Cc (but newline and tab), Cf, Cs,
    Zl and Zp code point is escaped, none is passed or dropped."""
    missed = [
        f"U+{code:04X}"
        for code in range(0x110000)
        if unicodedata.category(chr(code)) in SHOWN_CATEGORIES
        and chr(code) not in "\n\t"
        and visible(chr(code)) != escape(chr(code))
    ]
    assert missed == []


def test_the_escapes() -> None:
    assert [escape(c) for c in "\x00\x1b\x9b\u202e\U000e0041"] == [
        "\\x00",
        "\\x1b",
        "\\x9b",
        "\\u202e",
        "\\U000e0041",
    ]
    assert hidden_characters("a\x1bb\x1b\u202ec\r") == ["\\x1b", "\\u202e", "\\x0d"]


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
