"""`d3s compare`: several variants x seeds on the same task and generation budget, side by side.

    d3s compare --variants grpo,d3s --seeds 1,2 [--config RECIPE] [--output_dir DIR] [--field value ...]

Every run is `d3s train` with the same recipe and overrides, only `variant` and `seed` changing, so
all runs generate the same number of rollouts per step for the same number of steps (the same
generation budget); they differ in what they train on. Each run goes to `DIR/<variant>-seed<seed>/`
in its own process. A finished run (its `summary.json` exists) is reused, an unfinished one is
resumed from its last checkpoint — rerun the same command after an interruption.

Outputs in DIR: `compare.md` (the summary table), `compare.json`, `compare.png` (overlaid curves).
The summary: final held-out accuracy per variant (mean over seeds, with the 95% Wilson interval of
the pooled held-out answers), and the training wall-clock and tokens in the loss each variant needed
to first reach the reference variant's final accuracy (`grpo` if present), with the speedup.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from d3s.app.evaluation.heldout import wilson_interval


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def run_dir(root: Path, variant: str, seed: int) -> Path:
    return root / f"{variant}-seed{seed}"


def run_one(root: Path, variant: str, seed: int, train_argv: Sequence[str]) -> Path:
    """Run (or resume, or reuse) one `d3s train` in a child process; returns its folder."""
    from d3s.app.recipe import RecipeError

    out = run_dir(root, variant, seed)
    if (out / "summary.json").is_file():
        print(f"d3s compare: reusing {out}", file=sys.stderr)
        return out
    resume = out.is_dir() and any(out.glob("checkpoint-*"))
    cmd = [sys.executable, "-m", "d3s.cli", "train", *train_argv, "--variant", variant, "--seed", str(seed),
           "--output_dir", str(out), "--resume", "true" if resume else "false"]
    print(f"d3s compare: {'resuming' if resume else 'running'} {variant} seed {seed} -> {out}", file=sys.stderr,
          flush=True)
    # the run's own "how to continue" line must name this command, not the d3s train it runs
    env = {**os.environ, "D3S_CONTINUE_HINT": "rerun the same d3s compare command"}
    done = subprocess.run(cmd, env=env)
    if done.returncode in (130, 143, -2, -15):  # the child was stopped and said what it saved
        raise KeyboardInterrupt
    if done.returncode != 0:
        raise RecipeError(f"d3s train for {variant} seed {seed} failed (exit {done.returncode}, its error is above); "
                          "fix it and rerun the same d3s compare command to continue")
    return out


def claim_root(root: Path) -> None:
    """Refuse a non-empty `root` that is not a comparison's (its files, or a run folder of one)."""
    from d3s.app.runfolder import RunFolderError, is_run_folder

    if root.exists() and not root.is_dir():
        raise RunFolderError(f"--output_dir {str(root)!r} is a file; give a folder")
    if not root.is_dir():
        return
    entries = sorted(p.name for p in root.iterdir() if p.name != ".DS_Store")
    ours = any((root / n).is_file() for n in ("compare.json", "compare.md")) or any(
        is_run_folder(p) for p in root.iterdir() if p.is_dir() and "-seed" in p.name)
    if entries and not ours:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise RunFolderError(f"--output_dir {str(root)!r} is not empty ({len(entries)} entries: {shown}) and holds no "
                             "d3s comparison; pick another --output_dir")


def _reach(records: list[dict], target: float) -> dict | None:
    """The first held-out evaluation after training began (step > 0) at or above `target` accuracy."""
    return next((r for r in records if r.get("type") == "eval" and r["step"] > 0 and r["accuracy"] >= target - 1e-12),
                None)


def summarize(root: Path, variants: list[str], seeds: list[int]) -> dict:
    from d3s.app.runfolder import read_run_records

    runs = {v: [(s, json.loads((run_dir(root, v, s) / "summary.json").read_text()),
                 read_run_records(run_dir(root, v, s) / "metrics.jsonl")) for s in seeds] for v in variants}
    reference = "grpo" if "grpo" in variants else variants[0]
    target = statistics.mean(summ["after"]["accuracy"] for _, summ, _ in runs[reference])
    table = {}
    for v, items in runs.items():
        accs = [summ["after"]["accuracy"] for _, summ, _ in items]
        correct = sum(summ["after"]["correct"] for _, summ, _ in items)
        n = sum(summ["after"]["n"] for _, summ, _ in items)
        low, high = wilson_interval(correct, n)
        hits = [_reach(recs, target) for _, _, recs in items]
        reached = [h for h in hits if h is not None]
        table[v] = {
            "final_accuracy_mean": statistics.mean(accs),
            "final_accuracy_per_seed": accs,
            "pooled_ci95": [low, high],
            "base_accuracy": items[0][1]["before"].get("accuracy") if items[0][1]["before"] else None,
            "train_wall_s_mean": statistics.mean(summ["train_wall_s"] for _, summ, _ in items),
            "trained_tokens_mean": statistics.mean(summ["trained_tokens"] for _, summ, _ in items),
            "seeds_reaching_target": len(reached),
            "wall_s_to_target_mean": statistics.mean(h["wall_s"] for h in reached) if reached else None,
            "tokens_to_target_mean": statistics.mean(h["trained_tokens"] for h in reached) if reached else None,
            "steps_to_target_mean": statistics.mean(h["step"] for h in reached) if reached else None,
        }
    ref = table[reference]
    for row in table.values():
        for kind in ("wall_s", "tokens"):
            mine, theirs = row[f"{kind}_to_target_mean"], ref[f"{kind}_to_target_mean"]
            row[f"speedup_{kind.split('_')[0]}"] = theirs / mine if mine and theirs else None
    return {"reference": reference, "target_accuracy": target, "seeds": seeds, "variants": table}


