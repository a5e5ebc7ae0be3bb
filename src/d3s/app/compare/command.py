"""`d3s compare`: several variants x seeds on the same task and generation budget, side by side.

    d3s compare --variants grpo,d3s,d3s+prompt_skip --seeds 1,2 [--config RECIPE] [--output_dir DIR] [--field value ...]

Every run is `d3s train` with the same recipe and overrides, only `variant` and `seed` changing, so
all runs generate the same number of rollouts per step for the same number of steps (the same
generation budget); they differ in what they train on. A run setting `variant+switch[+field=value...]` is the
variant with those switches (boolean `d3s train` fields) on and fields set: `d3s+prompt_skip` is `--variant d3s
--prompt_skip true`, `d3s+token_cut=sign+min_tokens_per_rollout=4` is `--variant d3s --token_cut sign
--min_tokens_per_rollout 4`, each compared with `d3s` as another line of the tables. Each run goes to
`DIR/<setting>-seed<seed>/`
in its own process. A finished run (a valid `summary.json`) is reused, an unfinished one is
resumed from its last checkpoint — rerun the same command after an interruption. Once a run has
finished, also when reused, its checkpoints are pruned (`--keep_checkpoints`: by default only the final model
stays, without the optimizer state a resume needs), so that a campaign of many runs does not fill the disk. A
campaign can be split over days or machines: point `--output_dir` at a folder of committed runs and the same command
finishes it. A finished run is reused only if its recorded recipe trains what this command would
(`run_config.json`; else an error names the differences); the code version of every run is shown.

Outputs in DIR: `compare.json` (the numbers: `d3s.app.compare.summary`), `compare.md` (its tables:
`d3s.app.compare.markdown`), `compare.png` (overlaid curves: `d3s.app.plots`), for this command's variants
and seeds, each replaced atomically, `compare.json` last (a kill leaves the old outputs, or new plots beside the old
tables, never a truncated file beside finished ones); `compare.md` names the folder's other finished runs, which a
command naming them all tables together. This module runs the comparison.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from d3s.app.child_process import CHILD_MAIN, run_child
from d3s.app.compare.budget import STEP_CAP, budget_argv, check_budget_command, reference_argv
from d3s.app.compare.markdown import render_markdown
from d3s.app.compare.summary import run_dir, summarize
from d3s.app.errors import RecipeError
from d3s.app.machine import same_machine
from d3s.app.options import parse_command
from d3s.app.plots import plot_budget, plot_compare
from d3s.app.recipe import parse_train_args
from d3s.app.recipe_changes import data_change, training_changes
from d3s.app.runfiles import atomic_write_text, read_run_config, read_run_records, read_summary
from d3s.app.runfolder import KeepCheckpoints, RunFolderError, holds_comparison, is_run_folder, prune_checkpoints
from d3s.app.train import resolve_run_config
from d3s.variants import VARIANTS


@dataclass
class CompareArgs:
    """The options of `d3s compare` itself; the others are `d3s train` fields, passed to every run."""

    variants: tuple[str, ...] = field(default=("grpo", "d3s"), metadata={
        "help": "comma-separated variants, each optionally with switches on or fields set: variant+switch[+field=value] "
                "(d3s train fields), e.g. d3s,d3s+prompt_skip,d3s+token_cut=sign"})
    seeds: tuple[int, ...] = field(default=(1, 2), metadata={"help": "comma-separated seeds"})
    config: str | None = field(default=None, metadata={
        "help": "recipe file or shipped recipe name (default: the embedded one)"})
    output_dir: str = field(default="runs/compare", metadata={"help": "folder of all runs"})
    budget: str | None = field(default=None, metadata={
        "help": "'reference': compute-matched; the reference variant runs its recipe and every other variant, same "
                "seed, trains until it has spent the same model FLOPs, evaluated at the same compute "
                "shares (docs/compare.md). Default: every variant runs the same steps"})
    reference: str | None = field(default=None, metadata={
        "help": "the variant the others are paired with (default: grpo if listed, else the first)"})
    budget_points: int = field(default=5, metadata={
        "help": "with --budget: held-out evaluations over the budget, the end included (the reference evaluates "
                "every max_steps // budget_points steps)"})
    wall_clock_ratios: bool = field(default=False, metadata={
        "help": "refuse to finish unless every run was timed on one machine with nothing else running (wall-clock "
                "ratios need both; without this, the tables say where they could not compare)"})
    keep_checkpoints: KeepCheckpoints = field(default="model", metadata={
        "help": "what each finished run keeps of its checkpoints: 'model' the final model without optimizer and "
                "RNG states, 'none' nothing, 'all' everything (a full checkpoint of a 135M model with Adam is about "
                "1.6 GB)"})

    def __post_init__(self) -> None:
        for name, values in (("variants", self.variants), ("seeds", self.seeds)):
            twice = sorted({str(v) for v in values if values.count(v) > 1})
            if twice:
                raise RecipeError(f"--{name} lists {', '.join(twice)} more than once; each run is trained once")
        bad = [s for s in self.seeds if not 0 <= s < 2**32]
        if bad:
            raise RecipeError(f"--seeds {','.join(map(str, bad))}: a seed is an integer in [0, 2**32 - 1]")


def _setting_parts(setting: str) -> tuple[str, list[tuple[str, str | None]]]:
    """`variant+switch+field=value...` -> `(variant, [(field, value or None for a switch), ...])`."""
    variant, *parts = setting.split("+")
    return variant, [(p.split("=", 1)[0], p.split("=", 1)[1] if "=" in p else None) for p in parts]


def run_setting(setting: str) -> list[str]:
    """The `d3s train` options of a run setting `variant+switch+field=value...`: `--variant variant --switch true
    --field value ...`."""
    variant, parts = _setting_parts(setting)
    if variant not in VARIANTS:
        raise RecipeError(f"unknown variant {variant!r} in {setting!r}; valid: {', '.join(VARIANTS)}")
    names = [name for name, _ in parts]
    bad = [n for n, v in parts if not n.isidentifier() or n in ("variant", "seed", "output_dir", "resume") or v == ""]
    if bad or len(set(names)) != len(names):
        raise RecipeError(f"run setting {setting!r}: after the variant, give distinct switches (boolean d3s train "
                          "fields) or field=value pairs joined by '+', e.g. d3s+prompt_skip or d3s+token_cut=sign")
    return ["--variant", variant, *(arg for n, v in parts for arg in (f"--{n}", "true" if v is None else v))]


def run_one(root: Path, variant: str, seed: int, train_argv: Sequence[str], keep_checkpoints: str = "all") -> Path:
    """Run (or resume, or reuse) one `d3s train` in a child process; returns its folder. Once a run this
    call trained has finished, its checkpoints are pruned to `keep_checkpoints` (see `prune_checkpoints`)."""
    out = run_dir(root, variant, seed)
    if read_summary(out)[0] is not None:  # a damaged summary.json is written again by the resumed run
        check_reusable(out, variant, seed, train_argv)
        print(f"d3s compare: reusing {out}", file=sys.stderr)
        return _prune(out, keep_checkpoints)  # also a run whose compare stopped before pruning it
    resume = out.is_dir() and any(out.glob("checkpoint-*"))
    cmd = [sys.executable, "-c", CHILD_MAIN, "train", *train_argv, *run_setting(variant), "--seed", str(seed),
           "--output_dir", str(out), "--resume", "true" if resume else "false"]
    print(f"d3s compare: {'resuming' if resume else 'running'} {variant} seed {seed} -> {out}", file=sys.stderr,
          flush=True)
    # the run's own "how to continue" line must name this command, not the d3s train it runs
    env = {**os.environ, "D3S_CONTINUE_HINT": "rerun the same d3s compare command"}
    code = run_child(cmd, env)  # a Ctrl-C waits for the run to save; the run stops if this process dies
    if code in (130, 143, -2, -15):  # the child was stopped and said what it saved
        raise KeyboardInterrupt
    if code != 0:
        raise RecipeError(f"d3s train for {variant} seed {seed} failed (exit {code}, its error is above); "
                          "fix it and rerun the same d3s compare command to continue")
    return _prune(out, keep_checkpoints)


def _prune(out: Path, keep_checkpoints: str) -> Path:
    """Prune the checkpoints of the finished run `out` to `keep_checkpoints`; a folder it cannot change
    (read-only) keeps them, with a note."""
    try:
        freed = prune_checkpoints(out, keep_checkpoints)
    except OSError as err:
        print(f"d3s compare: note: {out}'s checkpoints cannot be pruned ({err.strerror}); kept", file=sys.stderr)
        return out
    if freed:
        print(f"d3s compare: kept {keep_checkpoints!r} of {out}'s checkpoints, freed {freed / 2**30:.1f} GiB",
              file=sys.stderr)
    return out


def planned_run_config(out: Path, variant: str, seed: int, train_argv: Sequence[str]) -> dict:
    """The `run_config.json` that `d3s train` would record for this run on this machine."""
    run, config, recipe = parse_train_args([*train_argv, *run_setting(variant), "--seed", str(seed),
                                            "--output_dir", str(out)])
    return resolve_run_config(run, config, recipe)


def check_reusable(out: Path, variant: str, seed: int, train_argv: Sequence[str]) -> None:
    """Refuse a finished run whose recorded recipe trains differently from this command's (the output
    folder, logging and evaluation frequency are free); a run without `run_config.json` is reused with a
    note, and the tables mark it unchecked."""
    saved, damaged = read_run_config(out)
    if damaged:
        raise RecipeError(f"{out / 'run_config.json'} is damaged ({damaged}); repair it or move {out} away")
    if saved is None:
        print(f"d3s compare: note: {out} records no recipe (run_config.json); reused unchecked", file=sys.stderr)
        return
    planned = planned_run_config(out, variant, seed, train_argv)
    data = data_change(saved, planned)
    if data:
        raise RecipeError(f"{out} was trained on other data ({data}); restore the data it was trained on, or move "
                          "the run away or use another --output_dir to train on the new data")
    changed, _ = training_changes(saved, planned)
    if changed:
        shown = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise RecipeError(f"{out} was trained with another recipe than this command's ({shown}); move it away, "
                          "use another --output_dir, or give the recipe it was trained with")


def claim_root(root: Path) -> None:
    """Refuse a non-empty `root` that is not a comparison's (its files, or a run folder of one)."""
    if root.exists() and not root.is_dir():
        raise RunFolderError(f"--output_dir {str(root)!r} is a file; give a folder")
    if not root.is_dir():
        return
    entries = sorted(p.name for p in root.iterdir() if p.name != ".DS_Store")
    if entries and not holds_comparison(root):
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise RunFolderError(f"--output_dir {str(root)!r} is not empty ({len(entries)} entries: {shown}) and holds no "
                             "d3s comparison; pick another --output_dir")


