"""``patchbox key`` (the host's signing key) and ``patchbox verify`` (a diff against its
signed attestations)."""

from __future__ import annotations

import argparse
from pathlib import Path

from controller.errors import ErrorCode, ExitCode
from controller.provenance.keys import (
    default_key_path,
    init_key,
    load_public,
    public_path,
    public_pem,
)
from controller.provenance.verify import verify_files

Result = tuple[int, dict[str, object], str]


def cmd_key(args: argparse.Namespace) -> Result:
    path = Path(args.path).expanduser() if args.path else default_key_path()
    if args.key_command == "init":
        path = init_key(path, scheme=args.algorithm, force=args.force)
    pem = public_pem(path)
    data: dict[str, object] = {"key": str(path), "public_key": pem}
    text = pem.rstrip("\n")
    if args.key_command == "init":
        data["public_key_file"] = str(public_path(path))
        text = f"signing key {path} (mode 0600)\npublic key {public_path(path)}:\n{text}"
    elif args.out:
        Path(args.out).write_text(pem)
        data["written"] = args.out
        text = f"public key written to {args.out}"
    return ExitCode.OK, data, text


def cmd_verify(args: argparse.Namespace) -> Result:
    report = verify_files(
        Path(args.diff),
        Path(args.attestations),
        load_public(Path(args.key)),
        Path(args.policy) if args.policy else None,
    )
    data: dict[str, object] = report.model_dump(mode="json")
    checks = ", ".join(f"{c} {r}" for c, r in sorted(report.checks.items())) or "none"
    if report.ok:
        text = (
            f"verified: job {report.job_id}, diff sha256 {report.diff_sha256}, "
            f"tree {report.tree}, key {report.key_id[:16]}; required checks: {checks}"
        )
        return ExitCode.OK, data, text
    data["code"] = str(ErrorCode.VERIFY_FAILED)
    lines = [f"{ErrorCode.VERIFY_FAILED}: {len(report.failures)} rule(s) failed"]
    lines += [f"- {f.code}: {f.message}" for f in report.failures]
    return ExitCode.FAILED, data, "\n".join(lines)
