"""The egress proxy's image: ``sandbox-image/proxy`` (Debian's squid, its helper and error
pages) built once per (base image, recipe), under the build lock."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import docker.errors

from controller.errors import PatchboxError
from controller.paths import sandbox_image_dir
from controller.sandbox.image import ImageBuilder, build_lock
from controller.sandbox.labels import KIND, OWNER, OWNER_VALUE

PROXY_REPO = "patchbox-proxy"


def recipe_digest(folder: Path) -> str:
    """Hash of every file of the proxy's recipe folder."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if "__pycache__" in rel or rel.endswith(".pyc"):
            continue
        h.update(rel.encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def _has_image(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def proxy_image(
    client: docker.DockerClient, base_ref: str, progress: Callable[[str], None] | None = None
) -> str:
    """The proxy image's tag, built (once) from ``base_ref`` if missing."""
    folder = sandbox_image_dir() / "proxy"
    try:
        base_id = client.images.get(base_ref).id or ""
    except docker.errors.ImageNotFound as exc:
        raise PatchboxError(f"the proxy's base image {base_ref} is missing") from exc
    digest = hashlib.sha256((base_id + recipe_digest(folder)).encode()).hexdigest()
    tag = f"{PROXY_REPO}:{digest[:16]}"
    if _has_image(client, tag):
        return tag
    with build_lock():
        if _has_image(client, tag):
            return tag
        if progress is not None:
            progress(f"building {tag} from {base_ref}")
        try:
            client.images.build(
                path=str(folder),
                buildargs={"BASE_IMAGE": base_ref},
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                labels={OWNER: OWNER_VALUE, KIND: "proxy-image"},
            )
        except docker.errors.BuildError as exc:
            tail = _build_tail(exc.build_log)
            raise PatchboxError(f"egress proxy image build failed: {exc.msg}{tail}") from exc
        except docker.errors.APIError as exc:
            raise PatchboxError(f"egress proxy image build failed: {exc.explanation}") from exc
    return tag


def _build_tail(log: Any) -> str:
    """The last lines a failed build printed (its reason is usually there)."""
    lines: list[str] = []
    with contextlib.suppress(TypeError):
        for item in log:
            if isinstance(item, dict) and isinstance(item.get("stream"), str):
                lines += item["stream"].splitlines()
    kept = [line for line in lines if line.strip()][-8:]
    return "\n" + "\n".join(kept) if kept else ""


def default_proxy_image(client: docker.DockerClient, progress: Callable[[str], None]) -> str:
    """The proxy image of the default base, built if missing (under the build lock: not to
    be called while holding it)."""
    base = ImageBuilder(client, progress).resolve_base(None)[0]
    return proxy_image(client, base, progress)
