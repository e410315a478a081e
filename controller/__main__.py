import sys

from controller.cli.main import main

sys.exit(main())
