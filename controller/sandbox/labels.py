"""Labels on every Docker resource patchbox creates, so a reaper can find them all."""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path

from controller.identity import (
    CONTROLLER,
    HOST,
    JOB,
    KIND,
    OWNER,
    OWNER_VALUE,
    ControllerIdentity,
    controller_alive,
    current_identity,
)
from controller.paths import patchbox_home

RECIPE = "io.patchbox.recipe"
HOME = "io.patchbox.home"
"""Which state directory (``$PATCHBOX_HOME``) a spare belongs to: only that home uses it."""

OWNER_FILTER = f"{OWNER}={OWNER_VALUE}"


def home_id(home: Path | None = None) -> str:
    """A short, path-free name of a state directory, for the ``HOME`` label."""
    where = str((home or patchbox_home()).resolve())
    return hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def labels_of(container: object) -> dict[str, str]:
    """The labels of a container from a sparse listing or a full inspection alike."""
    attrs = getattr(container, "attrs", {}) or {}
    found = attrs.get("Labels")
    if found is None:
        found = (attrs.get("Config") or {}).get("Labels")
    return dict(found or {})


def status_of(container: object) -> str:
    """``running``, ``exited``, ... from a sparse listing or a full inspection alike."""
    state = (getattr(container, "attrs", {}) or {}).get("State")
    if isinstance(state, dict):
        return str(state.get("Status", ""))
    return str(state or "")


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]


__all__ = [
    "CONTROLLER",
    "HOME",
    "HOST",
    "JOB",
    "KIND",
    "OWNER",
    "OWNER_FILTER",
    "OWNER_VALUE",
    "RECIPE",
    "ControllerIdentity",
    "controller_alive",
    "current_identity",
    "home_id",
    "labels_of",
    "new_job_id",
    "status_of",
]
