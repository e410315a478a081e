"""Attack tests on the real daemon: repo code inside the sandbox tries to get out.

The attacker code runs the way untrusted repo code runs, through ``box.run``, and every
test asserts the exact safe outcome for each runtime. Where runc and gVisor (runsc) differ,
the docstring says what each one does; the numbers are from the development machine
(2 cores, Docker 20.10, cgroup v1, runsc release 20221219 on its ptrace platform).
"""

from __future__ import annotations

import errno
import io
import ipaddress
import json
import socket
import subprocess
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import docker.errors
import pytest
from docker.types import LogConfig

from controller.config.limits import SHM_MB, Limits
from controller.errors import ErrorCode, LimitExceededError, SandboxError
from controller.sandbox import docker as sandbox_docker
from controller.sandbox.base import RunResult, Runtime, SandboxSpec
from controller.sandbox.docker import SANDBOX_UID, DockerSandbox, container_config, pids_limit
from controller.sandbox.labels import OWNER, OWNER_FILTER, OWNER_VALUE, current_identity, new_job_id
from tests.support.sandbox import SandboxFactory

pytestmark = pytest.mark.docker

MB = 1 << 20
SMALL = Limits(memory_mb=256, workspace_mb=64, tmp_mb=32)
SETUID_PY = "/usr/local/bin/supy"


# -- helpers ------------------------------------------------------------------------------


def _run_py(box: DockerSandbox, source: str, *args: str, timeout: float = 30.0) -> RunResult:
    return box.run(["python3", "-c", textwrap.dedent(source), *args], timeout=timeout)


def _probe(box: DockerSandbox, source: str, *args: str, timeout: float = 30.0) -> Any:
    """Runs ``source`` with python3 in the sandbox; its last line of output is JSON."""
    result = _run_py(box, source, *args, timeout=timeout)
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def _container_id(box: DockerSandbox) -> str:
    assert box.container.id is not None
    return box.container.id


def _stats(client: docker.DockerClient, container_id: str) -> dict[str, Any]:
    stats: dict[str, Any] = client.api.stats(container_id, stream=False, one_shot=True)
    return stats


def _state(box: DockerSandbox, *, until_exited: bool = False) -> dict[str, Any]:
    """The container's State; with ``until_exited``, waits (bounded) for it to stop."""
    deadline = time.monotonic() + 10.0
    while True:
        box.container.reload()
        state: dict[str, Any] = box.container.attrs["State"]
        if not until_exited or not state["Running"] or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def _host_true_seconds() -> float:
    started = time.monotonic()
    subprocess.run(["true"], check=True)
    return time.monotonic() - started


def _known_gap(request: pytest.FixtureRequest, reason: str) -> None:
    """Marks this test instance as a known, documented gap; strict, so a fix shows up."""
    request.applymarker(pytest.mark.xfail(reason=reason, strict=True))


# -- 1. network ---------------------------------------------------------------------------

NETWORK_PROBE = r"""
import json, socket, sys, time
out = {"connect": {}, "udp": {}}
with open("/proc/net/dev") as fh:
    out["proc_net_dev"] = sorted(line.split(":")[0].strip() for line in fh.readlines()[2:])
out["if_nameindex"] = [name for _, name in socket.if_nameindex()]
try:
    socket.getaddrinfo("pypi.org", 443)
    out["dns"] = "resolved"
except socket.gaierror as exc:
    out["dns"] = exc.errno
for addr in sys.argv[1:]:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(3.0)
        started = time.monotonic()
        try:
            s.connect((addr, 80))
            outcome = "connected"
        except socket.timeout:
            outcome = "timeout"
        except OSError as exc:
            outcome = exc.errno
        out["connect"][addr] = [outcome, time.monotonic() - started]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(b"x", (addr, 53))
            out["udp"][addr] = "sent"
        except OSError as exc:
            out["udp"][addr] = exc.errno
print(json.dumps(out))
"""


def _host_side_addresses(client: docker.DockerClient) -> list[str]:
    """The Docker bridge gateway and the host's own address on its default route."""
    addresses: list[str] = []
    for cfg in client.networks.get("bridge").attrs["IPAM"]["Config"] or []:
        gateway = cfg.get("Gateway")
        if not gateway and cfg.get("Subnet"):
            network = ipaddress.ip_network(cfg["Subnet"])
            if network.version == 4:
                gateway = str(next(network.hosts()))
        if gateway and ":" not in gateway:
            addresses.append(gateway)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # picks a route; sends nothing
            addresses.append(s.getsockname()[0])
        except OSError:
            pass
    return addresses


