"""The service's OpenAPI 3.1 document, written by hand; ``docs/openapi.json`` is the same
document (``python3 -m controller.service.openapi > docs/openapi.json``)."""

from __future__ import annotations

import json
from typing import Any

ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {
        400: "a malformed body, an invalid task, an unusable bundle or a repository path "
        "that does not exist (BAD_REQUEST, USAGE_ERROR, BUNDLE_INVALID, NOT_A_REPOSITORY)",
        401: "no or a bad bearer token (UNAUTHORIZED)",
        403: "a repository outside the tenant's repo_roots, behind a symbolic link below a "
        "root, with git data outside them, or no longer the folder submitted "
        "(REPO_NOT_ALLOWED), a task over the tenant's policy (TASK_NOT_ALLOWED), or apply "
        "or revert without allow_apply (APPLY_NOT_ALLOWED)",
        404: "no such job or bundle for this tenant (NOT_FOUND)",
        409: "the job is not in a state for this, its work tree changed or its repository "
        "is busy, it was rebased, or it ran on a bundle (USAGE_ERROR, APPLY_CONFLICT, "
        "REVERT_CONFLICT, JOB_REBASED, JOB_ALREADY_RUNNING, JOB_NOT_FINISHED, NO_WORK_TREE)",
        413: "the bundle is larger than bundle_max_bytes (BUNDLE_TOO_LARGE), or its HEAD "
        "holds more than bundle_max_tree_entries entries or bundle_max_tree_bytes bytes of "
        "files (BUNDLE_TREE_TOO_LARGE)",
        429: "the tenant's max_queued_jobs is reached (QUOTA_EXCEEDED)",
    }
    return {str(s): {"description": text[s]} | _json(ERROR) for s in statuses}


JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
SECURED: list[dict[str, list[str]]] = [{"bearer": []}]


def _job_op(summary: str, ok: dict[str, Any], *errors: int, post: bool = False) -> dict[str, Any]:
    return {
        "post" if post else "get": {
            "summary": summary,
            "security": SECURED,
            "parameters": [JOB_ID],
            "responses": ok | _errors(401, 404, *errors),
        }
    }


