"""``patchbox serve`` says what it loaded before it listens: the configuration file, the
store, the workers, each tenant (name, how many repository roots, allow_apply) and the
provider (API, endpoint host, model, whether a key is set), and never a key, a token, a
token's hash or the path of the provider's URL. A real ``patchbox serve`` process (no
worker runs a job, so no daemon is needed)."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from controller.config.host import load_config
from controller.service.config import load_service_config
from controller.service.startup import startup_lines
from tests.support.paths import REPO_ROOT
from tests.support.service import METRICS_TOKEN, TOKENS, write_config

KEY = "sk-startup-secret-424242"
ROUTE = "route-with-a-secret-7"
PROVIDER = f"""
[provider]
api = "responses"
base_url = "http://host.docker.internal:11434/{ROUTE}/v1"
model = "local-model"
api_key = "{KEY}"
allow_insecure_http_hosts = ["host.docker.internal"]
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_until_healthy(config: Path, env: dict[str, str]) -> str:
    """Starts ``patchbox serve``, waits for ``/healthz``, stops it with SIGTERM; its stderr."""
    port = free_port()
    argv = [sys.executable, "-m", "controller", "serve", "--config", str(config)]
    process = subprocess.Popen(
        [*argv, "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[1][-2000:]
                assert time.monotonic() < deadline, "patchbox serve did not start"
                time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return err


def secrets_of(config: Path) -> list[str]:
    tokens = [TOKENS["alpha"], TOKENS["beta"]]  # the tenants write_config configures
    hashes = [hashlib.sha256(t.encode()).hexdigest() for t in [*tokens, METRICS_TOKEN]]
    assert all(h in config.read_text() for h in hashes)
    return [KEY, ROUTE, *tokens, METRICS_TOKEN, *hashes]


def test_serve_prints_what_it_loaded_and_no_secret(tmp_path: Path) -> None:
    (tmp_path / "beta-more").mkdir()
    config = write_config(tmp_path, workers=0, host=PROVIDER)
    one = f'repo_roots = ["{tmp_path / "beta"}"]'
    two = f'repo_roots = ["{tmp_path / "beta"}", "{tmp_path / "beta-more"}"]'
    config.write_text(config.read_text().replace(one, two))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PATCHBOX_"))}
    env["PATCHBOX_HOME"] = str(tmp_path / "home")
    err = serve_until_healthy(config, env)
    lines = [line for line in err.splitlines() if line.startswith("patchbox serve: ")]
    assert lines == [
        f"patchbox serve: configuration: {config}",
        f"patchbox serve: store: sqlite {tmp_path / 'service.db'}",
        f"patchbox serve: data: {tmp_path / 'service-data'}",
        "patchbox serve: workers: 0",
        "patchbox serve: tenants: 2",
        "patchbox serve: tenant alpha: 1 repository root, allow_apply true",
        "patchbox serve: tenant beta: 2 repository roots, allow_apply false",
        "patchbox serve: metrics: per tenant with the operator's token",
        (
            "patchbox serve: provider: responses at http://host.docker.internal:11434, "
            "model local-model, key set"
        ),
    ], err[-3000:]
    assert "Application startup complete" in err  # the summary came before it listened
    assert err.index("patchbox serve: provider") < err.index("Application startup complete")
    for secret in secrets_of(config):
        assert secret not in err


def test_a_provider_that_is_not_usable_is_said_without_its_key(tmp_path: Path) -> None:
    """A key over plain http to a host not named: the service still starts (jobs with calls
    run), and its summary says why no provider is usable, without the key."""
    refused = PROVIDER.replace('allow_insecure_http_hosts = ["host.docker.internal"]\n', "")
    config = write_config(tmp_path, workers=0, host=refused)
    host, service = load_service_config(config)
    lines = startup_lines(config, host, service)
    assert lines[-1].startswith("provider: none usable (")
    assert "only over https" in lines[-1]
    assert "allow_insecure_http_hosts" in lines[-1]
    for secret in secrets_of(config):
        assert all(secret not in line for line in lines)
    # No [provider] table and no variables: none configured.
    bare = write_config(tmp_path / "bare", workers=0)
    host, service = load_service_config(bare)
    assert startup_lines(None, host, service)[0].startswith("configuration: ")
    assert startup_lines(bare, host, service)[-1].startswith("provider: none usable (no model")


def test_the_cli_commands_take_a_file_with_a_service_table(tmp_path: Path) -> None:
    """docs/service.md: one file can hold the service's table and the host configuration;
    the CLI's commands read the host configuration and leave the table to ``serve``."""
    config = write_config(tmp_path, workers=0, host=PROVIDER)
    loaded = load_config(config)
    assert loaded.spare_sandboxes == 0
    assert loaded.provider["model"] == "local-model"
    assert "tenants" in loaded.service
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PATCHBOX_"))}
    env["PATCHBOX_HOME"] = str(tmp_path / "home")
    argv = [sys.executable, "-m", "controller", "run", "--repo", str(tmp_path)]
    missing = str(tmp_path / "no-task.json")
    done = subprocess.run(
        [*argv, "--task", missing, "--config", str(config), "--json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "no-task.json" in done.stdout  # the task is what is wrong, not the configuration
    assert "configuration file" not in done.stdout
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(config.read_text().replace("spare_sandboxes = 0", "spare_sandbox = 0"))
    done = subprocess.run(
        [*argv, "--task", missing, "--config", str(wrong), "--json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "spare_sandbox" in done.stdout


def test_the_documented_lines_are_the_ones_it_prints(tmp_path: Path) -> None:
    """docs/service.md's example has the lines ``startup_lines`` makes, in its order."""
    doc = (REPO_ROOT / "docs" / "service.md").read_text()
    block = doc.split("**What it loaded.**", 1)[1].split("```\n", 2)[1]
    documented = [line.removeprefix("patchbox serve: ") for line in block.splitlines()]
    config = write_config(tmp_path, workers=0, host=PROVIDER)
    host, service = load_service_config(config)
    made = startup_lines(config, host, service)
    made = [line for line in made if not line.startswith("tenant beta")]
    assert [line.split(":", 1)[0] for line in documented] == [
        line.split(":", 1)[0] for line in made
    ]
    assert all(line.startswith("patchbox serve: ") for line in block.splitlines())
