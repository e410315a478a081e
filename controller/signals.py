"""What SIGINT, SIGTERM and SIGHUP do during a job: cancel it cleanly, then exit 130, 143 or
129 (what Ctrl-C, a CI runner's cancel and a closing terminal send)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

CANCEL_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code_for(signum: int) -> int:
    """The shell's convention: 128 plus the signal number."""
    return 128 + signum


def cancel_reason(signum: int) -> str:
    """What a job cancelled by this signal says: ``cancelled by the user (SIGINT)``."""
    return f"cancelled by the user ({signal.Signals(signum).name})"


@dataclass
class Cancellation:
    """The first cancel signal received while the block ran, if any."""

    signum: int | None = None

    @property
    def exit_code(self) -> int | None:
        return exit_code_for(self.signum) if self.signum is not None else None

    @property
    def reason(self) -> str | None:
        return cancel_reason(self.signum) if self.signum is not None else None


@contextlib.contextmanager
def cancel_on_signals(
    cancel: Callable[[str], None], progress: Callable[[str], None]
) -> Iterator[Cancellation]:
    """Runs ``cancel`` on a thread at the first SIGINT, SIGTERM or SIGHUP, given the
    cancel's reason in words (:func:`cancel_reason`); later ones are ignored while the
    cancel takes effect. The previous handlers come back after the block. Outside the main
    thread (where signals cannot be handled) it does nothing."""
    state = Cancellation()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum: int, _frame: object) -> None:
        if state.signum is not None:
            return
        state.signum = signum
        with contextlib.suppress(OSError, ValueError):  # the terminal may be gone (SIGHUP)
            progress(f"cancelling ({signal.Signals(signum).name})")
        thread = threading.Thread(
            target=cancel, args=(cancel_reason(signum),), name="cancel", daemon=True
        )
        thread.start()

    previous = {sig: signal.signal(sig, handler) for sig in CANCEL_SIGNALS}
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
