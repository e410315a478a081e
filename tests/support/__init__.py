"""Helpers shared by the tests: a test module imports them from here (and its fixtures from
``tests/conftest.py``), never from another test module.

``paths`` names the checkout, ``tests/data`` and ``bench``; ``git`` makes and runs real
repositories, ``worktree`` and ``baseline`` compare what the controller left in them, ``jobs``
builds whole jobs, ``harness`` drives the agent in a workspace, ``sandbox`` holds what the
daemon's fixtures share, ``loopback`` serves a fake model over HTTP (``openai`` its answers,
``loop`` fake tools for the tool loop), and ``proxy`` puts the daemon behind a TCP port.
The others hold what the two tiers of one topic share (a test module split into
``tests/unit/<area>/`` and ``tests/docker/<area>/`` under the same name).
"""
