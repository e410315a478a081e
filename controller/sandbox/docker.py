"""The hardened Docker sandbox: one container per sandbox, the agent on its attach stream.

The attach stream (the container's stdin and multiplexed stdout/stderr over the Docker
API) works the same with a local daemon, a remote one (``DOCKER_HOST``) and gVisor, and
needs no port, socket file or ``docker exec``. Verdicts that matter (OOM kills, exits) come
from the Docker API, never from what the agent says.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import structlog
from docker.types import LogConfig, Mount, Ulimit

from controller.config.limits import SHM_MB
from controller.errorinfo import Hint
from controller.errormap import map_error, mapped_class
from controller.errors import LimitExceededError, ProtocolError, SandboxError
from controller.sandbox.base import (
    PRELOAD_TARGET,
    HelloResult,
    RunResult,
    SandboxSpec,
    WorkClock,
)
from controller.sandbox.calls import ARCHIVE_TIMEOUT, DEFAULT_CALL_TIMEOUT, AgentCalls
from controller.sandbox.dockerargs import NO_DNS, NO_DNS_OPTIONS, ContainerConfig
from controller.sandbox.dockerclient import create_container, removal_in_progress
from controller.sandbox.labels import ControllerIdentity, status_of
from controller.sandbox.protocol import MAX_RESPONSE_FRAME, CallArgs
from controller.sandbox.session import AgentSession

if TYPE_CHECKING:
    from docker.models.containers import Container

log = structlog.get_logger(__name__)

SANDBOX_UID = 10001
_MUX_HEADER = struct.Struct(">BxxxI")
_MAX_MUX_PAYLOAD = 16 * 1024 * 1024
_STDERR_TAIL = 8192
_OOM_GRACE = 1.0
# How long a run that the agent saw OOM-killed waits for Docker's ``oom`` event.
_OOM_CONFIRM = 10.0


ORPHAN_STOP_SECONDS = 5.0
"""A sandbox whose controller is gone (its attach stream closed: a crash, SIGKILL) stops
within this long: Docker closes the container's stdin (``StdinOnce``), and the agent, the
container's init, ends when it reads that end, or a second after the hang-up when it is busy
(unpacking the baseline, waiting for a FIFO nobody feeds, a long call). Measured well under
2 s under runc and gVisor; ``docs/mcp.md`` and ``docs/architecture.md`` give the bound."""

RUNSC_THREADS_IDLE = 64
RUNSC_THREADS_PER_PROCESS = 8


def pids_limit(spec: SandboxSpec) -> int:
    """The pids cgroup limit. Under runc it counts the sandbox's processes and threads. Under
    gVisor it counts the sentry's host threads instead (measured here: about 35 idle and about
    5 more per process inside), so the limit is scaled to allow ``limits.pids`` processes."""
    if spec.runtime == "runsc":
        return RUNSC_THREADS_IDLE + RUNSC_THREADS_PER_PROCESS * spec.limits.pids
    return spec.limits.pids


def container_config(spec: SandboxSpec, labels: dict[str, str]) -> ContainerConfig:
    """The keyword arguments of ``containers.create`` for a sandbox (pure)."""
    lim = spec.limits
    # exec: Docker mounts a tmpfs noexec unless told otherwise, which stops nothing that
    # ``sh file`` or ``python3 file`` does not already do and breaks ``./gradlew``, ``bin/test``,
    # ``node_modules/.bin/*`` and every binary a test build makes.
    tmpfs_opts = f"rw,exec,nosuid,nodev,uid={SANDBOX_UID},gid={SANDBOX_UID}"
    config: ContainerConfig = {
        "image": spec.image,
        "entrypoint": list(spec.agent_argv),
        "command": [],
        "user": f"{SANDBOX_UID}:{SANDBOX_UID}",
        "working_dir": "/workspace",
        "environment": {"HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
        "labels": labels,
        "stdin_open": True,
        "tty": False,
        # Not detached: docker-py then sets StdinOnce, so the container's stdin closes when
        # the controller's attach ends (even by a crash) and the agent, its init, exits.
        "detach": False,
        "network_mode": "none",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "read_only": True,
        "tmpfs": {
            "/workspace": f"{tmpfs_opts},mode=0755,size={lim.workspace_mb}m",
            "/tmp": f"{tmpfs_opts},mode=1777,size={lim.tmp_mb}m",
        },
        "ipc_mode": "private",
        "shm_size": f"{SHM_MB}m",
        "mem_limit": f"{lim.memory_mb}m",
        "memswap_limit": f"{lim.memory_mb}m",
        "nano_cpus": int(lim.cpus * 1e9),
        "pids_limit": pids_limit(spec),
        "ulimits": [
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="nofile", soft=4096, hard=4096),
            Ulimit(name="msgqueue", soft=0, hard=0),
        ],
        "oom_score_adj": 500,
        # No docker-init: the agent is pid 1 and reaps orphans itself, so no process that
        # holds the channel is dumpable (docker-init would expose it as /proc/1/fd/0 and 1).
        "init": False,
        "hostname": "sandbox",
        "log_config": LogConfig(type=LogConfig.types.NONE),
    }
    if spec.runtime != "runc":
        config["runtime"] = spec.runtime
    if spec.network is not None:
        config["network_mode"] = spec.network
        # Docker's resolver answers the network's names (a service's); no other name
        # resolves, so no query leaves the host
        config["dns"] = list(NO_DNS)
        config["dns_opt"] = list(NO_DNS_OPTIONS)
        if spec.docker_runtime is not None:
            config["runtime"] = spec.docker_runtime
    if spec.preload is not None:
        config["mounts"] = [
            Mount(target=PRELOAD_TARGET, source=spec.preload, type="bind", read_only=True)
        ]
        config["environment"]["PATCHBOX_PRELOAD"] = PRELOAD_TARGET
    if spec.idle_exit is not None:
        config["environment"]["PATCHBOX_IDLE_EXIT"] = f"{spec.idle_exit:g}"
        config["auto_remove"] = True
    return config


class AttachChannel:
    """The container's attach stream: raw stdin out, demultiplexed stdout in.

    stderr is kept only as a bounded tail for diagnostics.
    """

    def __init__(self, sock: Any) -> None:
        self._holder = sock
        self._sock: socket.socket = getattr(sock, "_sock", sock)
        self._raw = bytearray()
        self._stderr: deque[bytes] = deque()
        self._stderr_len = 0

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def _pop_mux(self) -> tuple[int, bytes] | None:
        if len(self._raw) < _MUX_HEADER.size:
            return None
        stream, size = _MUX_HEADER.unpack_from(self._raw)
        if size > _MAX_MUX_PAYLOAD or stream not in (1, 2):
            raise ProtocolError("malformed attach stream")
        end = _MUX_HEADER.size + size
        if len(self._raw) < end:
            return None
        payload = bytes(self._raw[_MUX_HEADER.size : end])
        del self._raw[:end]
        return stream, payload

    def recv(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            item = self._pop_mux()
            if item is not None:
                stream, payload = item
                if stream == 1:
                    if payload:
                        return payload
                    continue
                self._keep_stderr(payload)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(1 << 18)
            if not chunk:
                return b""
            self._raw += chunk

    def _keep_stderr(self, data: bytes) -> None:
        self._stderr.append(data)
        self._stderr_len += len(data)
        while self._stderr_len > _STDERR_TAIL and len(self._stderr) > 1:
            self._stderr_len -= len(self._stderr.popleft())

    def stderr_tail(self) -> str:
        return b"".join(self._stderr)[-_STDERR_TAIL:].decode("utf-8", "replace")

    def interrupt(self) -> None:
        """Wakes a reader blocked in another thread (it sees the end of the stream). Safe
        from any thread: the descriptor stays open, so its number cannot be reused under
        that reader; the owner calls :meth:`close`."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        finally:
            close = getattr(self._holder, "close", None)
            if callable(close):
                try:
                    close()
                except OSError:
                    pass