def runs_left_out(root: Path, variants: Sequence[str], seeds: Sequence[int]) -> list[str]:
    """The finished run folders in `root` (a `summary.json` beside the run's record) outside `variants` x `seeds`."""
    ours = {run_dir(root, v, s).name for v in variants for s in seeds}
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and p.name not in ours and is_run_folder(p) and read_summary(p)[0] is not None)


def _without(argv: Sequence[str], name: str) -> list[str]:
    """`argv` without the option `--name` (`--name value` or `--name=value`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == f"--{name}":
            skip = True
        elif not a.startswith(f"--{name}="):
            out.append(a)
    return out


@dataclass
class BudgetPlan:
    """What `--budget reference` asks of the reference: its steps and an evaluation every `eval_every` of them."""

    max_steps: int
    eval_every: int
    points: int


def _budget_plan(args: CompareArgs, reference: str, train_argv: list[str], points_given: bool):
    """`(per_run, plan)`: `per_run(variant, reference run folder, to_train) -> d3s train options` of this command's
    runs (`to_train`: the run is not a finished one that is reused; with the folder None: the options of a budgeted
    run, its budget a stand-in, for checking them before any run), and the reference's `BudgetPlan` (None without
    `--budget`)."""
    if args.budget is None:
        if points_given:
            raise RecipeError(f"--budget_points {args.budget_points} is for --budget reference (held-out evaluations "
                              "over the reference's compute); without --budget every run evaluates every eval_every "
                              "steps (a d3s train field)")
        return (lambda variant, ref_folder, to_train=True: train_argv), None
    _, config, _ = parse_train_args([*train_argv, *run_setting(reference)])
    if config.max_steps < 1:
        raise RecipeError(f"--budget reference needs the reference's max_steps >= 1 (it is {config.max_steps}); the "
                          "others train on its compute")
    plan = _evaluation_plan(config.max_steps, args.budget_points, points_given)
    ref_argv = [*_without(train_argv, "eval_every"), *reference_argv(config.max_steps, args.budget_points)]
    others = _without(train_argv, "max_steps")
    stand_in = ["--compute_budget", "1.0", "--budget_eval_shares", "", "--max_steps", str(STEP_CAP * config.max_steps),
                "--eval_every", "0"]

    def per_run(variant, ref_folder, to_train=True):
        if variant == reference:
            return ref_argv
        return [*others, *(budget_argv(ref_folder, to_train) if ref_folder is not None else stand_in)]

    return per_run, plan


def _evaluation_plan(max_steps: int, points: int, given: bool) -> BudgetPlan:
    """The reference's evaluations for `--budget_points points` over `max_steps` (`reference_argv`: every
    `max_steps // points` steps, and the end). Points that its steps cannot hold evenly are refused when given
    (more points than steps, or a count that does not divide them); the default is taken as close as it goes,
    with a note."""
    every = max(1, max_steps // points)
    made = len(range(every, max_steps, every)) + 1
    if made != points:
        valid = [d for d in range(1, max_steps + 1) if max_steps % d == 0]
        if given:
            shown = sorted(valid, key=lambda d: (abs(d - points), d))[:8]
            raise RecipeError(f"--budget_points {points}: the reference's {max_steps} steps cannot hold {points} "
                              f"evenly spaced held-out evaluations (one every {every} step{'s' * (every > 1)} gives "
                              f"{made}); give one of {', '.join(map(str, sorted(shown)))} (a divisor of max_steps)")
        print(f"d3s compare: note: the reference's {max_steps} steps give {made} held-out evaluations over the budget "
              f"(one every {every} step{'s' * (every > 1)}), not the default {points}; --budget_points sets them",
              file=sys.stderr)
    return BudgetPlan(max_steps, every, made)


def _steps(steps) -> str:
    return ", ".join(map(str, sorted(steps))) or "none before its end"


def check_reference_evaluations(root: Path, reference: str, seeds: Sequence[int], plan: BudgetPlan) -> None:
    """Refuse, before any run starts, a reference run in `root` (finished, or begun) evaluated at other steps than
    this command asks: the budgeted runs are evaluated at the compute shares of its evaluations, so its curve (and,
    from a reference without evaluations before its end, theirs) would not be this command's."""
    for seed in seeds:
        ref = run_dir(root, reference, seed)
        summary = read_summary(ref)[0]
        if summary is not None:
            steps = summary["steps"]
            want = set(range(plan.eval_every, steps, plan.eval_every))
            have = {r["step"] for r in read_run_records(ref / "metrics.jsonl")
                    if r["type"] == "eval" and 0 < r["step"] < steps}
            what = f"was evaluated at steps {_steps(have)} before its end"
        else:
            saved = read_run_config(ref)[0]
            every = (saved or {}).get("run", {}).get("eval_every")
            if saved is None or not any(ref.glob("checkpoint-*")) or every == plan.eval_every:
                continue
            want, have = {plan.eval_every}, {every}
            what = f"was begun with an evaluation every {every} steps (eval_every)"
        if have != want:
            raise RecipeError(f"{ref}, the reference run of this folder, {what}, but --budget_points {plan.points} "
                              f"asks for one every {plan.eval_every} step{'s' * (plan.eval_every > 1)} "
                              f"({_steps(set(range(plan.eval_every, plan.max_steps, plan.eval_every)))}): the budgeted "
                              "runs are evaluated where it was, so its curve would not be this command's; give the "
                              "--budget_points it was run with, or use another --output_dir")


