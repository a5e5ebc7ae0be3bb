"""`d3s compare`: several variants x seeds on one task, side by side.

- `command`  the command: its options, the runs it trains, reuses or resumes, and the files it writes;
- `summary`  the numbers of a comparison (`compare.json`);
- `markdown` those numbers as the tables of `compare.md`;
- `stats`    the statistics, as pure functions (paired interval, sign-flip test, Holm, leave-one-out, the
             shown rule, detectable difference, budget curves).
"""

from d3s.app.compare.command import cmd_compare

__all__ = ["cmd_compare"]
