"""Builds the sandbox image, from a pullable base or from a base made locally.

Resolution of the base, cheapest first: the requested base if the daemon already has it;
the locally made base if it exists and no base was named; a pull; and where pulling fails,
a Debian root filesystem made with ``debootstrap`` and ``docker import``, cached by the
hash of its recipe. The sandbox image is tagged by the hash of (base image id, Dockerfile,
agent sources), so it is rebuilt only when one of them changes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from controller.errorinfo import Hint
from controller.errors import NotReadyError, PatchboxError
from controller.paths import owned_temp_dir, patchbox_home, sandbox_image_dir
from controller.sandbox.labels import KIND, OWNER, OWNER_VALUE, RECIPE

DEFAULT_BASE = "python:3.12-slim"
LOCAL_BASE_REPO = "patchbox-base"
SANDBOX_REPO = "patchbox-sandbox"

LOCAL_BASE_RECIPE: dict[str, object] = {
    "tool": "debootstrap",
    "suite": "bookworm",
    "variant": "minbase",
    "include": ["python3", "git", "python3-pytest"],
    "recipe_version": 2,
}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ImageInfo:
    tag: str
    image_id: str
    base: str
    base_source: str
    """``present``, ``pulled`` or ``local-debootstrap``."""
    built: bool
    """False when an up-to-date image was already there."""
    seconds: float


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recipe_hash(recipe: dict[str, object] = LOCAL_BASE_RECIPE) -> str:
    return _digest(json.dumps(recipe, sort_keys=True).encode())[:16]


def context_digest(folder: Path) -> str:
    """Hash of every file of the build context that goes into the image."""
    h = hashlib.sha256()
    files = [folder / "Dockerfile", folder / "agent.py"]
    files += sorted((folder / "patchbox_agent").glob("*.py"))
    for path in files:
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def _sandbox_tag(base_id: str) -> str:
    digest = _digest((base_id + context_digest(sandbox_image_dir())).encode())
    return f"{SANDBOX_REPO}:{digest[:16]}"


def _has_image(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """Held while an image is built: processes of one state directory wait for it (the
    kernel drops the lock with a process that dies)."""
    folder = patchbox_home() / "locks"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (folder / "image-build.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ImageBuilder:
    def __init__(self, client: docker.DockerClient, progress: Progress | None = None) -> None:
        self._client = client
        self._progress = progress or (lambda _msg: None)

    def ensure(self, base: str | None = None) -> ImageInfo:
        """Returns an up-to-date sandbox image, building what is missing."""
        started = time.monotonic()
        base_ref, source, base_id = self._base(base)
        folder = sandbox_image_dir()
        tag = _sandbox_tag(base_id)
        existing = _has_image(self._client, tag)
        if existing is None:
            with build_lock():  # many jobs at once build a missing image once
                existing = _has_image(self._client, tag)
                if existing is None:
                    return self._build(tag, folder, base_ref, source, started)
        return ImageInfo(
            tag, existing, base_ref, source, built=False, seconds=time.monotonic() - started
        )

    def _build(
        self, tag: str, folder: Path, base_ref: str, source: str, started: float
    ) -> ImageInfo:
        self._progress(f"building {tag} from {base_ref}")
        try:
            image, _logs = self._client.images.build(
                path=str(folder),
                buildargs={"BASE_IMAGE": base_ref},
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                labels={OWNER: OWNER_VALUE, KIND: "sandbox-image"},
            )
        except docker.errors.BuildError as exc:
            raise PatchboxError(f"sandbox image build failed: {exc.msg}") from exc
        except docker.errors.APIError as exc:
            raise PatchboxError(f"sandbox image build failed: {exc.explanation}") from exc
        return ImageInfo(
            tag, image.id or "", base_ref, source, built=True, seconds=time.monotonic() - started
        )

    def status(self, base: str | None = None) -> dict[str, str | bool | None]:
        """What ``ensure`` would use, without pulling or building anything."""
        wanted = base or DEFAULT_BASE
        local = f"{LOCAL_BASE_REPO}:{recipe_hash()}"
        base_ref = wanted if _has_image(self._client, wanted) else None
        if base_ref is None and base is None and _has_image(self._client, local):
            base_ref = local
        if base_ref is None:
            return {"base": None, "tag": None, "ready": False}
        base_id = _has_image(self._client, base_ref) or ""
        tag = _sandbox_tag(base_id)
        return {"base": base_ref, "tag": tag, "ready": _has_image(self._client, tag) is not None}

    def resolve_base(self, base: str | None) -> tuple[str, str]:
        """The base image and where it came from (``present``, ``local-debootstrap`` or
        ``pulled``), made when missing."""
        ref, source, _id = self._base(base)
        return ref, source

    def _base(self, base: str | None) -> tuple[str, str, str]:
        """:meth:`resolve_base` and the base's image id, each image inspected once."""
        wanted = base or DEFAULT_BASE
        if found := _has_image(self._client, wanted):
            return wanted, "present", found
        local = f"{LOCAL_BASE_REPO}:{recipe_hash()}"
        if base is None and (found := _has_image(self._client, local)):
            return local, "local-debootstrap", found
        self._progress(f"pulling {wanted}")
        try:
            self._client.images.pull(wanted)
        except docker.errors.APIError:
            self._progress("pull failed: making a base image locally with debootstrap")
        else:
            return wanted, "pulled", _has_image(self._client, wanted) or ""
        made = self.build_local_base()
        return made, "local-debootstrap", _has_image(self._client, made) or ""

    def build_local_base(self) -> str:
        """Makes (once) a Debian base image with python3 and git, without any registry."""
        tag = f"{LOCAL_BASE_REPO}:{recipe_hash()}"
        if _has_image(self._client, tag):
            return tag
        debootstrap = _find_debootstrap(self._progress)
        if os.geteuid() != 0:
            raise NotReadyError(
                "no base image can be pulled and making one with debootstrap needs root: build "
                "the image as root once, or load a python3 image with 'docker load'",
                hint=Hint(action="build_image"),
            )
        work = owned_temp_dir("base-")
        try:
            rootfs = work / "rootfs"
            argv = [
                *debootstrap.argv,
                f"--variant={LOCAL_BASE_RECIPE['variant']}",
                "--include=" + ",".join(LOCAL_BASE_RECIPE["include"]),  # type: ignore[arg-type]
                str(LOCAL_BASE_RECIPE["suite"]),
                str(rootfs),
            ]
            mirror = os.environ.get("PATCHBOX_DEBIAN_MIRROR")
            if mirror:
                argv.append(mirror)
            self._progress("debootstrap: making a Debian root filesystem (about a minute)")
            self._run_logged(argv, debootstrap.env)
            tarball = work / "rootfs.tar"
            self._progress("docker import: turning it into an image")
            subprocess.run(
                ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."],
                check=True,
                capture_output=True,
            )
            self._client.api.import_image(
                src=str(tarball),
                repository=LOCAL_BASE_REPO,
                tag=recipe_hash(),
                changes=[
                    f"LABEL {OWNER}={OWNER_VALUE} {KIND}=base {RECIPE}={recipe_hash()}",
                    'CMD ["/bin/bash"]',
                ],
            )
        except subprocess.CalledProcessError as exc:
            raise PatchboxError(f"making the local base image failed ({exc.cmd[0]})") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if not _has_image(self._client, tag):
            raise PatchboxError("docker import did not produce the local base image")
        return tag

    def _run_logged(self, argv: list[str], env: dict[str, str]) -> None:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
        )
        assert proc.stdout is not None  # noqa: S101 - Popen contract with stdout=PIPE
        tail: list[str] = []
        last = 0.0
        for line in proc.stdout:
            tail = [*tail[-20:], line.rstrip()]
            now = time.monotonic()
            if now - last > 5:
                self._progress(line.rstrip()[:120])
                last = now
        if proc.wait() != 0:
            raise NotReadyError("debootstrap failed; its last lines:\n" + "\n".join(tail[-10:]))


