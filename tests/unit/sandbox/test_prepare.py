"""From a repository to a ready sandbox: every way the baseline gets in, on the real daemon.

The workspace must equal what the user sees (HEAD plus, with consent, local changes), and
the user's repository must be byte-identical afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.sandbox.cache import BaselineCache


def test_cache_is_bounded_and_least_recently_used_goes_first(tmp_path: Path) -> None:
    cache = BaselineCache(tmp_path / "cache", max_bytes=2500)
    for i, tree in enumerate(["a" * 40, "b" * 40, "c" * 40]):
        with cache.writer(tree) as out:
            out.write(bytes(1000))
        os.utime(cache.path(tree), (1000 + i, 1000 + i))
    # a (oldest) was evicted when c arrived; b is used now, so d evicts c.
    assert sorted(p.stem for p in cache.root.glob("*.tar")) == ["b" * 40, "c" * 40]
    assert cache.get("b" * 40) is not None
    with cache.writer("d" * 40) as out:
        out.write(bytes(1000))
    assert sorted(p.stem for p in cache.root.glob("*.tar")) == ["b" * 40, "d" * 40]

    def interrupted() -> None:
        with cache.writer("e" * 40) as out:
            out.write(b"partial")
            raise RuntimeError

    with pytest.raises(RuntimeError):
        interrupted()
    assert cache.get("e" * 40) is None
    assert [p.name for p in cache.root.iterdir() if p.name.endswith(".tmp")] == []
