"""Hiding a change from the agent's change detection.

A check runs repository code as the agent's own uid. Everything the agent's ignore filter
reads must therefore be out of that uid's reach (a read-only git dir of the image, no git
config or excludes file in a writable place, only the baseline's ``.gitignore`` files), no
name may be hidden just because it looks like the agent's temp files, and on the host the
ledger is reconciled with the changes both ways, so a file an edit reported that vanished
from the changes fails the job by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from controller.config.task import CHECK_ENV
from controller.sandbox.base import Runtime
from patchbox_agent import ignore
from tests.support.harness import AgentWorkspace
from tests.support.jobs import (
    APP_AFTER,
    EDIT,
    GREET,
    call,
    check_call,
    code_of,
    make_repo,
    make_task,
    new_job,
    patch_call,
    scripted,
    sha256,
)
from tests.support.sandbox import SandboxFactory

# Every place a git that runs with HOME=/tmp (the check's and, before, the agent's) would
# read an excludes rule from, each written with `*`.
_PUT = """
import os, sys
def put(path, text, mode="w"):
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, mode) as out:
            out.write(text)
    except OSError:
        pass
home = os.environ.get("HOME") or "/tmp"
"""
VECTORS = {
    "index_git_exclude": """
for git_dir in ("/tmp/.patchbox-index-git", "/opt/patchbox/ignore-git"):
    put(git_dir + "/info/exclude", "*\\n")
""",
    "home_excludes_file": """
put(home + "/.config/git/ignore", "*\\n")
""",
    "home_gitconfig": """
put("/tmp/evil-ignore", "*\\n")
for name in ("/.gitconfig", "/.config/git/config"):
    put(home + name, "[core]\\n\\texcludesFile = /tmp/evil-ignore\\n\\tignoreCase = true\\n")
""",
    "new_gitignore": """
put("src/.gitignore", "*\\n")
""",
    "changed_gitignore": """
