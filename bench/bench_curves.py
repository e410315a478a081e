"""Cost curves: how the time of each step grows with the number of files in the repository.

For each size (``--sizes``, default 1,000, 10,000 and 100,000 files; the repositories of
``bench_tools``, generated once under ``--repo``), ``--rounds`` interleaved rounds, each with
a new sandbox (runc), time:

- **baseline, first job**: ``prepare()`` with nothing cached and no spare, against
  ``git worktree add --detach`` into tmpfs (``/dev/shm``) of the same repository;
- **first listing** of the new sandbox (the cold walk and git's ignore filter);
- **search_text** of a rare literal at a fresh workspace version, and again at the same
  version (the cache), against ``grep -rn`` of it in the same container;
- **list_files** at a fresh workspace version (the first 10,000 paths), against
  ``git ls-files`` on the host;
- **collection of the diff** (``collect``: the changes read out of the sandbox, hashed into
  the private git dir, diffed on the host) after a one-line change of one file, then after a
  change of 1% of the files, against ``git diff`` of the same changes in a scratch worktree;
- **apply** of that 1% diff to the repository (``apply_changeset``, then reverted), against
  ``git apply`` of it in the scratch worktree.

Each measure gets a table (median per size, with the reference and the ratio) and a
least-squares line through the medians, ``time = fixed + slope x files``: the slope in ms per
1,000 files and the fixed cost in ms, so that the time on another repository can be
predicted. With ``--idle N`` (default 100, 0 to skip), N idle sandboxes are then started at
once under runc through the project's own sandbox code (``bench_idle``), their memory read
from their cgroups against as many plain containers, and every container removed.

    python3 bench/bench_curves.py [--sizes 1000,10000,100000] [--rounds 3] [--idle 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import docker

from bench_baseline import worktree_add
from bench_idle import SERIES, measure_reference, measure_sandboxes
from bench_tools import RARE, ensure_repo, git
from common import fit_line, loadavg, percentile, print_table
from controller.changes.apply import apply_changeset, revert_changeset
from controller.changes.changeset import ChangesetLimits
from controller.changes.collect import MAX_CHANGED_FILES, collect
from controller.changes.journal import Journal
from controller.config.limits import Limits
from controller.sandbox.base import SandboxSpec
from controller.sandbox.cache import BaselineCache
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import JOB, current_identity, new_job_id
from controller.sandbox.prepare import prepare

IDLE_TARGET_MB = 15.0
APPEND = 'for f in "$@"; do printf "changed by the bench\\n" >> "$f"; done'

MEASURES: list[tuple[str, str, str | None]] = [
    ("baseline", "baseline ready in sandbox (first job)", "wt"),
    ("cold", "first list_files of a new sandbox (cold walk)", None),
    ("search", "search_text, fresh version", "grep"),
    ("again", "search_text, same version (cache)", "grep"),
    ("list", "list_files, fresh version", "ls"),
    ("collect1", "collect the diff: 1 file changed", "diff1"),
    ("collect", "collect the diff: 1% of files changed (at most 1,000)", "diff"),
    ("apply", "apply that diff (apply_changeset)", "gitapply"),
    ("revert", "revert it (revert_changeset)", "gitapply"),
]
"""(key, what, key of its reference or None)."""
REFERENCES = {
    "wt": "git worktree add into tmpfs",
    "grep": "grep -rn in the container",
    "ls": "git ls-files on the host",
    "diff1": "git diff on the host, same change",
    "diff": "git diff on the host, same change",
    "gitapply": "git apply on the host",
}


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"benchmark sanity check failed: {what}")


def wait_for_gc(root: Path, limit: float = 900.0) -> None:
    """A commit of many files starts git's automatic gc in the background: it would run
    during the measurements."""
    deadline = time.monotonic() + limit
    while (root / ".git" / "gc.pid").exists() and time.monotonic() < deadline:
        time.sleep(1)


def _name(i: int) -> str:
    """The path ``bench_tools.generate`` gives its file number ``i``."""
    return f"pkg{i // 10000:02d}/mod{(i // 100) % 100:02d}/f{i % 100:02d}.py"


def changed_files(root: Path, files: int) -> list[str]:
    """1% of the files (at least one, at most the 1,000 a job may change), spread over the
    tree; ``edit_target.py`` first."""
    count = min(max(1, files // 100), MAX_CHANGED_FILES)
    step = max(1, files // count)
    others = [_name(i) for i in range(0, files, step)]
    chosen = ["edit_target.py", *others][:count]
    check(all((root / name).is_file() for name in chosen), "the changed files exist")
    return chosen


class Size:
    """One repository size: its scratch worktree (the host-side references) and the rounds."""

    def __init__(self, root: Path, files: int, scratch: Path, client: docker.DockerClient) -> None:
        self.root = root
        self.files = files
        self.client = client
        self.scratch = scratch
        self.worktree = Path(tempfile.mkdtemp(prefix="bench-curves-wt-", dir="/dev/shm")) / "wt"
        git(root, "worktree", "add", "-q", "--detach", str(self.worktree))
        size_mb = sum(p.stat().st_size for p in root.rglob("*.py")) / 1e6
        ws_mb = int(size_mb * 1.6) + 256
        self.size_mb = size_mb
        self.spec = SandboxSpec(
            image=ImageBuilder(client).ensure().tag,
            job_id="bench",
            runtime="runc",
            limits=Limits(
                memory_mb=min(ws_mb * 2 + 1024, 65536), workspace_mb=ws_mb, wall_seconds=3600
            ),
        )
        self.changed = changed_files(root, files)
        self.limits = ChangesetLimits(max_files=max(len(self.changed), 1))
        self.journal = Journal(scratch / "journal")
        self.m: dict[str, list[float]] = {k: [] for k, _, _ in MEASURES}
        self.m.update({k: [] for k in REFERENCES})

    def close(self) -> None:
        git(self.root, "worktree", "remove", "--force", str(self.worktree))
        git(self.root, "worktree", "prune")
        shutil.rmtree(self.worktree.parent, ignore_errors=True)

    def host_diff(self, paths: list[str]) -> float:
        """``git diff`` in the scratch worktree after the same appends; then reset."""
        subprocess.run(["sh", "-c", APPEND, "sh", *paths], cwd=self.worktree, check=True)
        elapsed = timed(lambda: git(self.worktree, "diff"))
        git(self.worktree, "checkout", "-q", "--", ".")
        return elapsed

    def round(self, i: int) -> None:
        m = self.m
        m["wt"].append(worktree_add(self.root, "/dev/shm"))
        job = self.spec.model_copy(update={"job_id": new_job_id()})
        cache = BaselineCache(self.scratch / f"cache{i}")
        os.sync()
        started = time.perf_counter()
        prepared = prepare(self.client, self.root, job, current_identity(), cache=cache)
        m["baseline"].append(time.perf_counter() - started)
        check(prepared.source == "fifo", f"the first job's source is the FIFO ({prepared.source})")
        with prepared.sandbox as box:
            m["cold"].append(timed(lambda: box.list_files(max_results=10000)))
            self.tools(box)
            self.changes(box, prepared.baseline, i)
        prepared.finish()
        shutil.rmtree(self.scratch / f"cache{i}", ignore_errors=True)

    def tools(self, box: DockerSandbox) -> None:
        m = self.m

        def fresh() -> None:
            box.run(["true"], timeout=30)

        fresh()
        started = time.perf_counter()
        res = box.run(["grep", "-rn", "--", RARE, "."], timeout=600)
        m["grep"].append(time.perf_counter() - started)
        rare = res.output.count(RARE)
        fresh()
        box.list_files(max_results=1)  # the index, so that the search alone is timed
        started = time.perf_counter()
        hits = box.search_text(RARE, max_results=10)
        m["search"].append(time.perf_counter() - started)
        check(len(hits.hits) == rare and not hits.cached, "search_text finds what grep finds")
        started = time.perf_counter()
        again = box.search_text(RARE, max_results=10)
        m["again"].append(time.perf_counter() - started)
        check(again.cached, "the repeated search is served from the cache")
        fresh()
        m["list"].append(timed(lambda: box.list_files(max_results=10000)))
        m["ls"].append(timed(lambda: git(self.root, "ls-files")))

    def changes(self, box: DockerSandbox, baseline: object, i: int) -> None:
        from controller.repo.baseline import Baseline

        assert isinstance(baseline, Baseline)  # noqa: S101 - what prepare() gives
        m = self.m
        box.run(["sh", "-c", APPEND, "sh", self.changed[0]], timeout=60)
        m["collect1"].append(timed(lambda: collect(box, baseline)))
        m["diff1"].append(self.host_diff(self.changed[:1]))
        box.run(["sh", "-c", APPEND, "sh", *self.changed[1:]], timeout=600)
        collected: list[str] = []
        m["collect"].append(timed(lambda: collected.append(collect(box, baseline).diff)))
        # the first file got two lines in the sandbox: give the worktree the same
        subprocess.run(["sh", "-c", APPEND, "sh", self.changed[0]], cwd=self.worktree, check=True)
        m["diff"].append(self.host_diff(self.changed))
        diff = collected[0]
        patch = self.scratch / "bench.patch"
        patch.write_text(diff, encoding="utf-8", errors="surrogateescape")
        m["gitapply"].append(timed(lambda: git(self.worktree, "apply", str(patch))))
        git(self.worktree, "apply", "-R", str(patch))
        job_id = f"curves-{self.files}-{i}"
        m["apply"].append(
            timed(
                lambda: apply_changeset(
                    baseline, diff, job_id=job_id, journal=self.journal, limits=self.limits
                )
            )
        )
        check(
            (self.root / self.changed[-1]).read_bytes().endswith(b"changed by the bench\n"),
            "the apply wrote the change",
        )
        m["revert"].append(timed(lambda: revert_changeset(job_id, journal=self.journal)))
        check(not git(self.root, "status", "--porcelain"), "the repository is clean again")


def ms(value: float) -> str:
    return f"{value * 1000:.1f} ms"


def report(sizes: list[Size]) -> None:
    for key, what, ref_key in MEASURES:
        rows = []
        xs, ys = [], []
        for size in sizes:
            values = size.m[key]
            med = statistics.median(values)
            xs.append(float(size.files))
            ys.append(med * 1000)
            ref = statistics.median(size.m[ref_key]) if ref_key else None
            rows.append(
                [
                    f"{size.files:,}",
                    str(len(values)),
                    ms(med),
                    ms(max(values)),
                    ms(ref) if ref is not None else "-",
                    f"{med / ref:.2f}x" if ref else "-",
                ]
            )
        slope, fixed = fit_line(xs, ys)
        reference = REFERENCES[ref_key] if ref_key else "none"
        print(f"\n{what}  (reference: {reference})")
        print_table(["files", "n", "median", "max", "reference", "ratio"], rows)
        print(f"fit: {slope * 1000:.2f} ms per 1,000 files + {fixed:.1f} ms fixed")


def idle(client: docker.DockerClient, n: int, workers: int) -> None:
    """``n`` idle sandboxes at once under runc, and as many plain containers."""
    job_id = new_job_id()
    spec = SandboxSpec(image=ImageBuilder(client).ensure().tag, job_id=job_id, runtime="runc")
    args = argparse.Namespace(settle=5.0, workers=workers)
    print(f"\nidle: {n} plain containers, then {n} sandboxes (load {loadavg()})", file=sys.stderr)
    try:
        ref = measure_reference(client, spec, n, args)
        boxes = measure_sandboxes(client, spec, n, args)
    finally:
        left = client.containers.list(all=True, filters={"label": f"{JOB}={job_id}"})
        for container in left:
            container.remove(force=True, v=True)
    left = client.containers.list(all=True, filters={"label": f"{JOB}={job_id}"})
    rows = []
    for key, (label, targeted) in SERIES.items():
        med = percentile(boxes.series[key], 50)
        ref_med = percentile(ref.series[key], 50)
        rows.append(
            [
                f"sandbox, {label}",
                str(len(boxes.series[key])),
                f"{med:.1f} MB",
                f"{max(boxes.series[key]):.1f} MB",
                f"{ref_med:.1f} MB",
                f"{med / ref_med:.2f}x" if ref_med else "-",
                ("yes" if med <= IDLE_TARGET_MB else "NO") if targeted else "-",
            ]
        )
    host = boxes.host_each
    rows.append(
        [
            "sandbox, host MemAvailable drop / N",
            str(len(boxes.ids)),
            f"{host:.1f} MB",
            "-",
            f"{ref.host_each:.1f} MB",
            f"{host / ref.host_each:.2f}x" if ref.host_each else "-",
            "yes" if host <= IDLE_TARGET_MB else "NO",
        ]
    )
    rows.append(
        [
            "sandboxes up and answering read_file",
            str(n),
            f"{boxes.answered or 0}/{n}",
            "-",
            "-",
            "-",
            "yes" if boxes.answered == n else "NO",
        ]
    )
    print(f"\n{n} idle sandboxes at once, runc (target <= {IDLE_TARGET_MB:g} MB each)")
    print_table(["what", "n", "median", "max", "reference", "ratio", "met"], rows)
    failures = ref.failures + boxes.failures
    for failure in failures[:10]:
        print(f"failure: {failure}")
    print(f"containers of this run left afterwards: {len(left)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repo", type=Path, default=Path("/tmp/patchbox-bench-curves"))
    parser.add_argument("--idle", type=int, default=100, help="idle sandboxes at once (0: skip)")
    parser.add_argument("--workers", type=int, default=4, help="sandboxes started in parallel")
    args = parser.parse_args()
    counts = [int(x) for x in args.sizes.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="patchbox-bench-curves-"))
    os.environ["PATCHBOX_HOME"] = str(scratch / "home")
    client = connect()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}; load at the start: {loadavg()}", file=sys.stderr)
    sizes: list[Size] = []
    try:
        for files in counts:
            root = args.repo / str(files)
            ensure_repo(root, files)
            wait_for_gc(root)
            size = Size(root, files, scratch / str(files), client)
            sizes.append(size)
            for i in range(args.rounds):
                size.round(i)
                print(
                    f"{files} files: round {i + 1}/{args.rounds} (load {loadavg()})",
                    file=sys.stderr,
                )
    finally:
        for size in sizes:
            size.close()
    print(f"\nload at the end of the curves: {loadavg()}")
    print("sizes: " + ", ".join(f"{s.files:,} files ({s.size_mb:.0f} MB)" for s in sizes))
    report(sizes)
    if args.idle > 0:
        idle(client, args.idle, args.workers)
    print(f"load at the end: {loadavg()}")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
