"""`python -m d3s.cli` and `d3s.cli.main`: the `d3s` command, which lives in `d3s.app.cli`."""

from d3s.app.cli import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    run()