def check_every_run(variants: Sequence[str], reference: str, seeds: Sequence[int], root: Path, per_run,
                    budget: bool) -> None:
    """Parse the `d3s train` options of every run this command starts, before the first one: a setting that a run
    would refuse (a budgeted run's `warmup_steps` counted in steps, a schedule clock) is refused now, not after the
    reference has trained."""
    for v in [reference, *(v for v in variants if v != reference)]:
        try:
            parse_train_args([*per_run(v, None), *run_setting(v), "--seed", str(seeds[0]),
                              "--output_dir", str(run_dir(root, v, seeds[0]))])
        except RecipeError as err:
            how = f" on {reference}'s compute (--budget reference)" if budget and v != reference else ""
            raise RecipeError(f"run setting {v!r}{how}: {err}") from None


def _refuse_runs(names: list[str], why: str, fix: str) -> None:
    """One line refusing `--wall_clock_ratios true`, naming the first runs that fail its condition."""
    if names:
        raise RecipeError(f"--wall_clock_ratios true: {', '.join(names[:4])}{' and more' if len(names) > 4 else ''} "
                          f"{why}; {fix}, or leave the option off (the tables then say where they cannot compare)")


def refuse_mixed_machines(summary: dict) -> None:
    """One line naming the runs timed on another machine than the reference's first run (or on none recorded), and
    the runs timed while something else loaded the machine (`d3s.app.machine.quiet`)."""
    rows = [(v, p) for v, row in summary["variants"].items() for p in row["per_seed"]]
    first = summary["variants"][summary["reference"]]["per_seed"][0]["machine"]
    _refuse_runs([f"{v}-seed{p['seed']}" for v, p in rows if not same_machine(p["machine"], first)],
                 "were timed on another machine than the reference's first run, or on one not recorded", "rerun them here")
    _refuse_runs([f"{v}-seed{p['seed']}" for v, p in rows if p.get("quiet") is False],
                 "ran while something else loaded the machine (1-minute load average above its CPU count at start or "
                 "end; summary.json's load)", "rerun them with nothing else running")


