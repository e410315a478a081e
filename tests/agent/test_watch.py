"""The agent's watched run (``run_start``, ``run_poll``): its unread output, pure."""

from __future__ import annotations

import threading
import time

from patchbox_agent import runner


def test_a_character_cut_between_two_reads_waits_for_its_end() -> None:
    watch = runner.Watch()
    data = "héllo €\n".encode()
    watch.add(data[:2])  # "h" and the first byte of "é"
    first = watch.take(0)
    assert (first["output"], first["done"]) == ("h", False)
    watch.add(data[2:8])  # the rest of "é", "llo ", the first byte of "€"
    assert watch.take(0)["output"] == "éllo "
    watch.add(data[8:])
    assert watch.take(0)["output"] == "€\n"
    assert watch.take(0) == {"output": "", "dropped": 0, "done": False}


def test_the_newest_output_is_kept_and_the_rest_counted() -> None:
    watch = runner.Watch()
    watch.add(b"a" * runner.UNREAD_CAP)
    watch.add(b"b" * 10)
    taken = watch.take(0)
    assert taken["dropped"] == 10
    assert taken["output"] == "a" * (runner.UNREAD_CAP - 10) + "b" * 10


def test_a_take_waits_for_output_or_the_end_and_no_longer() -> None:
    watch = runner.Watch()
    started = time.monotonic()
    assert watch.take(0.2)["output"] == ""
    assert 0.15 < time.monotonic() - started < 1.0
    threading.Timer(0.1, watch.add, args=(b"x\n",)).start()
    started = time.monotonic()
    assert watch.take(5)["output"] == "x\n"
    assert time.monotonic() - started < 2.0
    watch.add(b"last")
    watch.end({"exitCode": 0})
    assert watch.take(5) == {
        "output": "last",
        "dropped": 0,
        "done": True,
        "result": {"exitCode": 0},
    }
