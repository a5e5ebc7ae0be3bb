"""`python -m d3s.cli` and `d3s.cli.main`: the `d3s` command, which lives in `d3s.app.cli`."""

import sys

from d3s.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
