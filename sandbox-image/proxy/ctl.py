# ruff: noqa: INP001
"""patchbox egress proxy: the container's entry point and the controller's commands.

    ctl.py serve              write the run-time state, then become squid (foreground)
    ctl.py ready SECONDS      wait until squid answers on 127.0.0.1:3128
    ctl.py allow PAIR...      replace the allow list (``host:port`` each; none denies all)
    ctl.py log OFFSET         the complete access-log lines after byte OFFSET, as JSON

State lives in /run/proxy (a tmpfs): the pid file, the logs, the allow list and the
clients' addresses (``$PROXY_CLIENTS``: the internal network's subnets).
"""

import json
import os
import re
import socket
import sys
import time

STATE = "/run/proxy"
ALLOW_FILE = STATE + "/allow.txt"
CLIENTS_FILE = STATE + "/clients.txt"
ACCESS_LOG = STATE + "/access.log"
CACHE_LOG = STATE + "/cache.log"
CONF = "/opt/proxy/squid.conf"
PORT = 3128
MAX_LOG_READ = 4 << 20
HOST = re.compile(r"^(\*\.)?[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*$")
CIDR = re.compile(r"^[0-9a-fA-F:.]+(/[0-9]{1,3})?$")


def write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def serve() -> int:
    os.makedirs(STATE, exist_ok=True)
    clients = [c for c in re.split(r"[\s,]+", os.environ.get("PROXY_CLIENTS", "")) if c]
    bad = [c for c in clients if not CIDR.match(c)]
    if bad:
        print(f"ctl.py: bad PROXY_CLIENTS entries: {bad}", file=sys.stderr)
        return 2
    # No client network named: nobody but the proxy's own probe is served.
    write_atomic(CLIENTS_FILE, "\n".join(clients or ["127.0.0.1/32"]) + "\n")
    if not os.path.exists(ALLOW_FILE):
        write_atomic(ALLOW_FILE, "")
    sys.stdout.flush()
    os.execvp("squid", ["squid", "-N", "-f", CONF])  # noqa: S606 - argv, no shell
    return 1


def ready(seconds: float) -> int:
    deadline = time.monotonic() + seconds
    started = time.monotonic()
    while True:
        try:
            with socket.create_connection(("127.0.0.1", PORT), timeout=2) as conn:
                conn.sendall(b"GET http://127.0.0.1:1/ HTTP/1.0\r\n\r\n")
                if conn.recv(5) == b"HTTP/":
                    print(json.dumps({"ready": True, "seconds": time.monotonic() - started}))
                    return 0
        except OSError:
            pass
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    tail = ""
    try:
        with open(CACHE_LOG, encoding="utf-8", errors="replace") as handle:
            tail = "".join(handle.readlines()[-15:])
    except OSError:
        pass
    print(json.dumps({"ready": False, "cache_log": tail}))
    return 1


def allow(pairs: list[str]) -> int:
    lines: list[str] = []
    for pair in pairs:
        host, _, port = pair.rpartition(":")
        if not HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
            print(f"ctl.py: not a host:port pair: {pair!r}", file=sys.stderr)
            return 2
        lines.append(f"{host}:{int(port)}")
    write_atomic(ALLOW_FILE, "".join(line + "\n" for line in lines))
    return 0


def log(offset: int) -> int:
    lines: list[str] = []
    try:
        with open(ACCESS_LOG, "rb") as handle:
            handle.seek(offset)
            data = handle.read(MAX_LOG_READ)
    except FileNotFoundError:
        data = b""
    end = data.rfind(b"\n") + 1
    if end:
        lines = data[:end].decode("utf-8", "replace").splitlines()
    print(json.dumps({"offset": offset + end, "lines": lines}))
    return 0


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command == "serve":
        return serve()
    if command == "ready" and len(argv) == 3:
        return ready(float(argv[2]))
    if command == "allow":
        return allow(argv[2:])
    if command == "log" and len(argv) == 3 and argv[2].isdigit():
        return log(int(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
