"""Signed provenance through the CLI, on real jobs: ``key init``, a job whose output folder
holds ``provenance.intoto.jsonl``, ``verify`` (and docs/ci.md's verifying step) accepting
it and refusing a changed diff, a failed check and a wrong key with their rules; the
in-toto project's own tooling accepting the envelopes; and the signing key out of the
sandbox's reach under both runtimes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.ci import verify_command
from tests.support.cli import ROOT, job_files, patchbox
from tests.support.exits import CALLS, TASK
from tests.support.jobs import FILES, make_repo
from tests.support.provenance import independently_verified, payloads

pytestmark = pytest.mark.docker


def _run(
    repo: Path, folder: Path, home: Path, task: dict[str, Any], *extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = folder / "out"
    proc = patchbox(
        "run",
        "--repo",
        str(repo),
        *job_files(folder, task, CALLS),
        "--output-dir",
        str(out),
        *extra,
        "--json",
        home=home,
    )
    return proc, out


def _verify(out: Path, key: Path, home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return patchbox(
        "verify",
        "--diff",
        str(out / "diff.patch"),
        "--attestations",
        str(out / "provenance.intoto.jsonl"),
        "--key",
        str(key),
        *extra,
        home=home,
    )


def test_a_signed_job_verifies_and_a_changed_diff_or_key_does_not(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    made = patchbox("key", "init", "--json", home=home)
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    pub = Path(info["public_key_file"])
    assert (home / "keys" / "provenance.key").stat().st_mode & 0o777 == 0o600
    assert pub.read_text() == info["public_key"]
    again = patchbox("key", "init", home=home)
    assert (again.returncode, "SIGNING_KEY_EXISTS" in again.stderr) == (2, True)

    repo = make_repo(tmp_path / "repo")
    proc, out = _run(repo, tmp_path / "a", home, TASK)
    assert proc.returncode == 0, proc.stderr[-2000:]
    view = json.loads(proc.stdout)
    job_id = view["job_id"]
    assert view["attestations"] == f"jobs/{job_id}/provenance.intoto.jsonl"
    lines = (out / "provenance.intoto.jsonl").read_text()
    assert lines == (home / "jobs" / job_id / "provenance.intoto.jsonl").read_text()
    statements = payloads(lines)
    provenance = statements[0]["predicate"]
    assert provenance["runDetails"]["metadata"]["invocationId"] == job_id
    internal = provenance["buildDefinition"]["internalParameters"]
    assert internal["sandboxImage"] == docker_client.images.get(sandbox_image).id
    assert internal["runtime"] == "runc"
    assert [s["predicate"]["result"] for s in statements[1:]] == ["PASSED"]
    text = json.dumps(statements)
    assert str(tmp_path) not in text

    ok = _verify(out, pub, home)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"verified: job {job_id}" in ok.stdout
    assert "greet PASSED" in ok.stdout
    assert len(independently_verified(lines, pub.read_bytes())) == 2

    _the_documented_step(out, pub, home, tmp_path / "ci")

    mail = (out / "diff.patch").read_text()
    (out / "diff.patch").write_text(mail.replace("Hello", "Hellp", 1))
    changed = _verify(out, pub, home, "--json")
    assert changed.returncode == 1
    report = json.loads(changed.stdout)
    assert (report["ok"], report["code"]) == (False, "VERIFY_FAILED")
    assert {f["code"] for f in report["failures"]} == {"SUBJECT_MISMATCH"}
    (out / "diff.patch").write_text(mail)

    other = tmp_path / "other.key"
    assert patchbox("key", "init", "--path", str(other), home=home).returncode == 0
    wrong = _verify(out, tmp_path / "other.pub", home)
    assert wrong.returncode == 1
    assert "- SIGNATURE_INVALID: envelope 1 is not signed by key" in wrong.stdout


def _the_documented_step(out: Path, pub: Path, home: Path, ci: Path) -> None:
    """docs/ci.md's verifying step, as written: passes with a policy the job meets, fails
    naming the rule with one it does not."""
    (ci / ".patchbox").mkdir(parents=True)
    (ci / "patchbox-out").symlink_to(out)
    (ci / ".patchbox" / "provenance.pub").write_text(pub.read_text())
    policy = {"runtime": "runc", "egress": [], "required_checks": ["greet"], "mode": "review"}
    (ci / ".patchbox" / "verify-policy.json").write_text(json.dumps(policy))
    step = _documented(verify_command(), ci, home)
    assert step.returncode == 0, step.stdout + step.stderr
    policy["runtime"] = "runsc"
    (ci / ".patchbox" / "verify-policy.json").write_text(json.dumps(policy))
    strict = _documented(verify_command(), ci, home)
    assert strict.returncode == 1
    assert "- POLICY_VIOLATION: policy.runtime: the job ran under 'runc'" in strict.stdout


def _documented(command: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """docs/ci.md's command run in ``cwd``, ``patchbox`` being this checkout's."""
    env = {
        **os.environ,
        "PATCHBOX_HOME": str(home),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "sandbox-image")]),
    }
    script = f'patchbox() {{ python3 -m controller "$@"; }}\n{command}\n'
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_a_failed_check_is_signed_failed_and_does_not_verify(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    home = tmp_path / "home"
    assert patchbox("key", "init", home=home).returncode == 0
    repo = make_repo(tmp_path / "repo")
    task = {
        **TASK,
        "checks": {
            "greet": {"argv": ["python3", "check.py"], "timeout_seconds": 60},
            "never": {
                "argv": ["sh", "-c", "grep -q Hello app.py && exit 1 || exit 0"],
                "timeout_seconds": 60,
            },
        },
    }
    proc, out = _run(repo, tmp_path / "a", home, task)
    view = json.loads(proc.stdout)
    assert (proc.returncode, view["error"]["code"]) == (1, "CHECK_FAILED"), proc.stderr[-2000:]
    results = {
        s["predicate"]["configuration"][0]["name"]: s["predicate"]["result"]
        for s in payloads((out / "provenance.intoto.jsonl").read_text())[1:]
    }
    assert results == {"check:greet": "PASSED", "check:never": "FAILED"}
    failed = _verify(out, home / "keys" / "provenance.pub", home)
    assert failed.returncode == 1
    assert failed.stdout.splitlines()[1:] == [
        "- CHECK_FAILED: required check 'never' did not pass (FAILED)"
    ]


def test_a_configured_key_that_cannot_sign_stops_the_job_before_it_starts(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    del docker_client, sandbox_image
    home = tmp_path / "home"
    repo = make_repo(tmp_path / "repo")
    key = tmp_path / "open.key"
    assert patchbox("key", "init", "--path", str(key), home=home).returncode == 0
    key.chmod(0o644)
    folder = tmp_path / "a"
    files = job_files(
        folder, TASK, CALLS, config=f'spare_sandboxes = 0\n[provenance]\nkey = "{key}"\n'
    )
    proc = patchbox("run", "--repo", str(repo), *files, "--json", home=home)
    view = json.loads(proc.stdout)
    assert (proc.returncode, view["error"]["code"]) == (2, "SIGNING_KEY_INVALID")
    assert view["tool_calls"] == []
    assert "mode 0644" in view["error"]["message"]


def test_the_signing_key_is_out_of_the_sandboxs_reach(
    docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path, runtime: str
) -> None:
    """A check (code the repository controls) looks for the key's bytes everywhere it can
    read, its environment included: nothing, under either runtime."""
    del docker_client, sandbox_image
    home = tmp_path / "home"
    assert patchbox("key", "init", home=home).returncode == 0
    body = "".join((home / "keys" / "provenance.key").read_text().splitlines()[1:-1])
    half = len(body) // 2
    look = (
        f'a="{body[:half]}"; b="{body[half:]}"; '
        'if env | grep -qF "$a$b"; then echo FOUND-ENV; exit 1; fi; '
        # grep exits 2 when some file could not be read, found or not: its output decides
        'found=$(grep -rlsF --exclude-dir=proc --exclude-dir=sys "$a$b" / 2>/dev/null); '
        'if [ -n "$found" ]; then echo "FOUND $found"; exit 1; fi; '
        # the control: the same search finds a marker the workspace holds
        'mark=$(grep -rlsF --exclude-dir=proc --exclude-dir=sys "pbx-mark""er-7f3a" / 2>/dev/null); '
        'echo "control: $mark"; [ -n "$mark" ] || exit 2'
    )
    task = {
        **TASK,
        "checks": {"look": {"argv": ["sh", "-c", look], "timeout_seconds": 240}},
        "baseline_checks": False,
    }
    repo = make_repo(tmp_path / "repo", {**FILES, "marker.txt": "pbx-marker-7f3a\n"})
    proc, out = _run(repo, tmp_path / "a", home, task, "--runtime", runtime)
    view = json.loads(proc.stdout)
    assert proc.returncode == 0, (view.get("error"), [c["output_tail"] for c in view["checks"]])
    assert [(c["id"], c["status"]) for c in view["checks"]] == [("look", "passed")]
    tail = view["checks"][0]["output_tail"]
    assert "FOUND" not in tail
    assert "/workspace/marker.txt" in tail
    assert (out / "provenance.intoto.jsonl").is_file()
