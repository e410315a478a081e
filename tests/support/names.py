"""Helpers of tests/unit/changes/test_attack_names.py
and tests/docker/changes/test_attack_names.py."""

from __future__ import annotations

# -- 9b: names that are not UTF-8 ----------------------------------------------------------

BAD_NAME = "import os; open(os.fsencode('bad') + b'\\xff', 'w').write('x\\n')"
