"""A job's container operations, bare: the Docker API requests one ``patchbox run`` job sends
(``docs/performance.md``, "A job's Docker API requests", spares off), from a process of its
own, with nothing of the controller around them.

Standard library only (started as ``python3 -I -S``): the client side costs an interpreter
start and a few socket writes, so what is left is the daemon's and the containers' work.
The plan (a JSON file, made by ``bench_concurrency.ops_plan``) holds the two create bodies
(the job's hardening, built by the controller's own ``container_config``), the three image
references, the sweep's label filter and the check's command. In order:

- ``GET /version``, ``GET /_ping``; the sweep (``GET /containers/json``, ``/volumes``,
  ``/networks``); ``GET /_ping``; three ``GET /images/{ref}/json``;
- the sandbox: create, an events stream for it, attach (before start), start; its process
  unpacks the repository from the read-only mounted archive into the tmpfs workspace and
  says ``ready``; stdin closed, it exits; remove;
- the check's fresh container, the same way, then ``POST .../exec``, ``POST /exec/{id}/start``
  (the check's output read to its end), ``GET /exec/{id}/json`` (its exit code); stdin
  closed, remove.

Exit 0 when the check passed, 1 otherwise.

    python3 -I -S bench/bare_job.py PLAN.json
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import urllib.parse
from typing import Any


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


class Api:
    """One keep-alive connection for plain requests; a socket of its own for each stream."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn = _UnixConnection(path)
        self.prefix = ""

    def call(self, method: str, url: str, body: Any = None, ok: tuple[int, ...] = ()) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        self.conn.request(method, self.prefix + url, body=data, headers=headers)
        resp = self.conn.getresponse()
        payload = resp.read()
        if resp.status >= 400 and resp.status not in ok:
            sys.exit(f"{method} {url}: {resp.status} {payload[:300]!r}")
        if payload and resp.headers.get_content_type() == "application/json":
            return json.loads(payload)
        return None

    def stream(self, method: str, url: str, body: Any = None) -> socket.socket:
        """Sends a request on a new connection (upgraded to a raw stream where Docker does
        that), reads the response head, returns the socket for the rest."""
        data = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {self.prefix}{url} HTTP/1.1\r\nHost: docker\r\n"
        if method == "POST":
            head += "Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(data)}\r\n\r\n"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        sock.sendall(head.encode() + data)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(4096)
            if not chunk:
                sys.exit(f"{method} {url}: connection closed")
            got += chunk
        status = int(got.split(b" ", 2)[1])
        if status >= 300 and status != 101:
            sys.exit(f"{method} {url}: {status} {got[:300]!r}")
        return sock


def _until(sock: socket.socket, marker: bytes | None) -> bytes:
    """Reads until ``marker`` arrived (``None``: until the stream ends)."""
    got = b""
    while marker is None or marker not in got:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def container(api: Api, body: dict[str, Any], check: list[str] | None) -> int:
    """One container's life as a job lives it; the check's exit code (0 without a check)."""
    cid = api.call("POST", "/containers/create", body)["Id"]
    filters = json.dumps({"container": [cid], "event": ["oom"], "type": ["container"]})
    events = api.stream("GET", "/events?filters=" + urllib.parse.quote(filters))
    attach = api.stream(
        "POST", f"/containers/{cid}/attach?stdin=1&stdout=1&stderr=1&stream=1&logs=0"
    )
    api.call("POST", f"/containers/{cid}/start")
    code = 0
    try:
        if b"ready" not in _until(attach, b"ready\n"):
            sys.exit("the sandbox's process ended before it was ready")
        if check is not None:
            exec_body = {
                "Cmd": check,
                "AttachStdin": False,
                "AttachStdout": True,
                "AttachStderr": True,
                "Tty": False,
                "User": body["User"],
                "WorkingDir": "/workspace",
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"],
            }
            exec_id = api.call("POST", f"/containers/{cid}/exec", exec_body)["Id"]
            with api.stream("POST", f"/exec/{exec_id}/start", {"Detach": False, "Tty": False}) as s:
                _until(s, None)
            code = int(api.call("GET", f"/exec/{exec_id}/json")["ExitCode"])
        attach.shutdown(socket.SHUT_WR)  # stdin closed: the process exits (StdinOnce)
        _until(attach, None)
    finally:
        attach.close()
        api.call("DELETE", f"/containers/{cid}?v=1&force=1")
        events.close()
    return code


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as handle:  # noqa: PTH123 - no pathlib import
        plan = json.load(handle)
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    api = Api(host.removeprefix("unix://"))
    version = api.call("GET", "/version")
    api.call("GET", "/_ping")
    api.prefix = f"/v{version['ApiVersion']}"
    label = urllib.parse.quote(json.dumps({"label": [plan["sweep_label"]]}))
    api.call("GET", f"/containers/json?all=1&filters={label}")
    api.call("GET", f"/volumes?filters={label}")
    api.call("GET", f"/networks?filters={label}")
    api.call("GET", "/_ping")
    for ref in plan["images"]:
        api.call("GET", f"/images/{urllib.parse.quote(ref, safe='')}/json", ok=(404,))
    container(api, plan["sandbox"], None)
    return 1 if container(api, plan["check"], plan["check_argv"]) else 0


if __name__ == "__main__":
    sys.exit(main())
