"""What every benchmark script shares: the load average, percentiles, the table."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tarfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

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


DAEMON_GROUPS = ("dockerd+containerd", "shims", "fuse-overlayfs")
"""What :class:`DaemonCpu` counts, by group."""


def wait_spares_started(home: Path | None = None, wait: float = 30.0) -> None:
    """Waits until no spare of the state directory ``home`` (default ``$PATCHBOX_HOME``)
    is still starting. A job ends once its spare's start is with the daemon; a bench waits
    for the rest of that start (untimed) so that it does not fall into the next side's
    time, and counts its CPU with the jobs'."""
    import time

    from controller.sandbox.dockerclient import connect
    from controller.sandbox.labels import HOME, KIND, home_id

    client = connect()
    labels = [f"{KIND}=spare", f"{HOME}={home_id(home)}"]
    filters: dict[str, str | list[str] | bool] = {"label": labels, "status": "created"}
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            if not client.containers.list(all=True, filters=filters, sparse=True):
                return
            time.sleep(0.01)
    finally:
        client.close()


def _proc_stat(pid: str) -> tuple[str, int, int, int] | None:
    """(name, parent pid, start time, utime + stime + cutime + cstime in ticks) of a process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    name = text[text.find("(") + 1 : text.rfind(")")]
    fields = text[text.rfind(")") + 2 :].split()
    return name, int(fields[1]), int(fields[19]), sum(int(v) for v in fields[11:15])


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class DaemonCpu:
    """CPU seconds the daemon's side of the machine spent while it runs (a context manager).

    A thread reads ``/proc/PID/stat`` of every process every ``interval`` seconds; each
    process is counted from its first sample (or from zero when it started after the first
    scan) to its last, in three groups: ``dockerd+containerd`` (the daemon at ``root`` and
    its containerd, the child of that dockerd), ``shims`` (each ``containerd-shim*`` of that
    containerd, told by its ``-address``; a shim is the parent of ``runc`` and of the
    container's processes and execs, so their CPU comes into its ``cutime`` as it reaps
    them: the shims' group is runc plus what ran in the containers) and ``fuse-overlayfs``
    (the storage driver's mount of each container under ``root``). Each is
    utime + stime + cutime + cstime. Other daemons on the machine (their own socket, root
    and containerd) are not counted; a process seen only after it exited (a zombie, no
    command line) is not counted either.

    With ``mine`` (a test of a container's labels), a shim counts only when its container
    (its ``-id``, labels read from the daemon's ``containers/ID/config.v2.json``, no API
    request) passes, and a fuse-overlayfs only when it mounts such a container's layer
    (``image/*/layerdb/mounts/ID/mount-id``); the other containers' shims and mounts (other
    work on the same daemon) go to :attr:`others`. dockerd and containerd serve every
    client of the daemon and cannot be split: under other work on the same daemon their
    figure includes it.
    """

    def __init__(
        self,
        root: str = "/var/lib/docker",
        interval: float = 0.1,
        mine: Callable[[dict[str, str]], bool] | None = None,
    ) -> None:
        self._root = root.rstrip("/") + "/"
        self._mine = mine
        self._mounts: set[str] = set()
        self._fuse: dict[tuple[str, int], str] = {}
        self.others = 0.0
        self._interval = interval
        self._tick = os.sysconf("SC_CLK_TCK")
        self._first: dict[tuple[str, int], int] = {}
        self._last: dict[tuple[str, int], int] = {}
        self._group: dict[tuple[str, int], str | None] = {}
        self._dockerd: set[str] = set()
        self._address = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = False
        self.seconds: dict[str, float] = dict.fromkeys(DAEMON_GROUPS, 0.0)

    def _daemon(self, pid: str, name: str, ppid: int) -> str | None:
        """dockerd at ``root``, or containerd, its child (whose address the shims name)."""
        line = _cmdline(pid)
        if name == "dockerd":
            root = line.split("--data-root", 1)[-1].lstrip(" =").split(" ", 1)[0]
            if "--data-root" not in line:
                root = "/var/lib/docker"
            own = root.rstrip("/") + "/" == self._root
            if own:
                self._dockerd.add(pid)
            return "dockerd+containerd" if own else None
        if str(ppid) in self._dockerd:
            config = line.split("--config ", 1)[-1].split(" ", 1)[0]
            self._address = config.rsplit("/", 1)[0] + "/"
            return "dockerd+containerd"
        return None

    def _ours(self, cid: str) -> bool:
        """Whether container ``cid`` passes ``mine``; if so, its layer's mount id is noted."""
        if self._mine is None:
            return True
        try:
            config = json.loads(Path(f"{self._root}containers/{cid}/config.v2.json").read_text())
        except (OSError, ValueError):
            return False
        if not self._mine(dict(config.get("Config", {}).get("Labels") or {})):
            return False
        for found in Path(f"{self._root}image").glob(f"*/layerdb/mounts/{cid}/mount-id"):
            with contextlib.suppress(OSError):
                self._mounts.add(found.read_text().strip())
        return True

    def _classify(self, pid: str, name: str, ppid: int) -> str | None:
        if name in {"dockerd", "containerd"}:
            return self._daemon(pid, name, ppid)
        if name.startswith("containerd-shim"):
            line = _cmdline(pid)
            if not self._address or f"-address {self._address}" not in line:
                return None
            return "shims" if self._ours(line.split("-id ", 1)[-1].split(" ", 1)[0]) else "others"
        if name == "fuse-overlayfs":
            line = _cmdline(pid)
            return "fuse?" if self._root in line else None
        return None

    def scan(self) -> None:
        pids = sorted((p.name for p in Path("/proc").iterdir() if p.name.isdigit()), key=int)
        for pid in pids:
            stat = _proc_stat(pid)
            if stat is None:
                continue
            name, ppid, start, ticks = stat
            if not (
                name in {"dockerd", "containerd", "fuse-overlayfs"}
                or name.startswith("containerd-shim")
            ):
                continue
            key = (pid, start)
            if key not in self._group:
                self._group[key] = self._classify(pid, name, ppid)
                if self._group[key] == "fuse?":
                    self._fuse[key] = _cmdline(pid)
                self._first[key] = ticks if not self._started else 0
            self._last[key] = ticks

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.scan()

    def __enter__(self) -> DaemonCpu:
        self.scan()
        self._started = True
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.scan()
        for key, seen in self._group.items():
            if seen is None:
                continue
            seconds = (self._last[key] - self._first[key]) / self._tick
            group = seen
            if group == "fuse?":
                line = self._fuse.get(key, "")
                ours = self._mine is None or any(m in line for m in self._mounts)
                group = "fuse-overlayfs" if ours else "others"
            if group == "others":
                self.others += seconds
            else:
                self.seconds[group] += seconds

    @property
    def total(self) -> float:
        return sum(self.seconds.values())
