"""`d3s compare`: several variants x seeds on the same task and generation budget, side by side.

    d3s compare --variants grpo,d3s --seeds 1,2 [--config RECIPE] [--output_dir DIR] [--field value ...]

Every run is `d3s train` with the same recipe and overrides, only `variant` and `seed` changing, so
all runs generate the same number of rollouts per step for the same number of steps (the same
generation budget); they differ in what they train on. Each run goes to `DIR/<variant>-seed<seed>/`
in its own process. A finished run (its `summary.json` exists) is reused, an unfinished one is
resumed from its last checkpoint — rerun the same command after an interruption. Once a run has
finished, its checkpoints are pruned (`--keep_checkpoints`: by default only the final model stays, without
the optimizer state a resume needs), so that a campaign of many runs does not fill the disk. A campaign can be
split over days or machines: point `--output_dir` at a folder of committed runs and the same command
finishes it. A finished run is reused only if its recorded recipe trains what this command would
(`run_config.json`; else an error names the differences); the code version of every run is shown.

Outputs in DIR: `compare.md` (the tables), `compare.json`, `compare.png` (overlaid curves).
- Final held-out accuracy per variant (the paper's Table 2 at this scale): mean over seeds with a 95%
  t-interval over seeds and the 95% Wilson interval of the pooled held-out answers; the difference to
  the reference variant (`grpo` if present) with a paired 95% t-interval over the same seeds.
- Cost to reach the reference's final accuracy (Table 3): training wall-clock, tokens in the loss and
  training-forward positions computed, at the first held-out evaluation at or above it, per seed.
- The share of steps with no signal (every group's rewards equal: a zero gradient for every variant).
"""

from __future__ import annotations

import json
import math
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


def run_one(root: Path, variant: str, seed: int, train_argv: Sequence[str], keep_checkpoints: str = "all") -> Path:
    """Run (or resume, or reuse) one `d3s train` in a child process; returns its folder. Once a run this
    call trained has finished, its checkpoints are pruned to `keep_checkpoints` (see `prune_checkpoints`)."""
    from d3s.app.recipe import RecipeError
    from d3s.app.runfolder import prune_checkpoints

    out = run_dir(root, variant, seed)
    if (out / "summary.json").is_file():
        check_reusable(out, variant, seed, train_argv)
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
    freed = prune_checkpoints(out, keep_checkpoints) if (out / "summary.json").is_file() else 0
    if freed:
        print(f"d3s compare: kept {keep_checkpoints!r} of {out}'s checkpoints, freed {freed / 2**30:.1f} GiB",
              file=sys.stderr)
    return out


def planned_run_config(out: Path, variant: str, seed: int, train_argv: Sequence[str]) -> dict:
    """The `run_config.json` that `d3s train` would record for this run on this machine."""
    from d3s.app.recipe import parse_train_args
    from d3s.app.train import resolve_run_config

    run, config, recipe = parse_train_args([*train_argv, "--variant", variant, "--seed", str(seed),
                                            "--output_dir", str(out)])
    return resolve_run_config(run, config, recipe)


def check_reusable(out: Path, variant: str, seed: int, train_argv: Sequence[str]) -> None:
    """Refuse a finished run whose recorded recipe trains differently from this command's (the output
    folder, logging and evaluation frequency are free); a run without `run_config.json` is reused with a
    note, and the tables mark it unchecked."""
    from d3s.app.recipe import RecipeError
    from d3s.app.runfolder import training_changes

    path = out / "run_config.json"
    if not path.is_file():
        print(f"d3s compare: note: {out} records no recipe (run_config.json); reused unchecked", file=sys.stderr)
        return
    try:
        saved = json.loads(path.read_text())
    except ValueError:
        raise RecipeError(f"{path} is not valid JSON; repair it or move {out} away") from None
    changed, _ = training_changes(saved, planned_run_config(out, variant, seed, train_argv))
    if changed:
        shown = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise RecipeError(f"{out} was trained with another recipe than this command's ({shown}); move it away, "
                          "use another --output_dir, or give the recipe it was trained with")


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



_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         15: 2.131, 20: 2.086, 30: 2.042}