def render_markdown(summary: dict, command: str) -> str:
    ref, target, seeds = summary["reference"], summary["target_accuracy"], summary["seeds"]
    lines = [
        f"# d3s compare ({len(seeds)} seeds: {', '.join(map(str, seeds))})",
        "",
        f"Command: `{command}`",
        "",
        f"Target = {ref}'s final held-out accuracy, {target:.1%} (mean over seeds). Time and tokens to target: "
        "first held-out evaluation after training began at or above it, mean over the seeds that reached it. Wall-clock counts "
        "training (generation included), not evaluation.",
        "",
        "| variant | final held-out acc (mean) | pooled 95% CI | per seed | train wall-clock | tokens in loss "
        "| reached target | wall-clock to target | tokens to target | speedup (wall) | speedup (tokens) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    fmt_min = lambda s: "-" if s is None else f"{s / 60:.1f} min"  # noqa: E731
    fmt_tok = lambda t: "-" if t is None else f"{t:,.0f}"  # noqa: E731
    fmt_x = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
    for v, row in summary["variants"].items():
        lo, hi = row["pooled_ci95"]
        lines.append(
            f"| {v} | {row['final_accuracy_mean']:.1%} | [{lo:.1%}, {hi:.1%}] | "
            f"{', '.join(f'{a:.1%}' for a in row['final_accuracy_per_seed'])} | {fmt_min(row['train_wall_s_mean'])} | "
            f"{fmt_tok(row['trained_tokens_mean'])} | {row['seeds_reaching_target']}/{len(seeds)} | "
            f"{fmt_min(row['wall_s_to_target_mean'])} | {fmt_tok(row['tokens_to_target_mean'])} | "
            f"{fmt_x(row['speedup_wall'])} | {fmt_x(row['speedup_tokens'])} |"
        )
    base = next((r["base_accuracy"] for r in summary["variants"].values() if r["base_accuracy"] is not None), None)
    if base is not None:
        lines += ["", f"Base model (before training): {base:.1%} held-out accuracy."]
    return "\n".join(lines) + "\n"


def cmd_compare(argv: Sequence[str]) -> int:
    """`d3s compare`: see the module docstring."""
    import argparse

    from d3s.app.plots import plot_compare
    from d3s.app.recipe import RecipeError, parse_train_args

    p = argparse.ArgumentParser(
        prog="d3s compare",
        allow_abbrev=False,  # `--variant grpo` is a d3s train field (refused below), not `--variants`
        description="Train several variants with several seeds on the same task and generation budget; "
        "write overlaid curves and a summary table. Other options are d3s train fields (see d3s train --help).",
    )
    p.add_argument("--variants", default="grpo,d3s", help="comma-separated variants (default grpo,d3s)")
    p.add_argument("--seeds", default="1,2", help="comma-separated seeds (default 1,2)")
    p.add_argument("--config", default=None, help="recipe file or shipped recipe name (default: the embedded one)")
    p.add_argument("--output_dir", default="runs/compare", help="folder of all runs (default runs/compare)")
    args, train_argv = p.parse_known_args(argv)
    variants = _csv(args.variants)
    try:
        seeds = [int(s) for s in _csv(args.seeds)]
    except ValueError:
        raise RecipeError(f"--seeds {args.seeds!r} must be comma-separated integers") from None
    if not variants or not seeds:
        raise RecipeError("--variants and --seeds must each name at least one")
    for bad in ("--variant", "--seed", "--output_dir", "--resume"):
        if bad in train_argv:
            raise RecipeError(f"{bad} is set by d3s compare for each run; remove it")
    if args.config:
        train_argv = ["--config", args.config, *train_argv]
    from d3s.variants import VARIANTS

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise RecipeError(f"unknown variants {unknown}; valid: {', '.join(VARIANTS)}")
    parse_train_args(train_argv)  # fail fast on a bad recipe or field, before any run starts

    root = Path(args.output_dir)
    claim_root(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RecipeError(f"--output_dir {str(root)!r} cannot be written ({err.strerror})") from None
    for seed in seeds:  # seeds outermost: a partial comparison already covers every variant
        for v in variants:
            run_one(root, v, seed, train_argv)
    summary = summarize(root, variants, seeds)
    command = "d3s compare " + " ".join(argv)
    (root / "compare.json").write_text(json.dumps(summary, indent=2))
    md = render_markdown(summary, command)
    (root / "compare.md").write_text(md)
    plot_compare({v: [(s, run_dir(root, v, s) / "metrics.jsonl") for s in seeds] for v in variants},
                 root / "compare.png", title=f"{' vs '.join(variants)}, seeds {', '.join(map(str, seeds))}")
    print(md)
    print(f"d3s compare: wrote {root / 'compare.md'}, {root / 'compare.json'}, {root / 'compare.png'}")
    return 0