class _OomWatcher:
    """Follows the container's Docker events and records an ``oom`` event."""

    def __init__(self, client: docker.DockerClient, container_id: str) -> None:
        self.oom = threading.Event()
        self._stream = client.api.events(
            decode=True,
            since=int(time.time()) - 1,
            filters={"container": container_id, "event": ["oom"]},
        )
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            for event in self._stream:
                if (
                    isinstance(event, dict)
                    and (event.get("Action") or event.get("status")) == "oom"
                ):
                    self.oom.set()
        except Exception:
            return

    def close(self) -> None:
        try:
            self._stream.close()
        except Exception:
            log.debug("events_close_failed")


class DockerSandbox(AgentCalls):
    """A running, greeted sandbox. Use :meth:`start`; always :meth:`close` (or ``with``)."""

    def __init__(
        self, client: docker.DockerClient, spec: SandboxSpec, container: Container
    ) -> None:
        self._client = client
        self.spec = spec
        self.container = container
        self.clock = WorkClock(spec.limits.wall_seconds)
        """The job's wall clock: every call's budget is what is left of it."""
        self._channel: AttachChannel | None = None
        self._session: AgentSession | None = None
        self._watcher: _OomWatcher | None = None
        self._hello: HelloResult | None = None
        self._closed = False
        self.run_env = dict(spec.run_env)

    @classmethod
    def start(
        cls,
        client: docker.DockerClient,
        spec: SandboxSpec,
        identity: ControllerIdentity,
    ) -> DockerSandbox:
        """Creates, starts and greets a sandbox; on any failure nothing is left behind."""
        labels = identity.labels(spec.job_id, "sandbox")
        try:
            container = create_container(client, **container_config(spec, labels))
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(
                f"sandbox image {spec.image!r} not found", hint=Hint(action="build_image")
            ) from exc
        except docker.errors.APIError as exc:
            raise map_error(exc, "cannot create the sandbox") from exc
        sandbox = cls(client, spec, container)
        try:
            for network in spec.networks:
                try:
                    client.networks.get(network).connect(container)
                except docker.errors.APIError as exc:
                    raise map_error(exc, f"cannot join the sandbox to {network}") from exc
            sandbox._boot()
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    @classmethod
    def claim(
        cls, client: docker.DockerClient, spec: SandboxSpec, container: Container
    ) -> DockerSandbox:
        """Takes over a spare (:mod:`controller.sandbox.spares`): attach, start it if its
        listed state is ``created`` (its own start may still be on its way: the daemon
        starts it once), and greet, with a key of this session. On failure it is removed."""
        sandbox = cls(client, spec, container)
        try:
            sandbox._boot(start=status_of(container) == "created")
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def _boot(self, *, start: bool = True) -> None:
        self._watcher = _OomWatcher(self._client, self.container.id or "")
        try:
            sock = self._client.api.attach_socket(
                self.container.id or "", params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            self._channel = AttachChannel(sock)
            self._session = AgentSession(self._channel, MAX_RESPONSE_FRAME)
            if start:
                self.container.start()
        except docker.errors.APIError as exc:
            raise map_error(exc, "cannot start the sandbox") from exc
        timeout = self.spec.ready_timeout + (ARCHIVE_TIMEOUT if self.spec.preload else 0.0)
        try:
            self._hello = self._session.hello(timeout, self.spec.protected)
        except SandboxError as exc:
            raise self._diagnose(exc) from exc
        preload = self._hello.preload
        if self.spec.preload is not None and (preload is None or preload.error is not None):
            why = (preload.error if preload is not None else None) or "no report"
            if "No space left" in why:
                raise LimitExceededError(
                    "the baseline does not fit in the workspace "
                    f"(workspace_mb={self.spec.limits.workspace_mb}): raise the task's limit"
                )
            raise SandboxError(f"the baseline did not load into the sandbox: {why}")

    # -- calls ----------------------------------------------------------------------------

    @property
    def hello(self) -> HelloResult:
        assert self._hello is not None  # noqa: S101 - set by start()
        return self._hello

    @property
    def session(self) -> AgentSession:
        if self._session is None or self._closed:
            raise SandboxError("the sandbox is closed")
        return self._session

    def _budget(self, timeout: float) -> float:
        if self.clock.paused:
            return timeout
        remaining = self.clock.remaining()
        if remaining <= 0:
            self._kill()
            raise LimitExceededError(
                f"wall-clock limit of {self.spec.limits.wall_seconds:g} s reached"
            )
        return min(timeout, remaining)

    def _call(
        self,
        op: str,
        args: CallArgs,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        binary: bytes | Iterable[bytes] | None = None,
    ) -> dict[str, object]:
        budget = self._budget(timeout)
        try:
            return self.session.call(op, args, budget, binary)
        except SandboxError as exc:
            raise self._diagnose(exc) from exc

    def _protocol_violation(self, error: ProtocolError) -> ProtocolError:
        if self._session is not None:
            self._session.poison(error.message)
        self._kill()
        return error

    def _diagnose(self, exc: SandboxError) -> Exception:
        """Turns a broken channel into the real reason, asked of Docker, and kills the rest."""
        if self.clock.expired():
            self._kill()
            return LimitExceededError(
                f"wall-clock limit of {self.spec.limits.wall_seconds:g} s reached"
            )
        if self._oom_killed(wait=isinstance(exc, ProtocolError) is False):
            self._kill()
            return self._oom_error()
        self._kill()
        tail = self._channel.stderr_tail() if self._channel else ""
        if tail:
            log.warning("sandbox_stderr", tail=tail[-2000:])
        return exc

    def _oom_killed(self, *, wait: bool) -> bool:
        if self._watcher is not None and self._watcher.oom.wait(_OOM_GRACE if wait else 0):
            return True
        try:
            self.container.reload()
        except docker.errors.APIError:
            return False
        state = self.container.attrs.get("State", {})
        return bool(state.get("OOMKilled"))

    def _before_run(self) -> None:
        self._raise_if_oom()

    def _after_run(self, result: RunResult) -> RunResult:
        """Raises LimitExceededError when Docker reports that the container hit its memory
        limit during the run (the job's wall clock is enforced by ``_call``)."""
        # An OOM kill anywhere in the run (also of a grandchild whose parent then exits
        # normally) comes as a Docker event, which may arrive after the response on a busy
        # host. The agent's count of the cgroup's OOM kills says one is on its way: then the
        # controller waits for Docker's word (a count alone, the agent's word, is no
        # verdict). A later event is still caught at the next call.
        self._raise_if_oom()
        if result.oom_kills and self._watcher is not None:
            if self._watcher.oom.wait(_OOM_CONFIRM):
                raise self._oom_error()
            log.warning("oom_count_without_event", oom_kills=result.oom_kills)
        if (
            result.signal == 9
            and not result.timed_out
            and not result.cancelled
            and self._oom_killed(wait=True)
        ):
            raise self._oom_error()
        return result

    def _oom_error(self) -> LimitExceededError:
        return LimitExceededError(
            f"memory limit of {self.spec.limits.memory_mb} MB exceeded (OOM kill)"
        )

    def _raise_if_oom(self) -> None:
        """Once Docker reported an OOM kill, the sandbox is not used again."""
        if self._watcher is not None and self._watcher.oom.is_set():
            raise self._oom_error()

    # -- teardown -------------------------------------------------------------------------

    def _kill(self) -> None:
        try:
            self.container.kill()
        except docker.errors.APIError:
            pass

    def interrupt(self) -> None:
        """From another thread: kills the container and wakes a call waiting on the channel,
        which then fails; the thread that owns the sandbox still calls :meth:`close`."""
        self._kill()
        if self._channel is not None:
            self._channel.interrupt()

    def close(self) -> None:
        """Removes the container and closes every stream; logs (never raises) a failure."""
        if self._closed:
            return
        self._closed = True
        if self._channel is not None:
            self._channel.close()
        if self._watcher is not None:
            self._watcher.close()
        try:
            self.container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        except Exception as exc:  # an API error, or no engine at all (requests' own errors)
            if mapped_class(exc) is None:  # not the engine's: a bug, raised
                raise
            if isinstance(exc, docker.errors.APIError) and removal_in_progress(exc):
                log.debug("sandbox_removal_in_progress", container=self.container.short_id)
                return  # a claimed spare: Docker removes it once it ends
            error = getattr(exc, "explanation", None) or type(exc).__name__
            log.error("sandbox_remove_failed", container=self.container.short_id, error=str(error))