put(".gitignore", "*\\n")
""",
    "agent_temp_name": "",
}
ATTACK_ALL = _PUT + "".join(VECTORS.values()) + "put('.patchbox-tmp-x', 'x\\n')\n"
OUTSIDE_ONLY = _PUT + "".join(
    VECTORS[k] for k in ("index_git_exclude", "home_excludes_file", "home_gitconfig")
)


def _attack(vector: str, new_file: str) -> str:
    return _PUT + VECTORS[vector] + f"put({new_file!r}, 'print(1)\\n')\n"


# -- one check run on the real agent, each hiding place alone ----------------------------


BASELINE: dict[str, bytes | str] = {
    ".gitignore": "*.log\n",
    "src/app.py": "x = 1\n",
    "README.md": "demo\n",
}


@pytest.mark.docker
@pytest.mark.parametrize("vector", list(VECTORS))
def test_check_cannot_hide_a_new_file(
    make_sandbox: SandboxFactory, runtime: Runtime, vector: str
) -> None:
    """A process writes `*` into one place git could read ignore rules from (or names its
    file like the agent's temp files), then creates a file: the run reports it."""
    ws = AgentWorkspace("docker", make_sandbox(runtime=runtime), Path("/workspace"), "/tmp/o")
    ws.setup(BASELINE)
    assert ws.box.list_files().files == [".gitignore", "README.md", "src/app.py"]
    new_file = "src/.patchbox-tmp-x" if vector == "agent_temp_name" else "src/new.py"
    res = ws.box.run(
        ["python3", "-c", _attack(vector, new_file)],
        timeout=60,
        env=dict(CHECK_ENV),
        track_changes=True,
    )
    assert res.exit_code == 0, res.output
    assert res.changes is not None
    assert new_file in res.changes.added
    assert not res.changes.removed, "a baseline file must never look removed"
    assert new_file in ws.box.changes().added


@pytest.mark.docker
def test_ignore_git_dir_is_read_only_and_root_owned(make_sandbox: SandboxFactory) -> None:
    box = make_sandbox()
    probe = (
        "import os\n"
        f"p = {ignore.BAKED_GIT_DIR!r}\n"
        "st = os.stat(p)\n"
        "print(st.st_uid, oct(st.st_mode & 0o777), os.access(p, os.W_OK),"
        " os.access(os.path.dirname(p), os.W_OK), sorted(os.listdir(p)))\n"
    )
    res = box.run(["python3", "-c", probe], timeout=30, env=dict(CHECK_ENV))
    assert res.output.split(" ", 3)[:3] == ["0", "0o555", "False"], res.output
    assert "False ['HEAD', 'config', 'objects', 'refs']" in res.output


# -- whole jobs ------------------------------------------------------------------------------


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    files = {
        "app.py": 'def greet(name):\n    return "hello " + name\n',
        "check.py": "import sys\nfrom app import greet\n"
        "sys.exit(0 if greet('x') == 'Hello x' else 1)\n",
        "README.md": "# demo\n",
        ".gitignore": "*.log\n",
    }
    return make_repo(tmp_path / "greet", files)


def _check(script: str, *, mutates: bool = False) -> dict[str, Any]:
    return {"argv": ["python3", "-c", script], "mutates": mutates, "required": False}


ADDED = "print('added by the model')\n"


def _create(path: str) -> dict[str, Any]:
    body = ADDED.rstrip("\n")
    patch = (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1 @@\n+{body}\n"
    )
    return patch_call("p1", patch)


@pytest.mark.docker
def test_a_check_hiding_its_new_file_fails_the_job(
    client: docker.DockerClient, repo: Path, runtime: Runtime
) -> None:
    """A check not declared to change files writes `*` into every place ignore rules could
    come from, then creates a file: that is an undeclared change, named in the error."""
    hide = _check(ATTACK_ALL + "put('sneaked.py', 'print(1)\\n')\n")
    task = make_task(checks={"greet": GREET, "hide": hide})
    provider = scripted([check_call("c1", "hide")], [call("c2", EDIT)])
    record = new_job(client, repo, task, provider, runtime=runtime).run()
    assert record.state == "failed"
    assert code_of(record) == "CHECK_FAILED", record.error
    assert record.error is not None
    message = record.error.message
    assert "it was not declared to change" in message
    assert "sneaked.py" in message
    assert ".gitignore" in message


@pytest.mark.docker
def test_a_file_the_model_created_after_a_hiding_check_is_in_the_diff(
    client: docker.DockerClient, repo: Path, runtime: Runtime
) -> None:
    """A check poisons every ignore source outside the workspace (no change a listing
    shows), then the model creates a file: it is in the final diff."""
    task = make_task(checks={"greet": GREET, "hide": _check(OUTSIDE_ONLY)})
    provider = scripted([check_call("c1", "hide")], [_create("added.py"), call("c2", EDIT)])
    job = new_job(client, repo, task, provider, runtime=runtime)
    record = job.run()
    assert record.state == "awaiting_review", record.error
    assert [(f.path, f.kind) for f in record.files] == [
        ("added.py", "create"),
        ("app.py", "modify"),
    ]
    assert [f.sha256_after for f in record.files] == [sha256(ADDED), sha256(APP_AFTER)]
    assert "+++ b/added.py" in (job.diff or "")


@pytest.mark.docker
def test_a_file_the_model_created_that_vanished_from_the_changes_fails_the_job(
    client: docker.DockerClient, repo: Path, runtime: Runtime
) -> None:
    """A check makes a new folder that ignores itself (as a tool's cache folder may); the
    model then creates a file in it. The change detection does not see it, but the ledger
    says an edit wrote it: the job fails naming the path, not ends with it missing."""
    task = make_task(
        checks={"greet": GREET, "cache": _check(_PUT + "put('pkg/.gitignore', '*\\n')\n")}
    )
    provider = scripted([check_call("c1", "cache")], [_create("pkg/mod.py"), call("c2", EDIT)])
    record = new_job(client, repo, task, provider, runtime=runtime).run()
    assert record.state == "failed"
    assert code_of(record) == "CHANGESET_INVALID", record.error
    assert record.error is not None
    assert "pkg/mod.py" in record.error.message
    assert record.diagnostics["missing"] == ["pkg/mod.py"]


@pytest.mark.docker
def test_an_edit_undone_by_a_later_edit_is_no_missing_change(
    client: docker.DockerClient, repo: Path, runtime: Runtime
) -> None:
    """Reconciling against each path's final state: README.md changed, then changed back,
    is absent from the changes and that is right (its last hash is the baseline's)."""
    there = {"path": "README.md", "oldText": "# demo", "newText": "# demo!"}
    back = {"path": "README.md", "oldText": "# demo!", "newText": "# demo"}
    provider = scripted(
        [call("r1", {"name": "replace_text", "arguments": there})],
        [call("r2", {"name": "replace_text", "arguments": back}), call("c2", EDIT)],
    )
    record = new_job(client, repo, make_task(), provider, runtime=runtime).run()
    assert record.state == "awaiting_review", record.error
    assert [f.path for f in record.files] == ["app.py"]
