"""Memory of idle sandboxes, many at once, vs plain idle containers of the same image.

N sandboxes are started and kept up together (each greeted and loaded with the demo
example); after a settle time each one is asked for a ``read_file``, and its memory is read
three ways:

- the container's cgroup, from the Docker stats API: ``usage``, and ``usage - cache``
  (cgroup v1 charges page cache and tmpfs pages to the container as ``cache``);
- the host processes that serve the container from outside its cgroup (containerd shim and
  the fuse-overlayfs mount of its root filesystem), as private memory (USS, from
  ``/proc/PID/smaps_rollup``): what one more of them costs;
- the host: the drop of ``MemAvailable`` in ``/proc/meminfo`` while all N are up, against
  the mean of the readings before the start and after the removal (a steady drift of the
  machine cancels), minus this process's own growth, divided by N. This includes everything
  above and the kernel's share (page tables, sockets, mounts); page cache counts as
  available. Anything else the machine does meanwhile disturbs it: prefer a large N.

The reference, measured the same way in the same run, is the same number of plain idle
containers ``docker run -d --network none --entrypoint sleep IMAGE infinity``.
Every container is removed at the end, also on Ctrl-C.

    python3 bench/bench_idle.py [--runtime runc|runsc|both] [--n 50] [--n-runsc 50]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker.errors

from common import loadavg, percentile, print_table
from controller.cli.demo.run import example_archive
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import JOB, current_identity, new_job_id

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import docker

MB = 1024 * 1024
TARGET_MB = 30.0
"""Target: an idle sandbox costs at most 30 MB, with 50 of them up at once."""
PROBE_PATH = "calc/parser.py"
SERIES: dict[str, tuple[str, bool]] = {
    "usage": ("cgroup usage", True),
    "no_cache": ("cgroup usage - cache", False),
    "no_file": ("cgroup usage - file cache", False),
    "outside": ("shim + fuse-overlayfs, private", False),
    "total": ("usage - file cache + shim/fuse (cost)", True),
}
"""Per-container readings: key -> (label, whether the 30 MB target applies)."""


# -- host-side readings -----------------------------------------------------------------


def mem_available() -> int:
    """``MemAvailable`` in bytes: the median of five readings over one second."""
    readings: list[int] = []
    for _ in range(5):
        lines = Path("/proc/meminfo").read_text(encoding="ascii").splitlines()
        readings += [int(x.split()[1]) * 1024 for x in lines if x.startswith("MemAvailable:")]
        time.sleep(0.2)
    return int(percentile(readings, 50))


def own_rss() -> int:
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _private(pid: str) -> int:
    """Memory that only this process maps (USS): what one more such process costs."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text(encoding="ascii")
    except OSError:
        return 0
    total = 0
    for line in text.splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


def outside_private(containers: dict[str, str]) -> dict[str, int]:
    """Private memory of the host processes that serve each container outside its cgroup.

    ``containers`` maps a container id to its root filesystem mount (``MergedDir``); a
    process belongs to the container when its command line names the id (the shim) or the
    mount (fuse-overlayfs), and its cgroup is not the container's.
    """
    found = dict.fromkeys(containers, 0)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroup = (entry / "cgroup").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        for cid, merged in containers.items():
            if cid in cgroup:
                continue
            if f"-id {cid}" in cmdline or (merged and cmdline.rstrip().endswith(merged)):
                found[cid] += _private(entry.name)
    return found


@dataclass
class HostView:
    """``MemAvailable`` and this process's RSS before, during and after a group was up."""

    mem: list[int] = field(default_factory=list)
    own: list[int] = field(default_factory=list)

    def note(self) -> None:
        self.mem.append(mem_available())
        self.own.append(own_rss())

    def per_container(self, n: int) -> float:
        """MB per container: the drop from the mean of the readings before and after (so
        that a steady drift of the machine cancels out), minus this process's growth."""
        if len(self.mem) < 3 or n < 1:
            return math.nan
        before, during, after = self.mem[:3]
        own_before, own_during, own_after = self.own[:3]
        drop = (before + after) / 2 - during
        growth = own_during - (own_before + own_after) / 2
        return (drop - growth) / n / MB

    def describe(self) -> str:
        names = ("before", "up", "after")
        return ", ".join(f"{k} {v / MB:.0f} MB" for k, v in zip(names, self.mem, strict=False))


# -- one group of containers ------------------------------------------------------------


