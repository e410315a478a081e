"""Project environments: the block's rules, the generated build, and real jobs whose checks
need a toolchain or a package from the registries (Python with a PyPI plugin, Node with a
script in node_modules/.bin, C compiled by its check), through the CLI as a user runs them,
under runc and gVisor. Every failure is a clear code with nothing left behind."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from controller.config.checks import resolve_environment, with_environment
from controller.config.environment import EnvironmentSpec
from controller.config.host import HostConfig
from controller.config.task import CheckSpec, TaskSpec
from controller.errors import (
    EnvironmentBuildError,
    EnvironmentInputError,
    ErrorCode,
    UsageError,
)
from controller.repo.baseline import build_baseline
from controller.sandbox import environment as envmod
from controller.sandbox.environment import (
    CA_VARIABLES,
    LABEL_KEY,
    dockerfile,
    find_ca_bundle,
    select_inputs,
)
from tests.support.cli import patchbox
from tests.support.git import init

# -- the block's rules (no daemon) ------------------------------------------------------


@pytest.mark.parametrize(
    ("block", "fragment"),
    [
        ({"nope": 1}, "environment.inline.nope"),
        ({"inputs": ["../etc/passwd"]}, "leaves the repository"),
        ({"inputs": ["/etc/passwd"]}, "relative repository path"),
        ({"inputs": [".git/config"]}, "names the git directory"),
        ({"inputs": ["a\\b"]}, "relative repository path"),
        ({"inputs": ["src/[z"]}, "is not a valid glob"),
        ({"env": {"API_TOKEN": "x"}}, "looks like a secret"),
        ({"env": {"HTTPS_PROXY": "x"}}, "looks like a secret or a proxy"),
        ({"env": {"lower": "x"}}, "is not allowed"),
        ({"setup": [[]]}, "setup.0"),
        ({"setup": "pip install x"}, "setup"),
        ({"setup_timeout_seconds": 0}, "setup_timeout_seconds"),
        ({"base": "bad image name!"}, "base"),
        ("not a name!", "environment.name"),
    ],
)
def test_a_bad_block_is_refused_naming_the_field(block: object, fragment: str) -> None:
    from controller.errormap import describe_validation

    with pytest.raises(ValidationError) as info:
        TaskSpec.model_validate({"prompt": "p", "environment": block})
    assert fragment in describe_validation(info.value, subject="task")


def test_every_field_is_optional_and_a_name_is_looked_up() -> None:
    empty = TaskSpec.model_validate({"prompt": "p", "environment": {}})
    assert empty.environment == EnvironmentSpec()
    config = HostConfig.model_validate({"environments": {"py": {"setup": [["true"]]}}})
    named = TaskSpec.model_validate({"prompt": "p", "environment": "py"})
    assert resolve_environment(named, config) == EnvironmentSpec(setup=[["true"]])
    assert resolve_environment(TaskSpec(prompt="p"), config) is None
    other = TaskSpec.model_validate({"prompt": "p", "environment": "node"})
    with pytest.raises(UsageError, match="'node', which the host configuration does not define"):
        resolve_environment(other, config)


def test_the_environment_variables_reach_every_check_and_a_check_wins() -> None:
    env = EnvironmentSpec(env={"PYTHONPATH": "src", "MODE": "env"})
    checks = {
        "a": CheckSpec(argv=["true"]),
        "b": CheckSpec(argv=["true"], env={"MODE": "check"}),
    }
    merged = with_environment(checks, env)
    assert merged["a"].environment()["PYTHONPATH"] == "src"
    assert merged["a"].environment()["MODE"] == "env"
    assert merged["b"].environment()["MODE"] == "check"
    assert merged["b"].environment()["PATH"] == "/usr/local/bin:/usr/bin:/bin"


def test_the_generated_build_runs_each_step_as_given_with_the_ca_and_no_shell_parsing() -> None:
    spec = EnvironmentSpec(
        setup=[["pip", "install", "a b; rm -rf /"], ["npm", "ci"]], env={"X": "1"}
    )
    text = dockerfile("base:1", spec, {LABEL_KEY: "k"}, ca=True, as_root=False)
    lines = text.splitlines()
    assert lines[0] == "FROM base:1"
    assert "USER root" in lines
    runs = [json.loads(line[4:]) for line in lines if line.startswith("RUN [")]
    setup = [r for r in runs if r[-3:] == ["pip", "install", "a b; rm -rf /"]]
    assert len(setup) == 1
    assert all(f"{name}={envmod.CA_PATH}" in setup[0] for name in CA_VARIABLES)
    assert "X=1" in setup[0]
    # the agent layer is not the builder's: it is put on afterwards in one commit
    assert "ENTRYPOINT" not in text
    assert "agent.py" not in text
    plain = dockerfile("base:1", EnvironmentSpec(), {LABEL_KEY: "k"}, ca=False, as_root=True)
    assert "USER root\n" not in plain
    assert "SSL_CERT_FILE" not in plain


def test_the_ca_bundle_is_the_configured_one_or_the_hosts(tmp_path: Path) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    assert find_ca_bundle(str(pem)) == pem
    assert find_ca_bundle("") is None
    with pytest.raises(EnvironmentBuildError, match="is not a readable file"):
        find_ca_bundle(str(tmp_path / "missing.pem"))
    assert find_ca_bundle(None, {"PIP_CERT": str(pem)}) == pem
    assert find_ca_bundle(None, {"PIP_CERT": "/nope", "SSL_CERT_FILE": str(pem)}) == pem


# -- inputs from the baseline (real git, no daemon) ---------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Path:
    repo = init(
        tmp_path / "proj",
        {
            "requirements-test.txt": "freezegun\n",
            "src/pkg/__init__.py": "",
            "src/pkg/core.py": "X = 1\n",
            "tools/run.sh": (0o755, b"#!/bin/sh\n"),
            "README.md": "# p\n",
        },
        symlinks={"link.txt": "README.md"},
    )
    return repo.path


def test_a_path_is_that_path_and_a_glob_matches_at_any_depth(tmp_path: Path) -> None:
    repo = init(tmp_path / "r", {"package.json": "{}", "packages/a/package.json": "{}"}).path
    baseline, _ = build_baseline(repo)
    assert [f.path for f in select_inputs(baseline, ["package.json"])] == ["package.json"]
    assert [f.path for f in select_inputs(baseline, ["packages/"])] == ["packages/a/package.json"]
    found = [f.path for f in select_inputs(baseline, ["*.json"])]
    assert found == ["package.json", "packages/a/package.json"]
    assert [f.path for f in select_inputs(baseline, ["pack*"])] == [
        "package.json",
        "packages/a/package.json",
    ]


def test_inputs_select_files_folders_and_globs(project: Path) -> None:
    baseline, _ = build_baseline(project)
    picked = select_inputs(baseline, ["requirements-test.txt", "src", "tools/*.sh"])
    assert [(f.path, f.mode) for f in picked] == [
        ("requirements-test.txt", "100644"),
        ("src/pkg/__init__.py", "100644"),
        ("src/pkg/core.py", "100644"),
        ("tools/run.sh", "100755"),
    ]


@pytest.mark.parametrize(
    ("patterns", "fragment"),
    [
        (["link.txt"], "is a symbolic link"),
        (["*.txt"], "is a symbolic link"),
        (["missing.txt"], "matches no file"),
        (["src/[z"], "is not a valid glob"),
    ],
)
def test_bad_inputs_are_refused(project: Path, patterns: list[str], fragment: str) -> None:
    baseline, _ = build_baseline(project)
    with pytest.raises(EnvironmentInputError, match=fragment) as info:
        select_inputs(baseline, patterns)
    assert info.value.code is ErrorCode.ENVIRONMENT_INPUT_INVALID


def test_an_input_set_over_the_bounds_is_refused(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline, _ = build_baseline(project)
    monkeypatch.setattr("controller.sandbox.environment.MAX_INPUT_FILES", 2)
    with pytest.raises(EnvironmentInputError, match="select 3 files"):
        select_inputs(baseline, ["src", "README.md"])
    monkeypatch.setattr("controller.sandbox.environment.MAX_INPUT_FILES", 100)
    monkeypatch.setattr("controller.sandbox.environment.MAX_INPUT_BYTES", 5)
    with pytest.raises(EnvironmentInputError, match="bytes are copied"):
        select_inputs(baseline, ["README.md", "src"])


def test_image_build_no_longer_takes_a_base() -> None:
    proc = patchbox("image", "build", "--base", "x", "--json")
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["code"] == "USAGE_ERROR"


def test_staged_files_carry_a_fixed_time_a_zip_can_hold(project: Path, tmp_path: Path) -> None:
    """Every file and folder of the build context is dated 2000-01-01 UTC: the same inputs
    give the same context, and a wheel zipped from them (``pip install .``) can hold the
    date (a ZIP entry cannot be older than 1980-01-01, in any time zone)."""
    import io
    import tarfile
    import zipfile

    baseline, _ = build_baseline(project)
    files = list(envmod.read_blobs(baseline, select_inputs(baseline, ["src", "tools"])))
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    context = envmod.build_context("FROM scratch\n", files, ca)
    assert context == envmod.build_context("FROM scratch\n", files, ca)
    with tarfile.open(fileobj=io.BytesIO(context)) as tar:
        members = tar.getmembers()
    staged = [m for m in members if m.name.startswith("stage/workspace/")]
    assert {m.name for m in staged} >= {
        "stage/workspace/src/pkg/core.py",
        "stage/workspace/tools/run.sh",
    }
    assert {m.mtime for m in members} == {envmod.STAGED_MTIME}
    assert envmod.STAGED_MTIME == 946_684_800
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        for m in staged:
            archive.writestr(zipfile.ZipInfo(m.name, time.gmtime(m.mtime)[:6]), b"")
