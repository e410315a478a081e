"""patchbox: run an AI coding agent's file work in a hardened sandbox; only a diff comes back."""

__version__ = "0.1.0"
