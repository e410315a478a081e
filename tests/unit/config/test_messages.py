"""What a wrong task file or host configuration is told: an unknown key gets the closest
known name, a value of the wrong type the form expected (with an example for the usual
fields, in the file's own syntax), every path in the user's own field names (a union's
internal tag never shows), and never a value."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controller.config.checks import read_repo_checks
from controller.config.host import load_config
from controller.config.task import task_from
from controller.errors import UsageError
from controller.providers.scripted import parse_calls
from controller.service.config import load_service_config


def task_error(data: dict[str, Any]) -> str:
    with pytest.raises(UsageError) as caught:
        task_from(json.dumps(data))
    return caught.value.message


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ({"alowed_paths": ["src/"]}, "alowed_paths: unknown key; did you mean 'allowed_paths'?"),
        ({"chekcs": {}}, "chekcs: unknown key; did you mean 'checks'?"),
        (
            {"checks": {"t": {"argv": ["pytest"], "timout_seconds": 3}}},
            "checks.t.timout_seconds: unknown key; did you mean 'timeout_seconds'?",
        ),
        (
            {"limits": {"memroy_mb": 512}},
            "limits.memroy_mb: unknown key; did you mean 'memory_mb'?",
        ),
        ({"environment": {"bse": "debian"}}, "environment.bse: unknown key; did you mean 'base'?"),
        (
            {"qwerty": 1},
            (
                "qwerty: unknown key (known keys: allowed_paths, baseline_checks, checks, environment, "
                "limits, mode, prompt)"
            ),
        ),
    ],
)
def test_an_unknown_key_gets_the_closest_name(task: dict[str, Any], expected: str) -> None:
    message = task_error({"prompt": "p", **task})
    assert message == f"the task is invalid: {expected}"


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        (
            {"checks": {"t": {"argv": "pytest -q"}}},
            'checks.t.argv: expected a list of strings, e.g. "argv": ["pytest", "-q"]',
        ),
        (
            {"allowed_paths": "src/"},
            'allowed_paths: expected a list of strings, e.g. "allowed_paths": ["src/", "tests/"]',
        ),
        (
            {"environment": {"setup": "make"}},
            "environment.setup: expected a list of lists of strings, e.g.",
        ),
        ({"environment": 5}, "environment: expected a string or an object"),
        ({"limits": {"memory_mb": "512"}}, "limits.memory_mb: expected a whole number"),
        ({"checks": []}, "checks: expected an object"),
        ({"checks": {"t": {"argv": ["x"], "required": "yes"}}}, "required: expected true or false"),
    ],
)
def test_a_type_error_says_the_form_expected(task: dict[str, Any], expected: str) -> None:
    message = task_error({"prompt": "p", **task})
    assert expected in message
    assert "inline" not in message
    assert "Input should be" not in message


def test_no_value_is_echoed() -> None:
    message = task_error({"prompt": "p", "checks": {"t": {"argv": "sk-SECRET-VALUE"}}})
    assert "SECRET" not in message


@pytest.mark.parametrize(
    ("load", "toml", "expected"),
    [
        (load_config, "alow_auto = true\n", "alow_auto: unknown key; did you mean 'allow_auto'?"),
        (
            load_config,
            '[checks.t]\nargv = "pytest"\n',
            'checks.t.argv: expected a list of strings, e.g. argv = ["pytest", "-q"]',
        ),
        (
            load_config,
            '[environments.py]\nbse = "debian"\n',
            "environments.py.bse: unknown key; did you mean",
        ),
        (
            load_config,
            'protected = "x"\n',
            "protected: expected a list of strings, e.g. protected = [",
        ),
        (
            load_service_config,
            "[service]\nworkerz = 2\n",
            "[service] fields: workerz: unknown key; did you mean",
        ),
        (
            load_service_config,
            '[service]\nworkers = "x"\n',
            "[service] fields: workers: expected a whole number",
        ),
        (
            load_service_config,
            "alow_auto = true\n",
            "alow_auto: unknown key; did you mean 'allow_auto'?",
        ),
    ],
)
def test_the_host_and_service_configuration_in_toml_words(
    tmp_path: Path, load: Callable[[Path], object], toml: str, expected: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(toml)
    with pytest.raises(UsageError) as caught:
        load(path)
    assert expected in caught.value.message


def test_a_calls_file_too() -> None:
    with pytest.raises(UsageError) as caught:
        parse_calls('{"turns": [], "fnial": "done"}')
    assert "fnial: unknown key; did you mean 'final'?" in caught.value.message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"tests": {"argvv": ["x"]}}, "tests.argvv: unknown key; did you mean 'argv'?"),
        (
            {"tests": {"argv": "pytest"}},
            'tests.argv: expected a list of strings, e.g. "argv": ["pytest", "-q"]',
        ),
        (
            {"tests": {"argv": ["x"], "timeout_second": 3}},
            "tests.timeout_second: unknown key; did you mean 'timeout_seconds'?",
        ),
    ],
)
def test_a_repository_checks_file_too(tmp_path: Path, body: dict[str, Any], expected: str) -> None:
    (tmp_path / ".patchbox").mkdir()
    (tmp_path / ".patchbox" / "checks.json").write_text(json.dumps(body))
    with pytest.raises(UsageError) as caught:
        read_repo_checks(tmp_path)
    assert expected in caught.value.message


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("src/**", "'src/**' is a glob; name a file or a folder"),
        ("*.py", "'*.py' is a glob"),
        ("src/[ab].py", "is a glob"),
        ("/work/src/a.py", "use a path relative to the repository's top"),
        ("src/../../etc", "'..' and NUL are not allowed"),
    ],
)
def test_an_allowed_path_that_would_match_nothing_is_refused_in_plain_words(
    entry: str, words: str
) -> None:
    """``allowed_paths`` matches files and folders by prefix: a glob, an absolute path or
    ``..`` would refuse every write; each is refused when the task is read, in the
    validator's own words (no ``Value error,`` prefix)."""
    with pytest.raises(UsageError) as raised:
        task_from({"prompt": "p", "allowed_paths": [entry]})
    message = raised.value.message
    assert message.startswith("the task is invalid: allowed_paths.0: allowed_paths entry ")
    assert words in message
    assert "Value error" not in message
    assert task_from({"prompt": "p", "allowed_paths": ["src/", "a.py"]}).allowed_paths == [
        "src/",
        "a.py",
    ]
