"""Resource limits of a job, with safe defaults."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

SHM_MB = 16
"""Size of the container's private /dev/shm; like every tmpfs it counts against memory."""

HEADROOM_MB = 64
"""Memory kept free beyond the tmpfs sizes, so filling them ends in ENOSPC, not an OOM kill."""


class Limits(BaseModel):
    """Per-job limits. Every tmpfs (workspace, /tmp, /dev/shm) is charged to the memory
    limit, so ``memory_mb`` must exceed their sum plus a headroom."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    memory_mb: int = Field(default=1024, ge=64, le=65536)
    """Memory limit of the container; swap is not allowed beyond it."""
    cpus: float = Field(default=1.0, gt=0.0, le=64.0)
    """CPU quota in cores."""
    pids: int = Field(default=256, ge=16, le=32768)
    """Maximum number of processes and threads in the container."""
    workspace_mb: int = Field(default=512, ge=1, le=65536)
    """Size of the writable /workspace tmpfs."""
    tmp_mb: int = Field(default=64, ge=1, le=4096)
    """Size of the writable /tmp tmpfs."""
    wall_seconds: float = Field(default=900.0, gt=0.0, le=86400.0)
    """Wall-clock limit of the whole job."""
    check_seconds: float = Field(default=300.0, gt=0.0, le=86400.0)
    """Default wall-clock limit of one check."""
    max_turns: int = Field(default=50, ge=1, le=10000)
    max_tool_calls: int = Field(default=200, ge=1, le=100000)

    @model_validator(mode="after")
    def _tmpfs_fits_in_memory(self) -> Self:
        need = self.workspace_mb + self.tmp_mb + SHM_MB + HEADROOM_MB
        if need > self.memory_mb:
            msg = (
                f"memory_mb ({self.memory_mb}) must be at least workspace_mb + tmp_mb + "
                f"{SHM_MB + HEADROOM_MB} ({need}): tmpfs pages count against the memory limit"
            )
            raise ValueError(msg)
        return self
