"""The attach-stream channel on the real daemon: handshake, transfer, and hostile agents.

A hostile agent stands in for a container whose agent was taken over by repo code: it
greets properly, then answers the next request with one kind of protocol violation. Each
must end in SANDBOX_FAILED within a bound, with the container killed and then removed.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
from collections.abc import Callable, Iterator

import docker
import pytest

from controller.config.limits import Limits
from controller.errorinfo import Hint
from controller.errors import ErrorCode, PatchboxError, ProtocolError, SandboxError
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.labels import OWNER_FILTER, current_identity, new_job_id
from tests.support.proxy import TcpProxy
from tests.support.sandbox import SandboxFactory

pytestmark = pytest.mark.docker

HOSTILE_AGENT = r"""
import hashlib, hmac, json, os, struct, sys, time
mode = sys.argv[1]
inp, out = 0, 1
seq = 0
def read_frame():
    hdr = b""
    while len(hdr) < 7:
        chunk = os.read(inp, 7 - len(hdr))
        if not chunk:
            sys.exit(0)
        hdr += chunk
    _, _, n = struct.unpack(">2scI", hdr)
    body = b""
    while len(body) < n:
        body += os.read(inp, n - len(body))
    return json.loads(body)
def send(raw):
    os.write(out, raw)
def frame(body, kind=b"S"):
    global seq
    if kind == b"S":
        seq += 1
        body = hmac.new(key, seq.to_bytes(8, "big") + body, hashlib.sha256).digest() + body
    return b"PB" + kind + struct.pack(">I", len(body)) + body
req = read_frame()
key = bytes.fromhex(req["args"]["key"])
hello = {"protocol": 1, "agent": "hostile", "python": "3", "uid": os.getuid(), "gid": os.getgid()}
first = frame(json.dumps({"id": req["id"], "ok": True, "result": hello}).encode())
send(first)
req = read_frame()
rid = req["id"]
good = json.dumps({"id": rid, "ok": True, "result": {"files": ["a"], "truncated": False, "version": 1}}).encode()
if mode == "garbage":
    send(b"this is not a frame at all")
elif mode == "oversized":
    send(b"PB" + b"S" + struct.pack(">I", 1 << 30))
    send(b"x" * 65536)
elif mode == "dupkeys":
    send(frame(b'{"id": %d, "ok": true, "ok": true, "result": {}}' % rid))
elif mode == "nan":
    send(frame(b'{"id": %d, "ok": true, "result": {"files": [], "truncated": NaN}}' % rid))
elif mode == "deep":
    send(frame(b'{"id": %d, "ok": true, "result": {"x": ' % rid + b"[" * 5000 + b"]" * 5000 + b"}}"))
elif mode == "wrongid":
    send(frame(good.replace(b'"id": %d' % rid, b'"id": %d' % (rid + 7))))
elif mode == "badschema":
    send(frame(json.dumps({"id": rid, "ok": True, "result": {"files": [], "truncated": False, "version": 1, "x": 1}}).encode()))
elif mode == "badcode":
    send(frame(json.dumps({"id": rid, "ok": False, "error": {"code": "APPLY_CONFLICT", "message": "m"}}).encode()))
elif mode == "binary":
    send(frame(b"abc", kind=b"B"))
elif mode == "unsigned":
    send(frame(good, kind=b"J"))
elif mode == "badtag":
    body = frame(good)
    send(body[:7] + bytes(32) + body[39:])
elif mode == "replay":
    send(first)
elif mode == "late":
    time.sleep(300)
elif mode == "exit":
    sys.exit(0)
elif mode == "stderr_flood":
    for _ in range(160):
        os.write(2, b"e" * 65536)
    send(frame(good))
    time.sleep(300)
"""


def _hostile(client: docker.DockerClient, image: str, runtime: Runtime, mode: str) -> DockerSandbox:
    spec = SandboxSpec(
        image=image,
        job_id=new_job_id(),
        runtime=runtime,
        limits=Limits(memory_mb=512, workspace_mb=128),
        agent_argv=("python3", "-I", "-c", HOSTILE_AGENT, mode),
    )
    return DockerSandbox.start(client, spec, current_identity())


@pytest.fixture
def hostile(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: Runtime
) -> Iterator[Callable[[str], DockerSandbox]]:
    """Starts hostile agents (by mode) on the test's runtime; all are removed after."""
    boxes: list[DockerSandbox] = []

    def start(mode: str) -> DockerSandbox:
        box = _hostile(docker_client, sandbox_image, runtime, mode)
        boxes.append(box)
        return box

    yield start
    for box in boxes:
        box.close()


def test_handshake_and_tools(make_sandbox: SandboxFactory, runtime: Runtime) -> None:
    box = make_sandbox(runtime=runtime)
    assert (box.hello.protocol, box.hello.uid, box.hello.gid) == (1, 10001, 10001)
    assert box.list_files().files == []
    with pytest.raises(PatchboxError) as info:
        box.read_file("../../etc/passwd")
    assert info.value.code is ErrorCode.TOOL_PATH_DENIED
    assert box.list_files().files == []  # a tool error leaves the session usable


