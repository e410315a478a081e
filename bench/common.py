"""What every benchmark script shares: the load average, percentiles, the table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


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


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """A plain table: a header, a rule, the rows, columns padded to fit."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for k, row in enumerate(table):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
