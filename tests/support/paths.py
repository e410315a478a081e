"""Where the checkout's files are, for any test module at any depth under ``tests/``."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
"""The checkout: ``controller/``, ``docs/``, ``bench/``, ``pyproject.toml``."""
DATA = REPO_ROOT / "tests" / "data"
"""The tests' fixed inputs (recorded job records, the wire names)."""
BENCH = REPO_ROOT / "bench"
"""The benchmark scripts, whose pure parts some tests import."""
