"""python -m fastrun: the fastrun command (fastrun/cli/main.py)."""

import sys

from fastrun.cli.main import main

sys.exit(main())
