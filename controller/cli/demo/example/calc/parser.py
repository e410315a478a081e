"""Parsing of comma-separated items."""


def parse_items(text):
    """Returns the comma-separated items of ``text``, stripped of surrounding spaces."""
    return [item.strip() for item in text.split(",")]
