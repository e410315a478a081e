"""A job's one diff: collected from the sandbox, validated, applied and reverted."""
