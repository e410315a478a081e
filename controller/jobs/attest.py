"""The signed provenance of a decided job (``provenance.intoto.jsonl`` in its folder): the
facts the engine notes while the job runs (:func:`facts`), and the statements made of the
record and signed on the host with the operator's key (:func:`attest`).

Signed only when there is a key: the host configuration's ``provenance.key``, else the
default key file when it exists. A configured key that cannot be used stops the job before
anything starts (``SIGNING_KEY_MISSING``, ``SIGNING_KEY_INVALID``). The statements are
scrubbed like the evidence: no secret and no host path."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from controller.config.host import HostConfig
from controller.config.network import expand
from controller.config.task import CheckSpec
from controller.jobs.log import write_atomic
from controller.jobs.records import CheckFact, JobRecord, ProvenanceFacts
from controller.jobs.store import ATTESTATIONS, JobStore
from controller.logs import Scrubber
from controller.paths import sandbox_image_dir
from controller.provenance.keys import default_key_path
from controller.sandbox.image import context_digest
from controller.tools import policy
from controller.version import version

if TYPE_CHECKING:
    from securesystemslib.signer import CryptoSigner

    from controller.provenance import statement as st

Signer: TypeAlias = "CryptoSigner"
"""A job's signer (securesystemslib's, loaded only when a job signs)."""


def signer_for(config: HostConfig) -> CryptoSigner | None:
    """The operator's signer: ``provenance.key`` (which must be usable), else the default
    key when its file exists, else None (the job is not signed). The signing library is
    loaded only then: a job that signs nothing does not pay for it."""
    from controller.provenance.keys import load_signer

    if config.provenance.key is not None:
        return load_signer(Path(config.provenance.key).expanduser())
    default = default_key_path()
    return load_signer(default) if default.exists() else None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def rules_digest(extra_protected: list[str], allowed_paths: list[str] | None) -> str:
    """SHA-256 over the path rules the diff was checked against: the built-in protected
    names and the operator's and the task's own."""
    return _sha256(
        _canonical(
            {
                "names": sorted(policy.NEVER_NAMES),
                "prefixes": sorted(policy.NEVER_PREFIXES),
                "suffixes": sorted(policy.NEVER_SUFFIXES),
                "pairs": sorted(list(p) for p in policy.NEVER_PAIRS),
                "config_names": sorted(policy.CONFIG_NAMES),
                "config_dirs": sorted(policy.CONFIG_DIRS),
                "protected": extra_protected,
                "allowed_paths": allowed_paths,
            }
        )
    )


def facts(
    record: JobRecord, config: HostConfig, checks: dict[str, CheckSpec], tree: str, image_id: str
) -> ProvenanceFacts:
    """What the statements say beyond the rest of the record, as the engine knows it once
    the change is collected (``image_id``: of the image the sandboxes run)."""
    environment = record.environment
    protected = config.protected
    return ProvenanceFacts(
        result_tree=tree,
        sandbox_image=image_id if environment is None else "",
        environment_image=image_id if environment is not None else None,
        agent_digest=context_digest(sandbox_image_dir()),
        rules_digest=rules_digest([str(p) for p in protected], record.allowed_paths),
        checks={
            cid: CheckFact(
                argv=list(spec.argv),
                egress=[rule.text() for _, rule in expand(spec.egress, config.network)],
            )
            for cid, spec in checks.items()
            if spec.required
        },
        setup_egress=list(environment.egress) if environment is not None else [],
    )


def _time(stamp: float) -> str:
    return dt.datetime.fromtimestamp(stamp, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def statements(record: JobRecord, made: ProvenanceFacts, diff: bytes) -> list[st.Statement]:
    """The provenance statement and one test result per required check."""
    from controller.provenance import statement as st  # its models load only when signing

    baseline = record.baseline
    assert baseline is not None  # noqa: S101 - a decided job has its baseline
    digest = _sha256(diff)
    subject = st.subjects(digest, made.result_tree)
    image = made.environment_image or made.sandbox_image
    limits = record.task.get("limits")
    provenance = st.Provenance(
        build_definition=st.BuildDefinition(
            build_type=st.BUILD_TYPE,
            external_parameters=st.ExternalParameters(
                task_digest=_sha256(_canonical(record.task)),
                repository=Path(record.repo).name,
                baseline=st.BaselineParameters(
                    commit=baseline.commit,
                    tree=baseline.tree,
                    head=baseline.head,
                    local_changes=baseline.commit != baseline.head,
                ),
                mode=record.mode,
                required_checks=sorted(made.checks),
            ),
            internal_parameters=st.InternalParameters(
                runtime=record.runtime,
                network=st.NetworkParameters(
                    egress={cid: fact.egress for cid, fact in made.checks.items() if fact.egress},
                    setup=made.setup_egress,
                ),
                limits=dict(limits) if isinstance(limits, dict) else {},
                sandbox_image=made.sandbox_image,
                environment_image=made.environment_image,
                agent_digest=made.agent_digest,
                rules_digest=made.rules_digest,
            ),
            resolved_dependencies=[
                st.Descriptor(name="baseline", digest={"gitCommit": baseline.commit}),
                st.Descriptor(name="image", digest={"sha256": image.removeprefix("sha256:")}),
            ],
        ),
        run_details=st.RunDetails(
            builder=st.Builder(id=st.BUILDER_ID, version={"patchbox": version()}),
            metadata=st.RunMetadata(
                invocation_id=record.job_id,
                started_on=_time(record.created_at),
                finished_on=_time(record.updated_at),
            ),
        ),
    )
    out = [
        st.Statement(
            subject=subject,
            predicate_type=st.PROVENANCE_TYPE,
            predicate=provenance.model_dump(mode="json"),
        )
    ]
    results = {c.id: c for c in record.checks if c.required}
    for cid, fact in sorted(made.checks.items()):
        check = results.get(cid)
        tests = (check.tests or []) if check is not None else []
        ran = check is not None and check.diff_sha256 == digest  # on exactly this diff
        passed = ran and check is not None and check.status == "passed"
        result = st.TestResult(
            result="PASSED" if passed else "FAILED",
            configuration=[
                st.Descriptor(
                    name=st.CHECK_PREFIX + cid,
                    digest={"sha256": _sha256(_canonical(fact.argv))},
                    annotations={
                        "argv": fact.argv,
                        "image": image,
                        "exit": check.exit_code if check is not None else None,
                        "status": check.status if ran and check is not None else "not_run",
                        "job": record.job_id,
                        "junit": _sha256(_canonical([t.model_dump(mode="json") for t in tests])),
                    },
                )
            ],
            passed_tests=[t.name for t in tests if t.status == "passed"],
            failed_tests=[t.name for t in tests if t.status in {"failed", "error"}],
        )
        out.append(
            st.Statement(
                subject=subject,
                predicate_type=st.TEST_RESULT_TYPE,
                predicate=result.model_dump(mode="json"),
            )
        )
    return out


def attest(
    record: JobRecord,
    diff: str | None,
    store: JobStore,
    signer: CryptoSigner | None,
    secrets: tuple[str, ...] = (),
) -> Path | None:
    """Signs and writes the job's attestations once it is decided (and made a diff, with
    its facts noted); returns their file (None when nothing was signed). Written once:
    a later change of the record (an apply) does not sign again."""
    made = record.provenance
    if signer is None or made is None or record.decision is None or not diff:
        return None
    target = store.folder(record.job_id) / ATTESTATIONS
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if target.exists():
        return target
    from controller.provenance import statement as st

    scrub = Scrubber(record.repo, secrets)
    signed = [
        st.Statement.model_validate(scrub.value(s.model_dump(mode="json")))
        for s in statements(record, made, diff.encode("utf-8", "surrogateescape"))
    ]
    from controller.provenance.envelope import signed_lines

    write_atomic(target, signed_lines(signed, signer))
    record.provenance = made.model_copy(update={"key_id": signer.public_key.keyid})
    return target
