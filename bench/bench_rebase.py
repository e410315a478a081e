"""``patchbox rebase``'s host side on a 200-file diff vs ``git rebase`` of the same commit.

The repository of ``bench_tools`` (``--files``, default 20,000) at its commit C0 is the
job's baseline. The job's diff rewrites 50 lines in each of 200 files, below line 10 of
each. The repository then moves on (commit C1): line 1 of 20 of those files and 200 other
files change, so 20 files merge three-way and 180 carry over as they are. Then,
interleaved over ``--repeat`` rounds:

- reference: ``git rebase`` of the job's commit (C0 plus the diff) onto C1, in a scratch
  clone made once (``git clone --shared``), its branch reset before each round (not timed);
- ``carry``: the diff carried onto C1's baseline in the private git dir
  (:func:`controller.changes.carry.carry`: the diff checked on the old baseline, the
  repository's versions read, 20 ``git merge-file``, the new blobs and tree written, the new
  diff made);
- ``build_baseline`` of C1 plus ``carry`` plus ``prepare_changeset`` of the result on the new
  baseline: what ``patchbox rebase`` does on the host before its checks run (the checks run
  in a sandbox as for any job, not measured here).

After the first round the carried result must equal the rebased commit's files.

    python3 bench/bench_rebase.py [--files 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
from pathlib import Path

from bench_apply import timed
from bench_tools import ensure_repo, git
from common import loadavg, print_table
from controller.changes.carry import carry
from controller.changes.changeset import ChangesetLimits
from controller.changes.validate import prepare_changeset
from controller.repo.baseline import build_baseline

FILES_CHANGED = 200
MERGED = 20
OTHER = 200
LINES_PER_FILE = 50
FIRST_LINE = 10
LIMITS = ChangesetLimits(max_files=FILES_CHANGED)
WHO = ("-c", "user.name=bench", "-c", "user.email=bench@localhost")


def files_with(root: Path, count: int, minimum: int, seed: int, skip: set[str]) -> list[str]:
    """``count`` files with at least ``minimum`` lines, spread over the tree, always the same."""
    rng = random.Random(seed)
    names = sorted(p.relative_to(root).as_posix() for p in root.glob("pkg*/mod*/f*.py"))
    rng.shuffle(names)
    chosen: list[str] = []
    for name in names:
        if name not in skip and (root / name).read_bytes().count(b"\n") >= minimum:
            chosen.append(name)
        if len(chosen) == count:
            break
    return sorted(chosen)


def rewrite(path: Path, lines_at: list[int], tag: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    for k in lines_at:
        lines[k] = f"{tag} {k}\n"
    path.write_text("".join(lines))


def row(what: str, values: list[float], ref: float | None) -> list[str]:
    med = statistics.median(values)
    return [
        what,
        str(len(values)),
        f"{med * 1000:.1f} ms",
        f"{max(values) * 1000:.1f} ms",
        f"{med / ref:.2f}x" if ref else "-",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--repo", type=Path, default=Path("/tmp/patchbox-bench-repo"))
    args = parser.parse_args()
    source: Path = args.repo / str(args.files)
    ensure_repo(source, args.files)
    scratch = Path(tempfile.mkdtemp(prefix="patchbox-bench-rebase-"))
    os.environ["PATCHBOX_HOME"] = str(scratch / "home")
    try:
        run(source, scratch, args.repeat)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(source: Path, scratch: Path, repeat: int) -> None:
    repo = scratch / "repo"  # the user's repository: a clone, so the source stays at C0
    git(source, "clone", "-q", "--shared", str(source), str(repo))
    rng = random.Random(3)
    job_files = files_with(repo, FILES_CHANGED, FIRST_LINE + LINES_PER_FILE + 5, 11, set())
    old = build_baseline(repo)[0]
    for name in job_files:
        count = (repo / name).read_text().count("\n")
        rewrite(repo / name, sorted(rng.sample(range(FIRST_LINE, count), LINES_PER_FILE)), "job")
    diff = git(repo, "diff", "--full-index", "--no-renames")
    git(repo, "checkout", "-q", "--", ".")
    for name in job_files[:MERGED]:
        rewrite(repo / name, [0], "upstream")
    for name in files_with(repo, OTHER, 2, 5, set(job_files)):
        rewrite(repo / name, [1], "upstream")
    git(repo, *WHO, "commit", "-qam", "upstream")
    c1 = git(repo, "rev-parse", "HEAD").strip()

    clone = scratch / "clone"  # the reference's scratch clone: job = C0 + the diff
    git(repo, "clone", "-q", "--shared", str(repo), str(clone))
    git(clone, "checkout", "-q", "-b", "job", old.commit)
    (scratch / "job.patch").write_text(diff)
    git(clone, "apply", "--index", str(scratch / "job.patch"))
    git(clone, *WHO, "commit", "-qm", "job")
    job_commit = git(clone, "rev-parse", "HEAD").strip()

    m: dict[str, list[float]] = {"git": [], "carry": [], "host": []}
    new = build_baseline(repo)[0]
    for i in range(repeat):
        git(clone, "checkout", "-q", "-f", "job")
        git(clone, "reset", "-q", "--hard", job_commit)
        m["git"].append(timed(lambda: git(clone, *WHO, "rebase", "-q", c1)))
        carried = carry(old, diff, new, extra_protected=())
        m["carry"].append(timed(lambda: carry(old, diff, new)))

        def host_side() -> None:
            fresh = build_baseline(repo)[0]
            result = carry(old, diff, fresh)
            prepare_changeset(fresh, result.collected.diff, limits=LIMITS)

        m["host"].append(timed(host_side))
        if i == 0:
            rebased = git(clone, "diff", "--full-index", "--no-renames", c1, "HEAD")
            if rebased != carried.collected.diff:
                raise SystemExit("benchmark sanity check failed: carry and git rebase differ")
            if len(carried.merged) != MERGED:
                raise SystemExit(f"benchmark sanity check failed: {carried.merged!r} merged")
    ref = statistics.median(m["git"])
    rows = [
        row("git rebase of the job's commit (reference, scratch clone)", m["git"], None),
        row("carry: the diff onto the new baseline", m["carry"], ref),
        row("build_baseline + carry + prepare_changeset (rebase's host side)", m["host"], ref),
    ]
    print(
        f"repo: {len(list(repo.glob('pkg*')))} packages; diff: {FILES_CHANGED} files "
        f"({MERGED} merged three-way), {len(diff.encode()) // 1024} KiB; upstream: "
        f"{MERGED + OTHER} files; load {loadavg()}"
    )
    print_table(["what", "n", "median", "max", "vs git rebase"], rows)


if __name__ == "__main__":
    main()
