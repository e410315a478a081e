"""The exception tree (controller/errors.py), an error as data (controller/errorinfo.py) and
the one mapping of third-party errors (controller/errormap.py)."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys

import docker.errors
import httpx
import pytest
import requests
from pydantic import BaseModel, ValidationError

from controller import errors
from controller.errormap import describe_validation, map_error, map_git_error, mapped_class
from controller.errors import (
    ErrorCode,
    ExitCode,
    GitError,
    InternalError,
    PatchboxError,
    ProviderError,
    SandboxError,
    TransientProviderError,
    exit_code_for_error,
)
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
THIRD_PARTY = ("docker", "httpx", "requests")


def _bare(cls: type[BaseException]) -> BaseException:
    """An instance without calling a constructor that wants a response or a request."""
    exc = cls.__new__(cls)
    BaseException.__init__(exc, "boom")
    return exc


def _caught_third_party() -> set[type[BaseException]]:
    """Every docker-py, requests or httpx exception class an ``except`` in controller/ names."""
    found: set[type[BaseException]] = set()
    for path in (ROOT / "controller").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ExceptHandler) or node.type is None:
                continue
            names = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            for name in names:
                dotted = ast.unparse(name)
                if not dotted.startswith(THIRD_PARTY):
                    continue
                module, _, attr = dotted.rpartition(".")
                found.add(getattr(importlib.import_module(module), attr))
    return found


def _library_errors() -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for module in (docker.errors, httpx):
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__.startswith(
                ("docker.", "httpx")
            ):
                found.add(value)
    return found


def test_every_caught_third_party_error_is_mapped() -> None:
    caught = _caught_third_party()
    assert docker.errors.APIError in caught  # the scan sees the edges
    unmapped = sorted(c.__qualname__ for c in caught if mapped_class(_bare(c)) is None)
    assert unmapped == []


def test_every_docker_and_httpx_error_is_mapped() -> None:
    unmapped = sorted(
        f"{c.__module__}.{c.__qualname__}"
        for c in _library_errors()
        if mapped_class(_bare(c)) is None
    )
    assert unmapped == []


@pytest.mark.parametrize(
    ("exc", "ours", "code"),
    [
        (docker.errors.APIError("x", explanation="no such image"), SandboxError, "SANDBOX_FAILED"),
        (docker.errors.ImageNotFound("x"), SandboxError, "SANDBOX_FAILED"),
        (docker.errors.DockerException("x"), SandboxError, "SANDBOX_FAILED"),
        (requests.ConnectionError("x"), SandboxError, "SANDBOX_FAILED"),
        (httpx.ReadTimeout("x"), TransientProviderError, "PROVIDER_ERROR"),
        (httpx.ConnectError("x"), TransientProviderError, "PROVIDER_ERROR"),
        (httpx.RemoteProtocolError("x"), ProviderError, "PROVIDER_ERROR"),
        (ValueError("x"), InternalError, "INTERNAL_ERROR"),
    ],
)
def test_map_error(exc: BaseException, ours: type[PatchboxError], code: str) -> None:
    mapped = map_error(exc, "doing")
    assert type(mapped) is ours
    assert mapped.code == code
    assert mapped.message.startswith("doing: ")


def test_map_error_keeps_ours_and_says_what_docker_said() -> None:
    own = SandboxError("mine")
    assert map_error(own, "doing") is own
    api = docker.errors.APIError("x", explanation="conflict: name in use")
    assert map_error(api, "cannot create").message == "cannot create: conflict: name in use"


def test_map_error_scrubs_before_it_cuts() -> None:
    secret = "sk-" + "s" * 200
    mapped = map_error(
        httpx.ConnectError(f"{'x' * 100} {secret}"), scrub=lambda t: t.replace(secret, "[r]")
    )
    assert "sk-" not in mapped.message
    assert "[r]" in mapped.message


def test_map_git_error() -> None:
    assert "not installed" in map_git_error(FileNotFoundError("git"), "status").message
    slow = map_git_error(subprocess.TimeoutExpired(["git"], 2.5), "status")
    assert isinstance(slow, GitError)
    assert slow.message == "git status did not finish in 2.5 s"


def test_the_tree_names_every_subclass_and_all_live_here() -> None:
    doc = errors.__doc__ or ""
    ours = [
        v
        for _, v in inspect.getmembers(errors, inspect.isclass)
        if issubclass(v, PatchboxError) and v is not PatchboxError
    ]
    assert all(c.__module__ == "controller.errors" for c in ours)
    missing = sorted(c.__name__ for c in ours if f"+-- {c.__name__} " not in doc)
    assert missing == []
    names = (PatchboxError.__name__, *(c.__name__ for c in ours))
    elsewhere = [
        f"{path.relative_to(ROOT)}:{node.name}"
        for path in (ROOT / "controller").rglob("*.py")
        if path.name != "errors.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(b).endswith(names) for b in node.bases)
    ]
    assert elsewhere == []


def test_the_exception_tree_imports_no_pydantic() -> None:
    """errors.py is the ground floor: importing it loads no data model (pydantic)."""
    code = "import sys, controller.errors; print(sorted(m for m in sys.modules if 'pydantic' in m))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert proc.stdout.strip() == "[]"
    info = errors.UsageError("bad").info()
    assert (info.code, info.message, info.hint) == ("USAGE_ERROR", "bad", None)


def test_exit_codes() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 5, 70]
    assert ErrorCode.INTERNAL_ERROR == "INTERNAL_ERROR"
    by_code = {code: exit_code_for_error(code) for code in ErrorCode}
    assert by_code.pop(ErrorCode.USAGE_ERROR) is ExitCode.USAGE
    assert by_code.pop(ErrorCode.NOT_A_REPOSITORY) is ExitCode.USAGE
    assert by_code.pop(ErrorCode.ENVIRONMENT_NOT_READY) is ExitCode.NOT_READY
    assert by_code.pop(ErrorCode.EGRESS_NOT_ALLOWED) is ExitCode.USAGE
    assert by_code.pop(ErrorCode.EGRESS_UNAVAILABLE) is ExitCode.NOT_READY
    assert by_code.pop(ErrorCode.PROVIDER_ERROR) is ExitCode.PROVIDER
    assert by_code.pop(ErrorCode.MODEL_TOOL_CALL_UNSUPPORTED) is ExitCode.PROVIDER
    assert by_code.pop(ErrorCode.NO_CHANGE) is ExitCode.NO_CHANGE
    assert by_code.pop(ErrorCode.INTERNAL_ERROR) is ExitCode.INTERNAL
    for code in ("SIGNING_KEY_MISSING", "SIGNING_KEY_INVALID", "SIGNING_KEY_EXISTS"):
        assert by_code.pop(ErrorCode(code)) is ExitCode.USAGE
    assert by_code.pop(ErrorCode.VERIFY_INPUT_INVALID) is ExitCode.USAGE
    assert by_code.pop(ErrorCode.VERIFY_FAILED) is ExitCode.FAILED
    assert set(by_code.values()) == {ExitCode.FAILED}


class _Model(BaseModel):
    name: str
    size: int


def test_describe_validation_names_fields_never_values() -> None:
    with pytest.raises(ValidationError) as info:
        _Model.model_validate({"name": 5, "size": "sekrit"})
    text = describe_validation(info.value, subject="model")
    assert text.startswith("name: ")
    assert "size: " in text
    assert "sekrit" not in text
    renamed = describe_validation(info.value, subject="model", names={"size": "SIZE_ENV"})
    assert "SIZE_ENV: " in renamed
