"""Variables that run code or carry a secret, given where a task, a check, the host
configuration or the repository's suggested checks set variables: each is refused with
``USAGE_ERROR`` naming the variable and never its value, from the CLI and over HTTP, before
anything starts. An environment image built with variables keeps their values out of its
labels and out of ``patchbox env list`` / ``env show``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from controller.config.checks import read_repo_checks
from controller.config.environment import EnvironmentSpec
from controller.config.fields import CODE_VARIABLES, check_env_names
from controller.config.host import load_config
from controller.config.task import CheckSpec, TaskSpec
from controller.errormap import describe_validation
from controller.errors import UsageError
from controller.logs import SECRET_NAME
from controller.sandbox import envimages
from controller.sandbox import environment as envmod
from tests.support.jobs import make_repo
from tests.support.service import CALLS, TASK, serving, write_config

REFUSED_CODE = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "LD_DEBUG_OUTPUT",
    "BASH_ENV",
    "ENV",
    "ZDOTDIR",
    "PROMPT_COMMAND",
    "PS4",
    "SHELLOPTS",
    "BASHOPTS",
    "IFS",
    "BASH_FUNC_X",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_KEY_0",
    "GIT_CONFIG_VALUE_0",
    "GIT_CONFIG",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_PROXY_COMMAND",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
    "GIT_EXEC_PATH",
    "GIT_EXTERNAL_DIFF",
    "GIT_TEMPLATE_DIR",
    "GIT_DIR",
    "GIT_EDITOR",
    "GIT_PAGER",
    "GIT_SSL_NO_VERIFY",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONINSPECT",
    "PYTHONUSERBASE",
    "PYTHONPLATLIBDIR",
    "PYTHONBREAKPOINT",
    "PERL5OPT",
    "PERL5DB",
    "RUBYOPT",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "HOME",
    "XDG_CONFIG_HOME",
    "GCONV_PATH",
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "BROWSER",
    "LESSOPEN",
    "LESSCLOSE",
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
]
CODE = "makes programs load or run other code and is refused"
BY_NAME = "looks like a secret or a proxy and is refused"

REFUSED: list[tuple[str, str, str]] = [
    *[(name, "/workspace/payload-v4lue", CODE) for name in REFUSED_CODE],
    ("PGPASS", "hunter2-v4lue", BY_NAME),
    ("DB_PASS", "hunter2-v4lue", BY_NAME),
    ("SMTP_PASS_FILE", "hunter2-v4lue", BY_NAME),
    ("MYSQL_PWD", "hunter2-v4lue", BY_NAME),
    ("GPG_PASSPHRASE", "hunter2-v4lue", BY_NAME),
    ("REDIS_PW", "hunter2-v4lue", BY_NAME),
    ("GH_PAT", "hunter2-v4lue", BY_NAME),
    ("AWS_CREDS", "hunter2-v4lue", BY_NAME),
    ("API_TOKEN", "hunter2-v4lue", BY_NAME),
    ("HTTPS_PROXY", "http://proxy:3128", BY_NAME),
    (
        "DATABASE_URL",
        "postgres://app:hunter2-v4lue@db:5432/test",
        "holds a URL with a password (scheme://user:password@host)",
    ),
    (
        "CACHE",
        "redis://:hunter2-v4lue@cache:6379/0",
        "holds a URL with a password",
    ),
    (
        "MIRROR",
        "pip install -i https://user:hunter2-v4lue@pypi.example/simple",
        "holds a URL with a password",
    ),
    (
        "REPO_URL",
        "https://ghp_hunter2v4lue@github.example/o/r.git",
        "holds an http(s) URL with a user name",
    ),
    ("PG_DSN", "host=db user=app password=hunter2-v4lue", "holds a credential (password=...)"),
    ("ODBC", "Server=db;Uid=app;Pwd=hunter2-v4lue;", "holds a credential (pwd=...)"),
    (
        "STORAGE",
        "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=hunter2-v4lue",
        "holds a credential (accountkey=...)",
    ),
    ("BLOB", "https://a.example/c/b?sv=1&sig=hunter2-v4lue", "holds a credential (sig=...)"),
    ("HOOK", "https://hooks.example/x?token=hunter2-v4lue", "holds a credential (token=...)"),
    ("NODE_OPTIONS", "--require /workspace/payload-v4lue.js", "the option --require"),
    ("NODE_OPTIONS", "-r ./payload-v4lue.js", "the option -r"),
    ("NODE_OPTIONS", "--import=./payload-v4lue.mjs", "the option --import"),
    (
        "NODE_OPTIONS",
        "--max-old-space-size=4096 --experimental-loader ./payload-v4lue.mjs",
        "the option --experimental-loader",
    ),
    ("NODE_OPTIONS", "--openssl-config=/workspace/payload-v4lue.cnf", "the option --openssl"),
]
"""(name, value, what the refusal says): every value holds ``v4lue``, which no message may."""

ACCEPTED = {
    "PATH": "/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin",
    "PYTHONPATH": "src",
    "PYTHONWARNINGS": "error::DeprecationWarning",
    "NODE_OPTIONS": "--max-old-space-size=4096 --enable-source-maps",
    "NODE_PATH": "lib",
    "PERL5LIB": "lib",
    "RUBYLIB": "lib",
    "CLASSPATH": "build/classes",
    "MAVEN_OPTS": "-Xmx1g",
    "GOFLAGS": "-mod=vendor",
    "GIT_AUTHOR_NAME": "ci",
    "GIT_COMMITTER_EMAIL": "ci@example.org",
    "GIT_SSL_CAINFO": "/etc/ssl/certs/ca-certificates.crt",
    "GIT_TERMINAL_PROMPT": "0",
    "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
    "PIP_INDEX_URL": "https://pypi.example/simple",
    "DATABASE_URL": "postgres://app@db:5432/test",
    "UPSTREAM": "ssh://git@git.example/o/r.git",
    "PYTEST_ADDOPTS": "-k 'not slow' -p no:cacheprovider",
    "XDG_CACHE_HOME": "/tmp/cache",
    "PWD": "/workspace",
    "TZ": "UTC",
    "PASSES": "3",
}
"""Variables projects set for their checks and builds."""


def _task_check(env: dict[str, str]) -> str:
    with pytest.raises(ValidationError) as info:
        TaskSpec.model_validate({"prompt": "p", "checks": {"c": {"argv": ["true"], "env": env}}})
    return describe_validation(info.value, subject="task")


def _task_environment(env: dict[str, str]) -> str:
    with pytest.raises(ValidationError) as info:
        TaskSpec.model_validate({"prompt": "p", "environment": {"env": env}})
    return describe_validation(info.value, subject="task")


def _host(table: str, env: dict[str, str], folder: Path) -> str:
    lines = [f"[{table}]"]
    if table.startswith("checks"):
        lines.append('argv = ["true"]')
    lines.append(f"[{table}.env]")
    lines += [f"{name} = {json.dumps(value)}" for name, value in env.items()]
    path = folder / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError) as info:
        load_config(path)
    return str(info.value)


def _repo_checks(env: dict[str, str], folder: Path) -> str:
    (folder / ".patchbox").mkdir(parents=True, exist_ok=True)
    checks = {"c": {"argv": ["true"], "env": env}}
    (folder / ".patchbox" / "checks.json").write_text(json.dumps(checks))
    with pytest.raises(UsageError) as info:
        read_repo_checks(folder)
    return str(info.value)


PLACES: dict[str, Callable[[dict[str, str], Path], str]] = {
    "task check": lambda env, _folder: _task_check(env),
    "task environment": lambda env, _folder: _task_environment(env),
    "host check": lambda env, folder: _host("checks.c", env, folder),
    "host environment": lambda env, folder: _host("environments.e", env, folder),
    "repository check": _repo_checks,
}


@pytest.mark.parametrize(("name", "value", "says"), REFUSED)
@pytest.mark.parametrize("place", sorted(PLACES))
def test_a_variable_that_runs_code_or_holds_a_secret_is_refused_where_variables_are_set(
    name: str, value: str, says: str, place: str, tmp_path: Path
) -> None:
    message = PLACES[place]({name: value}, tmp_path)
    assert f"environment variable {name} " in message
    assert says in message
    assert "v4lue" not in message


def test_the_variables_projects_set_pass_everywhere(tmp_path: Path) -> None:
    check_env_names(ACCEPTED)
    check_env_names(dict.fromkeys(envmod.CA_VARIABLES, "/etc/ca.pem"))  # env may set each
    spec = EnvironmentSpec(env=ACCEPTED)
    assert spec.env == ACCEPTED
    assert CheckSpec(argv=["true"], env=ACCEPTED).environment()["PYTHONPATH"] == "src"
    (tmp_path / "config.toml").write_text(
        "[environments.e.env]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in ACCEPTED.items())
    )
    assert load_config(tmp_path / "config.toml").environments["e"].env == ACCEPTED
    assert not any(SECRET_NAME.search(name) for name in ("PWD", "OLDPWD", "PASSES", "PATH"))
    assert "PATH" not in CODE_VARIABLES


def test_the_service_refuses_a_code_variable_or_a_password_url_naming_it(
    tmp_path: Path,
) -> None:
    with serving(write_config(tmp_path, workers=0)) as running:
        alpha = running.client("alpha")
        db = Path(running.service.config.database_path())
        repo = make_repo(db.parent / "alpha" / "repo")
        for env, name in (
            ({"BASH_ENV": "/workspace/x-v4lue.sh"}, "BASH_ENV"),
            ({"DATABASE_URL": "postgres://a:pw-v4lue@db/x"}, "DATABASE_URL"),
        ):
            task = {**TASK, "environment": {"env": env}}
            response = alpha.post(
                "/v1/jobs", json={"repo": str(repo), "task": task, "calls": CALLS}
            )
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "USAGE_ERROR"
            assert f"environment variable {name} " in error["message"]
            assert "v4lue" not in response.text
        assert alpha.get("/v1/jobs").json() == {"jobs": []}


# -- labels hold names only ------------------------------------------------------------------


def test_an_old_label_with_values_is_shown_with_names_only() -> None:
    labels = {envmod.LABEL_SPEC: json.dumps({"env": {"B": "v4lue", "A": "x"}})}
    image = SimpleNamespace(
        id="sha256:" + "0" * 64,
        tags=["patchbox-env:0123456789abcdef"],
        attrs={"Config": {"Labels": labels}},
    )
    assert envimages.describe(image)["spec"]["env"] == ["A", "B"]
    spec = EnvironmentSpec(env={"MODE": "v4lue"}, setup=[["true"]])
    label = envmod.label_spec(spec)
    assert label["env"] == ["MODE"]
    assert "v4lue" not in json.dumps(label)
