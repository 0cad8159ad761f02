"""`python -m supervisor`: see supervisor.cli."""

import sys

from supervisor.cli import main

if __name__ == "__main__":
    sys.exit(main())
