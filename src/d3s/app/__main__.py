"""`python -m d3s.app`: the `d3s` command."""

import sys

from d3s.app.cli import main

sys.exit(main())
