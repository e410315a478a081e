"""Symlinks at every path component, on the real agent: over pipes, under runc and under
gVisor (runsc).

gVisor (release 20221219 here) opens a symlink to a directory when asked for
``O_DIRECTORY | O_NOFOLLOW``, where Linux answers ENOTDIR; on the final component
``O_NOFOLLOW`` alone is honoured (ELOOP) by both. The jail therefore checks every component it
opens against an ``fstatat(AT_SYMLINK_NOFOLLOW)`` of the name (docs/architecture.md, "The path
jail"). Each test here asserts the one safe outcome for every runtime: reads and
``replace_text`` get TOOL_PATH_DENIED naming the link, patches get PATCH_REJECTED, listings and
searches show only the real files, and nothing appears or changes outside the workspace.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.errors import ErrorCode, ToolError
from controller.sandbox.local import LocalSandbox
from tests.support.harness import AgentWorkspace
from tests.support.sandbox import _require_runsc

KINDS = [
    "local",
    pytest.param("runc", marks=pytest.mark.docker),
    pytest.param("runsc", marks=[pytest.mark.docker, pytest.mark.runsc]),
]

FILES = {
    "a.txt": "hello needle\n",
    "sub/b.txt": "b needle\n",
    "sub/inner/c.txt": "c needle\n",
}
SECRET = "SECRET-OUTSIDE needle\n"  # noqa: S105 - file content, not a credential
PASSWD = "root:x:0:0:root:/root:/bin/sh\n"  # noqa: S105 - same

# What the outside looks like from the workspace in a container; the local agent gets the
# same shapes made of folders beside its workspace (see ``Attack.links``).
REAL = sorted(FILES)


@dataclass
class Attack:
    ws: AgentWorkspace
    up: str
    """``lnk_up`` (a link to ``..``) joined with the way to the outside folder's parent."""
    snapshot_outside: list[str]
    """Folders outside the workspace whose whole trees must not change."""

    @property
    def intermediate(self) -> list[str]:
        """Paths whose directory part goes through a link (to outside, to the workspace
        itself, to ``..``, to a sibling folder)."""
        return [
            "lnk_dir/passwd",
            "lnk_tmp/outside/secret.txt",
            "lnk_ws/a.txt",
            f"{self.up}/outside/secret.txt",
            "lnk_sib/b.txt",
            "lnk_sib/inner/c.txt",
            "sub/lnk_up2/a.txt",
            "sub/lnk_up2/sub/b.txt",
            "sub/deep/c.txt",
        ]

    @property
    def final(self) -> list[str]:
        """Paths that are themselves links (to files outside, inside, and through ``..``)."""
        return ["f_passwd", "f_secret", "f_ws", "f_sib", "f_up", "sub/f_up2"]

    def outside_state(self) -> str:
        """Every entry (and file content) of the outside folders, as one comparable text."""
        probe = textwrap.dedent(
            r"""
            import hashlib, json, os, sys
            out = {}
            for top in sys.argv[1:]:
                for dirpath, dirnames, filenames in os.walk(top):
                    dirnames[:] = [d for d in dirnames if not d.startswith(".patchbox")]
                    for name in dirnames + filenames:
                        p = os.path.join(dirpath, name)
                        try:
                            if os.path.isfile(p) and not os.path.islink(p):
                                with open(p, "rb") as fh:
                                    out[p] = hashlib.sha256(fh.read()).hexdigest()
                            else:
                                out[p] = "entry"
                        except OSError:
                            out[p] = "unreadable"
            print(json.dumps(out, sort_keys=True))
            """
        )
        if self.ws.kind == "local":
            return subprocess.run(
                [sys.executable, "-c", probe, *self.snapshot_outside],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        res = self.ws.box.run(
            ["python3", "-c", probe, *self.snapshot_outside], timeout=30, output_limit=1 << 20
        )
        assert res.exit_code == 0, res.output
        return res.output


@pytest.fixture(params=KINDS)
def attack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Attack]:
    kind: str = request.param
    if kind == "local":
        root = tmp_path / "ws"
        root.mkdir()
        outside = tmp_path / "outside"
        outside.mkdir()
        etc = tmp_path / "etc"
        etc.mkdir()
        (etc / "passwd").write_text(PASSWD)
        with LocalSandbox(root) as box:
            ws = AgentWorkspace("local", box, root, str(outside))
            links = {
                "lnk_dir": str(etc),
                "lnk_tmp": str(tmp_path),
                "lnk_ws": str(root),
                "f_passwd": str(etc / "passwd"),
                "f_ws": str(root / "a.txt"),
                "f_up": "../outside/secret.txt",
            }
            yield _prepared(ws, links, "lnk_up", [str(outside), str(etc), str(tmp_path)])
        return
    if kind == "runsc" and "runsc" not in request.getfixturevalue("docker_client").info().get(
        "Runtimes", {}
    ):
        if _require_runsc():
            pytest.fail("runsc is not registered with the Docker daemon (required under CI)")
        pytest.skip("runsc is not registered with the Docker daemon")
    box = request.getfixturevalue("make_sandbox")(kind)
    ws = AgentWorkspace("docker", box, Path("/workspace"), "/tmp/outside")
    links = {
        "lnk_dir": "/etc",
        "lnk_tmp": "/tmp",
        "lnk_ws": "/workspace",
        "f_passwd": "/etc/passwd",
        "f_ws": "/workspace/a.txt",
        "f_up": "../tmp/outside/secret.txt",
    }
    yield _prepared(ws, links, "lnk_up/tmp", ["/tmp", "/etc"])