@dataclass
class Group:
    """Memory of one group of containers that were up together."""

    wanted: int
    ids: list[str] = field(default_factory=list)
    series: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in SERIES})
    host: HostView = field(default_factory=HostView)
    answered: int | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def host_each(self) -> float:
        return self.host.per_container(len(self.ids))


def _cgroup_memory(stats: dict[str, Any]) -> tuple[int, int, int]:
    """(usage, cache, file) in bytes from one stats answer; cgroup v1 or v2 keys."""
    mem = stats.get("memory_stats", {})
    detail: dict[str, int] = mem.get("stats", {})
    usage = int(mem.get("usage", 0))
    if "total_cache" in detail:  # cgroup v1: "cache" includes tmpfs (shmem) pages
        file = detail.get("total_active_file", 0) + detail.get("total_inactive_file", 0)
        return usage, int(detail["total_cache"]), int(file)
    file = int(detail.get("file", 0))
    return usage, file, file


def read_group(client: docker.DockerClient, group: Group) -> None:
    merged: dict[str, str] = {}
    unreclaimable: dict[str, float] = {}
    for cid in group.ids:
        usage, cache, file = _cgroup_memory(client.api.stats(cid, stream=False, one_shot=True))
        group.series["usage"].append(usage / MB)
        group.series["no_cache"].append((usage - cache) / MB)
        group.series["no_file"].append((usage - file) / MB)
        unreclaimable[cid] = (usage - file) / MB
        attrs = client.api.inspect_container(cid)
        merged[cid] = str(attrs.get("GraphDriver", {}).get("Data", {}).get("MergedDir", ""))
    for cid, outside in outside_private(merged).items():
        group.series["outside"].append(outside / MB)
        group.series["total"].append(unreclaimable[cid] + outside / MB)


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Cleanup must not be cut short by a second Ctrl-C."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def remove_leftovers(client: docker.DockerClient, job_id: str) -> None:
    for container in client.containers.list(all=True, filters={"label": f"{JOB}={job_id}"}):
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True, v=True)


def start_all(pool: ThreadPoolExecutor, n: int, start: Callable[[], None], group: Group) -> None:
    futures: list[Future[None]] = [pool.submit(start) for _ in range(n)]
    for future in futures:
        try:
            future.result()
        except Exception as exc:  # a failed start is counted and reported
            group.failures.append(f"{type(exc).__name__}: {exc}"[:200])


def measure_reference(
    client: docker.DockerClient, spec: SandboxSpec, n: int, args: argparse.Namespace
) -> Group:
    """``n`` plain idle containers of the same image and runtime, up together."""
    group = Group(n)
    lock = threading.Lock()
    labels = current_identity().labels(spec.job_id, "bench")
    argv = ["docker", "run", "-d", "--network", "none", "--runtime", spec.runtime]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    argv += ["--entrypoint", "sleep", spec.image, "infinity"]

    def start() -> None:
        proc = subprocess.run(argv, capture_output=True, check=True, text=True)
        with lock:
            group.ids.append(proc.stdout.strip())

    group.host.note()
    pool = ThreadPoolExecutor(max_workers=args.workers)
    try:
        start_all(pool, n, start, group)
        time.sleep(args.settle)
        group.host.note()
        read_group(client, group)
    finally:
        with sigint_ignored():
            pool.shutdown(wait=True, cancel_futures=True)
            remove_leftovers(client, spec.job_id)
    time.sleep(args.settle)
    group.host.note()
    print(f"  MemAvailable: {group.host.describe()}", file=sys.stderr)
    return group


def measure_sandboxes(
    client: docker.DockerClient, spec: SandboxSpec, n: int, args: argparse.Namespace
) -> Group:
    """``n`` greeted sandboxes with the demo example loaded, up together."""
    group = Group(n)
    boxes: list[DockerSandbox] = []
    lock = threading.Lock()
    archive = example_archive()

    def start() -> None:
        box = DockerSandbox.start(client, spec, current_identity())
        with lock:
            boxes.append(box)
        box.put_archive(archive)

    group.host.note()
    pool = ThreadPoolExecutor(max_workers=args.workers)
    try:
        start_all(pool, n, start, group)
        time.sleep(args.settle)
        group.answered = 0
        for box in boxes:
            try:
                if box.read_file(PROBE_PATH).content:
                    group.answered += 1
            except Exception as exc:  # counted and reported
                group.failures.append(f"read_file: {type(exc).__name__}: {exc}"[:200])
        group.host.note()
        group.ids = [box.container.id or "" for box in boxes]
        read_group(client, group)
    finally:
        with sigint_ignored():
            pool.shutdown(wait=True, cancel_futures=True)
            for box in boxes:
                box.close()
            remove_leftovers(client, spec.job_id)
    time.sleep(args.settle)
    group.host.note()
    print(f"  MemAvailable: {group.host.describe()}", file=sys.stderr)
    return group


