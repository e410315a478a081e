"""The environment images on the Docker host (``patchbox env list``, ``show``, ``prune``):
read from the labels :mod:`controller.sandbox.envbuild` writes."""

from __future__ import annotations

import json
from typing import Any, TypedDict, cast

import docker
import docker.errors

from controller.errorinfo import Hint
from controller.errors import UsageError
from controller.sandbox.environment import (
    ENV_REPO,
    LABEL_BASE,
    LABEL_KEY,
    LABEL_SPEC,
    SpecLabel,
)
from controller.sandbox.labels import KIND, OWNER, OWNER_VALUE


class EnvImage(TypedDict):
    """An environment image as ``env list`` and ``env show`` give it."""

    id: str
    tag: str | None
    image_id: str | None
    base: str | None
    key: str | None
    created: str
    size_bytes: int
    spec: SpecLabel


def list_environments(client: docker.DockerClient) -> list[EnvImage]:
    """Every environment image on the Docker host, newest first."""
    images = client.images.list(
        filters={"label": [f"{OWNER}={OWNER_VALUE}", f"{KIND}=environment"]}
    )
    out = [describe(image) for image in images if image.tags]
    return sorted(out, key=lambda e: e["created"], reverse=True)


def describe(image: Any) -> EnvImage:
    attrs = image.attrs
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    tags = [t for t in image.tags if t.startswith(ENV_REPO + ":")]
    try:
        spec = json.loads(labels.get(LABEL_SPEC, "{}"))
    except ValueError:
        spec = {}
    if not isinstance(spec, dict):
        spec = {}
    if isinstance(spec.get("env"), dict):  # an image built before labels held names only
        spec["env"] = sorted(spec["env"])
    return {
        "id": (tags[0].split(":", 1)[1] if tags else (image.id or "")[7:23]),
        "tag": tags[0] if tags else None,
        "image_id": image.id,
        "base": labels.get(LABEL_BASE),
        "key": labels.get(LABEL_KEY),
        "created": attrs.get("Created", ""),
        "size_bytes": attrs.get("Size", 0),
        "spec": cast("SpecLabel", spec),
    }


def find_environment(client: docker.DockerClient, wanted: str) -> EnvImage:
    """The environment whose id, tag or key (or a unique prefix of the key, 8 characters
    at least) is ``wanted`` (``UsageError`` when none or several match)."""
    found = list_environments(client)
    hits = [
        e
        for e in found
        if wanted in {e["id"], e["tag"]}
        or (len(wanted) >= 8 and str(e["key"] or "").startswith(wanted))
    ]
    if len(hits) != 1:
        what = "no environment" if not hits else "several environments"
        msg = f"{what} match {wanted[:80]!r}"
        raise UsageError(msg, hint=Hint(action="list_environments"))
    return hits[0]


def prune_environments(client: docker.DockerClient) -> tuple[list[str], list[str]]:
    """Removes every environment image no container uses (also the untagged layers a failed
    build left for its retry); returns (removed, kept) ids."""
    used = {
        c.attrs.get("ImageID") or c.attrs.get("Image")
        for c in client.containers.list(all=True, sparse=True)
    }
    removed: list[str] = []
    kept: list[str] = []
    images = client.images.list(
        filters={"label": [f"{OWNER}={OWNER_VALUE}", f"{KIND}=environment"]}
    )
    # Tagged ones first: an untagged layer below them goes with them.
    for image in sorted(images, key=lambda i: not i.tags):
        env = describe(image)
        if image.id in used:
            kept.append(env["id"])
            continue
        try:
            client.images.remove(image.id or "", force=False, noprune=False)
        except docker.errors.ImageNotFound:
            continue
        except docker.errors.APIError:  # in use after all, or a parent of one in use
            if image.tags:
                kept.append(env["id"])
            continue
        removed.append(env["id"])
    return removed, kept
