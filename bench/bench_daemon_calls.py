"""Every Docker API request of one job's whole life, counted and listed.

The job is the one of the issue's concurrency figure: read a file, replace a line, one
required check (``patchbox run`` through the CLI, in this process: ``controller.cli.main``'s
``main``). Each HTTP request docker-py sends (every one goes through its ``APIClient``, a
``requests.Session``) is recorded, method and path, ids and names replaced by placeholders,
from the command's start to its exit. Two ways: spares off (``spare_sandboxes = 0``), and
with the default spare (the second of two jobs in a row on one repository: it claims the
spare the first offered and offers one for the next). The reference, counted the same way:
the requests of a bare ``docker run --rm`` of the same image through docker-py (create,
start, wait, remove) for each container the job runs.

    python3 bench/bench_daemon_calls.py
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests

from common import loadavg, make_repo, print_table

HEX = re.compile(r"\b[0-9a-f]{64}\b|\b[0-9a-f]{12}\b")
NAMES = re.compile(r"patchbox-[A-Za-z0-9_.-]+")
TASK = {
    "prompt": "Capitalize the greeting.",
    "checks": {"greet": {"argv": ["python3", "check.py"], "timeout_seconds": 60}},
    "baseline_checks": False,
    "limits": {"memory_mb": 512, "workspace_mb": 64, "tmp_mb": 32, "wall_seconds": 120},
}
FILES = {
    "app.py": 'def greet(name):\n    return "hello " + name\n',
    "check.py": (
        "import sys\nfrom app import greet\nsys.exit(0 if greet('x') == 'Hello x' else 1)\n"
    ),
}
READ = {"name": "read_file", "arguments": {"path": "app.py"}}
EDIT = {
    "name": "replace_text",
    "arguments": {"path": "app.py", "oldText": '"hello "', "newText": '"Hello "'},
}
CALLS = {"turns": [[{"id": "c1", **READ}], [{"id": "c2", **EDIT}]], "final": "done"}


def normal(method: str, url: str) -> str:
    """``METHOD /path`` without the API version, the query, ids or names."""
    path = url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
    path = re.sub(r"^v1\.\d+/", "", path)
    path = NAMES.sub("{name}", HEX.sub("{id}", path))
    return f"{method} /{path}"


@contextlib.contextmanager
def counting() -> Iterator[list[str]]:
    """Records each request docker-py sends, as :func:`normal` writes it."""
    seen: list[str] = []
    original = requests.Session.send

    def send(self: requests.Session, request: Any, **kwargs: Any) -> Any:
        seen.append(normal(str(request.method), str(request.url)))
        return original(self, request, **kwargs)

    requests.Session.send = send  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        requests.Session.send = original  # type: ignore[method-assign]


def one_job(
    scratch: Path, config: str, tag: str, repo: Path | None = None
) -> tuple[int, list[str]]:
    """One job on ``repo`` (default: a new one) through the CLI's ``main``, counted."""
    from controller.cli.main import main
    from controller.sandbox import dockerclient

    dockerclient._versions.clear()  # noqa: SLF001 - each job counted as in a process of its own
    folder = scratch / tag
    folder.mkdir()
    repo = repo or make_repo(folder / "repo", FILES)
    (folder / "task.json").write_text(json.dumps(TASK))
    (folder / "calls.json").write_text(json.dumps(CALLS))
    (folder / "config.toml").write_text(config)
    argv = ["run", "--repo", str(repo), "--task", str(folder / "task.json")]
    argv += ["--calls", str(folder / "calls.json"), "--config", str(folder / "config.toml")]
    with counting() as seen, Path("/dev/null").open("w") as null, contextlib.redirect_stdout(null):
        code = main([*argv, "--json", "--quiet"])
    return code, seen


def bare_run(image: str) -> list[str]:
    import docker

    client = docker.from_env()
    with counting() as seen:
        client.containers.run(image, ["true"], entrypoint=[], network_mode="none", remove=True)
    client.close()
    return seen


def main() -> int:
    import os

    from controller.sandbox.image import ImageBuilder

    print(f"load average at the start: {loadavg()}")
    with tempfile.TemporaryDirectory(prefix="pbx-calls-") as tmp:
        scratch = Path(tmp)
        os.environ["PATCHBOX_HOME"] = str(scratch / "home")
        import docker

        image = ImageBuilder(docker.from_env()).ensure().tag
        cold_code, cold = one_job(scratch, "spare_sandboxes = 0\n", "cold")
        warm_config = "spare_sandboxes = 1\nspare_idle_seconds = 600\n"
        one_job(scratch, warm_config, "first", make_repo(scratch / "repo", FILES))
        warm_code, warm = one_job(scratch, warm_config, "warm", scratch / "repo")
        bare = bare_run(image)
        from controller.api.jobs import remove_spares

        remove_spares()  # the spare the last job offered (this run's state directory only)
    print(f"load average at the end: {loadavg()}; exit codes {cold_code}, {warm_code}")
    rows = []
    for what, calls in (("spares off", cold), ("with a spare (2nd job)", warm)):
        rows.append([what, str(len(calls)), str(len(calls) - 2 * len(bare))])
    rows.append(["bare docker run --rm (docker-py)", str(len(bare)), "-"])
    print_table(["what", "API requests", "beyond 2 bare runs"], rows)
    for what, calls in (("spares off", cold), ("with a spare", warm)):
        print(f"\n{what}: requests in order (count x request)")
        grouped: list[list[Any]] = []
        for call in calls:
            if grouped and grouped[-1][1] == call:
                grouped[-1][0] += 1
            else:
                grouped.append([1, call])
        for count, call in grouped:
            print(f"  {count:>3} x {call}")
        totals = collections.Counter(calls)
        print(f"  distinct: {len(totals)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