def test_network_is_loopback_only(
    runtime: Runtime, make_sandbox: SandboxFactory, docker_client: docker.DockerClient
) -> None:
    """Only ``lo`` exists; DNS fails; TCP and UDP to the internet, the Docker gateway and
    the host fail at once, without a packet leaving.

    runc answers ENETUNREACH (IPv6: EADDRNOTAVAIL, no address at all); gVisor's own
    network stack answers EHOSTUNREACH for both families. Connecting to a closed port on
    127.0.0.1 is refused (ECONNREFUSED): the probe does reach a working network stack.
    """
    host_side = _host_side_addresses(docker_client)
    assert host_side, "no Docker gateway address found"
    outside = ["192.0.2.1", "1.1.1.1", *host_side]
    box = make_sandbox(runtime)
    out = _probe(box, NETWORK_PROBE, *outside, "2001:db8::1", "127.0.0.1")

    assert out["proc_net_dev"] == ["lo"]
    assert out["if_nameindex"] == ["lo"]
    assert out["dns"] == socket.EAI_AGAIN
    unreachable = errno.ENETUNREACH if runtime == "runc" else errno.EHOSTUNREACH
    unreachable6 = errno.EADDRNOTAVAIL if runtime == "runc" else errno.EHOSTUNREACH
    for addr in outside:
        outcome, seconds = out["connect"][addr]
        assert outcome == unreachable, (addr, outcome)
        assert seconds < 1.0, (addr, seconds)
        assert out["udp"][addr] == unreachable, addr
    assert out["connect"]["2001:db8::1"][0] == unreachable6
    assert out["udp"]["2001:db8::1"] == unreachable6
    assert out["connect"]["127.0.0.1"][0] == errno.ECONNREFUSED


# -- 2. capabilities and seccomp ----------------------------------------------------------

STATUS_PROBE = r"""
import json
fields = {}
with open("/proc/self/status") as fh:
    for line in fh:
        key, _, value = line.partition(":")
        fields[key] = value.strip()
print(json.dumps(fields))
"""

NO_CAPS = "0000000000000000"


def test_no_capabilities_and_seccomp(runtime: Runtime, make_sandbox: SandboxFactory) -> None:
    """Every capability set is empty; runc shows Docker's default seccomp filter
    (``Seccomp: 2``, one filter) and ``NoNewPrivs: 1``.

    gVisor reports ``Seccomp: 0`` and has no CapAmb/NoNewPrivs lines: its Sentry
    implements the system calls itself and does not install the OCI seccomp profile into
    the guest (runsc applies it only with ``--oci-seccomp``); the host side of the sandbox
    runs under gVisor's own seccomp filter, which the guest cannot see.
    """
    box = make_sandbox(runtime)
    status = _probe(box, STATUS_PROBE)
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd"):
        assert status[key] == NO_CAPS, key
    if runtime == "runc":
        assert status["CapAmb"] == NO_CAPS
        assert status["Seccomp"] == "2"
        assert status["Seccomp_filters"] == "1"
        assert status["NoNewPrivs"] == "1"
    else:
        assert status["Seccomp"] == "0"
        assert "CapAmb" not in status
        assert "NoNewPrivs" not in status


# -- 3. no-new-privileges -----------------------------------------------------------------

EUID_PROBE = rf"""
import json, os
st = os.stat("{SETUID_PY}")
print(json.dumps({{"resuid": os.getresuid(), "mode": st.st_mode & 0o7777, "owner": st.st_uid}}))
"""


def _ancestry(client: docker.DockerClient, image_id: str) -> list[str]:
    """The image and its parents, as far as they are local images (legacy builder)."""
    chain: list[str] = []
    current = image_id
    while current and current not in chain:
        chain.append(current)
        try:
            current = client.images.get(current).attrs.get("Parent") or ""
        except docker.errors.ImageNotFound:
            break
    return chain


def _remove_build_leftovers(client: docker.DockerClient, layers: set[str]) -> None:
    """Removes step containers of our build that the legacy builder left behind; they
    carry the sandbox image's labels (owner=patchbox), so a leftover would fail the suite.
    """
    for container in client.containers.list(all=True, filters={"label": OWNER_FILTER}):
        if container.attrs.get("Image") in layers:
            container.remove(force=True, v=True)


@pytest.fixture(scope="module")
def setuid_image(docker_client: docker.DockerClient, sandbox_image: str) -> Iterator[str]:
    """The sandbox image plus a setuid-root copy of python3; removed after the module."""
    tag = f"patchbox-test-setuid:{uuid.uuid4().hex[:12]}"
    dockerfile = (
        f"FROM {sandbox_image}\n"
        "USER 0:0\n"
        f"RUN cp /usr/bin/python3 {SETUID_PY} && chmod 4755 {SETUID_PY}\n"
        f"USER {SANDBOX_UID}:{SANDBOX_UID}\n"
    )
    image, _ = docker_client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()),
        tag=tag,
        labels={OWNER: OWNER_VALUE},
        rm=True,
        forcerm=True,
        network_mode="none",
    )
    assert image.id is not None
    base = set(_ancestry(docker_client, docker_client.images.get(sandbox_image).id or ""))
    layers = set(_ancestry(docker_client, image.id)) - base
    _remove_build_leftovers(docker_client, layers)
    try:
        yield tag
    finally:
        _remove_build_leftovers(docker_client, layers)
        docker_client.images.remove(image.id, force=True)