def cmd_compare(argv: Sequence[str]) -> int:
    """`d3s compare`: see the module docstring."""
    (args,), train_argv = parse_command(
        (CompareArgs,), argv, prog="d3s compare", known_only=True,
        description="Train several variants with several seeds on the same task and generation budget; write "
        "overlaid curves and a summary table. Other options are d3s train fields (see d3s train --help).",
    )
    variants, seeds = list(args.variants), list(args.seeds)
    own = {f.name for f in dataclasses.fields(CompareArgs)}
    for arg in train_argv:  # another spelling of compare's own options would reach d3s train as unknown there
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        if "-" in name and name.replace("-", "_") in own:
            raise RecipeError(f"unknown option --{name}; did you mean --{name.replace('-', '_')}?")
    for bad in ("--variant", "--seed", "--output_dir", "--resume"):
        if bad in train_argv:
            raise RecipeError(f"{bad} is set by d3s compare for each run; remove it")
    if args.config:
        train_argv = ["--config", args.config, *train_argv]
    unknown = [v for v in variants if v.split("+")[0] not in VARIANTS]
    if unknown:
        raise RecipeError(f"unknown variants {unknown}; valid: {', '.join(VARIANTS)}, each optionally followed by "
                          "+switch (a boolean d3s train field) or +field=value, e.g. d3s+prompt_skip or d3s+token_cut=sign")
    reference = args.reference or ("grpo" if "grpo" in variants else variants[0])
    if args.reference is not None and args.reference not in variants and args.budget is None:
        raise RecipeError(f"--reference {args.reference!r} is not among --variants ({','.join(variants)})")
    check_budget_command(args.budget, reference, variants, train_argv, args.budget_points)
    parse_train_args(train_argv)  # fail fast on a bad recipe or field, before any run starts
    for v in variants:
        if "+" in v:
            run, config, _ = parse_train_args([*train_argv, *run_setting(v)])
            for switch, value in _setting_parts(v)[1]:
                if value is None and not isinstance(getattr(config, switch, getattr(run, switch, None)), bool):
                    raise RecipeError(f"run setting {v!r}: {switch} is not a switch (a boolean d3s train field)")

    points_given = any(a == "--budget_points" or a.startswith("--budget_points=") for a in argv)
    per_run, plan = _budget_plan(args, reference, train_argv, points_given)
    root = Path(args.output_dir)
    check_every_run(variants, reference, seeds, root, per_run, args.budget is not None)

    claim_root(root)
    if plan is not None:
        check_reference_evaluations(root, reference, seeds, plan)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RecipeError(f"--output_dir {str(root)!r} cannot be written ({err.strerror})") from None
    for seed in seeds:  # seeds outermost: a partial comparison already covers every variant
        for v in [reference, *(v for v in variants if v != reference)]:  # the reference first: its compute
            to_train = read_summary(run_dir(root, v, seed))[0] is None
            run_one(root, v, seed, per_run(v, run_dir(root, reference, seed), to_train), args.keep_checkpoints)
    summary = summarize(root, variants, seeds, reference=reference, budget=args.budget is not None)
    if args.wall_clock_ratios:
        refuse_mixed_machines(summary)
    command = "d3s compare " + " ".join(argv)
    # Every output is replaced atomically (a kill leaves the old file or none), the plots first and compare.json
    # last: a compare.json that is new says every other output is too.
    for leftover in root.glob(".compare*.tmp-*"):  # the temporary file of a compare killed while writing
        leftover.unlink(missing_ok=True)
    wrote = [plot_compare({v: [(s, run_dir(root, v, s) / "metrics.jsonl") for s in seeds] for v in variants},
                          root / "compare.png", title=f"{' vs '.join(variants)}, seeds {', '.join(map(str, seeds))}")]
    if args.budget is not None:
        wrote.append(plot_budget(summary, root / "compare-budget.png",
                                 title=f"at {reference}'s compute, seeds {', '.join(map(str, seeds))}"))
    md = render_markdown(summary, command)
    others = runs_left_out(root, variants, seeds)
    if others:  # a subset of a folder's comparison: say what its tables no longer show
        note = (f"This folder also holds finished runs these tables leave out: {', '.join(others)}. A `d3s compare` "
                "naming all their settings and seeds tables them together, reusing every run.")
        md = md.rstrip("\n") + "\n\n" + note + "\n"
        print(f"d3s compare: note: {note}", file=sys.stderr)
    atomic_write_text(root / "compare.md", md)
    atomic_write_text(root / "compare.json", json.dumps(summary, indent=2))
    wrote = [root / "compare.md", root / "compare.json", *wrote]
    print(md)
    print(f"d3s compare: wrote {', '.join(map(str, wrote))}")
    return 0
