"""The tools on a large repository: search, listing and an edit against same-run references.

A repository of ``--files`` files (default 100,000, about 400 MB) is generated once (cached
under ``--repo``), committed with git on the host, and loaded into one sandbox. Then:

- ``search_text`` for a rare literal, first at a fresh workspace version and again at the same
  version, against ``grep -rn`` of the same literal on the same tree in the same container;
- ``list_files`` of the tree at a fresh workspace version (the index is rebuilt: a walk, the
  gitignore filter, the first 10,000 paths) against ``git ls-files`` on the host;
- one ``replace_text`` in that repository (must not rescan the tree).

    python3 bench/bench_tools.py [--files 100000] [--repeat 5] [--runtime runc|runsc]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import subprocess
import tarfile
import time
from pathlib import Path

from controller.config.limits import Limits
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import current_identity, new_job_id

RARE = "zqxjv_rare_marker_7741"
WORDS = [
    *["def", "class", "return", "import", "self", "value", "items", "parse", "token"],
    *["buffer", "index", "result", "error", "config", "handler", "request", "response"],
    *["stream", "module", "package", "client", "server", "cache"],
]


def generate(root: Path, files: int, seed: int = 7) -> None:
    """Writes ``files`` text files of 1-7 KB in folders of 100, a few with the rare literal."""
    rng = random.Random(seed)
    lines = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "\n" for _ in range(4000)
    ]
    blob = "".join(lines)
    rare_at = {rng.randrange(files) for _ in range(3)}
    for i in range(files):
        folder = root / f"pkg{i // 10000:02d}" / f"mod{(i // 100) % 100:02d}"
        if i % 100 == 0:
            folder.mkdir(parents=True, exist_ok=True)
        start = rng.randrange(len(blob) - 8000)
        text = blob[start : start + rng.randint(1000, 7000)]
        if i in rare_at:
            text += f"value = '{RARE}'\n"
        (folder / f"f{i % 100:02d}.py").write_text(text)
    (root / ".gitignore").write_text("*.pyc\n__pycache__/\n")
    (root / "edit_target.py").write_text("counter = 0\n")


def git(root: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(root.parent), "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-C", str(root), *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def ensure_repo(root: Path, files: int) -> None:
    marker = root / ".bench-complete"
    if marker.is_file() and marker.read_text() == str(files):
        return
    subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir(parents=True)
    started = time.monotonic()
    generate(root, files)
    git(root, "init", "-q")
    (root / ".git" / "info" / "exclude").write_text(".bench-complete\n")  # a clean tree
    git(root, "add", "-A")
    git(root, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "bench")
    marker.write_text(str(files))
    print(f"generated {files} files in {time.monotonic() - started:.0f} s")


def tree_archive(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != ".git")
            rel = Path(dirpath).relative_to(root)
            for name in sorted(filenames):
                if name == ".bench-complete":
                    continue
                path = Path(dirpath) / name
                tar.add(str(path), arcname=(rel / name).as_posix(), recursive=False)
    return buf.getvalue()


def timed(fn: object, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - started)
    return out


def row(
    what: str, values: list[float], ref: float | None, target: str, met: bool | None
) -> list[str]:
    med = statistics.median(values)
    ratio = f"{med / ref:.2f}x" if ref else "-"
    verdict = "-" if met is None else ("yes" if met else "NO")
    return [
        what,
        str(len(values)),
        f"{med * 1000:.1f} ms",
        f"{max(values) * 1000:.1f} ms",
        ratio,
        target,
        verdict,
    ]


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"benchmark sanity check failed: {what}")


def measure(box: DockerSandbox, repeat: int) -> dict[str, list[float]]:
    """Interleaved rounds, each at a fresh workspace version (a process ran before it)."""
    out: dict[str, list[float]] = {"grep": [], "first": [], "again": [], "list": [], "edit": []}

    def fresh() -> None:
        box.run(["true"], timeout=30)

    for i in range(repeat):
        fresh()
        t = time.perf_counter()
        res = box.run(["grep", "-rn", "--", RARE, "."], timeout=600)
        out["grep"].append(time.perf_counter() - t)
        check(res.output.count(RARE) == 3, "grep finds the 3 rare lines")
        fresh()
        box.list_files(max_results=1)  # builds the index, so the search below times the search
        t = time.perf_counter()
        hits = box.search_text(RARE, max_results=10)
        out["first"].append(time.perf_counter() - t)
        check(len(hits.hits) == 3 and not hits.cached, "search_text finds the 3 rare lines")
        t = time.perf_counter()
        again = box.search_text(RARE, max_results=10)
        out["again"].append(time.perf_counter() - t)
        check(again.cached and again.hits == hits.hits, "the repeated search is served from cache")
        fresh()
        t = time.perf_counter()
        box.list_files(max_results=10000)
        out["list"].append(time.perf_counter() - t)
        t = time.perf_counter()
        box.replace_text("edit_target.py", f"counter = {i}", f"counter = {i + 1}")
        out["edit"].append(time.perf_counter() - t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    parser.add_argument("--repo", type=Path, default=Path("/tmp/patchbox-bench-repo"))
    args = parser.parse_args()
    root: Path = args.repo / str(args.files)
    ensure_repo(root, args.files)
    size_mb = sum(p.stat().st_size for p in root.rglob("*.py")) / 1e6
    client = connect()
    runtime: Runtime = args.runtime
    ws_mb = int(size_mb * 1.6) + 256
    spec = SandboxSpec(
        image=ImageBuilder(client).ensure().tag,
        job_id=new_job_id(),
        runtime=runtime,
        limits=Limits(memory_mb=ws_mb + 1024, workspace_mb=ws_mb, wall_seconds=3600),
    )
    data = tree_archive(root)
    with DockerSandbox.start(client, spec, current_identity()) as box:
        started = time.perf_counter()
        box.put_archive(data)
        load = time.perf_counter() - started
        started = time.perf_counter()
        box.list_files(max_results=10000)
        cold = time.perf_counter() - started
        m = measure(box, args.repeat)
    m["ls"] = timed(lambda: git(root, "ls-files"), args.repeat)
    g, lf = statistics.median(m["grep"]), statistics.median(m["ls"])
    rows = [
        row("grep -rn (reference, in container)", m["grep"], None, "-", None),
        row(
            "search_text, fresh version",
            m["first"],
            g,
            "<= 1.2x",
            statistics.median(m["first"]) <= 1.2 * g,
        ),
        row(
            "search_text, same version",
            m["again"],
            g,
            "<= 0.25x",
            statistics.median(m["again"]) <= 0.25 * g,
        ),
        row("git ls-files (reference, host)", m["ls"], None, "-", None),
        row(
            "list_files, new version",
            m["list"],
            lf,
            "<= 2x",
            statistics.median(m["list"]) <= 2 * lf,
        ),
        row("replace_text", m["edit"], None, "<= 20 ms", statistics.median(m["edit"]) <= 0.020),
    ]
    print(f"repo: {args.files} files, {size_mb:.0f} MB; runtime {runtime}; loaded in {load:.1f} s")
    print(f"first listing (cold index: walk + git ignore filter): {cold * 1000:.0f} ms")
    header = ["what", "n", "median", "max", "ratio", "target", "met"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