def _run_without_no_new_privileges(client: docker.DockerClient, spec: SandboxSpec) -> Any:
    """The sandbox's own container config minus ``no-new-privileges``, running the probe
    directly (with a log driver, to read its output)."""
    config = container_config(spec, current_identity().labels(spec.job_id, "test"))
    assert config["security_opt"] == ["no-new-privileges:true"]
    config["security_opt"] = []
    config["entrypoint"] = [SETUID_PY, "-c", textwrap.dedent(EUID_PROBE)]
    config["stdin_open"] = False
    config["log_config"] = LogConfig(type=LogConfig.types.JSON)
    container = client.containers.create(**config)
    try:
        container.start()
        assert container.wait(timeout=60)["StatusCode"] == 0
        return json.loads(container.logs(stdout=True, stderr=False).decode())
    finally:
        container.remove(force=True, v=True)


def test_setuid_binary_gains_no_privileges(
    runtime: Runtime, setuid_image: str, docker_client: docker.DockerClient
) -> None:
    """A setuid-root python3 in the image runs with euid 10001 in the sandbox.

    The control is the same container config without ``no-new-privileges``: under runc
    the binary then gets euid 0 (so the sandbox result is due to the flag). gVisor
    (release 20221219) ignores setuid bits altogether: euid stays 10001 even in the
    control, so under runsc this test shows the outcome, not the flag's effect.
    """
    spec = SandboxSpec(image=setuid_image, job_id=new_job_id(), runtime=runtime)
    with DockerSandbox.start(docker_client, spec, current_identity()) as box:
        result = box.run([SETUID_PY, "-c", textwrap.dedent(EUID_PROBE)], timeout=30)
    assert result.exit_code == 0, result.output
    inside = json.loads(result.output)
    assert inside == {"resuid": [SANDBOX_UID] * 3, "mode": 0o4755, "owner": 0}

    control = _run_without_no_new_privileges(docker_client, spec)
    escalated = [SANDBOX_UID, 0, 0] if runtime == "runc" else [SANDBOX_UID] * 3
    assert control == {"resuid": escalated, "mode": 0o4755, "owner": 0}


# -- 4. read-only root filesystem ---------------------------------------------------------

ROOTFS_PROBE = r"""
import errno, json, os, sys
out = {}
for path in sys.argv[1:]:
    target = os.path.join(path, ".patchbox-probe")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        out[path] = errno.errorcode[exc.errno]
    else:
        os.close(fd)
        os.unlink(target)
        out[path] = "written"
try:
    os.close(os.open("/opt/patchbox/agent.py", os.O_WRONLY))
    out["agent.py"] = "opened"
except OSError as exc:
    out["agent.py"] = errno.errorcode[exc.errno]
out["var_tmp_mode"] = os.stat("/var/tmp").st_mode & 0o7777
out["root_rdonly"] = bool(os.statvfs("/").f_flag & os.ST_RDONLY)
print(json.dumps(out))
"""


def test_root_filesystem_is_read_only(runtime: Runtime, make_sandbox: SandboxFactory) -> None:
    """Creating files in /, /etc, /usr, /opt/patchbox, /home fails with EROFS under runc.

    gVisor checks permissions before the read-only mount, so for these root-owned
    directories it answers EACCES. The world-writable /var/tmp (mode 1777) is where
    permissions would allow the write: there both runtimes answer EROFS, which shows the
    root filesystem itself is read-only. The agent's own code cannot be opened for writing.
    ``statvfs("/")`` shows ST_RDONLY under runc only; gVisor does not report mount flags.
    """
    box = make_sandbox(runtime)
    dirs = ["/", "/etc", "/usr", "/opt/patchbox", "/home"]
    out = _probe(box, ROOTFS_PROBE, *dirs, "/var/tmp")
    denied = "EROFS" if runtime == "runc" else "EACCES"
    assert {d: out[d] for d in dirs} == dict.fromkeys(dirs, denied)
    assert out["var_tmp_mode"] == 0o1777
    assert out["/var/tmp"] == "EROFS"
    assert out["agent.py"] == "EACCES"
    assert out["root_rdonly"] is (runtime == "runc")  # gVisor's statvfs omits ST_RDONLY


# -- 5. non-root --------------------------------------------------------------------------

ID_PROBE = r"""
import json, os
print(json.dumps({"uid": os.getresuid(), "gid": os.getresgid(), "groups": os.getgroups()}))
"""


