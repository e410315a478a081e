"""A tiny comma-separated list parser."""
