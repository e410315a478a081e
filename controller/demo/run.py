"""``patchbox demo``: a sandbox on the bundled example, driven through a few tool calls."""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path
from typing import Any

from controller.dockerclient import connect
from controller.image import ImageBuilder, Progress
from controller.labels import current_identity, new_job_id
from controller.limits import Limits
from controller.paths import patchbox_home
from controller.reaper import reap
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox

EXAMPLE = Path(__file__).resolve().parent / "example"


def example_archive(root: Path = EXAMPLE) -> bytes:
    """A tar of the example tree with normalised owners, times and modes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts:
                continue
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path.is_file():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def run_demo(progress: Progress, runtime: Runtime = "runc") -> dict[str, Any]:
    client = connect()
    reap(client, patchbox_home() / "tmp")
    image = ImageBuilder(client, progress).ensure()
    progress(
        f"image {image.tag} ({'built' if image.built else 'cached'}, base {image.base_source})"
    )
    spec = SandboxSpec(
        image=image.tag,
        job_id=new_job_id(),
        runtime=runtime,
        limits=Limits(memory_mb=512, workspace_mb=128, wall_seconds=120),
    )
    calls: list[dict[str, Any]] = []
    started = time.monotonic()
    with DockerSandbox.start(client, spec, current_identity()) as box:
        ready_ms = (time.monotonic() - started) * 1000
        progress(
            f"sandbox ready in {ready_ms:.0f} ms (agent {box.hello.agent}, uid {box.hello.uid})"
        )
        loaded = box.put_archive(example_archive())
        calls.append({"tool": "put_archive", "entries": loaded.entries})
        listing = box.list_files()
        calls.append({"tool": "list_files", "files": listing.files})
        source = box.read_file("calc/parser.py")
        calls.append({"tool": "read_file", "path": source.path, "content": source.content})
        denied = "ok"
        try:
            box.read_file("../etc/passwd")
        except Exception as exc:
            denied = getattr(exc, "code", type(exc).__name__)
        calls.append({"tool": "read_file", "path": "../etc/passwd", "error": str(denied)})
        check = box.run(["python3", "-m", "unittest", "-q"], timeout=60)
        calls.append(
            {
                "tool": "run_check",
                "argv": "python3 -m unittest -q",
                "exit_code": check.exitCode,
                "output_tail": check.output[-600:],
            }
        )
    return {
        "image": image.tag,
        "runtime": runtime,
        "ready_ms": round(ready_ms, 1),
        "calls": calls,
        "note": "The check fails: parse_items('') returns [''] (the bug the demo job will fix).",
    }