def test_runs_as_unprivileged_user(runtime: Runtime, make_sandbox: SandboxFactory) -> None:
    box = make_sandbox(runtime)
    assert box.hello.uid == SANDBOX_UID
    assert box.hello.gid == SANDBOX_UID
    box.container.reload()  # the container as the daemon has it
    assert box.container.attrs["Config"]["User"] == f"{SANDBOX_UID}:{SANDBOX_UID}"
    out = _probe(box, ID_PROBE)
    assert out == {
        "uid": [SANDBOX_UID] * 3,
        "gid": [SANDBOX_UID] * 3,
        "groups": [SANDBOX_UID],
    }


# -- 6. memory ----------------------------------------------------------------------------

BALLOON = r"""
import mmap
blocks = []
for _ in range(64):  # 64 x 16 MB = 1 GB, every page touched
    block = mmap.mmap(-1, 16 << 20)
    for offset in range(0, 16 << 20, 4096):
        block[offset] = 1
    blocks.append(block)
print("survived")
"""


@pytest.mark.parametrize("nested", [False, True], ids=["direct", "grandchild"])
def test_memory_balloon_is_limit_exceeded(
    runtime: Runtime, make_sandbox: SandboxFactory, nested: bool
) -> None:
    """Touching 1 GB in a 256 MB sandbox ends in LIMIT_EXCEEDED on that very call.

    ``grandchild``: the balloon runs under ``sh``, which survives and exits 0 after it.
    runc OOM-kills only the balloon: the container keeps running (State.OOMKilled stays
    false) and the verdict comes from Docker's ``oom`` event. gVisor dies as a whole:
    the channel closes, the container exits 137 (State.OOMKilled set, or not yet: Docker's
    flag, seen false once under gVisor). Either way the sandbox is not used again.
    """
    box = make_sandbox(runtime, limits=SMALL)
    balloon = textwrap.dedent(BALLOON)
    argv = ["python3", "-c", balloon]
    if nested:
        argv = ["sh", "-c", 'python3 -c "$1"; echo "balloon exit $?"', "sh", balloon]
    started = time.monotonic()
    with pytest.raises(LimitExceededError) as info:
        box.run(argv, timeout=60)
    assert time.monotonic() - started < 20.0
    assert info.value.code is ErrorCode.LIMIT_EXCEEDED
    assert "memory limit of 256 MB" in info.value.message
    with pytest.raises(LimitExceededError):
        box.run(["true"], timeout=10)
    if runtime == "runc":
        state = _state(box)
        assert (state["Running"], state["OOMKilled"]) == (True, False)
    else:
        # Killed whole (SIGKILL). Docker's own ``OOMKilled`` flag is set from an event that,
        # under gVisor, may be handled after the exit: the verdict above does not use it.
        state = _state(box, until_exited=True)
        assert (state["Running"], state["ExitCode"]) == (False, 137)


def test_late_oom_event_still_fails_that_call(
    make_sandbox: SandboxFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a busy host Docker's ``oom`` event can come after the run's response. A grandchild
    OOM-killed under a shell that exits 0 still fails that very call, not the next one: the
    agent's cgroup count says an event is due and the controller waits for it (here it is
    held back 2 s)."""

    def late_follow(self: Any) -> None:
        try:
            for event in self._stream:
                if (
                    isinstance(event, dict)
                    and (event.get("Action") or event.get("status")) == "oom"
                ):
                    time.sleep(2.0)
                    self.oom.set()
        except Exception:
            return

    monkeypatch.setattr(sandbox_docker._OomWatcher, "_follow", late_follow)
    box = make_sandbox("runc", limits=SMALL)
    argv = ["sh", "-c", 'python3 -c "$1"; echo "balloon exit $?"', "sh", textwrap.dedent(BALLOON)]
    started = time.monotonic()
    with pytest.raises(LimitExceededError) as info:
        box.run(argv, timeout=60)
    assert 2.0 <= time.monotonic() - started < 20.0
    assert "memory limit of 256 MB" in info.value.message


def test_run_reports_the_cgroup_oom_count(make_sandbox: SandboxFactory) -> None:
    """A run without an OOM kill reports a count of 0 under runc (the kernel's memory cgroup
    is readable in the container); the agent reads it before and after each run."""
    box = make_sandbox("runc", limits=SMALL)
    result = box.run(["true"], timeout=10)
    assert (result.exit_code, result.oom_kills) == (0, 0)


# -- 7. pids ------------------------------------------------------------------------------

FORK_BOMB = r"""
import os, time
while True:
    try:
        pid = os.fork()
    except OSError:
        time.sleep(0.005)
        continue
    if pid == 0:
        try:
            os.setsid()  # leave the run's process group, so its kill misses us
        except OSError:
            pass
