"""A ``read_file`` round trip through ``patchbox mcp`` over stdio vs the same call through the
Python API, measured in one run, interleaved.

Two repositories with the same 1 KB text file (16 lines of 64 bytes, as in
``bench_channel.py``), one job each (the write lock is per repository):

- MCP: ``python3 -m controller mcp --repo A`` spawned by the official SDK's client
  (``mcp.client.client.Client`` over stdio, the 2026-07-28 protocol its "auto" mode picks, or
  ``--mode legacy`` for the 2025 handshake); one ``client.call_tool("read_file", ...)``:
  JSON-RPC over the pipes, the server's dispatch, a worker thread, ``Session.call``, the
  sandbox, and back;
- reference: ``controller.api.open_session(B).call("read_file", ...)`` in this process;
- for the record, the SDK's own round trip: ``client.read_resource("patchbox://task/prompt")``
  on the same server (answered without a thread or the sandbox; no target).

Warm-up on both sides, then ``--rounds`` rounds of ``--per-round`` calls on each side, the
side that goes first alternating. The table gives p50/p99 and p50(MCP) / p50(API); the
target is at most 3x.

Every call is a turn of its job, and the engine appends the turn to the job's record
(``log.jsonl``) after it, on both sides alike.

    python3 bench/bench_mcp.py [--rounds 30] [--per-round 10] [--mode auto|legacy]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from common import SAMPLE, SAMPLE_PATH, fmt_ms, loadavg, make_repo, percentile, print_table
from controller import api
from controller.config.host import HostConfig
from controller.config.task import TaskSpec
from controller.mcp.server import PROMPT_URI
from controller.sandbox.dockerclient import connect
from controller.sandbox.image import ImageBuilder

ROOT = Path(__file__).resolve().parent.parent
TARGET = 3.0
"""Target: p50(MCP) / p50(API) at most this."""
TASK = {
    "prompt": "bench: read one file many times",
    "limits": {
        "memory_mb": 512,
        "workspace_mb": 64,
        "tmp_mb": 32,
        "wall_seconds": 3600,
        "max_turns": 10000,
        "max_tool_calls": 100000,
    },
}
CONFIG = "spare_sandboxes = 0\n"


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"benchmark sanity check failed: {what}")


async def measure(
    scratch: Path, args: argparse.Namespace
) -> tuple[list[float], list[float], list[float], dict[str, Any]]:
    (scratch / "task.json").write_text(json.dumps(TASK))
    (scratch / "config.toml").write_text(CONFIG)
    mcp_repo, api_repo = make_repo(scratch / "a"), make_repo(scratch / "b")
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            *("-m", "controller", "mcp", "--quiet", "--repo", str(mcp_repo)),
            *("--task", str(scratch / "task.json"), "--config", str(scratch / "config.toml")),
        ],
        env=dict(os.environ),
        cwd=str(ROOT),
    )
    arguments = {"path": SAMPLE_PATH}
    task = TaskSpec.model_validate(TASK)
    config = HostConfig(spare_sandboxes=0)
    over_mcp: list[float] = []
    over_api: list[float] = []
    floor: list[float] = []
    async with Client(params, mode=args.mode) as client:
        await client.list_tools()  # the client checks results against the listing
        session = api.open_session(api_repo, task=task, config=config)
        try:

            async def mcp_call() -> float:
                started = time.perf_counter()
                result = await client.call_tool("read_file", arguments)
                elapsed = time.perf_counter() - started
                check(not result.is_error, f"read_file over MCP: {result.content}")
                check(result.structured_content is not None, "structured content")
                content = (result.structured_content or {}).get("content")
                check(content == SAMPLE, "read_file over MCP: the content")
                return elapsed

            async def sdk_call() -> float:
                started = time.perf_counter()
                result = await client.read_resource(PROMPT_URI)
                elapsed = time.perf_counter() - started
                check(len(result.contents) == 1, "the prompt resource")
                return elapsed

            def api_call() -> float:
                started = time.perf_counter()
                result = session.call("read_file", arguments)
                elapsed = time.perf_counter() - started
                check(result.ok and result.result is not None, "read_file over the API")
                check((result.result or {}).get("content") == SAMPLE, "the API's content")
                return elapsed

            for _ in range(args.warmup):
                await mcp_call()
                api_call()
            for r in range(args.rounds):
                for side in ("mcp", "api") if r % 2 == 0 else ("api", "mcp"):
                    for _ in range(args.per_round):
                        if side == "mcp":
                            over_mcp.append(await mcp_call())
                            floor.append(await sdk_call())
                        else:
                            over_api.append(api_call())
        finally:
            session.close()
        info = {"protocol": client.protocol_version}
    return over_mcp, over_api, floor, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=30, help="calls on each side first")
    parser.add_argument("--mode", choices=["auto", "legacy"], default="auto")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.per_round < 1:
        parser.error("--rounds and --per-round must be at least 1")
    calls = 2 * (args.warmup + args.rounds * args.per_round)
    check(calls <= 10000, "at most 10,000 calls per job (max_turns)")
    image = ImageBuilder(connect()).ensure().tag
    scratch = Path(tempfile.mkdtemp(prefix="bench-mcp-"))
    os.environ.setdefault("PATCHBOX_HOME", str(scratch / "home"))
    print(f"image {image}; {time.strftime('%Y-%m-%d %H:%M:%S')}", file=sys.stderr)
    print(f"PATCHBOX_HOME {os.environ['PATCHBOX_HOME']}", file=sys.stderr)
    print(f"load average at the start: {loadavg()}", file=sys.stderr)
    try:
        over_mcp, over_api, floor, info = anyio.run(measure, scratch, args)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"load average at the end: {loadavg()}", file=sys.stderr)
    mcp50, api50 = percentile(over_mcp, 50), percentile(over_api, 50)
    ratio = mcp50 / api50
    print_table(
        ["what", "n", "p50", "p99", "ratio vs reference", "target", "met?"],
        [
            [
                f"read_file over MCP stdio ({info['protocol']})",
                str(len(over_mcp)),
                fmt_ms(mcp50),
                fmt_ms(percentile(over_mcp, 99)),
                f"{ratio:.2f}x",
                f"<= {TARGET:g}x",
                "yes" if ratio <= TARGET else "NO",
            ],
            [
                "read_file through api.Session.call (reference)",
                str(len(over_api)),
                fmt_ms(api50),
                fmt_ms(percentile(over_api, 99)),
                "1",
                "-",
                "-",
            ],
            [
                "MCP round trip alone (read_resource)",
                str(len(floor)),
                fmt_ms(percentile(floor, 50)),
                fmt_ms(percentile(floor, 99)),
                f"{percentile(floor, 50) / api50:.2f}x",
                "-",
                "-",
            ],
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
