"""Starts the agent. Run as ``python3 -I -S -B /opt/patchbox/agent.py``.

Isolated mode keeps the environment, user site-packages and the working directory out of
``sys.path``, so files in the workspace can never shadow a module the agent imports. ``-S``
skips the site module (the agent needs nothing from site-packages): a faster start.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from patchbox_agent.server import main

sys.exit(main())
