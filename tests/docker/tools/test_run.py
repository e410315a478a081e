"""Processes in the sandbox (the base of run_check) on the real agent, over pipes and in a
container: distinct exit, signal and timeout; the whole process group dies; cancel works."""

from __future__ import annotations

import sys
import threading
import time

from tests.support.harness import AgentWorkspace


def _py(ws: AgentWorkspace) -> str:
    return "python3" if ws.kind == "docker" else sys.executable


def test_exit_signal_timeout_and_spawn_failure_are_distinct(agent: AgentWorkspace) -> None:
    py = _py(agent)
    ok = agent.box.run([py, "-c", "print('hi')"], timeout=20)
    assert (ok.exit_code, ok.signal, ok.timed_out, ok.output) == (0, None, False, "hi\n")
    assert agent.box.run([py, "-c", "import sys; sys.exit(3)"], timeout=20).exit_code == 3
    killed = agent.box.run([py, "-c", "import os; os.kill(os.getpid(), 15)"], timeout=20)
    assert (killed.exit_code, killed.signal, killed.timed_out) == (None, 15, False)
    slow = agent.box.run(["sleep", "30"], timeout=1)
    assert (slow.exit_code, slow.signal, slow.timed_out) == (None, 9, True)
    missing = agent.box.run(["/no/such/program"], timeout=20)
    assert (missing.exit_code, missing.signal, missing.timed_out) == (None, None, False)
    assert missing.spawn_error


GRANDCHILD = """
import subprocess, sys, time
subprocess.Popen([sys.argv[1], "-c", "import time; time.sleep(3); open('grandchild-alive', 'w')"])
time.sleep(60)
"""


def test_timeout_kills_grandchildren(agent: AgentWorkspace) -> None:
    started = time.monotonic()
    py = _py(agent) if agent.kind == "local" else "/usr/bin/python3"
    res = agent.box.run([py, "-c", GRANDCHILD, py], timeout=1)
    assert res.timed_out is True
    assert time.monotonic() - started < 5
    time.sleep(3.5)
    assert "grandchild-alive" not in agent.files()


def test_cancel_kills_the_process_group(agent: AgentWorkspace) -> None:
    target = agent.box.session.next_id
    timer = threading.Timer(0.5, agent.box.session.cancel, args=(target,))
    timer.start()
    started = time.monotonic()
    res = agent.box.run(["sh", "-c", "sleep 30 & sleep 30"], timeout=60)
    timer.join()
    assert (res.cancelled, res.signal, res.timed_out) == (True, 9, False)
    assert time.monotonic() - started < 5
    assert agent.box.list_files().files == []  # the session is still usable


def test_output_is_a_bounded_tail(agent: AgentWorkspace) -> None:
    res = agent.box.run(
        [_py(agent), "-c", "print('x' * 100000 + 'END')"], timeout=20, output_limit=1000
    )
    assert (res.output_bytes, res.truncated, len(res.output)) == (100004, True, 1000)
    assert res.output.endswith("END\n")