def _prepared(ws: AgentWorkspace, links: dict[str, str], up: str, outside: list[str]) -> Attack:
    files: dict[str, bytes | str] = {**FILES}
    ws.setup(
        files,
        links={
            **links,
            "lnk_up": "..",
            "lnk_sib": "sub",
            "sub/lnk_up2": "..",
            "sub/deep": "inner",
            "f_secret": "{outside}/secret.txt",
            "f_sib": "sub/b.txt",
            "sub/f_up2": "../a.txt",
        },
        outside={"secret.txt": SECRET},
    )
    return Attack(ws, up, outside)


def _error(call: object) -> tuple[str, str] | str:
    """(code, message) of a refused call, or "ok: ..." when it went through."""
    assert callable(call)
    try:
        result = call()
    except ToolError as exc:
        return (exc.code.value, exc.message)
    return f"ok: {result!r}"[:200]


DENIED = (
    ErrorCode.TOOL_PATH_DENIED.value,
    "not allowed: a symbolic link, which the tools do not follow",
)


def test_reads_through_any_link_are_denied_alike(attack: Attack) -> None:
    box = attack.ws.box
    paths = attack.intermediate + attack.final
    got = {p: _error(lambda p=p: box.read_file(p)) for p in paths}
    assert got == dict.fromkeys(paths, DENIED)
    raw = {p: _error(lambda p=p: box.read_raw(p)) for p in attack.intermediate}
    assert raw == dict.fromkeys(attack.intermediate, DENIED)
    assert box.read_file("sub/inner/c.txt").content == FILES["sub/inner/c.txt"]


def test_listings_and_searches_show_only_real_files(attack: Attack) -> None:
    box = attack.ws.box
    assert box.list_files().files == REAL
    for regex in (False, True):
        hits = box.search_text("needle", regex=regex).hits
        assert sorted({h.path for h in hits}) == REAL
        assert box.search_text("SECRET-OUTSIDE", regex=regex).hits == []
        assert box.search_text("root:x", regex=regex).hits == []


def test_replace_text_through_any_link_is_denied(attack: Attack) -> None:
    box = attack.ws.box
    before = attack.ws.files(), attack.outside_state()
    paths = attack.intermediate + attack.final
    got = {p: _error(lambda p=p: box.replace_text(p, "needle", "NEEDLE")) for p in paths}
    got |= {
        p: _error(lambda p=p: box.replace_text(p, "root:x", "owned"))
        for p in ("lnk_dir/passwd", "f_passwd")
    }
    assert got == dict.fromkeys(paths, DENIED)
    assert (attack.ws.files(), attack.outside_state()) == before


def _create(path: str) -> str:
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        "@@ -0,0 +1 @@\n+owned\n"
    )


def _modify(path: str, old: str) -> str:
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old}+owned\n"


def _delete(path: str, old: str) -> str:
    return (
        f"diff --git a/{path} b/{path}\ndeleted file mode 100644\n--- a/{path}\n+++ /dev/null\n"
        f"@@ -1 +0,0 @@\n-{old}"
    )


def _rename(src: str, dst: str) -> str:
    return (
        f"diff --git a/{src} b/{dst}\nsimilarity index 100%\nrename from {src}\nrename to {dst}\n"
    )


