"""The baseline archive cache: a tar of each baseline tree under
``$PATCHBOX_HOME/cache/baselines`` (keyed by tree id, bounded, least recently used evicted),
mounted read-only into a container under a neutral name (:func:`mount_alias`) and unpacked
there by GNU tar."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from controller.paths import MOUNT_PREFIX, mount_staging_root, owned_temp_dir, patchbox_home
from controller.repo.baseline import Baseline, archive_into


class BaselineCache:
    """Tar archives of baseline trees, keyed by tree id; at most ``max_bytes`` in all.

    Writers write a temp file and rename it into place; eviction only unlinks, so a reader
    (or a container that mounted the file) keeps its open copy."""

    def __init__(self, root: Path | None = None, max_bytes: int = 4 << 30) -> None:
        self.root = root or patchbox_home() / "cache" / "baselines"
        self.max_bytes = max_bytes

    def path(self, tree: str) -> Path:
        return self.root / f"{tree}.tar"

    def get(self, tree: str) -> Path | None:
        path = self.path(tree)
        try:
            os.utime(path)
        except OSError:
            return None
        return path

    @contextlib.contextmanager
    def writer(self, tree: str) -> Iterator[IO[bytes]]:
        """A file to write the archive into; it enters the cache only if the block ends
        without an exception."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.root / f".{tree}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with tmp.open("wb") as out:
                yield out
            tmp.chmod(0o644)
            tmp.replace(self.path(tree))
        finally:
            tmp.unlink(missing_ok=True)
        self.evict(keep=tree)

    def fill(self, baseline: Baseline) -> Path:
        """The cached archive of ``baseline`` (made now if missing)."""
        found = self.get(baseline.tree)
        if found is not None:
            return found
        with self.writer(baseline.tree) as out:
            archive_into(baseline, out.fileno())
        return self.path(baseline.tree)

    def evict(self, keep: str | None = None) -> list[str]:
        """Removes the least recently used archives until the total fits."""
        entries = []
        for path in self.root.glob("*.tar"):
            with contextlib.suppress(OSError):
                st = path.stat()
                entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        removed = []
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path.stem == keep:
                continue
            path.unlink(missing_ok=True)
            total -= size
            removed.append(path.stem)
        return removed


@contextlib.contextmanager
def mount_alias(source: Path) -> Iterator[Path]:
    """A second name for ``source`` under :func:`mount_staging_root`, to be bind-mounted
    instead of it: the container sees that neutral name in its mountinfo, never the path of
    ``$PATCHBOX_HOME``. A hard link where both share a filesystem, else a copy. Removed when
    the block ends; a started container's mount keeps the file itself."""
    folder = owned_temp_dir(MOUNT_PREFIX, mount_staging_root())
    alias = folder / "baseline.tar"
    try:
        try:
            os.link(source, alias)
        except OSError:
            shutil.copyfile(source, alias)
            alias.chmod(0o644)
        yield alias
    finally:
        shutil.rmtree(folder, ignore_errors=True)
