"""Helpers shared by the tests: a test module imports them from here (and its fixtures from
``tests/conftest.py``), never from another test module.

``git`` makes and runs real repositories, ``worktree`` and ``baseline`` compare what the
controller left in them, ``jobs`` builds whole jobs, ``harness`` drives the agent in a
workspace, ``loopback`` serves a fake model over HTTP, and ``proxy`` puts the daemon behind
a TCP port.
"""