def test_binary_transfer_is_exact(make_sandbox: SandboxFactory, runtime: Runtime) -> None:
    """Every byte value, including the attach detach keys (ctrl-p ctrl-q), crosses intact,
    in an archive larger than one chunk."""
    payload = bytes(range(256)) * 64 + b"\x10\x11" * 1000 + os.urandom(3 * 1024 * 1024)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("data.bin")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    box = make_sandbox(runtime=runtime)
    data = buf.getvalue()
    assert box.put_archive(data).bytes == len(data)
    res = box.run(["sha256sum", "data.bin"], timeout=30)
    assert res.output.split()[0] == hashlib.sha256(payload).hexdigest()


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("garbage", "malformed frame header"),
        ("oversized", "oversized frame"),
        ("dupkeys", "duplicate key"),
        ("nan", "non-finite"),
        ("deep", "undecodable|nested too deeply"),
        ("wrongid", "unexpected id"),
        ("badschema", "does not match its schema"),
        ("badcode", "malformed"),
        ("binary", "unexpected unsigned or binary frame"),
        ("unsigned", "unexpected unsigned or binary frame"),
        ("badtag", "bad signature"),
        ("replay", "bad signature"),
        ("exit", "closed the channel"),
    ],
)
def test_hostile_agent_fails_the_job_cleanly(
    hostile: Callable[[str], DockerSandbox],
    mode: str,
    error: str,
) -> None:
    box = hostile(mode)
    started = time.monotonic()
    with pytest.raises(SandboxError, match=error) as info:
        box.list_files()
    assert info.value.code is ErrorCode.SANDBOX_FAILED
    assert time.monotonic() - started < 10
    with pytest.raises(SandboxError, match="unusable"):
        box.list_files()
    box.container.reload()
    assert box.container.status in ("exited", "dead") or mode == "exit"


def test_late_answer_fails_without_hanging(hostile: Callable[[str], DockerSandbox]) -> None:
    box = hostile("late")
    started = time.monotonic()
    with pytest.raises(ProtocolError, match="did not answer in time"):
        box._call("list_files", {}, timeout=2.0)
    assert 1.9 < time.monotonic() - started < 6
    box.container.reload()
    assert box.container.status != "running"


def test_stderr_flood_is_bounded(hostile: Callable[[str], DockerSandbox]) -> None:
    box = hostile("stderr_flood")
    assert box.list_files().files == ["a"]
    assert box._channel is not None
    assert len(box._channel.stderr_tail()) <= 8192


def test_agent_that_never_greets_is_removed(
    docker_client: docker.DockerClient, sandbox_image: str, runtime: Runtime
) -> None:
    spec = SandboxSpec(
        image=sandbox_image,
        job_id=new_job_id(),
        runtime=runtime,
        ready_timeout=3.0,
        agent_argv=("sleep", "60"),
    )
    started = time.monotonic()
    with pytest.raises(SandboxError, match="did not answer in time"):
        DockerSandbox.start(docker_client, spec, current_identity())
    assert time.monotonic() - started < 15
    left = docker_client.containers.list(
        all=True, filters={"label": f"io.patchbox.job={spec.job_id}"}
    )
    assert left == []


def test_missing_agent_binary_is_a_clean_failure(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    spec = SandboxSpec(image=sandbox_image, job_id=new_job_id(), agent_argv=("/no/such/agent",))
    with pytest.raises(SandboxError, match="cannot start the sandbox"):
        DockerSandbox.start(docker_client, spec, current_identity())
    assert (
        docker_client.containers.list(all=True, filters={"label": f"io.patchbox.job={spec.job_id}"})
        == []
    )


def test_missing_image_names_the_fix(docker_client: docker.DockerClient) -> None:
    spec = SandboxSpec(image="patchbox-sandbox:does-not-exist", job_id=new_job_id())
    with pytest.raises(SandboxError, match="not found") as info:
        DockerSandbox.start(docker_client, spec, current_identity())
    assert info.value.hint == Hint(action="build_image")


def test_workspace_files_cannot_shadow_agent_modules(make_sandbox: SandboxFactory) -> None:
    """The agent runs with ``python3 -I`` from /: a repo's json.py is never imported by it."""
    evil = b"open('/tmp/shadowed', 'w').write('yes')\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("json.py", "struct.py", "tarfile.py", "patchbox_agent.py"):
            info = tarfile.TarInfo(name)
            info.size = len(evil)
            tar.addfile(info, io.BytesIO(evil))
    box = make_sandbox()
    box.put_archive(buf.getvalue())
    res = box.run(["python3", "-I", "-B", "/opt/patchbox/agent.py"], timeout=20)
    assert res.exit_code == 0
    check = box.run(
        ["sh", "-c", "test -e /tmp/shadowed && echo SHADOWED || echo clean"], timeout=20
    )
    assert check.output == "clean\n"


def test_sandbox_closes_and_leaves_nothing(
    make_sandbox: SandboxFactory, docker_client: docker.DockerClient
) -> None:
    box = make_sandbox()
    cid = box.container.id
    box.close()
    box.close()  # idempotent
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(cid or "")
    with pytest.raises(SandboxError, match="closed"):
        box.list_files()


def test_remote_daemon_over_tcp(sandbox_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through DOCKER_HOST=tcp://... the same attach channel works (no unix socket, no exec)."""
    proxy = TcpProxy()
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{proxy.port}")
    from controller.sandbox.dockerclient import connect

    client = connect()
    try:
        spec = SandboxSpec(
            image=sandbox_image, job_id=new_job_id(), limits=Limits(memory_mb=512, workspace_mb=128)
        )
        with DockerSandbox.start(client, spec, current_identity()) as box:
            assert box.hello.uid == 10001
            assert box.run(["echo", "over tcp"], timeout=20).output == "over tcp\n"
        assert proxy.connections >= 2
        assert (
            client.containers.list(all=True, filters={"label": f"io.patchbox.job={spec.job_id}"})
            == []
        )
    finally:
        client.close()
        proxy.close()
    assert OWNER_FILTER
