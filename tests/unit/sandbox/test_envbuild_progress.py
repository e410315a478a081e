"""An environment build names its running step with its time every 10 s while the step runs,
whether or not it writes anything (the builder's output followed by a timer)."""

from __future__ import annotations

import pytest

from controller.sandbox.envbuild import _BuildRun


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_silent_step_is_named_at_each_10_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr("controller.sandbox.envbuild.time.monotonic", clock)
    said: list[str] = []
    run = _BuildRun({4: "setup 1/2: sleep 25", 5: "setup 2/2: true"}, said.append)
    run.tick()  # no step yet: nothing
    run.feed({"stream": "Step 4/9 : RUN sleep 25\n"})
    for second in range(1, 26):
        clock.now = 1000.0 + second
        run.tick()
    clock.now += 0.5
    run.feed({"stream": "Step 5/9 : RUN true\n"})
    clock.now += 9.9
    run.tick()
    assert said == [
        "environment: setup 1/2: sleep 25",
        "environment: setup 1/2: sleep 25 (10 s)",
        "environment: setup 1/2: sleep 25 (20 s)",
        "environment: setup 2/2: true",
    ]


def test_a_late_tick_reports_once_and_keeps_the_10_second_beat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr("controller.sandbox.envbuild.time.monotonic", clock)
    said: list[str] = []
    run = _BuildRun({2: "python3 for the agent"}, said.append)
    run.feed({"stream": "Step 2/3 : RUN x\n"})
    clock.now += 25.0  # the timer was late: one line, not two
    run.tick()
    clock.now += 5.0
    run.tick()
    assert said[1:] == [
        "environment: python3 for the agent (25 s)",
        "environment: python3 for the agent (30 s)",
    ]