def t_quantile_975(df: int) -> float:
    """Student's t 97.5% quantile (two-sided 95%), from a table; conservative between its rows."""
    if df < 1:
        raise ValueError(f"df={df}; need at least 1 (two seeds)")
    return _T975[min((k for k in _T975 if k >= df), default=30)] if df <= 30 else 1.96


def mean_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """95% t-interval of the mean of `values` (None with fewer than two)."""
    if len(values) < 2:
        return None
    m, half = statistics.mean(values), t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return m - half, m + half


def _reach(records: list[dict], target: float) -> dict | None:
    """The first held-out evaluation after training began (step > 0) at or above `target` accuracy."""
    return next((r for r in records if r.get("type") == "eval" and r["step"] > 0 and r["accuracy"] >= target - 1e-12),
                None)


def _run_version(folder: Path, summary: dict) -> str:
    if summary.get("code_version"):
        return summary["code_version"]
    try:
        return json.loads((folder / "run_config.json").read_text()).get("code_version") or "not recorded"
    except (OSError, ValueError):
        return "not recorded"


def _spread(values: list[float]) -> list[float] | None:
    return [min(values), max(values)] if values else None


def _mean_parts(parts: list[dict | None]) -> dict[str, float] | None:
    """Mean over runs of each timing part that every run recorded."""
    if not parts or any(p is None for p in parts):
        return None
    common = [k for k in parts[0] if all(k in p for p in parts)]
    return {k: statistics.mean(p[k] for p in parts) for k in common} or None


def summarize(root: Path, variants: list[str], seeds: list[int]) -> dict:
    from d3s.app.runfolder import no_signal_share, read_run_records, step_seconds, with_computed_tokens

    runs = {}
    for v in variants:
        runs[v] = []
        for s in seeds:
            folder = run_dir(root, v, s)
            summary = json.loads((folder / "summary.json").read_text())
            runs[v].append({"seed": s, "summary": summary, "records": with_computed_tokens(read_run_records(folder / "metrics.jsonl")),
                            "version": _run_version(folder, summary),
                            "recipe_checked": (folder / "run_config.json").is_file()})
    reference = "grpo" if "grpo" in variants else variants[0]
    ref_final = {r["seed"]: r["summary"]["after"]["accuracy"] for r in runs[reference]}
    target = statistics.mean(ref_final.values())
    table = {}
    for v, items in runs.items():
        accs = [r["summary"]["after"]["accuracy"] for r in items]
        correct = sum(r["summary"]["after"]["correct"] for r in items)
        n = sum(r["summary"]["after"]["n"] for r in items)
        diffs = [r["summary"]["after"]["accuracy"] - ref_final[r["seed"]] for r in items]
        hits = [(r["seed"], _reach(r["records"], target)) for r in items]
        reached = [h for _, h in hits if h is not None]
        per_seed = []
        for r, (_, hit) in zip(items, hits):
            records = r["records"]
            train = [x for x in records if x.get("type") == "train"]
            per_seed.append({
                "seed": r["seed"],
                "final_accuracy": r["summary"]["after"]["accuracy"],
                "train_wall_s": r["summary"]["train_wall_s"],
                "trained_tokens": r["summary"]["trained_tokens"],
                "computed_tokens": records[-1]["computed_tokens"] if records else None,
                "no_signal_steps": no_signal_share(records),
                "steps": len(train),
                "step_seconds": step_seconds(records),
                "command_wall_s": r["summary"].get("command_wall_s"),
                "to_target": None if hit is None else {k: hit[k] for k in ("step", "wall_s", "trained_tokens",
                                                                             "computed_tokens")},
                "code_version": r["version"],
                "recipe_checked": r["recipe_checked"],
            })
        lo, hi = wilson_interval(correct, n)
        shares = [p["no_signal_steps"] for p in per_seed if p["no_signal_steps"] is not None]
        table[v] = {
            "final_accuracy_mean": statistics.mean(accs),
            "final_accuracy_per_seed": accs,
            "seed_ci95": mean_interval(accs),
            "pooled_ci95": [lo, hi],
            "diff_to_reference_mean": statistics.mean(diffs),
            "diff_to_reference_ci95": mean_interval(diffs),
            "base_accuracy": (items[0]["summary"].get("before") or {}).get("accuracy"),
            "train_wall_s_mean": statistics.mean(r["summary"]["train_wall_s"] for r in items),
            "trained_tokens_mean": statistics.mean(r["summary"]["trained_tokens"] for r in items),
            "computed_tokens_mean": statistics.mean(p["computed_tokens"] or 0.0 for p in per_seed),
            "no_signal_share_mean": statistics.mean(shares) if shares else None,
            "step_seconds_mean": _mean_parts([p["step_seconds"] for p in per_seed]),
            "seeds_reaching_target": len(reached),
            "wall_s_to_target_mean": statistics.mean(h["wall_s"] for h in reached) if reached else None,
            "wall_s_to_target_spread": _spread([h["wall_s"] for h in reached]),
            "tokens_to_target_mean": statistics.mean(h["trained_tokens"] for h in reached) if reached else None,
            "computed_to_target_mean": statistics.mean(h["computed_tokens"] for h in reached) if reached else None,
            "computed_to_target_spread": _spread([h["computed_tokens"] for h in reached]),
            "steps_to_target_mean": statistics.mean(h["step"] for h in reached) if reached else None,
            "per_seed": per_seed,
        }
    ref = table[reference]
    for row in table.values():
        for kind, key in (("wall", "wall_s_to_target_mean"), ("tokens", "tokens_to_target_mean"),
                          ("computed", "computed_to_target_mean")):
            mine, theirs = row[key], ref[key]
            row[f"speedup_{kind}"] = theirs / mine if mine and theirs else None
    versions = sorted({p["code_version"] for row in table.values() for p in row["per_seed"]})
    return {"reference": reference, "target_accuracy": target, "seeds": seeds, "variants": table,
            "code_versions": versions}


