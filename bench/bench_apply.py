"""Apply of a 200-file, 20,000-line diff on a 100,000-file repository vs plain ``git apply``.

The repository of ``bench_tools`` (``--files``, default 100,000) gets a baseline
(``build_baseline``, clean tree); a deterministic diff rewrites 50 lines in each of 200 files
(100 diff lines per file: 20,000 in all), made by ``git diff`` in a scratch
``git worktree add --detach`` copy made once. Then, interleaved over ``--repeat`` rounds:

- reference (a): ``git apply`` of the diff in the scratch worktree (reset with ``git apply
  -R``, not timed);
- reference (b), the durability floor: the same ``git apply`` followed by as many flushes as
  the apply itself makes (``fsync`` and ``fdatasync`` calls, counted during an untimed
  apply before the rounds): one of each written file and of each of their folders, on the
  same number of threads as the apply uses, then the rest one after the other on a small
  file written for it and its folder (the journal's record and markers);
- reference (c): ``git apply --check`` of the diff in the scratch worktree: the kind of
  check ``apply_changeset`` runs itself (there with ``--cached`` on a temporary index of the
  touched paths), so a floor under any checked apply;
- ``apply_changeset``: validation (parse, rules, every touched path looked up in the private
  git dir, contents computed in memory), ``git apply --check --cached`` on a temporary index,
  the work-tree checks (operations in progress, SHA-256 of each touched file), the fsync'd
  journal record, temp files (each flushed), each path checked again and renamed, the
  folders flushed, the done marker;
- ``prepare_changeset`` alone (validation and patch check) and ``revert_changeset``, to show
  where the time goes.

After the first round both trees must hold the same 200 files.

    python3 bench/bench_apply.py [--files 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_tools import ensure_repo, git
from common import loadavg, print_table
from controller.changes.apply import apply_changeset, revert_changeset
from controller.changes.changeset import ChangesetLimits
from controller.changes.journal import Journal
from controller.changes.validate import prepare_changeset
from controller.changes.worktree import IO_THREADS
from controller.repo.baseline import build_baseline

FILES_CHANGED = 200
LINES_PER_FILE = 50
LIMITS = ChangesetLimits(max_files=FILES_CHANGED)


def pick_files(root: Path, seed: int = 11) -> list[str]:
    """200 files with at least 60 lines, spread over the tree, always the same ones."""
    rng = random.Random(seed)
    names = sorted(p.relative_to(root).as_posix() for p in root.glob("pkg*/mod*/f*.py"))
    rng.shuffle(names)
    chosen = []
    for name in names:
        if (root / name).read_bytes().count(b"\n") >= LINES_PER_FILE + 10:
            chosen.append(name)
        if len(chosen) == FILES_CHANGED:
            break
    return sorted(chosen)


def make_diff(worktree: Path, files: list[str], seed: int = 5) -> str:
    """Rewrites 50 lines of each file in the scratch worktree, takes ``git diff``, resets."""
    rng = random.Random(seed)
    for name in files:
        path = worktree / name
        lines = path.read_text().splitlines(keepends=True)
        for k in rng.sample(range(len(lines)), LINES_PER_FILE):
            lines[k] = f"changed {k} {rng.randrange(1 << 30)}\n"
        path.write_text("".join(lines))
    diff = git(worktree, "diff")
    git(worktree, "checkout", "-q", "--", ".")
    return diff


def timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def count_flushes(fn: object) -> int:
    """How many ``fsync`` and ``fdatasync`` calls ``fn()`` makes (any thread)."""
    counter = itertools.count()
    real = os.fsync, os.fdatasync

    def fsync(fd: int) -> None:
        next(counter)
        real[0](fd)

    def fdatasync(fd: int) -> None:
        next(counter)
        real[1](fd)

    os.fsync, os.fdatasync = fsync, fdatasync  # type: ignore[assignment]
    try:
        fn()  # type: ignore[operator]
    finally:
        os.fsync, os.fdatasync = real
    return next(counter)


def fsync_rest(folder: Path, count: int) -> None:
    """``count`` flushes one after the other, as the journal makes its own: a small file
    written and flushed, then its folder with a new entry flushed, and so on."""
    for n in range(count):
        if n % 2 == 0:
            fd = os.open(folder / "record", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, str(n).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            os.close(os.open(folder / f"marker-{n}", os.O_WRONLY | os.O_CREAT, 0o600))
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def fsync_written(pool: ThreadPoolExecutor, worktree: Path, files: list[str]) -> int:
    """``fsync`` of each written file, then of each of their folders, as the apply does;
    returns how many flushes that was."""

    def flush(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    folders = sorted({(worktree / name).parent for name in files})
    list(pool.map(flush, [worktree / name for name in files]))
    list(pool.map(flush, folders))
    return len(files) + len(folders)


def row(
    what: str, values: list[float], refs: tuple[float | None, float | None], verdict: str = "-"
) -> list[str]:
    """A table row: the median against each reference that is given."""
    med = statistics.median(values)
    return [
        what,
        str(len(values)),
        f"{med * 1000:.1f} ms",
        f"{max(values) * 1000:.1f} ms",
        *(f"{med / ref:.2f}x" if ref else "-" for ref in refs),
        "<= 1.5x (b)" if verdict != "-" else "-",
        verdict,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--repo", type=Path, default=Path("/tmp/patchbox-bench-repo"))
    args = parser.parse_args()
    root: Path = args.repo / str(args.files)
    ensure_repo(root, args.files)
    scratch = Path(tempfile.mkdtemp(prefix="patchbox-bench-apply-"))
    os.environ["PATCHBOX_HOME"] = str(scratch / "home")
    worktree = scratch / "worktree"
    git(root, "worktree", "add", "-q", "--detach", str(worktree))
    try:
        run(root, worktree, scratch, args.repeat)
    finally:
        git(root, "worktree", "remove", "--force", str(worktree))
        git(root, "worktree", "prune")
        shutil.rmtree(scratch, ignore_errors=True)


def run(root: Path, worktree: Path, scratch: Path, repeat: int) -> None:
    started = time.perf_counter()
    baseline = build_baseline(root)[0]
    built = time.perf_counter() - started
    files = pick_files(root)
    diff = make_diff(worktree, files)
    patch = scratch / "bench.patch"
    patch.write_text(diff)
    changed = sum(
        1 for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")
    )
    journal = Journal(scratch / "journal")
    pool = ThreadPoolExecutor(max_workers=IO_THREADS)
    flushes = count_flushes(
        lambda: apply_changeset(
            baseline, diff, job_id="bench-count", journal=journal, limits=LIMITS
        )
    )
    revert_changeset("bench-count", journal=journal)
    rest = scratch / "floor"
    rest.mkdir()
    os.sync()  # the worktree's checkout written back before anything is timed
    m: dict[str, list[float]] = {
        "git": [],
        "git_check": [],
        "git_fsync": [],
        "apply": [],
        "prepare": [],
        "revert": [],
    }
    for i in range(repeat):
        m["git_check"].append(timed(lambda: git(worktree, "apply", "--check", str(patch))))
        m["git"].append(timed(lambda: git(worktree, "apply", str(patch))))
        git(worktree, "apply", "-R", str(patch))

        def git_then_fsync() -> None:
            git(worktree, "apply", str(patch))
            fsync_rest(rest, flushes - fsync_written(pool, worktree, files))

        m["git_fsync"].append(timed(git_then_fsync))
        m["apply"].append(
            timed(
                lambda i=i: apply_changeset(
                    baseline, diff, job_id=f"bench-{i}", journal=journal, limits=LIMITS
                )
            )
        )
        if i == 0:
            differ = [n for n in files if (root / n).read_bytes() != (worktree / n).read_bytes()]
            if differ:
                raise SystemExit(f"benchmark sanity check failed: {len(differ)} files differ")
        git(worktree, "apply", "-R", str(patch))
        m["revert"].append(timed(lambda i=i: revert_changeset(f"bench-{i}", journal=journal)))
        m["prepare"].append(timed(lambda: prepare_changeset(baseline, diff, limits=LIMITS)))
    if git(root, "status", "--porcelain"):
        raise SystemExit("benchmark sanity check failed: the repository is not clean after revert")
    pool.shutdown()
    ref_a = statistics.median(m["git"])
    ref_b = statistics.median(m["git_fsync"])
    apply_ratio = statistics.median(m["apply"]) / ref_b
    met = "yes" if apply_ratio <= 1.5 else "NO"
    rows = [
        row("(a) git apply (reference, scratch worktree)", m["git"], (None, None)),
        row(f"(b) git apply + the apply's {flushes} flushes", m["git_fsync"], (ref_a, None)),
        row("(c) git apply --check alone (apply runs one)", m["git_check"], (ref_a, ref_b)),
        row("apply_changeset: validate + check + journal + apply", m["apply"], (ref_a, ref_b), met),
        row("  prepare_changeset alone (validate + check)", m["prepare"], (ref_a, ref_b)),
        row("revert_changeset", m["revert"], (ref_a, ref_b)),
    ]
    print(
        f"repo: {len(list(root.glob('pkg*')))} packages, baseline built in {built:.2f} s; "
        f"diff: {len(files)} files, {changed} changed lines, {len(diff.encode()) // 1024} KiB; "
        f"load {loadavg()}"
    )
    print_table(["what", "n", "median", "max", "vs (a)", "vs (b)", "target", "met"], rows)


if __name__ == "__main__":
    main()
