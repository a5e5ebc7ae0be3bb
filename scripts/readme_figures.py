"""The learning and speed figures that README.md and docs/*.md quote, computed from committed campaigns.

Every figure sits in a marked block of a page:

    <!-- figures:NAME -->
    ...generated text...
    <!-- /figures:NAME -->

and comes from `benchmarks/results/<folder>/compare.json` (what `d3s compare` wrote) or, for what that file
does not hold (the held-out curve of every run, the machine a run was timed on), the run folders beside it.
Each block names its source folders in its text. Three blocks come from the code instead: docs/trl.md's table of
`D3SConfig`'s fields (from the dataclass), its table of the private TRL names the glue relies on (from
`PRIVATE_TRL_API`), and the supported versions (from pyproject.toml). The pages
are README.md and docs/*.md (docs/results.md holds the results).

This file holds the pages and the registry of blocks (`FIGURES`); the blocks are computed in the modules beside
it: `figures_common` (reading, tests, formatting), `figures_campaigns` (the fixed-step campaigns), `figures_race`
(the races at GRPO's compute, the FLOP table), `figures_credit` (the controls), `figures_readme` (the README's lead
and results) and `figures_project` (the GPU measurement, versions, TRL names and fields).

    python scripts/readme_figures.py           # rewrite every block from the data
    python scripts/readme_figures.py --check   # exit 1, naming each block whose text differs from the data

Intervals and tests are the repository's own (`d3s.app.intervals.mean_interval`: 95% Student t over seeds, paired
by seed; `d3s.app.compare.stats`: the exact sign-flip p-value, Holm-corrected over the arms of one table). A
difference is "not shown" unless both agree (`d3s.app.compare.stats.shown`): its interval excludes zero and its
corrected p-value is below 0.05. compare.json files written before the tests were stored get them computed here
from their per-seed values, the same way (`arm_tests`).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the figures modules beside this file, however it is loaded

from figures_common import *  # noqa: F401,F403
from figures_campaigns import *  # noqa: F401,F403
from figures_race import *  # noqa: F401,F403
from figures_credit import *  # noqa: F401,F403
from figures_readme import *  # noqa: F401,F403
from figures_project import *  # noqa: F401,F403

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/*.md")
BLOCK = re.compile(r"(<!-- figures:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)", re.S)


FIGURES = {
    "race-headline": race_headline,
    "race-terms": race_terms,
    "race-verdict": race_verdict,
    "race-default": lambda root, prefix="": race_table(root, "race-default", prefix),
    "race-default-settings": lambda root, prefix="": race_settings(root, "race-default", prefix),
    "race-ablations": lambda root, prefix="": race_table(root, "race-ablations", prefix),
    "race-arith2digit": lambda root, prefix="": race_table(root, "race-arith2digit", prefix),
    "race-arith2digit-settings": lambda root, prefix="": race_settings(root, "race-arith2digit", prefix),
    "race-decision": race_decision,
    "race-ablations-settings": lambda root, prefix="": race_settings(root, "race-ablations", prefix),
    "first-command": first_command,
    "generation": generation,
    "campaign5-default": lambda root, prefix="": campaign_table(root, "campaign5-default", prefix),
    "campaign5-arith2digit": lambda root, prefix="": campaign_table(root, "campaign5-arith2digit", prefix),
    "floor-vs-paper": floor_vs_paper,
    "wall-clock-to-grpo": wall_clock_to_grpo,
    "seed-spread": seed_spread,
    "three-seed-history": three_seed_history,
    "keep-last": keep_last,
    "d3s-config-fields": d3s_config_fields,
    "gpu-training-phase": gpu_training_phase,
    "generation-share": generation_share,
    "supported-versions": supported_versions,
    "private-trl-names": private_trl_names,
    "credit-verdict": credit_verdict,
    "flops-step": flops_step,
    "trl-matrix": trl_matrix,
    "collapse-tuning": collapse_tuning,
    "collapse-flat": collapse_flat,
    "credit-race-default": lambda root, prefix="": credit_table(root, "credit-race-default", prefix),
    "credit-race-arith2digit": lambda root, prefix="": credit_table(root, "credit-race-arith2digit", prefix),
    "credit-steps": credit_steps,
    "readme-lead": readme_lead,
    "readme-results": readme_results,
}


# --- the pages ----------------------------------------------------------------------------------------------

def pages(root: Path) -> list[Path]:
    return [p for pattern in PAGES for p in sorted(root.glob(pattern))]


def render(text: str, root: Path, prefix: str = "") -> tuple[str, list[str]]:
    """The page with every block regenerated, and the names of the blocks whose text changed."""
    changed: list[str] = []

    def fill(m: re.Match) -> str:
        name = m.group("name")
        if name not in FIGURES:
            raise SystemExit(f"unknown figures block {name!r}; known: {', '.join(FIGURES)}")
        body = FIGURES[name](root, prefix) + "\n"
        if body != m.group("body"):
            changed.append(name)
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(fill, text), changed


def run(root: Path, check: bool, files: list[Path] | None = None) -> list[str]:
    """Regenerate (or with `check`, only compare) the blocks of `files` (default: README.md and docs/*.md);
    returns 'file: block' for every block whose text differs from the data."""
    stale = []
    for page in files or pages(root):
        text = page.read_text(encoding="utf-8")
        prefix = "../" if page.parent.name == "docs" else ""
        new, changed = render(text, root, prefix)
        stale += [f"{page.name}: {name}" for name in changed]
        if not check and new != text:
            page.write_text(new, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if any block differs from the data")
    args = parser.parse_args(argv)
    stale = run(ROOT, args.check)
    if args.check and stale:
        print("figures that differ from the committed data (run scripts/readme_figures.py):", *stale, sep="\n  ")
        return 1
    if not args.check:
        print(f"{len(stale)} block(s) rewritten" + (": " + ", ".join(stale) if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
