"""One workspace, two agents: the agent over pipes on the host, or in a real container.

Tool tests take the ``agent`` fixture (conftest.py), parametrized over both, so every rule is
shown on the real agent in a real sandbox as well as in milliseconds on the host. Set-up and
inspection go around the tools: on the host directly, in the container through ``run``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from controller.sandbox.docker import DockerSandbox
from controller.sandbox.local import LocalSandbox

Kind = Literal["local", "docker"]

_DUMP = r"""
import base64, json, os, stat, sys
root = sys.argv[1]
out = {}
for dirpath, dirnames, filenames in os.walk(root):
    for name in filenames:
        p = os.path.join(dirpath, name)
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = [base64.b64encode(fh.read()).decode(), st.st_mode & 0o777]
print(json.dumps(out))
"""

_PREPARE = r"""
import base64, json, os, sys
spec = json.loads(sys.argv[1])
for name, data in spec["outside"].items():
    path = os.path.join("/tmp/outside", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(base64.b64decode(data))
for name in spec["fifos"]:
    os.mkfifo(os.path.join("/workspace", name))
"""


@dataclass
class AgentWorkspace:
    kind: Kind
    box: LocalSandbox | DockerSandbox
    root: Path
    """The workspace on the host (local kind only)."""
    outside_dir: str
    """A folder outside the workspace that links may point to."""
    _files: dict[str, tuple[bytes, int]] = field(default_factory=dict)

    def setup(
        self,
        files: dict[str, bytes | str],
        *,
        modes: dict[str, int] | None = None,
        links: dict[str, str] | None = None,
        fifos: list[str] | None = None,
        outside: dict[str, bytes | str] | None = None,
    ) -> None:
        """Creates files, links (targets may use ``{outside}``), FIFOs and outside files."""
        modes = modes or {}
        raw = {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}
        out = {k: v.encode() if isinstance(v, str) else v for k, v in (outside or {}).items()}
        targets = {k: v.format(outside=self.outside_dir) for k, v in (links or {}).items()}
        if isinstance(self.box, LocalSandbox):
            self._setup_local(raw, modes, targets, fifos or [], out)
        else:
            self._setup_docker(raw, modes, targets, fifos or [], out)

    def _setup_local(
        self,
        raw: dict[str, bytes],
        modes: dict[str, int],
        links: dict[str, str],
        fifos: list[str],
        outside: dict[str, bytes],
    ) -> None:
        for name, data in outside.items():
            p = Path(self.outside_dir) / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        for name, data in raw.items():
            p = self.root / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            p.chmod(modes.get(name, 0o644))
        for name, target in links.items():
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
            (self.root / name).symlink_to(target)
        for name in fifos:
            os.mkfifo(self.root / name)
        self.box.run(["true"], timeout=30)

    def _setup_docker(
        self,
        raw: dict[str, bytes],
        modes: dict[str, int],
        links: dict[str, str],
        fifos: list[str],
        outside: dict[str, bytes],
    ) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in sorted(raw.items()):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = modes.get(name, 0o644)
                tar.addfile(info, io.BytesIO(data))
            for name, target in sorted(links.items()):
                info = tarfile.TarInfo(name)
                info.type = tarfile.SYMTYPE
                info.linkname = target
                tar.addfile(info)
        self.box.put_archive(buf.getvalue())
        spec = {
            "outside": {k: base64.b64encode(v).decode() for k, v in outside.items()},
            "fifos": fifos,
        }
        res = self.box.run(["python3", "-c", _PREPARE, json.dumps(spec)], timeout=30)
        assert res.exit_code == 0, res.output

    def files(self) -> dict[str, tuple[bytes, int]]:
        """Every regular file of the workspace (links not followed): (bytes, mode)."""
        if isinstance(self.box, LocalSandbox):
            out = {}
            for p in sorted(self.root.rglob("*")):
                if p.is_file() and not p.is_symlink():
                    out[p.relative_to(self.root).as_posix()] = (
                        p.read_bytes(),
                        p.stat().st_mode & 0o777,
                    )
            return out
        res = self.box.run(
            ["python3", "-c", _DUMP, "/workspace"], timeout=30, output_limit=1024 * 1024
        )
        data = json.loads(res.output)
        return {k: (base64.b64decode(v[0]), v[1]) for k, v in sorted(data.items())}

    def contents(self) -> dict[str, bytes]:
        return {k: v[0] for k, v in self.files().items()}

    def read(self, path: str) -> bytes:
        return self.files()[path][0]

    def outside(self, name: str) -> bytes:
        if isinstance(self.box, LocalSandbox):
            return (Path(self.outside_dir) / name).read_bytes()
        res = self.box.run(["cat", f"/tmp/outside/{name}"], timeout=30)
        return res.output.encode()
