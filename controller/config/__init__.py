"""What the operator says: the host configuration, the task file, limits, checks."""