"""


class _Sampler:
    """Samples the container's pids count and the host's responsiveness in a thread."""

    def __init__(self, client: docker.DockerClient, container_id: str) -> None:
        self._client = client
        self._id = container_id
        self.pids: list[tuple[int, int]] = []
        self.host_true: list[float] = []
        self._stop = threading.Event()
        self.sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def sample(self) -> bool:
        try:
            pids = _stats(self._client, self._id).get("pids_stats") or {}
        except docker.errors.APIError:
            return False
        if "current" in pids:
            self.pids.append((pids["current"], pids["limit"]))
        self.host_true.append(_host_true_seconds())
        return True

    def _loop(self) -> None:
        while not self._stop.wait(0.1) and self.sample():
            pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_fork_bomb_is_contained(
    runtime: Runtime, make_sandbox: SandboxFactory, docker_client: docker.DockerClient
) -> None:
    """A fork bomb whose children leave the process group, with a pids limit of 64.

    runc: forks fail with EAGAIN at the limit (the pids count peaks at exactly 64), the
    run times out after 5 s and its group is killed; the escaped children live on until
    ``close`` removes the container.
    gVisor (ptrace platform) charges the pids cgroup with host threads: about 35 for an
    idle Sentry and about 5 more per guest process, so the controller sets the cgroup
    limit to 64 + 8 * pids (576 here). The fork bomb then ends the whole sandbox one of two
    ways, both seen here: the Sentry cannot create a thread (exit code 2, SANDBOX_FAILED:
    Docker reports nothing about pids), or it runs out of memory first (exit 137, an OOM:
    LIMIT_EXCEEDED). Either way the job ends.
    Both: the host stays responsive, and the container is gone after ``close``.
    """
    box = make_sandbox(runtime, pids=64)
    container_id = _container_id(box)
    sampler = _Sampler(docker_client, container_id)
    started = time.monotonic()
    try:
        if runtime == "runc":
            result = _run_py(box, FORK_BOMB, timeout=5.0)
            assert result.timed_out is True
            assert result.signal == 9
        else:
            with pytest.raises((SandboxError, LimitExceededError)) as info:
                _run_py(box, FORK_BOMB, timeout=5.0)
            state = _state(box, until_exited=True)
            if isinstance(info.value, LimitExceededError):
                # The bomb ran the Sentry out of memory before it ran out of threads.
                assert info.value.code is ErrorCode.LIMIT_EXCEEDED
                assert (state["Running"], state["ExitCode"]) == (False, 137)
            else:
                assert info.value.code is ErrorCode.SANDBOX_FAILED
                assert (state["Running"], state["OOMKilled"], state["ExitCode"]) == (
                    False,
                    False,
                    2,
                )
        elapsed = time.monotonic() - started
        if runtime == "runc":
            time.sleep(0.5)  # the escaped children are still forking
            sampler.sample()
    finally:
        sampler.stop()
    assert elapsed < 12.0

    box.close()
    assert docker_client.containers.list(all=True, filters={"id": container_id}) == []
    assert _host_true_seconds() < 1.0
    assert max(sampler.host_true) < 1.0

    assert sampler.pids, "no pids sample"
    expected_limit = pids_limit(box.spec)
    assert expected_limit == (64 if runtime == "runc" else 64 + 8 * 64)
    assert {limit for _, limit in sampler.pids} == {expected_limit}
    peak = max(current for current, _ in sampler.pids)
    if runtime == "runc":
        assert peak == 64
    else:
        assert peak <= expected_limit


# -- 8. CPU -------------------------------------------------------------------------------

CPU_PROBE = r"""
import json, time
wall0 = time.monotonic()
cpu0 = time.process_time()
while time.monotonic() - wall0 < 2.0:
    pass
print(json.dumps({"wall": time.monotonic() - wall0, "cpu": time.process_time() - cpu0}))
"""


def test_cpu_quota_throttles_a_busy_loop(
    runtime: Runtime, make_sandbox: SandboxFactory, docker_client: docker.DockerClient
) -> None:
    """With ``cpus=0.5`` a 2 s busy loop gets about 0.5 CPU seconds per wall second.

    Measured on the host (the container's cgroup usage, authoritative for both runtimes:
    about 0.50) and, under runc, inside (``process_time``: about 0.50). gVisor's own task
    clock is not bound to the host cgroup: it read 0.67 to 0.89 on the machines seen while
    the host cgroup showed 0.50, so it is not asserted. Unthrottled, the loop would read
    about 1.0.
    """
    box = make_sandbox(runtime, cpus=0.5)
    box.container.reload()  # the container as the daemon has it
    assert box.container.attrs["HostConfig"]["NanoCpus"] == 500_000_000
    container_id = _container_id(box)
    before = _stats(docker_client, container_id)["cpu_stats"]
    wall0 = time.monotonic()
    out = _probe(box, CPU_PROBE)
    wall = time.monotonic() - wall0
    after = _stats(docker_client, container_id)["cpu_stats"]

    host_ratio = (after["cpu_usage"]["total_usage"] - before["cpu_usage"]["total_usage"]) / (
        wall * 1e9
    )
    throttled = (
        after["throttling_data"]["throttled_periods"]
        - before["throttling_data"]["throttled_periods"]
    )
    inside_ratio = out["cpu"] / out["wall"]
    assert out["wall"] >= 2.0
    assert 0.2 <= host_ratio <= 0.65, host_ratio
    assert throttled >= 5, throttled
    if runtime == "runc":
        assert 0.2 <= inside_ratio <= 0.65, inside_ratio


# -- 9. bounded writable space ------------------------------------------------------------

FILL_PROBE = r"""
import errno, json, os, sys
path, cap = sys.argv[1], int(sys.argv[2])
chunk = b"x" * (1 << 20)
written, error = 0, None
with open(path, "wb", buffering=0) as fh:
    try:
        while written < cap:
            written += fh.write(chunk)
    except OSError as exc:
        error = errno.errorcode[exc.errno]
