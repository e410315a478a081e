"""A follow-up's sandbox ready vs a fresh job's, on the same repository, in the same run.

The repository of ``bench_tools`` (``--files``, default 20,000) gets a parent job's baseline
(``build_baseline``) and a diff of 200 files (50 lines each). Then, interleaved over
``--rounds`` rounds (the first ``--warmup`` not counted):

- fresh: what ``run`` does before the first model turn, ``prepare`` on the repository (the
  health gate, the baseline, the sandbox from the baseline's archive), no spare;
- follow-up: what ``run --from`` does instead, the parent's result made in the private git
  dir (:func:`controller.changes.carry.result_baseline`: the diff checked, the new blobs
  and tree written) and ``prepare`` from it (the repository not read);
- follow-up, result only: ``result_baseline`` alone.

Each sandbox is closed after it is ready. Both use the archive cache: after the warm-up
rounds, both sandboxes start from a cached archive.

    python3 bench/bench_follow_up.py [--files 20000] [--rounds 7] [--warmup 2]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_tools import ensure_repo, git
from common import loadavg, print_table
from controller.changes.carry import result_baseline
from controller.config.limits import Limits
from controller.repo.baseline import build_baseline
from controller.sandbox.base import SandboxSpec
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import current_identity, new_job_id
from controller.sandbox.prepare import prepare

FILES_CHANGED = 200
LINES_PER_FILE = 50


def make_diff(repo: Path) -> str:
    rng = random.Random(11)
    names = sorted(p.relative_to(repo).as_posix() for p in repo.glob("pkg*/mod*/f*.py"))
    rng.shuffle(names)
    chosen = [n for n in names if (repo / n).read_text().count("\n") > LINES_PER_FILE + 5]
    for name in chosen[:FILES_CHANGED]:
        lines = (repo / name).read_text().splitlines(keepends=True)
        for k in rng.sample(range(len(lines)), LINES_PER_FILE):
            lines[k] = f"follow {k}\n"
        (repo / name).write_text("".join(lines))
    diff = git(repo, "diff", "--full-index", "--no-renames")
    git(repo, "checkout", "-q", "--", ".")
    return diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repo", type=Path, default=Path("/tmp/patchbox-bench-repo"))
    args = parser.parse_args()
    source: Path = args.repo / str(args.files)
    ensure_repo(source, args.files)
    scratch = Path(tempfile.mkdtemp(prefix="patchbox-bench-follow-"))
    os.environ["PATCHBOX_HOME"] = str(scratch / "home")
    repo = scratch / "repo"
    git(source, "clone", "-q", "--shared", str(source), str(repo))
    client = connect()
    try:
        image = ImageBuilder(client).ensure().tag
        spec = SandboxSpec(
            image=image,
            job_id=new_job_id(),
            runtime="runc",
            limits=Limits(memory_mb=1024, workspace_mb=512, wall_seconds=600),
        )
        parent = build_baseline(repo)[0]
        diff = make_diff(repo)
        m: dict[str, list[float]] = {"fresh": [], "follow": [], "result": []}
        for i in range(args.rounds + args.warmup):
            t = time.perf_counter()
            fresh = prepare(client, repo, spec, current_identity())
            took = time.perf_counter() - t
            fresh.sandbox.close()
            fresh.finish()
            t = time.perf_counter()
            made = result_baseline(parent, diff)
            result_took = time.perf_counter() - t
            follow = prepare(client, repo, spec, current_identity(), made=made)
            follow_took = time.perf_counter() - t
            if i == 0:
                files = follow.sandbox.changes()
                if files.count:
                    raise SystemExit("benchmark sanity check failed: the result is not a baseline")
            follow.sandbox.close()
            follow.finish()
            if i >= args.warmup:
                m["fresh"].append(took)
                m["follow"].append(follow_took)
                m["result"].append(result_took)
    finally:
        client.close()
        shutil.rmtree(scratch, ignore_errors=True)
    ref = statistics.median(m["fresh"])
    rows = [
        [
            what,
            str(len(v)),
            f"{statistics.median(v) * 1000:.0f} ms",
            f"{max(v) * 1000:.0f} ms",
            "-" if what.startswith("fresh") else f"{statistics.median(v) / ref:.2f}x",
        ]
        for what, v in (
            ("fresh job: prepare on the repository (reference)", m["fresh"]),
            ("follow-up: the parent's result + prepare from it", m["follow"]),
            ("  the parent's result alone", m["result"]),
        )
    ]
    print(f"repo: {args.files} files; parent diff: {FILES_CHANGED} files; load {loadavg()}")
    print_table(["what", "n", "median", "max", "vs fresh"], rows)


if __name__ == "__main__":
    main()
