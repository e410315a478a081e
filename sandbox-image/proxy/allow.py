# ruff: noqa: INP001
"""patchbox egress proxy: squid's external ACL helper for the allow list.

Squid sends one line per request, ``<host> <port> -`` (URL-escaped); the answer is ``OK``
when the pair is in /run/proxy/allow.txt, else ``ERR``. The file is re-read whenever it
changes (ctl.py replaces it atomically), so a new list applies to the next request
without reconfiguring squid. A rule is ``host:port``: ``host`` is an exact lower-case name
or ``*.name``, which matches any name ending in ``.name`` (not ``name`` itself).
"""

import os
import sys
from urllib.parse import unquote

ALLOW_FILE = "/run/proxy/allow.txt"
Rules = tuple[set[tuple[str, int]], list[tuple[str, int]]]


def load(path: str) -> Rules:
    exact: set[tuple[str, int]] = set()
    wild: list[tuple[str, int]] = []
    try:
        with open(path, encoding="ascii") as handle:
            lines = handle.read().split()
    except (OSError, UnicodeDecodeError):
        return exact, wild
    for line in lines:
        host, _, port = line.rpartition(":")
        if not host or not port.isdigit():
            continue
        if host.startswith("*."):
            wild.append((host[1:], int(port)))
        else:
            exact.add((host, int(port)))
    return exact, wild


def allowed(rules: Rules, host: str, port: str) -> bool:
    exact, wild = rules
    host = unquote(host).strip().lower().rstrip(".")
    if not port.isdigit() or not host:
        return False
    number = int(port)
    if (host, number) in exact:
        return True
    return any(host.endswith(suffix) and number == p for suffix, p in wild)


def main() -> None:
    stamp: tuple[int, int, int] | None = None
    rules: Rules = (set(), [])
    for line in sys.stdin:
        try:
            info = os.stat(ALLOW_FILE)
            now = (info.st_ino, info.st_mtime_ns, info.st_size)
        except OSError:
            now = None
        if now != stamp:
            stamp = now
            rules = load(ALLOW_FILE) if now is not None else (set(), [])
        # Squid appends the acl's arguments ("-" when there are none): only two count.
        parts = line.split()
        verdict = len(parts) >= 2 and allowed(rules, parts[0], parts[1])
        sys.stdout.write("OK\n" if verdict else "ERR\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