print(json.dumps({"error": error, "written": written, "size": os.path.getsize(path)}))
"""


def test_filling_a_tmpfs_ends_in_enospc(runtime: Runtime, make_sandbox: SandboxFactory) -> None:
    """Writing past /workspace (64 MB), /tmp (32 MB) and /dev/shm (16 MB) stops with
    ENOSPC at their size (to the page), all three held full at once; the sandbox keeps running,
    is not OOM-killed, and answers later calls."""
    box = make_sandbox(runtime, limits=SMALL)
    note = box.run(["sh", "-c", "echo still here > note.txt"], timeout=10)
    assert note.exit_code == 0, note.output
    sizes = {"/workspace": SMALL.workspace_mb, "/tmp": SMALL.tmp_mb, "/dev/shm": SHM_MB}
    for mount, size_mb in sizes.items():
        out = _probe(box, FILL_PROBE, f"{mount}/fill", str(2 * size_mb * MB), timeout=60)
        assert out["error"] == "ENOSPC", mount
        assert out["written"] == out["size"], mount
        # the full size, less the few pages other files hold (note.txt; in /tmp the agent's
        # private git dir, made when the workspace is first listed)
        assert size_mb * MB - 256 * 1024 <= out["written"] <= size_mb * MB, (mount, out)

    assert box.read_file("note.txt").content == "still here\n"
    assert box.list_files().files == ["fill", "note.txt"]
    assert box.run(["true"], timeout=10).exit_code == 0  # raises if Docker saw an OOM
    state = _state(box)
    assert (state["Running"], state["OOMKilled"]) == (True, False)


MOUNTS_PROBE = r"""
import errno, json, os
out = {}
with open("/proc/self/mounts") as fh:
    mounts = [line.split()[1].encode().decode("unicode_escape") for line in fh]
for mount in mounts:
    if mount in out:
        continue
    if mount in ("/proc", "/sys") or mount.startswith(("/proc/", "/sys/")):
        out[mount] = "skipped"
        continue
    if os.path.isdir(mount):
        target = os.path.join(mount, ".patchbox-probe")
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            out[mount] = errno.errorcode[exc.errno]
            continue
        try:
            os.write(fd, b"x")
            out[mount] = "writable"
        except OSError as exc:
            out[mount] = "created, write " + errno.errorcode[exc.errno]
        finally:
            os.close(fd)
            os.unlink(target)
    else:
        try:
            os.close(os.open(mount, os.O_WRONLY | os.O_APPEND))
            out[mount] = "writable"
        except OSError as exc:
            out[mount] = errno.errorcode[exc.errno]