# -- report -----------------------------------------------------------------------------


def _mb(value: float) -> str:
    return f"{value:.1f} MB"


def _ratio(value: float, ref: float | None) -> str:
    return f"{value / ref:.2f}x" if ref else "-"


def _met(value: float) -> str:
    return "yes" if value <= TARGET_MB else "NO"


def rows_for(runtime: Runtime, boxes: Group, ref: Group | None) -> list[list[str]]:
    target = f"<= {TARGET_MB:.0f} MB each"
    rows: list[list[str]] = []
    for key, (label, targeted) in SERIES.items():
        values = boxes.series[key]
        med = percentile(values, 50)
        ref_med = percentile(ref.series[key], 50) if ref else None
        rows.append(
            [
                f"{runtime}: sandbox, {label}",
                str(len(values)),
                _mb(med),
                _mb(max(values)),
                _ratio(med, ref_med),
                target if targeted else "-",
                _met(max(values)) if targeted else "-",
            ]
        )
    rows.append(
        [
            f"{runtime}: sandbox, host MemAvailable drop / N",
            str(len(boxes.ids)),
            _mb(boxes.host_each),
            "-",
            _ratio(boxes.host_each, ref.host_each if ref else None),
            target,
            _met(boxes.host_each),
        ]
    )
    rows.append(
        [
            f"{runtime}: sandboxes up and answering read_file",
            str(boxes.wanted),
            f"{boxes.answered or 0}/{boxes.wanted}",
            "-",
            "-",
            "all",
            "yes" if boxes.answered == boxes.wanted else "NO",
        ]
    )
    if ref is None:
        return rows
    for key, (label, _targeted) in SERIES.items():
        values = ref.series[key]
        rows.append(
            [
                f"{runtime}: plain container (reference), {label}",
                str(len(values)),
                _mb(percentile(values, 50)),
                _mb(max(values)),
                "1",
                "-",
                "-",
            ]
        )
    rows.append(
        [
            f"{runtime}: plain container (reference), host MemAvailable drop / N",
            str(len(ref.ids)),
            _mb(ref.host_each),
            "-",
            "1",
            "-",
            "-",
        ]
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--runtime", choices=["runc", "runsc", "both"], default="both")
    parser.add_argument("--n", type=int, default=50, help="sandboxes at once under runc")
    parser.add_argument("--n-runsc", type=int, default=50, help="sandboxes at once under runsc")
    parser.add_argument("--no-reference", action="store_true", help="skip the plain containers")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds idle before reading")
    parser.add_argument("--workers", type=int, default=4, help="sandboxes started in parallel")
    args = parser.parse_args(argv)
    if args.n < 1 or args.n_runsc < 1 or args.workers < 1:
        parser.error("--n, --n-runsc and --workers must be at least 1")
    runtimes: list[Runtime] = ["runc", "runsc"] if args.runtime == "both" else [args.runtime]
    client = connect()
    image = ImageBuilder(client).ensure().tag
    job_id = new_job_id()
    print(f"image {image}; {time.strftime('%Y-%m-%d %H:%M:%S')}", file=sys.stderr)
    print(f"load average at the start: {loadavg()}", file=sys.stderr)
    rows: list[list[str]] = []
    failures: list[str] = []
    try:
        for runtime in runtimes:
            n = args.n if runtime == "runc" else args.n_runsc
            spec = SandboxSpec(image=image, job_id=job_id, runtime=runtime)
            ref = None
            if not args.no_reference:
                print(f"{runtime}: {n} plain containers ...", file=sys.stderr)
                ref = measure_reference(client, spec, n, args)
                failures += ref.failures
            print(f"{runtime}: {n} sandboxes ...", file=sys.stderr)
            boxes = measure_sandboxes(client, spec, n, args)
            failures += boxes.failures
            rows += rows_for(runtime, boxes, ref)
    finally:
        with sigint_ignored():
            remove_leftovers(client, job_id)
    print(f"load average at the end: {loadavg()}", file=sys.stderr)
    print_table(["what", "n", "median", "max", "ratio vs reference", "target", "met?"], rows)
    for failure in failures[:10]:
        print(f"failure: {failure}", file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
