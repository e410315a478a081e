"""A second Docker daemon on this machine, for the tests of replicas on engines of their own:
``dockerd`` with its socket, data root, exec root and pid file in a temporary folder, the
machine daemon's storage driver, no iptables rules and a bridge interface of its own (never
``--bridge=none``: that removes the host's ``docker0`` the machine's daemon uses). It starts
its own supervised containerd under its exec root. It can be stopped (SIGTERM: its engine
goes away under the jobs running on it) and started again on the same folder; at the end its
containers, processes, mounts, bridge and folder are removed."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

BRIDGES = [(f"pbtest{n}", f"10.213.{n}.1/24") for n in range(8)]
"""The bridge interfaces (name, address) a second daemon may make: the first free one."""


def missing() -> str | None:
    """Why this machine cannot run a second daemon here (None: it can)."""
    if os.geteuid() != 0:
        return "a second Docker daemon needs root"
    for program in ("dockerd", "ip", "umount"):
        if shutil.which(program) is None:
            return f"{program} is not installed"
    return None


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _free_bridge() -> tuple[str, str]:
    """The first of :data:`BRIDGES` whose name and subnet are not in use on this host."""
    shown = json.loads(_ip("-j", "addr").stdout or "[]")
    names = {link["ifname"] for link in shown}
    used = [
        ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network
        for link in shown
        for a in link.get("addr_info", [])
    ]
    for name, address in BRIDGES:
        subnet = ipaddress.ip_interface(address).network
        if name not in names and not any(subnet.overlaps(n) for n in used):
            return name, address
    msg = f"none of the bridges {BRIDGES} is free on this host"
    raise RuntimeError(msg)


def _mounts_under(folder: Path) -> list[str]:
    """The mount points under ``folder``, deepest first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # octal escapes: \040
        if point == str(folder) or point.startswith(f"{folder}/"):
            found.append(point)
    return sorted(found, key=len, reverse=True)


def _processes_of(folder: Path) -> list[int]:
    """The processes whose command line names ``folder`` (its containerd's shims)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if str(folder).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


@dataclass
class Dockerd:
    """A second daemon in ``folder`` on bridge ``bridge``: :meth:`start` / :meth:`stop`,
    :meth:`close` at the end."""

    folder: Path
    bridge: str
    driver: str
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def host(self) -> str:
        """Its ``DOCKER_HOST``."""
        return f"unix://{self.folder / 'docker.sock'}"

    @property
    def log(self) -> Path:
        return self.folder / "dockerd.log"

    def client(self, timeout: int = 60) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, timeout=timeout)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def answers(self) -> bool:
        try:
            client = self.client(timeout=5)
        except docker.errors.DockerException:
            return False
        try:
            return bool(client.ping())
        except Exception:
            return False
        finally:
            client.close()

    def start(self, timeout: float = 120) -> None:
        """Starts the daemon; returns once it answers."""
        config = self.folder / "daemon.json"  # not the machine's /etc/docker/daemon.json
        config.write_text(json.dumps({"storage-driver": self.driver}))
        argv = [
            "dockerd",
            "--config-file",
            str(config),
            "--host",
            self.host,
            "--data-root",
            str(self.folder / "data"),
            "--exec-root",
            str(self.folder / "exec"),
            "--pidfile",
            str(self.folder / "docker.pid"),
            "--iptables=false",
            "--ip-masq=false",
            f"--bridge={self.bridge}",
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                msg = f"the second dockerd did not start: {self.log.read_text()[-3000:]}"
                raise RuntimeError(msg)
            time.sleep(0.2)

    def stop(self, timeout: float = 90) -> None:
        """SIGTERM (it stops its containers and its containerd), SIGKILL after ``timeout``
        seconds; then any shim of it still running is killed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in _processes_of(self.folder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def load(self, *refs: str) -> None:
        """Copies images from the machine's daemon (``docker save | docker load``)."""
        save = subprocess.Popen(["docker", "save", *refs], stdout=subprocess.PIPE)
        try:
            loaded = subprocess.run(
                ["docker", "-H", self.host, "load", "-q"],
                stdin=save.stdout,
                capture_output=True,
                check=False,
                timeout=600,
            )
        finally:
            if save.stdout is not None:
                save.stdout.close()
            saved = save.wait(timeout=600)
        if saved != 0 or loaded.returncode != 0:
            msg = f"loading {refs} into the second dockerd failed: {loaded.stderr!r}"
            raise RuntimeError(msg)

    def remove_containers(self) -> None:
        """Every container on it (it answers)."""
        client = self.client()
        try:
            for container in client.containers.list(all=True, sparse=True):
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True, v=True)
        finally:
            client.close()

    def close(self) -> None:
        """Its containers removed (when it answers), the daemon stopped, its mounts, bridge
        and folder removed."""
        if self.running() and self.answers():
            with contextlib.suppress(docker.errors.DockerException):
                self.remove_containers()
        self.stop()
        for point in _mounts_under(self.folder):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        _ip("link", "del", self.bridge)
        shutil.rmtree(self.folder, ignore_errors=True)


def start_dockerd(driver: str) -> Dockerd:
    """A second daemon with storage driver ``driver`` on a new bridge, started."""
    name, address = _free_bridge()
    for step, args in enumerate(
        [
            ("link", "add", name, "type", "bridge"),
            ("addr", "add", address, "dev", name),
            ("link", "set", name, "up"),
        ]
    ):
        done = _ip(*args)
        if done.returncode != 0:
            if step:  # made here
                _ip("link", "del", name)
            msg = f"ip {' '.join(args)}: {done.stderr}"
            raise RuntimeError(msg)
    daemon = Dockerd(Path(tempfile.mkdtemp(prefix="pb-dockerd-")), name, driver)
    try:
        daemon.start()
    except BaseException:
        daemon.close()
        raise
    return daemon