print(json.dumps(out))
"""


def test_only_the_tmpfs_mounts_are_writable(runtime: Runtime, make_sandbox: SandboxFactory) -> None:
    """A file can be written under every mount point in /proc/self/mounts only on
    /workspace, /tmp and /dev/shm; everywhere else EROFS or EACCES.

    /proc and /sys (and the mounts under them) are skipped: they are kernel pseudo
    filesystems, not storage; sysfs and /proc/sys are mounted read-only there, and the
    masked /proc files are binds of /dev/null.
    runc also mounts /dev/mqueue (POSIX message queues, private IPC namespace): the sandbox's
    RLIMIT_MSGQUEUE is 0, so no queue can be created there (EMFILE). gVisor has no
    /dev/mqueue.
    """
    box = make_sandbox(runtime)
    out: dict[str, str] = _probe(box, MOUNTS_PROBE)
    writable = {mount for mount, outcome in out.items() if outcome == "writable"}
    assert writable == {"/workspace", "/tmp", "/dev/shm"}
    assert out.get("/dev/mqueue") == ("EMFILE" if runtime == "runc" else None)
    others = {
        mount: outcome
        for mount, outcome in out.items()
        if mount not in writable and mount != "/dev/mqueue" and outcome != "skipped"
    }
    assert {"/", "/dev", "/etc/hosts", "/etc/resolv.conf"} <= set(others)
    assert set(others.values()) <= {"EROFS", "EACCES"}, others


# -- 10. wall clock -----------------------------------------------------------------------


def test_wall_clock_limit_kills_the_sandbox(runtime: Runtime, make_sandbox: SandboxFactory) -> None:
    """With ``wall_seconds=3`` a 30 s sleep ends in LIMIT_EXCEEDED about 3 s after the
    sandbox was created; the container is killed (exit 137) and every later call
    raises LIMIT_EXCEEDED at once."""
    started = time.monotonic()
    box = make_sandbox(runtime, wall_seconds=3.0)
    with pytest.raises(LimitExceededError) as info:
        box.run(["sleep", "30"], timeout=60)
    elapsed = time.monotonic() - started
    assert info.value.code is ErrorCode.LIMIT_EXCEEDED
    assert "wall-clock limit of 3 s" in info.value.message
    assert 2.9 <= elapsed <= 5.5, elapsed
    state = _state(box, until_exited=True)
    assert (state["Running"], state["ExitCode"]) == (False, 137)
    quick = time.monotonic()
    with pytest.raises(LimitExceededError):
        box.list_files()
    assert time.monotonic() - quick < 1.0


# -- 11. the controller channel -----------------------------------------------------------

DUMPABLE_PROBE = r"""
import errno, json, os, subprocess
def outcome(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
agents = []
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    try:
        with open(f"/proc/{name}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        continue
    if argv[0].endswith(b"python3") and b"/opt/patchbox/agent.py" in argv:
        agents.append(int(name))
out = {"agents": sorted(agents)}
out["listdir"] = sorted({outcome(lambda: os.listdir(f"/proc/{pid}/fd")) for pid in agents})
out["open"] = sorted({
    outcome(lambda: os.close(os.open(f"/proc/{pid}/fd/{n}", os.O_WRONLY | os.O_NONBLOCK)))
    for pid in agents
    for n in range(10)
})
child = subprocess.Popen(["sleep", "30"])
out["control"] = outcome(lambda: os.listdir(f"/proc/{child.pid}/fd"))
child.kill()
child.wait()
print(json.dumps(out))
"""


def test_agent_is_not_dumpable(
    runtime: Runtime, make_sandbox: SandboxFactory, request: pytest.FixtureRequest
) -> None:
    """A process started by ``run`` (same uid) cannot list or open the fds of the agent, the
    container's init (one process: it serves and reaps orphans).

    The control: the probe's own child (same uid, dumpable) has a listable fd table.
    gVisor release 20221219 applies the dumpable flag to /proc/PID/{status,mem,environ}
    but not to /proc/PID/fd (owned by the task's uid, mode 0555): there the agent's fds,
    channel included, can be opened. Known gap, marked xfail under runsc; the signed frames
    (test_run_cannot_forge_its_own_result) keep it from mattering.
    """
    if runtime == "runsc":
        _known_gap(request, "gVisor 20221219 does not apply dumpability to /proc/PID/fd")
    box = make_sandbox(runtime)
    out = _probe(box, DUMPABLE_PROBE)
    assert out["agents"] == [1], "the agent is the container's init, and the only agent process"
    assert out["control"] == "ok"
    assert out["listdir"] == ["EACCES"]
    assert out["open"] == ["EACCES"]


ORPHANS = r"""
import os, sys, time
n = int(sys.argv[1])
for i in range(n):
    if os.fork() == 0:
        os.setsid()  # out of the run's process group: its kill at the end misses them
        if os.fork() == 0:
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)  # the run ends now, not when they close its output
            time.sleep(0.1)  # outlive the parent: now an orphan of the container's init
            with open(f"/tmp/orphan-{i}", "w") as fh:
                fh.write(str(os.getppid()))
            time.sleep(2.9)
            os._exit(0)
        os._exit(0)
    os.wait()
"""

ZOMBIES = r"""
import json, os
orphans = [name for name in os.listdir("/tmp") if name.startswith("orphan-")]
states = {}
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        states[name] = stat[stat.rfind(b")") + 2 :].split()[0].decode()
print(json.dumps({
    "ppids": sorted({open(f"/tmp/{name}").read() for name in orphans}),
    "written": len(orphans),
    "zombies": sorted(pid for pid, state in states.items() if state == "Z"),
}))
"""


def test_orphans_are_reaped(runtime: Runtime, make_sandbox: SandboxFactory) -> None:
    """Processes that outlive their parent (and leave the run's process group) are
    re-parented to the agent, the container's init. It reaps them when they exit, also while
    no run is going on: no zombie is left to fill the pids limit. The control: each orphan
    saw pid 1 as its parent.
    """
    box = make_sandbox(runtime)
    result = _run_py(box, ORPHANS, "20")
    assert result.exit_code == 0
    assert result.duration_ms < 2500, "the orphans do not hold the run's output"
    time.sleep(5.0)  # they exit about 3 s after the run ended; nothing runs meanwhile
    out = _probe(box, ZOMBIES)
    assert out["ppids"] == ["1"]
    assert out["written"] == 20
    assert out["zombies"] == []


CHURN = r"""
import os, sys, time
# Orphans that keep this run's output open for 0.3 s after it exits: meanwhile the run's
# own process waits as a zombie for the agent to read its status, and the orphans' exits
# wake the init's reaping.
for _ in range(4):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(0.3)
            os._exit(0)
        os._exit(0)
    os.wait()
sys.exit(int(sys.argv[1]))
"""


def test_reaping_never_takes_a_runs_exit_status(
    runtime: Runtime, make_sandbox: SandboxFactory
) -> None:
    """The init's reaping never reaps a process the agent started itself: that would turn
    a failing check's status into 0. 15 runs, each leaving orphans that exit while its own
    status waits to be read, keep their exact exit codes, and no zombie is left."""
    box = make_sandbox(runtime)
    codes = [3, 0, 1, 2, 5] * 3
    got = [_run_py(box, CHURN, str(code)).exit_code for code in codes]
    assert got == codes
    time.sleep(1.0)
    assert _probe(box, ZOMBIES)["zombies"] == []


def test_docker_stop_ends_the_sandbox_at_once(
    runtime: Runtime, make_sandbox: SandboxFactory
) -> None:
    """The agent is pid 1, and the kernel delivers to a namespace's init only signals it
    handles: without its SIGTERM handler ``docker stop`` would wait out its whole timeout
    and then SIGKILL. With it the agent exits with 143 at once, and the kernel kills
    everything else in the sandbox (here a running ``sleep``)."""
    box = make_sandbox(runtime)
    assert _run_py(box, "import subprocess; subprocess.Popen(['sleep', '300'])").exit_code == 0
    started = time.monotonic()
    box.container.stop(timeout=30)
    elapsed = time.monotonic() - started
    state = _state(box, until_exited=True)
    assert (state["Running"], state["ExitCode"]) == (False, 143)
    assert elapsed < 10.0, elapsed


FORGE_PROBE = r"""
import json, os, struct, sys, time
rid = int(sys.argv[1])
forged = {"exitCode": 0, "signal": None, "timedOut": False, "cancelled": False,
          "spawnError": None, "output": "FORGED: 120 passed", "outputBytes": 18,
          "truncated": False, "durationMs": 5}
payload = json.dumps({"id": rid, "ok": True, "result": forged}).encode()
frame = b"PBJ" + struct.pack(">I", len(payload)) + payload
me = os.getpid()
candidates = []
for name in sorted(os.listdir("/proc"), key=lambda n: (not n.isdigit(), n.zfill(10))):
    if name.isdigit() and int(name) not in (me, os.getppid()):
        candidates.append(f"/proc/{name}/fd/1")
candidates += [f"/proc/{os.getppid()}/fd/{n}" for n in range(3, 10)]
for path in candidates:
    try:
        if os.readlink(path) == "/dev/null":
            continue
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        continue
    try:
        os.write(fd, frame)
        print("wrote to", path, flush=True)
    except OSError as exc:
        print("open but not writable:", path, exc.errno, flush=True)
    finally:
        os.close(fd)
time.sleep(1.0)
print("genuine")
sys.exit(7)
"""


def test_run_cannot_forge_its_own_result(runtime: Runtime, make_sandbox: SandboxFactory) -> None:
    """Repo code cannot pass a forged answer through the controller channel.

    The probe tries every other process's fd 1 and the agent's (its parent's) fds 3-9, and
    writes a forged ``run`` result to the first it can open.
    runc: no descriptor of the channel can be opened (the agent, pid 1, is non-dumpable),
    so the controller gets the genuine result (exit 7).
    gVisor: /proc/PID/fd stays open to the same uid (see test_agent_is_not_dumpable), so the
    forged frame does reach the controller, which refuses it (it is not signed with the key
    sent in ``hello``): the job fails with SANDBOX_FAILED, and a forged result is never used.
    """
    box = make_sandbox(runtime)
    if runtime == "runc":
        result = _run_py(box, FORGE_PROBE, str(box.session.next_id))
        assert "FORGED" not in result.output
        assert "wrote to" not in result.output
        assert result.exit_code == 7
        assert "genuine" in result.output
        return
    with pytest.raises(SandboxError, match=r"unsigned|signature") as info:
        _run_py(box, FORGE_PROBE, str(box.session.next_id))
    assert info.value.code is ErrorCode.SANDBOX_FAILED
