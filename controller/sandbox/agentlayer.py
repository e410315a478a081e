"""The agent layer on an environment's image in one container and one commit.

The sandbox image's Dockerfile ends with the agent layer (its ``COPY`` lines, one ``RUN``,
then ``ENV``, ``USER``, ``WORKDIR`` and ``ENTRYPOINT``). Sent to the daemon's classic
builder each of those lines is a container and a commit of its own, seconds each on a
copy-on-write store; an environment's image is finished instead by one container that
receives the ``COPY`` sources, runs the ``RUN`` line as root, and is committed once with
the other lines as the commit's changes. The Dockerfile stays the one statement of the
layer: :func:`parse` reads it, and refuses a line it does not know how to replay.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from controller.errors import EnvironmentBuildError
from controller.paths import sandbox_image_dir

CHANGES = ("ENV", "USER", "WORKDIR", "ENTRYPOINT", "CMD", "LABEL")
"""The instructions replayed as the commit's changes (they change the image's config only)."""


@dataclass(frozen=True)
class AgentLayer:
    copies: tuple[tuple[str, str], ...]
    """(source in the sandbox image's folder, destination in the image), in order."""
    run: str
    """The one ``RUN`` line's shell command."""
    changes: tuple[str, ...]
    """The config instructions, as written."""


def _instructions(text: str) -> Iterator[str]:
    """The Dockerfile's instructions: comments and blank lines dropped, continued lines
    joined."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""
    if pending.strip():
        yield pending.strip()


def parse(text: str) -> AgentLayer:
    """The agent layer of a Dockerfile's text: ``COPY`` lines, one shell-form ``RUN``, then
    config lines only."""
    copies: list[tuple[str, str]] = []
    runs: list[str] = []
    changes: list[str] = []
    for line in _instructions(text):
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "COPY" and not changes and not runs:
            parts = rest.split()
            if len(parts) != 2 or parts[0].startswith("--"):
                msg = f"the agent layer's COPY takes one source and one target: {line!r}"
                raise EnvironmentBuildError(msg)
            copies.append((parts[0], parts[1]))
        elif word == "RUN" and not runs and not changes and not rest.lstrip().startswith("["):
            runs.append(rest.strip())
        elif word in CHANGES:
            changes.append(line)
        else:
            msg = f"the agent layer cannot be replayed in one commit: {line!r}"
            raise EnvironmentBuildError(msg)
    if len(runs) != 1:
        msg = "the agent layer has no RUN line"
        raise EnvironmentBuildError(msg)
    return AgentLayer(tuple(copies), runs[0], tuple(changes))


def archive(layer: AgentLayer, folder: Path, mtime: int) -> bytes:
    """The ``COPY`` sources as one tar to unpack at ``/``: a file to its target, a folder's
    files (not its bytecode caches) under its target; root-owned, fixed times."""
    buf = io.BytesIO()
    made: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add_dirs(path: str) -> None:
            parts = path.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                name = "/".join(parts[:i])
                if name not in made:
                    made.add(name)
                    info = tarfile.TarInfo(name)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
                    tar.addfile(info)

        def add_file(source: Path, target: str) -> None:
            add_dirs(target)
            data = source.read_bytes()
            info = tarfile.TarInfo(target.strip("/"))
            info.size, info.mtime = len(data), mtime
            info.mode = 0o755 if source.stat().st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))

        for source, target in layer.copies:
            path = folder / source
            if path.is_dir():
                for item in sorted(path.rglob("*")):
                    if item.is_file() and "__pycache__" not in item.parts:
                        add_file(item, f"{target.rstrip('/')}/{item.relative_to(path)}")
            else:
                add_file(path, target + path.name if target.endswith("/") else target)
    return buf.getvalue()


def finish(  # noqa: PLR0913 - the build's parts
    client: docker.DockerClient,
    image_id: str,
    *,
    repository: str,
    tag: str,
    layer_text: str,
    mtime: int,
    memory: int,
    prelude: str | None = None,
) -> tuple[str | None, int, str]:
    """Puts the agent layer on ``image_id`` and tags the result ``repository:tag``:
    (the new image's id or None when the ``RUN`` failed, its exit code, its log's tail).
    ``prelude``: a script run first in the same container (its failure is the step's).
    The container carries the image's labels, so the build's watchdog finds and kills it."""
    layer = parse(layer_text)
    data = archive(layer, sandbox_image_dir(), mtime)
    script = layer.run if prelude is None else f"(\n{prelude}\n) || exit $?\n{layer.run}"
    container = client.api.create_container(
        image_id,
        entrypoint=["/bin/sh", "-c"],
        command=[script],
        user="0:0",
        network_disabled=True,
        host_config=client.api.create_host_config(mem_limit=memory, memswap_limit=memory),
    )
    cid = str(container["Id"])
    try:
        client.api.put_archive(cid, "/", data)
        client.api.start(cid)
        code = int(client.api.wait(cid)["StatusCode"])
        if code != 0:
            logs = client.api.logs(cid, stdout=True, stderr=True, tail=80)
            return None, code, logs.decode(errors="replace")
        done = client.api.commit(cid, repository=repository, tag=tag, changes=list(layer.changes))
        return str(done["Id"]), 0, ""
    finally:
        with contextlib.suppress(docker.errors.APIError):
            client.api.remove_container(cid, force=True)
