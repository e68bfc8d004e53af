"""``python -m hybridplan``: the same command line as the ``hybridplan`` script (cli/__init__.py)."""

import sys

from hybridplan.cli import main

sys.exit(main())
