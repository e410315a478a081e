"""What every benchmark script shares: the load average, percentiles, the table."""

from __future__ import annotations

import contextlib
import io
import math
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

SAMPLE_PATH = "bench/sample.txt"
"""The file the per-call benchmarks read."""
SAMPLE = "".join(f"{i:02d} {'x' * 60}\n" for i in range(16))
"""16 lines of 64 bytes: a 1 KB text file."""


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages: a busy machine shows in the numbers."""
    return " ".join(Path("/proc/loadavg").read_text(encoding="ascii").split()[:3])


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def fmt_ms(seconds: float, *, whole: bool = False) -> str:
    """Milliseconds: three decimals below 10 ms and one above, or ``whole`` ones."""
    ms = seconds * 1000
    if whole:
        return f"{ms:.0f} ms"
    return f"{ms:.3f} ms" if ms < 10 else f"{ms:.1f} ms"


def sample_archive(files: Mapping[str, str] | None = None) -> bytes:
    """A tar of ``files`` (default: the sample at :data:`SAMPLE_PATH`) with their folders,
    for a bare sandbox's workspace."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        folders: set[str] = set()
        for rel, text in (files or {SAMPLE_PATH: SAMPLE}).items():
            parts = rel.split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                name = "/".join(parts[:depth])
                if name not in folders:
                    folders.add(name)
                    folder = tarfile.TarInfo(name)
                    folder.type = tarfile.DIRTYPE
                    folder.mode = 0o755
                    tar.addfile(folder)
            data = text.encode()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_repo(root: Path, files: Mapping[str, str] | None = None, message: str = "bench") -> Path:
    """A git repository at ``root`` with one commit of ``files`` (default: the sample),
    made through the controller's own git runner (no user configuration)."""
    from controller.repo.git import GitContext, run_git

    for rel, text in (files or {SAMPLE_PATH: SAMPLE}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    ctx = GitContext(cwd=root, home=root.parent)
    run_git(ctx, "init", "-q")
    run_git(ctx, "add", "-A")
    run_git(ctx, "commit", "-q", "-m", message)
    return root


def cgroup_memory(stats: dict[str, Any]) -> tuple[int, int]:
    """(usage, usage - file cache) in bytes from one answer of the Docker stats API.

    cgroup v1 charges the page cache of the files a container read to the container
    (``total_active_file + total_inactive_file``, which the host can reclaim); cgroup v2
    calls it ``file``. The second figure is what the host cannot take back.
    """
    mem = stats.get("memory_stats", {})
    detail: dict[str, int] = mem.get("stats", {})
    usage = int(mem.get("usage", 0))
    if "total_cache" in detail:
        file = int(detail.get("total_active_file", 0)) + int(detail.get("total_inactive_file", 0))
    else:
        file = int(detail.get("file", 0))
    return usage, usage - file


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """A plain table: a header, a rule, the rows, columns padded to fit."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for k, row in enumerate(table):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = slope * x + intercept``; returns ``(slope, intercept)``."""
    n = len(xs)
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        return 0.0, mean_y
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
    return slope, mean_y - slope * mean_x


def remove_labelled(client: Any, label: str) -> None:
    """Removes every container carrying ``label`` (``key=value``), running or not; a
    container that is already going is no failure."""
    for container in client.containers.list(all=True, filters={"label": label}):
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)
