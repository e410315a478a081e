"""The operations' limits and their fixed words. The controller imports them (its result
models, the tools' argument schemas, the checks' bounds) rather than copying them."""

from __future__ import annotations

MAX_READ_BYTES = 256 * 1024
MAX_READ_LINES = 2000
MAX_LINE_NUMBER = 10_000_000
MAX_READ_FILE = 64 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024
MAX_LIST_RESULTS = 10000
DEFAULT_LIST_RESULTS = 1000
MAX_SEARCH_RESULTS = 1000
DEFAULT_SEARCH_RESULTS = 100
MAX_QUERY = 1000
SEARCH_CACHE_ENTRIES = 64
MAX_RUN_OUTPUT = 1024 * 1024
DEFAULT_RUN_OUTPUT = 64 * 1024
MAX_RUN_SECONDS = 24 * 3600
MAX_EXPORT_PATHS = 10000
MAX_CHANGE_PATHS = 200
SEED = "/opt/patchbox-seed"
"""Where a project environment keeps what its setup left in /workspace."""
RAW_CHUNK = 2 * 1024 * 1024


MAX_CHECK_PATHS = 256
NO_SUCH_PATH = "no such file or folder"

NOT_TEXT = "not a text file the tools read (binary, not UTF-8, or a line over 1 MiB)"
