"""The package hosts an environment's setup reaches in these tests, found at run time (the
suite names none): the Debian mirror of the default base image's apt sources, and the
Python package index that pip itself defaults to. A host configuration's ``[network]``
table gives them to setup steps as the ``packages`` preset and ``setup_default``."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from urllib.parse import urlsplit

import docker

from controller.sandbox.image import ImageBuilder

_URI = re.compile(r"(?m)^(?:deb(?:-src)?\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)")


def apt_hosts(sources: str) -> list[str]:
    """``host:port`` of every http(s) URI of apt sources (one-line and deb822 forms)."""
    found: list[str] = []
    for uri in _URI.findall(sources):
        parts = urlsplit(uri)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            continue
        port = parts.port or (443 if parts.scheme == "https" else 80)
        pair = f"{parts.hostname.lower()}:{port}"
        if pair not in found:
            found.append(pair)
    return found


@functools.cache
def pip_hosts() -> list[str]:
    """The index pip uses when none is configured, and its file host (port 443), as the
    installed pip itself says."""
    code = (
        "from pip._internal.models.index import PyPI; "
        "print(PyPI.netloc); print(PyPI.file_storage_domain)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return [f"{name}:443" for name in proc.stdout.split()]


@functools.cache
def package_hosts() -> tuple[str, ...]:
    """The default base's apt hosts, then pip's."""
    client = docker.from_env()
    try:
        base = ImageBuilder(client).resolve_base(None)[0]
        out = client.containers.run(
            base,
            ["sh", "-c", "cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null; true"],
            remove=True,
            network_disabled=True,
        )
    finally:
        client.close()
    text = out.decode() if isinstance(out, bytes) else str(out)
    hosts = apt_hosts(text)
    assert hosts, f"no http(s) source in the base image's apt sources:\n{text}"
    return (*hosts, *pip_hosts())


def network_table(*, setup_default: bool = True) -> str:
    """The host configuration's ``[network]`` table: the package hosts allowed, as the
    ``packages`` preset, and (``setup_default``) the default egress of setup steps."""
    hosts = json.dumps(list(package_hosts()))
    default = 'setup_default = ["preset:packages"]\n' if setup_default else ""
    return f"[network]\nallow = {hosts}\n{default}[network.presets]\npackages = {hosts}\n"
