"""What a service costs a job: a job whose check needs a Redis service (built from Debian's
packages on the local base) against the same job without it, in the same run.

Both jobs run the engine end to end on a small repository with a scripted driver: one
``run_check`` of a check that runs ``true`` (the model's sandbox), then the model ends
without a change. Timed, interleaved, after a first job that builds every image:

- the job's time to its check's result (the sandbox ready, and with the service: the
  services network made, the service started and its ``ready`` command succeeded),
- the whole job (the sandbox and the service removed).

    python3 bench/bench_services.py [--runtime runc|runsc] [--runs 7] [--config FILE]

``--config``: a host configuration whose ``[network]`` lets the setup reach Debian's
package hosts (``setup_default``); the service image is built once through it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from common import fmt_ms, loadavg, make_repo, print_table
from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.jobs.engine import Job
from controller.jobs.request import JobRequest
from controller.providers.scripted import ScriptedProvider, parse_calls
from controller.sandbox.dockerclient import connect

REDIS: dict[str, Any] = {
    "build": {
        "setup": [
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "--no-install-recommends", "redis-server"],
        ]
    },
    "user": "redis",
    "command": ["redis-server", "--dir", "/tmp", "--appendonly", "no", "--protected-mode", "no"],
    "ready": {"argv": ["redis-cli", "ping"], "timeout_seconds": 30},
}
CALLS = '{"turns": [[{"id": "c1", "name": "run_check", "arguments": {"checkId": "t"}}]]}'


def _task(services: dict[str, Any]) -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "prompt": "bench",
            "baseline_checks": False,
            "checks": {"t": {"argv": ["true"], "required": False}},
            "environment": {"setup": [["true"]], "services": services},
        }
    )


def _one(config: HostConfig, repo: Path, task: TaskSpec, runtime: str) -> tuple[float, float]:
    """(seconds to the check's result, seconds of the whole job)."""
    marks: dict[str, float] = {}
    started = time.perf_counter()

    def progress(message: str) -> None:
        if message.startswith("turn 1 run_check"):  # the check's result came back
            marks.setdefault("check", time.perf_counter())

    request = JobRequest(
        repo=repo,
        task=task,
        provider=ScriptedProvider(parse_calls(CALLS)),
        config=config,
        runtime="runsc" if runtime == "runsc" else "runc",
    )
    job = Job(connect(), request, progress=progress)
    job.run()
    ended = time.perf_counter()
    if job.record.state != "no_change":
        msg = f"the bench job ended {job.record.state}: {job.record.error}"
        raise SystemExit(msg)
    return marks.get("check", ended) - started, ended - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args()
    network = tomllib.loads(args.config.read_text()).get("network", {})
    config = HostConfig.model_validate({"spare_sandboxes": 0, "network": network})
    with tempfile.TemporaryDirectory() as folder:
        repo = make_repo(Path(folder) / "repo", {"a.txt": "a\n"})
        plain, served = _task({}), _task({"cache": REDIS})
        _one(config, repo, served, args.runtime)  # builds the images
        _one(config, repo, plain, args.runtime)
        without: list[tuple[float, float]] = []
        with_service: list[tuple[float, float]] = []
        for _ in range(args.runs):
            without.append(_one(config, repo, plain, args.runtime))
            with_service.append(_one(config, repo, served, args.runtime))

    def med(values: list[tuple[float, float]], i: int) -> float:
        return statistics.median(v[i] for v in values)

    print(f"\nruntime {args.runtime}; {args.runs} runs each, interleaved; load {loadavg()}")
    print_table(
        ["what", "median", "min", "max"],
        [
            ["to the check's result, no service (reference)", fmt_ms(med(without, 0)),
             fmt_ms(min(v[0] for v in without)), fmt_ms(max(v[0] for v in without))],
            ["to the check's result, one Redis service ready", fmt_ms(med(with_service, 0)),
             fmt_ms(min(v[0] for v in with_service)), fmt_ms(max(v[0] for v in with_service))],
            ["ratio (median)", f"{med(with_service, 0) / med(without, 0):.2f}", "", ""],
            ["whole job, no service (reference)", fmt_ms(med(without, 1)),
             fmt_ms(min(v[1] for v in without)), fmt_ms(max(v[1] for v in without))],
            ["whole job, one Redis service", fmt_ms(med(with_service, 1)),
             fmt_ms(min(v[1] for v in with_service)), fmt_ms(max(v[1] for v in with_service))],
            ["ratio (median)", f"{med(with_service, 1) / med(without, 1):.2f}", "", ""],
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
