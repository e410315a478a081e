"""A job's background duties while it runs: call something every few seconds on a thread of
its own, stopped (and joined) when the block ends."""

from __future__ import annotations

import contextlib
import threading
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
