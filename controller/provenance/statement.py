"""The in-toto statements patchbox signs for a job, as typed data.

- One SLSA provenance v1 statement: how the diff was made (the task's digest, the
  repository's baseline, the sandbox's runtime, network policy, limits and images, the
  agent's and the path rules' digests) and by whom (the controller's version, the job's id,
  start and end).
- One test-result statement per required check: its argv, image, exit and verdict.

Every statement has the same two subjects: the diff (``diff.patch``, SHA-256 of its bytes)
and the tree the diff makes of the baseline (``tree``, its git tree id), so a statement
made for another diff does not verify against this one."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PROVENANCE_TYPE = "https://slsa.dev/provenance/v1"
TEST_RESULT_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
BUILD_TYPE = "urn:patchbox:job:v1"
BUILDER_ID = "urn:patchbox:controller"
DIFF_SUBJECT = "diff.patch"
TREE_SUBJECT = "tree"


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        serialize_by_alias=True,
    )


class Descriptor(_Model):
    """An in-toto ResourceDescriptor: a name, its digests, what else is said of it."""

    name: str
    digest: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, object] | None = Field(default=None, exclude_if=lambda v: v is None)


class BaselineParameters(_Model):
    commit: str
    """The baseline's commit (HEAD, or a private commit over HEAD with the local changes)."""
    tree: str
    head: str
    local_changes: bool


class ExternalParameters(_Model):
    """What the requester chose."""

    task_digest: str
    """SHA-256 of the task as given (canonical JSON)."""
    repository: str
    """The repository's folder name (never a host path)."""
    baseline: BaselineParameters
    mode: str
    required_checks: list[str]


class NetworkParameters(_Model):
    egress: dict[str, list[str]] = Field(default_factory=dict)
    """Each check's declared egress (``host:port``); none: no network at all."""
    setup: list[str] = Field(default_factory=list)
    """What the environment's setup steps could reach."""


class InternalParameters(_Model):
    """What patchbox decided."""

    runtime: str
    network: NetworkParameters
    limits: dict[str, object]
    sandbox_image: str
    environment_image: str | None
    agent_digest: str
    rules_digest: str


class BuildDefinition(_Model):
    build_type: str
    external_parameters: ExternalParameters
    internal_parameters: InternalParameters
    resolved_dependencies: list[Descriptor]


class Builder(_Model):
    id: str
    version: dict[str, str]


class RunMetadata(_Model):
    invocation_id: str
    started_on: str
    finished_on: str


class RunDetails(_Model):
    builder: Builder
    metadata: RunMetadata


class Provenance(_Model):
    """The SLSA provenance v1 predicate."""

    build_definition: BuildDefinition
    run_details: RunDetails


class TestResult(_Model):
    """The in-toto test-result predicate of one required check."""

    result: Literal["PASSED", "WARNED", "FAILED"]
    configuration: list[Descriptor]
    """The check (``check:ID``: its argv's digest; annotations: argv, image, exit, job)."""
    passed_tests: list[str] = Field(default_factory=list)
    warned_tests: list[str] = Field(default_factory=list)
    failed_tests: list[str] = Field(default_factory=list)


class Statement(_Model):
    """An in-toto Statement v1 with one of patchbox's two predicates."""

    type: Literal["https://in-toto.io/Statement/v1"] = Field(
        default=STATEMENT_TYPE, validation_alias="_type", serialization_alias="_type"
    )
    subject: list[Descriptor]
    predicate_type: str
    predicate: dict[str, object]


CHECK_PREFIX = "check:"


def subjects(diff_sha256: str, tree: str) -> list[Descriptor]:
    """The two subjects of every statement of a job."""
    return [
        Descriptor(name=DIFF_SUBJECT, digest={"sha256": diff_sha256}),
        Descriptor(name=TREE_SUBJECT, digest={"gitTree": tree}),
    ]
