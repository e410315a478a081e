"""The version of patchbox, as the installed distribution says."""

from __future__ import annotations

import functools


@functools.cache
def version() -> str:
    """The installed distribution's version (``unknown (not installed)`` in a bare checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("patchbox")
    except PackageNotFoundError:
        return "unknown (not installed)"
