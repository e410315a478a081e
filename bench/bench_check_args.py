"""An aimed check run against the whole suite, and what checking a call's arguments costs.

A generated project (``--files`` test modules of ``--tests`` tests each, every test a loop
of ``--work`` steps) goes into one sandbox. The check ``python3 -m pytest -q -p no:cacheprovider
{tests}`` runs through the tool executor as a model calls it: with no arguments (its
default, the whole suite: the reference) and aimed at one node, interleaved, each run
fresh (no reuse). Then the cost of a call's arguments on their own: the pure checks
(``check_values``), and the whole of it with the paths checked in the sandbox
(``check_arguments``, one ``check_paths`` round trip), beside a ``read_file`` call.

    python3 bench/bench_check_args.py [--runtime runc|runsc] [--files 20] [--tests 20]
        [--work 100000] [--runs 5] [--calls 500]
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import tarfile
import time

from common import fmt_ms, loadavg, percentile, print_table
from controller.config.checkargs import check_values
from controller.config.limits import Limits
from controller.config.task import CheckSpec
from controller.sandbox.base import Runtime, SandboxSpec
from controller.sandbox.docker import DockerSandbox
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder
from controller.sandbox.labels import current_identity, new_job_id
from controller.tools.executor import ToolExecutor, check_arguments

CHECK = CheckSpec.model_validate(
    {
        "argv": ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "{tests}"],
        "args": {"tests": {"kind": "pytest_node", "max": 20, "default": ["tests"]}},
        "timeout_seconds": 600,
    }
)
AIMED = {"tests": ["tests/test_m3.py::test_7"]}
PASSED = re.compile(r"(\d+) passed")


def project(files: int, tests: int, work: int) -> bytes:
    """A tar of the project: ``files`` modules of ``tests`` tests (a loop of ``work`` steps
    each)."""
    body = "".join(
        f"def test_{t}():\n    assert sum(i * i for i in range({work})) > {t}\n\n"
        for t in range(tests)
    )
    sources = {"pyproject.toml": "[tool.pytest.ini_options]\ntestpaths = ['tests']\n"}
    sources |= {f"tests/test_m{f}.py": body for f in range(files)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in sources.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def run(box: DockerSandbox, args: dict[str, list[str]] | None) -> tuple[float, int]:
    """One fresh run_check (a new executor: nothing reused): seconds, tests passed."""
    ex = ToolExecutor(box, checks={"tests": CHECK})
    raw: dict[str, object] = {"checkId": "tests", **({"args": args} if args else {})}
    started = time.perf_counter()
    done = ex.execute(1, "c", "run_check", raw)
    elapsed = time.perf_counter() - started
    if done.result is None:
        raise SystemExit(f"run_check refused: {done.error}")
    found = PASSED.findall(done.result["output"])
    return elapsed, int(found[-1]) if found else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--tests", type=int, default=20)
    parser.add_argument("--work", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    runtime: Runtime = args.runtime
    client = connect()
    image = ImageBuilder(client).ensure().tag
    spec = SandboxSpec(
        image=image,
        job_id=new_job_id(),
        runtime=runtime,
        limits=Limits(memory_mb=1024, workspace_mb=128, wall_seconds=3600),
    )
    whole: list[float] = []
    aimed: list[float] = []
    counts: set[tuple[int, int]] = set()
    pure: list[float] = []
    checked: list[float] = []
    reads: list[float] = []
    with DockerSandbox.start(client, spec, current_identity()) as box:
        box.put_archive(project(args.files, args.tests, args.work))
        run(box, AIMED)  # warm-up: the interpreter, pytest's import
        for _ in range(args.runs):
            w, nw = run(box, None)
            a, na = run(box, AIMED)
            whole.append(w)
            aimed.append(a)
            counts.add((nw, na))
        for _ in range(50):
            check_arguments(box, "tests", CHECK, AIMED)
        for _ in range(args.calls):
            started = time.perf_counter()
            check_values("tests", CHECK.args, AIMED)
            pure.append(time.perf_counter() - started)
            started = time.perf_counter()
            check_arguments(box, "tests", CHECK, AIMED)
            checked.append(time.perf_counter() - started)
            started = time.perf_counter()
            box.read_file("pyproject.toml")
            reads.append(time.perf_counter() - started)
    w50, a50 = statistics.median(whole), statistics.median(aimed)
    total = args.files * args.tests
    print(f"\nruntime {runtime}; {total} tests; {args.runs} runs each; load {loadavg()}")
    print(f"tests passed (whole, aimed): {sorted(counts)}")
    print_table(
        ["run_check", "median", "min", "max"],
        [
            _spread("whole suite, default (reference)", whole),
            _spread("aimed at one node", aimed),
            ["ratio aimed / whole (medians)", f"{a50 / w50:.1%}", "", ""],
        ],
    )
    print(f"\nchecking one call's arguments, {args.calls} calls")
    ratio = percentile(checked, 50) / percentile(reads, 50)
    print_table(
        ["what", "p50", "p99"],
        [
            _tail("read_file over the channel (reference)", reads),
            _tail("check_values (pure)", pure),
            _tail("check_arguments (+ check_paths in the sandbox)", checked),
            ["ratio check_arguments / read_file (p50)", f"{ratio:.0%}", ""],
        ],
    )


def _spread(name: str, values: list[float]) -> list[str]:
    shown = (statistics.median(values), min(values), max(values))
    return [name, *(fmt_ms(v, whole=True) for v in shown)]


def _tail(name: str, values: list[float]) -> list[str]:
    return [name, fmt_ms(percentile(values, 50)), fmt_ms(percentile(values, 99))]


if __name__ == "__main__":
    main()
