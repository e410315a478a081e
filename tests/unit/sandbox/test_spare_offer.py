"""The lock a spare's start holds for its pool key: one start at a time per key, within a
process and across processes, and the lock file swept once nothing holds it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, cast

from controller.sandbox.spares import OFFERING, SparePool, _unlink_unless_held

KEY = "k" * 32


def _pool(root: Path) -> SparePool:
    return SparePool(cast(Any, None), root=root, home="test")


def test_one_start_per_key_at_a_time_other_keys_go_on(tmp_path: Path) -> None:
    pool = _pool(tmp_path / "spares")
    with pool._offering(KEY) as first:
        assert first is not None
        with pool._offering(KEY) as second:
            assert second is None
        with pool._offering("o" * 32) as other:
            assert other is not None
    with pool._offering(KEY) as again:
        assert again is not None


def test_a_start_in_another_process_holds_the_key(tmp_path: Path) -> None:
    pool = _pool(tmp_path / "spares")
    code = (
        "import sys; from pathlib import Path; from typing import Any, cast\n"
        "from controller.sandbox.spares import SparePool\n"
        "pool = SparePool(cast(Any, None), root=Path(sys.argv[1]), home='test')\n"
        "with pool._offering(sys.argv[2]) as mine:\n"
        "    print(mine is not None, flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    argv = [sys.executable, "-c", code, str(pool.root), KEY]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as other:
        assert other.stdout is not None
        assert other.stdin is not None
        assert other.stdout.readline().strip() == "True"
        with pool._offering(KEY) as mine:
            assert mine is None
        held = pool.root / f"{KEY}{OFFERING}"
        _unlink_unless_held(held)
        assert held.exists()  # held by the other process: left
        other.stdin.write("\n")
        other.stdin.close()
        assert other.wait(timeout=30) == 0
    _unlink_unless_held(held)
    assert not held.exists()
    with pool._offering(KEY) as mine:
        assert mine is not None
