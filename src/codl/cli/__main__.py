"""``python -m codl.cli``: how a run job and the launcher start ``codl`` without its script."""

import sys

from codl.cli import main

sys.exit(main())
