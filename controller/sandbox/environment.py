"""Builds a project's environment image: its base, python3 for the agent where the base
lacks it, the selected repository files, the setup steps (as root, with network, no host
mount, no secret, bounded in time and memory, trusting the host's CAs), then the agent layer
of the sandbox image. The image is tagged by the hash of everything that goes into it, so a
job whose environment exists starts without a build.

A Dockerfile is generated and built by the daemon's classic builder: each step is one
layer, so a build that failed at step N reuses steps 1..N-1 the next time.

It is over 600 lines because an environment is one content-addressed object: the inputs'
selection, the generated Dockerfile and the tag are one hash, and the build, listing and
pruning read the labels that hash writes; split, the two halves would share every name.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import ssl
import tarfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import structlog

from controller.config.environment import MAX_INPUT_BYTES, MAX_INPUT_FILES, EnvironmentSpec
from controller.errors import (
    EnvironmentBuildError,
    EnvironmentInputError,
    ErrorCode,
    PatchboxError,
    UsageError,
)
from controller.paths import sandbox_image_dir
from controller.repo.baseline import Baseline
from controller.repo.git import GitContext, run_git
from controller.sandbox.image import ImageBuilder, Progress, build_lock, context_digest
from controller.sandbox.labels import KIND, OWNER, OWNER_VALUE
from patchbox_agent.globs import Glob, GlobError

log = structlog.get_logger(__name__)

ENV_REPO = "patchbox-env"
LABEL_KEY = "io.patchbox.env.key"
LABEL_SPEC = "io.patchbox.env.spec"
LABEL_BASE = "io.patchbox.env.base"
RECIPE_VERSION = 3
AGENT_LAYER_MARKER = "# -- agent layer:"
BUILD_DIR = "/opt/patchbox-build"
CA_PATH = f"{BUILD_DIR}/ca.pem"
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
)
"""What the setup steps are given to find the CA bundle: OpenSSL, pip, requests, curl, node
and git read these."""
_HOST_CA_VARIABLES = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE")
_SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
)
NO_PYTHON_EXIT = 97

ENSURE_PYTHON = f"""\
set -u
ok() {{ command -v python3 >/dev/null 2>&1 \\
    && python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)'; }}
need=""
ok || need="python3"
command -v git >/dev/null 2>&1 || need="$need git"
[ -z "$need" ] && exit 0
if command -v apt-get >/dev/null 2>&1; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \\
        --no-install-recommends $need && rm -rf /var/lib/apt/lists/*
elif command -v apk >/dev/null 2>&1; then
    apk add --no-cache $need
elif command -v dnf >/dev/null 2>&1; then
    dnf install -y $need && dnf clean all
elif command -v microdnf >/dev/null 2>&1; then
    microdnf install -y $need && microdnf clean all
elif command -v yum >/dev/null 2>&1; then
    yum install -y $need && yum clean all
elif ! ok; then
    echo "patchbox: the base image has no python3 >= 3.9 and no package manager patchbox \\
knows (apt-get, apk, dnf, microdnf, yum) to install it" >&2
    exit {NO_PYTHON_EXIT}
else
    echo "patchbox: no git in the base image: .gitignore rules are not applied" >&2
fi
ok || {{ echo "patchbox: python3 >= 3.9 is needed; the base's package manager did not \\
provide it" >&2; exit {NO_PYTHON_EXIT}; }}
"""

SEED = "/opt/patchbox-seed"
SEED_SCRIPT = f"""set -eu
mkdir -p {SEED}
cd /workspace
for f in * .[!.]* ..?*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    grep -qxF -- "$f" {BUILD_DIR}/inputs.txt && continue
    mv -- "$f" {SEED}/
done
chmod -R a+rX,go-w {SEED}
"""
"""After the setup: what it left at the top of /workspace (not an input) moves to the
seed, which the agent links into every workspace (``node_modules``, ``.venv``)."""


@dataclass(frozen=True)
class InputFile:
    path: str
    mode: str
    blob: str
    size: int


@dataclass(frozen=True)
class EnvironmentImage:
    tag: str
    image_id: str
    key: str
    base: str
    built: bool
    """False when the image was already there."""
    seconds: float
    steps: list[dict[str, Any]] = field(default_factory=list)
    """Per build step: its name and seconds (empty when nothing was built)."""


def agent_layer() -> str:
    """The sandbox image's agent layer: its Dockerfile from the marker to the end."""
    text = (sandbox_image_dir() / "Dockerfile").read_text()
    start = text.index(AGENT_LAYER_MARKER)
    return text[start:]


def find_ca_bundle(configured: str | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The CA bundle environment builds trust: the configured file (``""``: none), else the
    one the host's own TLS clients are told to use, else the system bundle."""
    if configured is not None:
        if configured == "":
            return None
        path = Path(configured)
        if not path.is_file():
            msg = f"the configured ca_bundle {configured!r} is not a readable file"
            raise EnvironmentBuildError(msg)
        return path
    env = os.environ if environ is None else environ
    candidates = [env.get(name, "") for name in _HOST_CA_VARIABLES]
    candidates.append(ssl.get_default_verify_paths().cafile or "")
    candidates += list(_SYSTEM_BUNDLES)
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _git(baseline: Baseline, *args: str, stdin: bytes | None = None) -> bytes:
    git_dir = Path(baseline.private_git_dir)
    ctx = GitContext(cwd=git_dir.parent, git_dir=git_dir, home=git_dir.parent)
    return run_git(ctx, *args, stdin=stdin).stdout


def _tree_entries(baseline: Baseline) -> list[InputFile]:
    raw = _git(baseline, "ls-tree", "-r", "-z", "-l", "--full-tree", baseline.tree)
    entries: list[InputFile] = []
    for record in raw.split(b"\0"):
        if not record:
            continue
        meta, _, name = record.partition(b"\t")
        mode, _kind, blob, size = meta.split()
        path = name.decode("utf-8", "surrogateescape")
        entries.append(
            InputFile(path, mode.decode(), blob.decode(), int(size) if size != b"-" else 0)
        )
    return entries


def select_inputs(baseline: Baseline, patterns: list[str]) -> list[InputFile]:
    """The baseline files the inputs name: a path (a file, or a folder and all under it) or
    a glob. Refuses (``ENVIRONMENT_INPUT_INVALID``) a pattern that selects nothing, a
    symbolic link or a submodule, and a selection over the count or byte bound."""
    if not patterns:
        return []
    entries = _tree_entries(baseline)
    chosen: dict[str, InputFile] = {}
    for pattern in patterns:
        prefix = pattern.rstrip("/") + "/"
        if any(c in pattern for c in "*?["):
            try:
                glob = Glob(pattern)
            except GlobError as exc:
                msg = f"input {pattern!r} is not a valid glob: {exc}"
                raise EnvironmentInputError(msg) from exc
            hits = [
                e
                for e in entries
                if glob(e.path)
                or any(glob(e.path[:i]) for i in range(len(e.path)) if e.path[i] == "/")
            ]
        else:  # a path: that file, or that folder and everything beneath it
            hits = [e for e in entries if e.path == pattern or e.path.startswith(prefix)]
        if not hits:
            msg = f"input {pattern!r} matches no file of the job's baseline"
            raise EnvironmentInputError(msg)
        for entry in hits:
            if entry.mode == "120000":
                msg = f"input {entry.path!r} is a symbolic link; inputs must be regular files"
                raise EnvironmentInputError(msg)
            if entry.mode == "160000":
                msg = f"input {entry.path!r} is a submodule; inputs must be regular files"
                raise EnvironmentInputError(msg)
            chosen[entry.path] = entry
    files = sorted(chosen.values(), key=lambda e: e.path)
    total = sum(f.size for f in files)
    if len(files) > MAX_INPUT_FILES or total > MAX_INPUT_BYTES:
        msg = (
            f"the inputs select {len(files)} files, {total} bytes; at most {MAX_INPUT_FILES} "
            f"files and {MAX_INPUT_BYTES} bytes are copied into a build"
        )
        raise EnvironmentInputError(msg)
    return files


def _read_blobs(baseline: Baseline, files: list[InputFile]) -> Iterator[tuple[InputFile, bytes]]:
    if not files:
        return
    out = _git(
        baseline, "cat-file", "--batch", stdin="".join(f.blob + "\n" for f in files).encode()
    )
    view = memoryview(out)
    pos = 0
    for f in files:
        end = out.index(b"\n", pos)
        header = out[pos:end].split()
        size = int(header[2])
        yield f, bytes(view[end + 1 : end + 1 + size])
        pos = end + 1 + size + 1


def environment_key(
    base_id: str, spec: EnvironmentSpec, files: list[InputFile], agent_digest: str
) -> str:
    """Hash of (base image id, setup, env, the inputs' paths, modes and bytes, the agent)."""
    doc = {
        "recipe": RECIPE_VERSION,
        "base_id": base_id,
        "setup": spec.setup,
        "env": dict(sorted(spec.env.items())),
        "inputs": [[f.path, f.mode, f.blob] for f in files],
        "memory_mb": spec.setup_memory_mb,
        "agent": agent_digest,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def label_spec(spec: EnvironmentSpec) -> dict[str, Any]:
    """The environment's block as its image's label holds it: ``env`` is its variables'
    names only (a label is shown to anyone who lists the images; the key, a digest, covers
    the values)."""
    shown = spec.model_dump(mode="json")
    shown["env"] = sorted(spec.env)
    return shown


def dockerfile(
    base_ref: str,
    spec: EnvironmentSpec,
    labels: dict[str, str],
    *,
    ca: bool,
    as_root: bool,
) -> str:
    """The generated Dockerfile (see the module docstring). Few steps: each costs a commit.
    The labels (the environment's key among them, which the watchdog finds the running
    step by) come first; setup steps run in /workspace through ``sh`` and ``env``."""
    env_args = [f"{name}={CA_PATH}" for name in CA_VARIABLES] if ca else []
    env_args += [f"{k}={v}" for k, v in sorted(spec.env.items())]
    prefix = ["/bin/sh", "-c", 'cd /workspace && exec /usr/bin/env "$@"', "setup", *env_args]
    lines = [
        f"FROM {base_ref}",
        "LABEL " + " ".join(f"{k}={json.dumps(v)}" for k, v in labels.items()),
    ]
    if not as_root:
        lines.append("USER root")
    lines += [
        "COPY stage/ /",
        "RUN " + json.dumps([*prefix, "/bin/sh", f"{BUILD_DIR}/ensure-python.sh"]),
    ]
    lines += ["RUN " + json.dumps([*prefix, *step]) for step in spec.setup]
    if spec.setup:
        lines.append("RUN " + json.dumps(["/bin/sh", "-c", SEED_SCRIPT]))
    return "\n".join(lines) + "\n" + agent_layer()


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def _dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    tar.addfile(info)


def build_context(
    text: str,
    files: list[tuple[InputFile, bytes]],
    ca_bundle: Path | None,
) -> bytes:
    """The build context: the Dockerfile, the build helpers, the inputs, the agent."""
    buf = io.BytesIO()
    folder = sandbox_image_dir()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add(tar, "Dockerfile", text.encode())
        _add(tar, f"stage{BUILD_DIR}/ensure-python.sh", ENSURE_PYTHON.encode())
        if ca_bundle is not None:
            _add(tar, f"stage{CA_PATH}", ca_bundle.read_bytes())
        _dir(tar, "stage/workspace")
        tops = sorted({f.path.split("/", 1)[0] for f, _data in files})
        _add(tar, f"stage{BUILD_DIR}/inputs.txt", "".join(t + "\n" for t in tops).encode())
        for f, data in files:
            _add(tar, f"stage/workspace/{f.path}", data, 0o755 if f.mode == "100755" else 0o644)
        _add(tar, "agent.py", (folder / "agent.py").read_bytes())
        for path in sorted((folder / "patchbox_agent").glob("*.py")):
            _add(tar, f"patchbox_agent/{path.name}", path.read_bytes())
    return buf.getvalue()


@dataclass
class _Step:
    index: int
    name: str


def step_names(spec: EnvironmentSpec, *, as_root: bool) -> dict[int, str]:
    """Dockerfile step number (1-based, as the builder counts) -> what the user calls it."""
    names = ["base", "labels"] + ([] if as_root else ["user"])
    names += ["inputs", "python3 for the agent"]
    names += [f"setup {i + 1}/{len(spec.setup)}: {_argv_text(s)}" for i, s in enumerate(spec.setup)]
    if spec.setup:
        names.append("seed")
    return {i + 1: n for i, n in enumerate(names)}


def _argv_text(argv: list[str]) -> str:
    text = " ".join(argv)
    return text if len(text) <= 120 else text[:117] + "..."


class EnvironmentBuilder:
    """Makes (once) and finds environment images."""

    def __init__(
        self,
        client: docker.DockerClient,
        progress: Progress | None = None,
        ca_bundle: str | None = None,
    ) -> None:
        self._client = client
        self._progress = progress or (lambda _msg: None)
        self._ca_setting = ca_bundle

    def _base(self, spec: EnvironmentSpec) -> tuple[str, str]:
        """(base reference, its image id): a named base present or pulled, else the default
        sandbox base (made locally where nothing can be pulled)."""
        if spec.base is None:
            images = ImageBuilder(self._client, self._progress)
            ref, _source = images.resolve_base(None)
            return ref, self._client.images.get(ref).id or ""
        try:
            return spec.base, self._client.images.get(spec.base).id or ""
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            msg = f"the base image {spec.base!r} cannot be inspected: {exc.explanation}"
            raise EnvironmentBuildError(msg) from exc
        self._progress(f"environment: pulling {spec.base}")
        try:
            image = self._client.images.pull(spec.base)
        except docker.errors.APIError as exc:
            msg = (
                f"the base image {spec.base!r} is not on this Docker host and cannot be pulled: "
                f"{(exc.explanation or str(exc))[:300]}"
            )
            raise EnvironmentBuildError(msg) from exc
        return spec.base, image.id or ""

    def plan(
        self, spec: EnvironmentSpec, baseline: Baseline
    ) -> tuple[str, str, str, list[InputFile]]:
        """(tag, key, base reference, inputs) of the environment, without building."""
        files = select_inputs(baseline, spec.inputs)
        base_ref, base_id = self._base(spec)
        key = environment_key(base_id, spec, files, context_digest(sandbox_image_dir()))
        return f"{ENV_REPO}:{key[:16]}", key, base_ref, files

    def ensure(
        self,
        spec: EnvironmentSpec,
        baseline: Baseline,
        *,
        cancel: threading.Event | None = None,
    ) -> EnvironmentImage:
        """The environment's image, built if it is missing."""
        started = time.monotonic()
        tag, key, base_ref, files = self.plan(spec, baseline)
        existing = _image_id(self._client, tag)
        if existing is None:
            with build_lock():  # jobs at once build a missing environment once
                existing = _image_id(self._client, tag)
                if existing is None:
                    return self._build(spec, baseline, tag, key, base_ref, files, cancel, started)
        return EnvironmentImage(
            tag, existing, key, base_ref, built=False, seconds=time.monotonic() - started
        )

    def _build(  # noqa: PLR0913, PLR0917 - internal; the plan's parts
        self,
        spec: EnvironmentSpec,
        baseline: Baseline,
        tag: str,
        key: str,
        base_ref: str,
        files: list[InputFile],
        cancel: threading.Event | None,
        started: float,
    ) -> EnvironmentImage:
        ca = find_ca_bundle(self._ca_setting)
        labels = {
            OWNER: OWNER_VALUE,
            KIND: "environment",
            LABEL_KEY: key,
            LABEL_BASE: base_ref,
            LABEL_SPEC: json.dumps(label_spec(spec), sort_keys=True),
        }
        user = (self._client.images.get(base_ref).attrs.get("Config") or {}).get("User") or ""
        as_root = user.split(":", 1)[0] in {"", "root", "0"}
        text = dockerfile(base_ref, spec, labels, ca=ca is not None, as_root=as_root)
        context = build_context(text, list(_read_blobs(baseline, files)), ca)
        names = step_names(spec, as_root=as_root)
        self._progress(f"environment: building {tag} from {base_ref} ({len(files)} input files)")
        watchdog = _Watchdog(self._client, key, spec.setup_timeout_seconds, cancel)
        run = _BuildRun(names, self._progress)
        memory = spec.setup_memory_mb * 1024 * 1024
        with watchdog:
            try:
                stream = self._client.api.build(
                    fileobj=io.BytesIO(context),
                    custom_context=True,
                    tag=tag,
                    rm=True,
                    forcerm=True,
                    pull=False,
                    decode=True,
                    container_limits={"memory": memory, "memswap": memory},
                    network_mode="default",
                )
                for chunk in stream:
                    run.feed(chunk)
            except docker.errors.APIError as exc:
                run.error = run.error or (exc.explanation or str(exc))
            except (OSError, ValueError) as exc:  # the connection, closed by a cancel
                run.error = run.error or str(exc)
        run.finish()
        if watchdog.fired or run.error is not None:
            watchdog.remove_steps()  # the builder removes them too; nothing may be left
        if watchdog.fired:
            reason = (
                "cancelled"
                if watchdog.cancelled
                else (f"the setup did not finish within {spec.setup_timeout_seconds:g} s")
            )
            raise run.failure(reason, code=ErrorCode.CANCELLED if watchdog.cancelled else None)
        if run.error is not None:
            raise run.failure(None)
        image_id = _image_id(self._client, tag)
        if image_id is None:
            msg = "the environment build ended without an image"
            raise EnvironmentBuildError(msg)
        seconds = time.monotonic() - started
        self._progress(f"environment: built {tag} in {seconds:.1f} s")
        return EnvironmentImage(
            tag, image_id, key, base_ref, built=True, seconds=seconds, steps=run.steps
        )


class _BuildRun:
    """Follows the builder's output: the running step, its elapsed time, the log's tail."""

    def __init__(self, names: dict[int, str], progress: Progress) -> None:
        self._names = names
        self._progress = progress
        self.step: _Step | None = None
        self.step_started = time.monotonic()
        self.tail: list[str] = []
        self.error: str | None = None
        self.exit_code: int | None = None
        self.steps: list[dict[str, Any]] = []
        self._last_note = time.monotonic()

    def feed(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail") or {}
            self.error = str(detail.get("message") or chunk.get("error") or "build failed")
            code = detail.get("code")
            self.exit_code = code if isinstance(code, int) else None
            return
        text = chunk.get("stream")
        if not isinstance(text, str):
            return
        for line in text.splitlines():
            if line.startswith("Step ") and " : " in line:
                number = line[5:].split("/", 1)[0]
                if number.isdigit():
                    self._start(int(number))
                    continue
            if line.strip():
                self.tail = [*self.tail[-79:], line.rstrip()]
        now = time.monotonic()
        if self.step is not None and now - self._last_note >= 10:
            self._last_note = now
            self._progress(f"environment: {self.step.name} ({now - self.step_started:.0f} s)")

    def _start(self, number: int) -> None:
        self._close_step()
        name = self._names.get(number, "agent layer")
        self.step = _Step(number, name)
        self.step_started = time.monotonic()
        self._last_note = self.step_started
        self.tail = []
        first_agent_step = name == "agent layer" and all(
            s["name"] != "agent layer" for s in self.steps
        )
        if name.startswith(("setup", "python3")) or first_agent_step:
            self._progress(f"environment: {name}")

    def _close_step(self) -> None:
        if self.step is None:
            return
        seconds = round(time.monotonic() - self.step_started, 3)
        if self.steps and self.steps[-1]["name"] == self.step.name:
            self.steps[-1]["seconds"] = round(self.steps[-1]["seconds"] + seconds, 3)
        else:
            self.steps.append({"name": self.step.name, "seconds": seconds})

    def finish(self) -> None:
        self._close_step()

    def failure(self, reason: str | None, code: ErrorCode | None = None) -> PatchboxError:
        step = self.step.name if self.step is not None else "before the first step"
        exit_text = ""
        if self.exit_code is not None:
            exit_text = f", exit code {self.exit_code}"
        elif self.error and "non-zero code:" in self.error:
            exit_text = ", exit code " + self.error.rsplit("non-zero code:", 1)[1].strip()
        what = reason or (self.error or "build failed")
        if reason is None and self.error and "returned a non-zero code" in self.error:
            what = "the step failed"  # the builder's text repeats the whole command
        if self.exit_code == NO_PYTHON_EXIT or any("patchbox: " in t for t in self.tail[-5:]):
            told = [t for t in self.tail if t.startswith("patchbox: ")]
            if told:
                what = told[-1].removeprefix("patchbox: ")
        tail = "\n".join(self.tail[-20:])
        msg = f"environment build failed at {step}{exit_text}: {what[:500]}"
        if tail:
            msg += "\nlast lines of its log:\n" + tail[-4000:]
        return EnvironmentBuildError(msg, code=code)


class _Watchdog:
    """Kills the build's running step when the setup's time is up or the job is cancelled
    (the step's container carries the environment's key as a label)."""

    def __init__(
        self,
        client: docker.DockerClient,
        key: str,
        seconds: float,
        cancel: threading.Event | None,
    ) -> None:
        self._client = client
        self._key = key
        self._deadline = time.monotonic() + seconds
        self._cancel = cancel or threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="env-build-watchdog", daemon=True)
        self.fired = False
        self.cancelled = False

    def __enter__(self) -> _Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.is_set():
            if self._cancel.is_set():
                self.cancelled = True
            elif time.monotonic() < self._deadline:
                self._done.wait(0.2)
                continue
            self.fired = True
            # Until the build returns: a later step must not start after the kill.
            while not self._done.is_set():
                self._kill_steps()
                self._done.wait(0.5)
            return

    def remove_steps(self) -> None:
        with contextlib.suppress(docker.errors.APIError):
            for container in self._client.containers.list(
                all=True, filters={"label": f"{LABEL_KEY}={self._key}"}, sparse=True
            ):
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)

    def _kill_steps(self) -> None:
        with contextlib.suppress(docker.errors.APIError):
            for container in self._client.containers.list(
                filters={"label": f"{LABEL_KEY}={self._key}"}, sparse=True
            ):
                with contextlib.suppress(docker.errors.APIError):
                    container.kill()


def _image_id(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


def list_environments(client: docker.DockerClient) -> list[dict[str, Any]]:
    """Every environment image on the Docker host, newest first."""
    images = client.images.list(
        filters={"label": [f"{OWNER}={OWNER_VALUE}", f"{KIND}=environment"]}
    )
    out = [describe(image) for image in images if image.tags]
    return sorted(out, key=lambda e: e["created"], reverse=True)


def describe(image: Any) -> dict[str, Any]:
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
        "spec": spec,
    }


def find_environment(client: docker.DockerClient, wanted: str) -> dict[str, Any]:
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
        msg = f"{what} match {wanted[:80]!r}; 'patchbox env list' shows them"
        raise UsageError(msg)
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
