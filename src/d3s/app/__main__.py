"""`python -m d3s.app`: the `d3s` command."""

from d3s.app.cli import run

run()
