"""The egress tests' outside world: a non-private network of the test's own with a small
HTTP server on it (``files.example.test``, also ``example.test``), and a client program
that probes the network from a sandbox."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import docker
import docker.errors
from docker.models.containers import Container
from docker.models.networks import Network

from controller.config.network import EgressRule
from controller.sandbox.labels import current_identity, new_job_id

MB = 1 << 20
SERVER_PORT = 8000
FILES = "files.example.test"
RULE = EgressRule(FILES, SERVER_PORT)
SUBNETS = ("198.51.100.0/24", "192.0.2.0/24", "198.18.77.0/24")
"""Candidates for the outside network: none is in the proxy's inward ranges."""
INWARD_HOSTS = {
    "meta.example.test": "169.254.169.254",
    "ten.example.test": "10.1.2.3",
    "six.example.test": "::1",
}
NOT_ALLOWED_TEXT = "is not in the check's egress list"

SERVER = r"""
import functools, http.server, os
os.makedirs("/tmp/www", exist_ok=True)
with open("/tmp/www/big", "wb") as fh:
    fh.write(bytes(range(256)) * 4096)
with open("/tmp/www/hello", "w") as fh:
    fh.write("hello from the outside\n")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/tmp/www")
handler.func.log_message = lambda *a: None
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), handler).serve_forever()
"""

SERVER_READY = """
import time, urllib.request
for _ in range(100):
    try:
        urllib.request.urlopen("http://127.0.0.1:8000/hello", timeout=1)
        break
    except OSError:
        time.sleep(0.1)
"""

CLIENT = r"""
import json, os, socket, sys, urllib.error, urllib.request

def get(url, proxied=True):
    handlers = [] if proxied else [urllib.request.ProxyHandler({})]
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=30) as resp:
            body = resp.read()
            return {"status": resp.status, "length": len(body), "body": body[:200].decode("latin-1")}
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return {"status": exc.code, "length": len(body), "body": body.decode("utf-8", "replace")}

def tunnel(host, port):
    proxy = os.environ["http_proxy"].split("//")[1]
    phost, pport = proxy.rsplit(":", 1)
    with socket.create_connection((phost, int(pport)), timeout=30) as conn:
        conn.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        status = int(head.split(b" ", 2)[1])
        out = {"status": status, "length": 0}
        if status != 200:
            return out
        conn.sendall(f"GET /big HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        data = head.split(b"\r\n\r\n", 1)[1]
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        out["inner"] = data.split(b"\r\n", 1)[0].decode("latin-1")
        out["length"] = len(data.split(b"\r\n\r\n", 1)[-1])
        return out

def tcp(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        sock.connect((host, port))
    return {"result": "connected"}

def udp(host, port):
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        sock.sendto(query, (host, port))
        sock.recvfrom(512)
    return {"result": "answered"}

def resolve(name):
    return {"result": "resolved", "addresses": sorted({a[4][0] for a in socket.getaddrinfo(name, 80)})}

def run(probe):
    kind, args = probe[0], probe[1:]
    try:
        return {"get": get, "direct": lambda u: get(u, False), "tunnel": tunnel, "tcp": tcp,
                "udp": udp, "resolve": resolve}[kind](*args)
    except socket.timeout:
        return {"result": "timeout"}
    except OSError as exc:
        return {"result": "error", "errno": exc.errno, "text": str(exc)}

probes = json.loads(sys.argv[1])
if sys.argv[2:] == ["parallel"]:  # probes that wait for timeouts, all at once
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(probes) or 1) as pool:
        out = list(pool.map(run, probes))
else:  # in order: the proxy logs them in this order
    out = [run(probe) for probe in probes]
print(json.dumps(out))
"""


@dataclass
class Outside:
    network: Network
    server: Container
    server_address: str

    @property
    def name(self) -> str:
        return self.network.name or ""


def labels_for(kind: str) -> dict[str, str]:
    return current_identity().labels(new_job_id(), kind)


def remove(*things: Container | Network | None) -> None:
    for thing in things:
        if thing is None:
            continue
        with contextlib.suppress(docker.errors.NotFound):
            if isinstance(thing, Container):
                thing.remove(force=True)
            else:
                thing.remove()