def test_patches_through_any_link_are_rejected(attack: Attack) -> None:
    box = attack.ws.box
    up = attack.up
    patches = {
        "create in /tmp": _create("lnk_tmp/x.txt"),
        "create in a new folder of /tmp": _create("lnk_tmp/newdir/x.txt"),
        "create beside the outside secret": _create("lnk_tmp/outside/x.txt"),
        "create through ..": _create(f"{up}/x.txt"),
        "create in the workspace's own link": _create("lnk_ws/new.txt"),
        "create in a sibling link": _create("lnk_sib/new.txt"),
        "create deeper in a sibling link": _create("lnk_sib/inner/new.txt"),
        "create through sub/..": _create("sub/lnk_up2/new.txt"),
        "create in /etc": _create("lnk_dir/x.txt"),
        "create over a final link": _create("f_secret"),
        "modify the outside secret": _modify("lnk_tmp/outside/secret.txt", SECRET),
        "modify through the workspace link": _modify("lnk_ws/a.txt", FILES["a.txt"]),
        "modify through a sibling link": _modify("lnk_sib/b.txt", FILES["sub/b.txt"]),
        "modify through sub/..": _modify("sub/lnk_up2/a.txt", FILES["a.txt"]),
        "modify a final link": _modify("f_ws", FILES["a.txt"]),
        "modify a final link to a sibling": _modify("f_sib", FILES["sub/b.txt"]),
        "delete through the workspace link": _delete("lnk_ws/a.txt", FILES["a.txt"]),
        "delete through a sibling link": _delete("lnk_sib/b.txt", FILES["sub/b.txt"]),
        "delete the outside secret": _delete("lnk_tmp/outside/secret.txt", SECRET),
        "delete a final link": _delete("f_sib", FILES["sub/b.txt"]),
        "rename into /tmp": _rename("a.txt", "lnk_tmp/x.txt"),
        "rename into a sibling link": _rename("a.txt", "lnk_sib/a.txt"),
        "rename out of a sibling link": _rename("lnk_sib/b.txt", "b2.txt"),
        "rename out of the workspace link": _rename("lnk_ws/a.txt", "a2.txt"),
    }
    before = attack.ws.files(), attack.outside_state(), box.list_files().files
    got = {name: _error(lambda p=p: box.apply_patch(p)) for name, p in patches.items()}
    codes = {name: r[0] if isinstance(r, tuple) else r for name, r in got.items()}
    assert codes == dict.fromkeys(patches, ErrorCode.PATCH_REJECTED.value), got
    assert (attack.ws.files(), attack.outside_state(), box.list_files().files) == before
    # The same patches without the links apply: the refusals are about the links alone.
    box.apply_patch(_create("sub/new.txt") + _modify("a.txt", FILES["a.txt"]))
    assert attack.ws.read("a.txt") == b"owned\n"


SWAPPER = r"""
import os, sys, time
os.chdir(sys.argv[1])
os.makedirs("real.tmp")
with open("real.tmp/secret.txt", "w") as fh:
    fh.write("inside\n")
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    os.rename("real.tmp", "sw"); os.rename("sw", "real.tmp")
    os.symlink(sys.argv[2], "sw"); os.unlink("sw")
"""


SWAP_REFUSALS = {
    DENIED,
    (ErrorCode.TOOL_FILE_NOT_FOUND.value, "no such file"),
    (ErrorCode.TOOL_PATH_DENIED.value, "not allowed: it changed while it was opened"),
    (ErrorCode.TOOL_PATH_DENIED.value, "not allowed: it cannot be opened"),
}
"""What a read of ``sw/secret.txt`` may answer while ``sw`` is swapped: a link, nothing
(between renames), or an entry that changed while it was opened."""


def test_a_folder_swapped_for_a_link_during_reads_never_escapes(attack: Attack) -> None:
    """A process flips ``sw`` between a real folder and a link to the outside folder as fast
    as it can while the agent reads ``sw/secret.txt`` (both hold one): every answer is the
    inside file or a denial."""
    ws = attack.ws
    py = "python3" if ws.kind == "docker" else sys.executable
    root = "/workspace" if ws.kind == "docker" else str(ws.root)
    # The session serialises calls, so the swapper runs detached (its own session).
    detach = 'setsid "$0" -c "$1" "$2" "$3" 4 >/dev/null 2>&1 & sleep 0.5'
    res = ws.box.run(["sh", "-c", detach, py, SWAPPER, root, ws.outside_dir], timeout=30)
    assert res.exit_code == 0
    time.sleep(0.3)
    seen = {"inside": 0, "denied": 0}
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            content = ws.box.read_file("sw/secret.txt").content
        except ToolError as exc:
            seen["denied"] += 1
            assert (exc.code.value, exc.message) in SWAP_REFUSALS  # noqa: PT017 - in a loop
            continue
        assert content == "inside\n", seen
        seen["inside"] += 1
    assert seen["inside"] > 0, seen
    assert seen["denied"] > 0, seen
