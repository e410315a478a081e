"""Where patchbox keeps its state, and where its sandbox image recipe lives."""

from __future__ import annotations

import os
from pathlib import Path

from controller.errors import NotReadyError
from controller.identity import current_identity


def patchbox_home() -> Path:
    """``$PATCHBOX_HOME``, else the user's data directory for patchbox (created 0700)."""
    env = os.environ.get("PATCHBOX_HOME")
    if env:
        home = Path(env)
    else:
        data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        home = Path(data) / "patchbox"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def sandbox_image_dir() -> Path:
    """The ``sandbox-image`` folder: inside the installed package, or beside it in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "sandbox_image", here.parent / "sandbox-image"):
        if (candidate / "Dockerfile").is_file():
            return candidate
    msg = "the sandbox-image folder is missing from this installation"
    raise FileNotFoundError(msg)


MOUNT_PREFIX = "pb-mount-"
"""Folders under :func:`mount_staging_root` that hold what a container mounts."""


def mount_staging_root() -> Path:
    """Where files a container mounts are named while it starts. The name of a bind mount's
    source shows in the container's ``/proc/self/mountinfo``, so it must say nothing of this
    host's user (no home, no user name, no ``$PATCHBOX_HOME``): a shared temp folder.

    ``$PATCHBOX_MOUNT_DIR`` names it instead: a controller in a container needs a folder
    that is at the same path on the Docker daemon's host (docs/service.md)."""
    named = os.environ.get("PATCHBOX_MOUNT_DIR")
    if named:
        folder = Path(named)
        if not (folder.is_absolute() and folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
            raise NotReadyError(
                f"PATCHBOX_MOUNT_DIR={named} is not an absolute path to a folder this user "
                "can write"
            )
        return folder
    # Each folder is made with mkdtemp (0700, a random name): shared roots are safe here.
    for candidate in (Path("/var/tmp"), Path("/tmp"), Path("/dev/shm")):  # noqa: S108
        if candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return patchbox_home() / "tmp"


def owned_temp_dir(prefix: str, root: Path | None = None) -> Path:
    """A private temp folder under ``root`` (default ``$PATCHBOX_HOME/tmp``) marked with this
    controller's identity, so the reaper can remove it if this process dies before it does."""
    import socket
    import tempfile

    root = root or patchbox_home() / "tmp"
    root.mkdir(mode=0o700, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    (folder / ".owner").write_text(f"{current_identity().token}\n{socket.gethostname()}\n")
    return folder
