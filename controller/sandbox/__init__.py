"""Where the agent runs: the hardened Docker sandbox, and an in-process fake for unit tests."""

from controller.sandbox.base import Channel, RunResult, Sandbox, SandboxSpec
from controller.sandbox.session import AgentSession

__all__ = ["AgentSession", "Channel", "RunResult", "Sandbox", "SandboxSpec"]
