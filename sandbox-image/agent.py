"""Starts the agent. Run as ``python3 -I -B /opt/patchbox/agent.py``.

Isolated mode keeps the environment, user site-packages and the working directory out of
``sys.path``, so files in the workspace can never shadow a module the agent imports.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from patchbox_agent.server import main

sys.exit(main())