ACTION_RESULT = {
    "type": "object",
    "required": ["job_id", "status"],
    "properties": {
        "job_id": {"type": "string"},
        "status": {"type": "string"},
        "files": {"type": "array", "items": {"type": "object"}},
        "merged": {"type": "array", "items": {"type": "string"}},
        "already_applied": {"type": "boolean"},
    },
}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "patchbox service",
        "version": "1",
        "description": "Jobs of the patchbox engine for several tenants (docs/service.md).",
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {
                        "type": "object",
                        "required": ["code", "message"],
                        "properties": {
                            "code": {"type": "string"},
                            "message": {"type": "string"},
                        },
                    }
                },
            },
            "JobRequest": {
                "type": "object",
                "description": "repo or bundle, not both; or from (a follow-up), with neither",
                "required": ["task"],
                "additionalProperties": False,
                "properties": {
                    "repo": {"type": "string", "description": "the repository's top folder"},
                    "bundle": {
                        "type": "string",
                        "description": "an uploaded bundle's id (POST /v1/bundles), in place "
                        "of repo",
                    },
                    "task": {"type": "object", "description": "a task file's object"},
                    "calls": {"type": "object", "description": "a calls file's object"},
                    "include_local_changes": {"type": "boolean", "default": False},
                    "from": {
                        "type": "string",
                        "description": "a follow-up: one of the tenant's jobs (awaiting "
                        "review or applied) whose result the new job starts from, on its "
                        "repository; task then holds the fields that change, over that job's "
                        "task",
                    },
                },
            },
            "BundleRef": {
                "type": "object",
                "description": "only for a job on an uploaded bundle",
                "required": ["id", "head"],
                "properties": {"id": {"type": "string"}, "head": {"type": "string"}},
            },
            "Bundle": {
                "type": "object",
                "required": ["bundle_id", "head", "size"],
                "properties": {
                    "bundle_id": {"type": "string"},
                    "head": {"type": "string", "description": "the bundle's HEAD commit"},
                    "size": {"type": "integer"},
                },
            },
            "Accepted": {
                "type": "object",
                "required": ["job_id", "status"],
                "properties": {
                    "job_id": {"type": "string"},
                    "status": {"type": "string"},
                    "parent": {
                        "type": "string",
                        "description": "the job a rebase carries or a follow-up starts from",
                    },
                },
            },
            "Job": {
                "type": "object",
                "description": "the object of `patchbox run --json`; status `queued` before "
                "a worker starts the job",
                "required": ["job_id", "status", "error", "diff", "files", "checks"],
                "properties": {
                    "job_id": {"type": "string"},
                    "status": {"type": "string"},
                    "error": {"type": ["object", "null"]},
                    "diff": {"type": "string"},
                    "files": {"type": "array", "items": {"type": "object"}},
                    "control_characters": {
                        "type": "array",
                        "description": "added lines holding control, format or bidi "
                        "characters (a flag; docs/reference.md)",
                        "items": {
                            "type": "object",
                            "required": ["path", "line", "characters"],
                            "properties": {
                                "path": {"type": "string"},
                                "line": {"type": "integer"},
                                "characters": {"type": "array", "items": {"type": "string"}},
                            },
                        },
                    },
                    "baseline_checks": {
                        "type": "array",
                        "description": "the required checks as run on the baseline before "
                        "the model's first turn; absent when none ran",
                        "items": {"type": "object"},
                    },
                    "checks": {"type": "array", "items": {"type": "object"}},
                    "services": {
                        "type": "array",
                        "description": "each service container the checks used (name, "
                        "image, image_id, sandbox, ready_seconds, exit, log_tail); absent "
                        "without services",
                        "items": {"type": "object"},
                    },
                    "tool_calls": {"type": "array", "items": {"type": "object"}},
                    "evidence": {"type": "string"},
                    "attestations": {
                        "type": "string",
                        "description": "the signed attestations' path once the job was "
                        "signed (GET /v1/jobs/{id}/attestations serves them); absent otherwise",
                    },
                    "decision": {"type": ["object", "null"]},
                    "bundle": {"$ref": "#/components/schemas/BundleRef"},
                    "parent": {
                        "type": "object",
                        "description": "the job this one was rebased from (job_id, "
                        "diff_sha256, relation); absent otherwise",
                    },
                    "stale": {
                        "type": "object",
                        "description": "set once this job was rebased (by: the new job, "
                        "reason, at): it is not applied (JOB_REBASED); absent otherwise",
                    },
                },
            },
            "JobList": {
                "type": "object",
                "required": ["jobs"],
                "properties": {
                    "jobs": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["job_id", "status", "repo", "created"],
                            "properties": {
                                "job_id": {"type": "string"},
                                "status": {"type": "string"},
                                "repo": {
                                    "type": "string",
                                    "description": "the repository's path; bundle:ID for "
                                    "a job on an uploaded bundle",
                                },
                                "created": {"type": "number"},
                                "bundle": {"$ref": "#/components/schemas/BundleRef"},
                            },
                        },
                    }
                },
            },
        },
    },
    "paths": {
        "/healthz": {
            "get": {
                "summary": "liveness, no authentication",
                "responses": {"200": {"description": "the service answers"}},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus text: jobs by state, queued and running jobs, requests; "
                "per tenant only with the operator's metrics token (metrics_token_sha256)",
                "security": [{}, {"bearer": []}],
                "responses": {
                    "200": {
                        "description": "metrics",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": {
                        "description": "a token that is not the operator's metrics token "
                        "(UNAUTHORIZED)"
                    }
                    | _json(ERROR),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "this document",
                "responses": {"200": {"description": "OpenAPI 3.1"}},
            }
        },
        "/v1/jobs": {
            "post": {
                "summary": "queue a job",
                "security": SECURED,
                "requestBody": {"required": True}
                | _json({"$ref": "#/components/schemas/JobRequest"}),
                "responses": {
                    "202": {"description": "queued (or already started)"}
                    | _json({"$ref": "#/components/schemas/Accepted"})
                }
                | _errors(400, 401, 403, 404, 429),
            },
            "get": {
                "summary": "the tenant's jobs",
                "security": SECURED,
                "responses": {
                    "200": {"description": "jobs, oldest first"}
                    | _json({"$ref": "#/components/schemas/JobList"})
                }
                | _errors(401),
            },
        },
        "/v1/bundles": {
            "post": {
                "summary": "upload a git bundle (git bundle create - HEAD) for bundle jobs",
                "security": SECURED,
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        }
                    },
                },
                "responses": {
                    "201": {"description": "verified and kept for bundle_keep_seconds"}
                    | _json({"$ref": "#/components/schemas/Bundle"})
                }
                | _errors(400, 401, 413),
            }
        },
        "/v1/jobs/{job_id}": _job_op(
            "a job, as `run --json` prints it",
            {"200": {"description": "the job"} | _json({"$ref": "#/components/schemas/Job"})},
        ),
        "/v1/jobs/{job_id}/diff": _job_op(
            "the job's diff",
            {
                "200": {
                    "description": "a unified diff, empty before it is collected",
                    "content": {"text/x-diff": {"schema": {"type": "string"}}},
                }
            },
        ),
        "/v1/jobs/{job_id}/evidence": _job_op(
            "the job's evidence bundle",
            {"200": {"description": "evidence.json"} | _json({"type": "object"})},
            409,
        ),
        "/v1/jobs/{job_id}/attestations": _job_op(
            "the job's signed attestations (in-toto statements in DSSE envelopes, one per "
            "line), signed with the service's key once the job is decided with a diff",
            {
                "200": {
                    "description": "provenance.intoto.jsonl",
                    "content": {"application/jsonl": {"schema": {"type": "string"}}},
                }
            },
            409,
        ),
        "/v1/provenance/key": {
            "get": {
                "summary": "the PEM public key the service signs attestations with",
                "responses": {
                    "200": {
                        "description": "a PEM PUBLIC KEY block",
                        "content": {"application/x-pem-file": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/v1/jobs/{job_id}/events": {
            "get": {
                "summary": "server-sent events: state, tool_call, check, check_output; resumable",
                "security": SECURED,
                "parameters": [
                    JOB_ID,
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 0},
                    },
                ],
                "responses": {
                    "200": {
                        "description": "the events after Last-Event-ID; the stream ends "
                        "when the job no longer runs",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    }
                }
                | _errors(400, 401, 404),
            }
        },
        "/v1/jobs/{job_id}/cancel": _job_op(
            "cancel a queued or running job",
            {
                "202": {"description": "cancelled or cancelling"}
                | _json({"$ref": "#/components/schemas/Accepted"}),
                "200": {"description": "the job had already ended"}
                | _json({"$ref": "#/components/schemas/Accepted"}),
            },
            post=True,
        ),
        "/v1/jobs/{job_id}/apply": _job_op(
            "apply a job awaiting review (allow_apply; not a bundle job)",
            {"200": {"description": "applied"} | _json(ACTION_RESULT)},
            403,
            409,
            post=True,
        ),
        "/v1/jobs/{job_id}/revert": _job_op(
            "revert an applied job (allow_apply; not a bundle job)",
            {"200": {"description": "reverted"} | _json(ACTION_RESULT)},
            403,
            409,
            post=True,
        ),
        "/v1/jobs/{job_id}/rebase": _job_op(
            "queue a new job that carries this job's diff (awaiting review) onto its "
            "repository as it is now: merged three-way, checked again, decided; this job "
            "is stale once the new one awaits review (not a bundle job)",
            {
                "202": {"description": "the new job, queued (or already started)"}
                | _json({"$ref": "#/components/schemas/Accepted"})
            },
            409,
            429,
            post=True,
        ),
        "/v1/jobs/{job_id}/discard": _job_op(
            "discard a job awaiting review, failed or cancelled",
            {"200": {"description": "discarded"} | _json(ACTION_RESULT)},
            403,
            409,
            post=True,
        ),
    },
}


def document() -> str:
    """The document as ``docs/openapi.json`` holds it."""
    return json.dumps(OPENAPI, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(document(), end="")  # noqa: T201 - the document on stdout
