"""A project environment's recipe: its base, python3 for the agent where the base lacks it,
the selected repository files, the setup steps (as root, reaching only the hosts of the
environment's egress through a proxy, no host mount, no secret, bounded in time and memory,
trusting the host's CAs), then the agent layer of the sandbox image
(:mod:`controller.sandbox.agentlayer`). The image is tagged by the hash of everything that
goes into it (:func:`environment_key`), so a job whose environment exists starts without a build
(:mod:`controller.sandbox.envbuild` builds it; :mod:`controller.sandbox.envimages` lists and
prunes what was built).

The Dockerfile is generated and built by the daemon's classic builder: each step is one
layer, so a build that failed at step N reuses steps 1..N-1 the next time.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import ssl
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

from controller.config.environment import MAX_INPUT_BYTES, MAX_INPUT_FILES, EnvironmentSpec
from controller.errors import EnvironmentBuildError, EnvironmentInputError
from controller.paths import sandbox_image_dir
from controller.repo.baseline import Baseline
from controller.repo.git import GitContext, run_git
from patchbox_agent.globs import Glob, GlobError

ENV_REPO = "patchbox-env"
LABEL_KEY = "io.patchbox.env.key"
LABEL_SPEC = "io.patchbox.env.spec"
LABEL_BASE = "io.patchbox.env.base"
RECIPE_VERSION = 4
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
STAGED_MTIME = 946_684_800
"""The modification time of every file staged into a build (inputs, helpers, the agent):
2000-01-01 00:00:00 UTC. Fixed, so the same inputs give the same build; after 1980 in every
time zone, since a ZIP entry cannot hold an earlier time and build backends that zip the
staged files (a wheel built by ``pip install .``) refuse one."""

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

HAS_PYTHON = """\
command -v python3 >/dev/null 2>&1 \\
    && python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \\
    && command -v git >/dev/null 2>&1
"""
"""Exits 0 when the base has what the agent needs (python3 >= 3.9 and git): the build then
has no step for it."""

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


def read_blobs(baseline: Baseline, files: list[InputFile]) -> Iterator[tuple[InputFile, bytes]]:
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
    base_id: str,
    spec: EnvironmentSpec,
    files: list[InputFile],
    agent_digest: str,
    egress: Sequence[str] = (),
) -> str:
    """Hash of (base image id, setup, env, the inputs' paths, modes and bytes, the agent, the
    ``host:port`` pairs the setup could reach)."""
    doc = {
        "egress": sorted(egress),
        "recipe": RECIPE_VERSION,
        "base_id": base_id,
        "setup": spec.setup,
        "env": dict(sorted(spec.env.items())),
        "inputs": [[f.path, f.mode, f.blob] for f in files],
        "memory_mb": spec.setup_memory_mb,
        "agent": agent_digest,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class SpecLabel(TypedDict, total=False):
    """An environment image's spec label (an image built before labels held names only
    has ``env`` as a mapping, which :mod:`.envimages` reads as its names)."""

    base: str | None
    setup: list[list[str]]
    inputs: list[str]
    env: list[str]
    setup_timeout_seconds: float
    setup_memory_mb: int


def label_spec(spec: EnvironmentSpec) -> SpecLabel:
    """The environment's block as its image's label holds it: ``env`` is its variables'
    names only (a label is shown to anyone who lists the images; the key, a digest, covers
    the values)."""
    shown = spec.model_dump(mode="json", exclude={"services"})
    shown["env"] = sorted(spec.env)
    return cast("SpecLabel", shown)


def dockerfile(  # noqa: PLR0913 - the Dockerfile's parts, all but two by keyword
    base_ref: str,
    spec: EnvironmentSpec,
    labels: dict[str, str],
    *,
    ca: bool,
    as_root: bool,
    python: bool = True,
) -> str:
    """The generated Dockerfile (see the module docstring), up to the agent layer
    (:mod:`controller.sandbox.agentlayer` puts that on in one commit, the seed with it).
    Few steps: each costs a commit. The labels (the environment's key among them, which the
    watchdog finds the running step by) come first; python3 for the agent only when the base
    lacks it (``python``); setup steps run in /workspace through ``sh`` and ``env``."""
    env_args = [f"{name}={CA_PATH}" for name in CA_VARIABLES] if ca else []
    env_args += [f"{k}={v}" for k, v in sorted(spec.env.items())]
    prefix = ["/bin/sh", "-c", 'cd /workspace && exec /usr/bin/env "$@"', "setup", *env_args]
    lines = [
        f"FROM {base_ref}",
        "LABEL " + " ".join(f"{k}={json.dumps(v)}" for k, v in labels.items()),
    ]
    if not as_root:
        lines.append("USER root")
    lines.append("COPY stage/ /")
    if python:
        lines.append("RUN " + json.dumps([*prefix, "/bin/sh", f"{BUILD_DIR}/ensure-python.sh"]))
    lines += ["RUN " + json.dumps([*prefix, *step]) for step in spec.setup]
    return "\n".join(lines) + "\n"


def seed_of(spec: EnvironmentSpec) -> str | None:
    """The seed's script, run in the agent layer's container before its own line (what a
    setup left in /workspace); None without a setup."""
    return SEED_SCRIPT if spec.setup else None


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = STAGED_MTIME
    tar.addfile(info, io.BytesIO(data))


def _dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = STAGED_MTIME
    tar.addfile(info)


def build_context(
    text: str,
    files: list[tuple[InputFile, bytes]],
    ca_bundle: Path | None,
) -> bytes:
    """The build context: the Dockerfile, the build helpers, the inputs."""
    buf = io.BytesIO()
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
    return buf.getvalue()


def step_names(spec: EnvironmentSpec, *, as_root: bool, python: bool = True) -> dict[int, str]:
    """Dockerfile step number (1-based, as the builder counts) -> what the user calls it."""
    names = ["base", "labels"] + ([] if as_root else ["user"])
    names += ["inputs"] + (["python3 for the agent"] if python else [])
    names += [f"setup {i + 1}/{len(spec.setup)}: {_argv_text(s)}" for i, s in enumerate(spec.setup)]
    return {i + 1: n for i, n in enumerate(names)}


def _argv_text(argv: list[str]) -> str:
    text = " ".join(argv)
    return text if len(text) <= 120 else text[:117] + "..."
