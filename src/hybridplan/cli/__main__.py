import sys

from hybridplan.cli import main

sys.exit(main())
