"""Whether a lock file is held (``flock``) by another open file description."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def held(lock: Path) -> bool:
    """True when an exclusive ``flock`` on ``lock`` cannot be taken now (it is released at
    once when it can)."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