def _apt_download(package: str, folder: Path) -> None:
    """``apt-get download`` (no install); refreshes the package lists once if needed (root)."""
    argv = ["apt-get", "download", "-qq", package]
    if subprocess.run(argv, cwd=folder, capture_output=True, check=False).returncode == 0:
        return
    if os.geteuid() != 0:
        raise subprocess.CalledProcessError(1, argv)
    subprocess.run(["apt-get", "update", "-qq"], capture_output=True, check=True)
    subprocess.run(argv, cwd=folder, capture_output=True, check=True)


@dataclass(frozen=True)
class _Debootstrap:
    argv: list[str]
    env: dict[str, str]


def _find_debootstrap(progress: Progress) -> _Debootstrap:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TMPDIR")}
    env.setdefault("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    found = shutil.which("debootstrap", path=env["PATH"] + ":/usr/sbin:/sbin")
    if found:
        return _Debootstrap([found], env)
    # Not installed: unpack Debian's package into the state directory, without installing it.
    tools = patchbox_home() / "tools" / "debootstrap"
    script = tools / "usr" / "sbin" / "debootstrap"
    if not script.is_file():
        if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
            raise NotReadyError(
                "no base image can be pulled and debootstrap is missing: install debootstrap"
            )
        progress("debootstrap is not installed: fetching Debian's package into the state directory")
        download = tools.parent / "download"
        shutil.rmtree(download, ignore_errors=True)
        download.mkdir(parents=True)
        try:
            _apt_download("debootstrap", download)
            debs = sorted(download.glob("debootstrap_*.deb"))
            subprocess.run(
                ["dpkg-deb", "-x", str(debs[-1]), str(tools)], check=True, capture_output=True
            )
        except (subprocess.CalledProcessError, IndexError) as exc:
            raise NotReadyError(
                "no base image can be pulled and debootstrap could not be fetched: "
                "install debootstrap (apt-get install debootstrap)"
            ) from exc
        finally:
            shutil.rmtree(download, ignore_errors=True)
    env["DEBOOTSTRAP_DIR"] = str(tools / "usr" / "share" / "debootstrap")
    return _Debootstrap([str(script)], env)
