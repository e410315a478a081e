"""A job's background duties while it runs: call something every few seconds on a thread of
its own, stopped (and joined) when the block ends; the job's heartbeat and its watch for a
cancel asked for from another process."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def periodically(every: float, action: Callable[[], bool], name: str) -> Iterator[None]:
    """Calls ``action`` every ``every`` seconds while the block runs, until it returns
    True; the thread is stopped and joined when the block ends."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every):
            if action():
                return

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def heartbeat(
    every: float, activity: Callable[[], tuple[str, float]], progress: Callable[[str], None]
) -> contextlib.AbstractContextManager[None]:
    """While the block runs: a progress line every ``every`` seconds that one step has
    lasted (``activity`` says what it is and since when, a ``time.monotonic`` value), so a
    long check, build or model turn shows that it is alive."""

    def beat() -> bool:
        what, since = activity()
        lasted = time.monotonic() - since
        if lasted >= every:
            with contextlib.suppress(Exception):
                progress(f"still {what} ({lasted:.0f} s)")
        return False

    return periodically(every, beat, "job-heartbeat")


def cancel_watch(
    every: float, requested: Callable[[], bool], cancel: Callable[[], None]
) -> contextlib.AbstractContextManager[None]:
    """While the block runs: ``cancel`` once ``requested`` says a cancel was asked for (a
    file in the job's folder, written by another process)."""

    def watch() -> bool:
        if requested():
            cancel()
            return True
        return False

    return periodically(every, watch, "job-cancel-requests")
