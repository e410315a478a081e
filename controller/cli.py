"""The ``patchbox`` command line (SPEC 11.1).

Exit codes: 0 success, 1 a job or check failed, 2 bad usage, 3 the environment is not ready.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from controller.errors import NotReadyError, PatchboxError, UsageError

if TYPE_CHECKING:
    from controller.baseline import HealthReport

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_READY = 3


def _progress(message: str) -> None:
    print(f"patchbox: {message}", file=sys.stderr, flush=True)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="patchbox", description="A hardened sandbox for AI coding agents.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    doctor = sub.add_parser("doctor", help="is this machine (and a repository) ready?")
    doctor.add_argument("--json", action="store_true")
    doctor.add_argument("--repo", help="also check this repository's health (SPEC 3.1)")
    doctor.add_argument("--max-local-files", type=int, default=None, metavar="N")
    doctor.add_argument("--max-local-bytes", type=int, default=None, metavar="N")
    image = sub.add_parser("image", help="the sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True, parser_class=_Parser)
    build = image_sub.add_parser("build", help="build the sandbox image")
    build.add_argument(
        "--base", help="base image with python3 >= 3.9 (default: a slim Python image)"
    )
    build.add_argument("--json", action="store_true")
    demo = sub.add_parser("demo", help="a sandbox on the bundled example repository")
    demo.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    demo.add_argument("--json", action="store_true")
    return parser


def _emit(data: dict[str, Any], *, as_json: bool, text: str) -> None:
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(text)


def _doctor(args: argparse.Namespace) -> int:
    from controller.doctor import diagnose

    report = diagnose()
    lines = [f"ready: {'yes' if report['ready'] else 'no'}"]
    if report.get("docker"):
        d = report["docker"]
        runtimes = ", ".join(d["runtimes"])
        lines.append(f"docker: {d['server_version']} (API {d['api_version']}), runtimes {runtimes}")
    lines.append(f"git: {report.get('git') or 'missing'}")
    if "image" in report:
        img = report["image"]
        lines.append(
            f"image: {img['tag'] or 'not built'} ({'ready' if img['ready'] else 'missing'})"
        )
    if "runsc" in report:
        r = report["runsc"]
        state = (
            "works" if r.get("works") else ("registered" if r["registered"] else "not registered")
        )
        lines.append(f"gVisor (runsc): {state}")
    lines += [f"problem: {p}" for p in report["problems"]]
    lines += [f"to do: {a}" for a in report["advice"]]
    repo_ok = True
    if args.repo is not None:
        health = _repo_health(args)
        report["repository"] = health.model_dump(mode="json")
        repo_ok = health.ok
        lines += _health_lines(health)
    _emit(report, as_json=args.json, text="\n".join(lines))
    if not report["ready"]:
        return EXIT_NOT_READY
    return EXIT_OK if repo_ok else EXIT_FAILED


def _repo_health(args: argparse.Namespace) -> HealthReport:
    from pathlib import Path

    from controller.baseline import SnapshotLimits, check_health

    fields = {
        k: v
        for k, v in (("max_files", args.max_local_files), ("max_bytes", args.max_local_bytes))
        if v is not None
    }
    try:
        limits = SnapshotLimits(**fields)
    except ValueError as exc:
        raise UsageError("--max-local-files and --max-local-bytes must be >= 0") from exc
    return check_health(Path(args.repo), limits)


def _health_lines(health: HealthReport) -> list[str]:
    c = health.counts
    where = f" ({health.kind}, HEAD {health.head[:12]})" if health.head else ""
    changes = f"{c.staged_files} staged, {c.unstaged_files} unstaged, {c.untracked_files}"
    lines = [
        f"repository: {health.repo}: {'ok' if health.ok else 'blocked'}{where}",
        f"local changes: {changes} untracked files; {c.local_bytes} bytes",
    ]
    lines += [f"blocked: {r.code}: {r.detail}" for r in health.reasons]
    if health.submodules:
        lines.append(f"submodules (not entered): {', '.join(health.submodules)}")
    return lines


def _image_build(args: argparse.Namespace) -> int:
    from controller.dockerclient import connect
    from controller.image import ImageBuilder

    info = ImageBuilder(connect(), _progress).ensure(args.base)
    data = {
        "tag": info.tag,
        "image_id": info.image_id,
        "base": info.base,
        "base_source": info.base_source,
        "built": info.built,
        "seconds": round(info.seconds, 2),
    }
    state = "built" if info.built else "up to date"
    _emit(
        data, as_json=args.json, text=f"{info.tag} {state} (base {info.base}, {info.base_source})"
    )
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from controller.demo.run import run_demo

    result = run_demo(_progress, runtime=args.runtime)
    lines = [f"sandbox {result['image']} on {result['runtime']}, ready in {result['ready_ms']} ms"]
    for call in result["calls"]:
        detail = {k: v for k, v in call.items() if k != "tool"}
        lines.append(f"- {call['tool']}: {json.dumps(detail)[:300]}")
    lines.append(result["note"])
    _emit(result, as_json=args.json, text="\n".join(lines))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    from controller.logs import configure

    configure()
    as_json = "--json" in (argv if argv is not None else sys.argv[1:])
    try:
        args = _parser().parse_args(argv)
        handlers = {"doctor": _doctor, "image": _image_build, "demo": _demo}
        return handlers[args.command](args)
    except PatchboxError as exc:
        if as_json:
            print(json.dumps({"error": exc.to_dict()}))
        print(f"patchbox: error {exc.code}: {exc.message}", file=sys.stderr)
        if isinstance(exc, UsageError):
            return EXIT_USAGE
        if isinstance(exc, NotReadyError):
            return EXIT_NOT_READY
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("patchbox: cancelled", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
