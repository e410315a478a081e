"""patchbox: run an AI coding agent's file work in a hardened sandbox; only a diff comes back."""