def render_markdown(summary: dict, command: str) -> str:
    ref, target, seeds = summary["reference"], summary["target_accuracy"], summary["seeds"]
    pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    pts = lambda x: f"{x * 100:+.1f}"  # noqa: E731
    ci = lambda c, f=pct: "-" if c is None else f"[{f(c[0])}, {f(c[1])}]"  # noqa: E731
    fmt_min = lambda s: "-" if s is None else f"{s / 60:.1f} min"  # noqa: E731
    fmt_tok = lambda t: "-" if t is None else f"{t:,.0f}"  # noqa: E731
    fmt_x = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
    span = lambda s, f: "" if s is None or s[0] == s[1] else f" ({f(s[0])}-{f(s[1])})"  # noqa: E731
    lines = [
        f"# d3s compare ({len(seeds)} seed{'s' if len(seeds) != 1 else ''}: {', '.join(map(str, seeds))})",
        "",
        f"Command: `{command}`",
        "",
        "## Final held-out accuracy",
        "",
        f"Mean over seeds with a 95% t-interval over seeds (needs 2 seeds) and the 95% Wilson interval of the "
        f"pooled answers; the difference to {ref} is paired by seed, in percentage points.",
        "",
        "| variant | final acc (mean) | 95% CI over seeds | pooled 95% CI | per seed | vs " + ref + " (points) "
        "| paired 95% CI | steps with no signal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, row in summary["variants"].items():
        lines.append(
            f"| {v} | {pct(row['final_accuracy_mean'])} | {ci(row['seed_ci95'])} | {ci(row['pooled_ci95'])} | "
            f"{', '.join(pct(a) for a in row['final_accuracy_per_seed'])} | "
            f"{pts(row['diff_to_reference_mean']) if v != ref else '-'} | "
            f"{ci(row['diff_to_reference_ci95'], pts) if v != ref else '-'} | {pct(row['no_signal_share_mean'])} |")
    lines += [
        "",
        f"## Cost to reach {ref}'s final accuracy ({target:.1%})",
        "",
        "At the first held-out evaluation after training began at or above the target; mean (range) over the "
        "seeds that reached it. Wall-clock counts training (generation included), not evaluation. Positions "
        "computed: what the training forward computes (the cost); tokens in the loss: what it trains on.",
        "",
        "| variant | reached | wall-clock to target | positions computed to target | tokens in loss to target "
        "| speedup (wall) | speedup (computed) | whole run: wall-clock | whole run: positions computed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v, row in summary["variants"].items():
        lines.append(
            f"| {v} | {row['seeds_reaching_target']}/{len(seeds)} | {fmt_min(row['wall_s_to_target_mean'])}"
            f"{span(row['wall_s_to_target_spread'], fmt_min)} | {fmt_tok(row['computed_to_target_mean'])}"
            f"{span(row['computed_to_target_spread'], fmt_tok)} | {fmt_tok(row['tokens_to_target_mean'])} | "
            f"{fmt_x(row['speedup_wall'])} | {fmt_x(row['speedup_computed'])} | {fmt_min(row['train_wall_s_mean'])} | "
            f"{fmt_tok(row['computed_tokens_mean'])} |")
    from d3s.app.runfolder import STEP_PARTS

    timed = [row["step_seconds_mean"] or {} for row in summary["variants"].values()]
    parts = [p for p in STEP_PARTS if any(p in d for d in timed)]
    secs = lambda d, k: "-" if not d or d.get(k) is None else f"{d[k]:.1f}"  # noqa: E731
    lines += [
        "",
        "## Where a training step's time goes",
        "",
        "Seconds per step, mean over steps and seeds: TRL's `step_time` (generation included, the optimizer update "
        "not) and, where the runs timed them, its parts (`d3s/time/*`: generation with reward scoring; selection "
        "with the kept rows' passes; the KL metric; the loss forward; the backward pass and the rest).",
        "",
        "| " + " | ".join(["variant", "step", *(p.replace("_", " ") for p in parts), f"step vs {ref}"]) + " |",
        "|---|---|" + "---|" * len(parts) + "---|",
    ]
    ref_step = (summary["variants"][ref]["step_seconds_mean"] or {}).get("step")
    for v, row in summary["variants"].items():
        d = row["step_seconds_mean"]
        ratio = "-" if not d or not ref_step or d.get("step") is None else f"{d['step'] / ref_step:.2f}"
        lines.append(f"| {v} | {secs(d, 'step')} | " + "".join(f"{secs(d, p)} | " for p in parts) + f"{ratio} |")
    lines += [
        "",
        "## Runs",
        "",
        "Training wall-clock, and the whole `d3s train` command that finished the run (model loading and held-out "
        "evaluations included; a resumed run: its last part).",
        "",
        "| run | final acc | training wall-clock | whole command | steps with no signal | code version |",
        "|---|---|---|---|---|---|",
    ]
    for v, row in summary["variants"].items():
        for p in row["per_seed"]:
            lines.append(f"| {v} seed {p['seed']} | {pct(p['final_accuracy'])} | {fmt_min(p['train_wall_s'])} | "
                         f"{fmt_min(p['command_wall_s'])} | {pct(p['no_signal_steps'])} | `{p['code_version']}` |")
    base = next((r["base_accuracy"] for r in summary["variants"].values() if r["base_accuracy"] is not None), None)
    if base is not None:
        lines += ["", f"Base model (before training): {base:.1%} held-out accuracy."]
    versions = summary["code_versions"]
    lines += ["", "Code version of the runs: " + ", ".join(f"`{v}`" for v in versions) + "."]
    if len(versions) > 1:
        lines += ["**The runs were made by different code versions**; per run:", ""]
        for v, row in summary["variants"].items():
            lines.append(f"- {v}: " + ", ".join(f"seed {p['seed']} `{p['code_version']}`" for p in row["per_seed"]))
    unchecked = [f"{v} seed {p['seed']}" for v, row in summary["variants"].items() for p in row["per_seed"]
                 if not p["recipe_checked"]]
    if unchecked:
        lines += ["", f"Recipe not recorded, so not checked against this command: {', '.join(unchecked)}."]
    return "\n".join(lines) + "\n"


def cmd_compare(argv: Sequence[str]) -> int:
    """`d3s compare`: see the module docstring."""
    import argparse

    from d3s.app.plots import plot_compare
    from d3s.app.recipe import RecipeError, parse_train_args
    from d3s.app.runfolder import KEEP_CHECKPOINTS

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
    p.add_argument("--keep_checkpoints", default="model", choices=KEEP_CHECKPOINTS,
                   help="what each finished run keeps of its checkpoints: 'model' (default) the final model without "
                   "optimizer and RNG states, 'none' nothing, 'all' everything (a full checkpoint of a 135M model "
                   "with Adam is about 1.6 GB)")
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
            run_one(root, v, seed, train_argv, args.keep_checkpoints)
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
