"""What the token cut and the update size did in a campaign: recomputed from any folder of `d3s train` runs.

    python benchmarks/token_cut_diagnosis.py benchmarks/results/campaign-default [--output diagnosis.md]

Reads every run folder below the given one (a folder with `metrics.jsonl` and `run_config.json`; the run's
name is its folder's, `<name>-seed<k>`), pools the training steps of each name over its seeds and prints one
table (markdown):

- tokens in the loss per kept rollout (`d3s/tokens_in_loss` / `d3s/rollouts_kept`): median over steps, the
  range of the per-step values, and the mean in bands of K (K <= 10%, 10-15%, above 15%; all tokens: K = 100%);
- steps with fewer tokens in the loss than kept rollouts;
- one-sided steps: the share whose tokens in the loss all carry one sign of advantage while the kept rollouts
  had both (`d3s/one_sided`, logged since the token-cut options; "-" for older runs), and the share of steps
  with |loss| > 1 (a surrogate that is one-sided is about -A of the rollouts it keeps: -3.75 for 1 correct
  of 16; a two-sided one stays near 0);
- the update: median gradient norm before clipping (over steps with a gradient) and the share of those steps
  clipped (`grad_norm` > `max_grad_norm`);
- where the learning rate went: K and N weighted by each step's learning rate (what the schedule looks like
  to the optimizer), against the plain means over steps.

A second table follows the completions' length (`completions/mean_length`) from the first 5 steps to the last 5,
and the share of completions cut off at `max_completion_length` in the last 5 (`completions/clipped_ratio`): a
policy that drifts to the length cap answers fewer held-out problems within it.

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def runs_in(folder: Path) -> dict[str, list[tuple[dict, list[dict]]]]:
    """`{name: [(trainer settings, train records), ...]}` of every run below `folder`, seeds pooled by name."""
    found = defaultdict(list)
    for metrics in sorted(folder.rglob("metrics.jsonl")):
        run = metrics.parent
        config_file = run / "run_config.json"
        if not config_file.exists():
            continue
        settings = json.loads(config_file.read_text(encoding="utf-8")).get("trainer", {})
        records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
        train = [r for r in records if r.get("type") == "train"]
        if train:
            found[re.sub(r"-seed\d+$", "", run.name)].append((settings, train))
    return dict(found)


def _fmt(value, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _share(flags: list[bool]) -> float | None:
    return 100.0 * sum(flags) / len(flags) if flags else None


def diagnose(runs: list[tuple[dict, list[dict]]]) -> dict:
    """The figures of one name, pooled over its runs."""
    per_rollout, few, one_sided, big_loss, norms, clipped = [], [], [], [], [], []
    bands = defaultdict(list)
    weighted_k = weighted_n = weights = 0.0
    plain_k, plain_n = [], []
    for settings, train in runs:
        clip = settings.get("max_grad_norm") or 0.0
        for r in train:
            kept, tokens = r.get("d3s/rollouts_kept"), r.get("d3s/tokens_in_loss")
            k, n, lr = r.get("d3s/k_fraction"), r.get("d3s/n_keep"), r.get("learning_rate")
            if kept and tokens is not None:
                value = tokens / kept
                per_rollout.append(value)
                few.append(tokens < kept)
                if k is not None:
                    bands["<=10%" if k <= 0.10 + 1e-9 else "10-15%" if k <= 0.15 + 1e-9 else ">15%"].append(value)
            if r.get("d3s/one_sided") is not None:
                one_sided.append(r["d3s/one_sided"] > 0.5)
            if r.get("loss") is not None:
                big_loss.append(abs(r["loss"]) > 1.0)
            norm = r.get("grad_norm")
            if norm is not None and norm > 0:
                norms.append(norm)
                clipped.append(clip > 0 and norm > clip)
            if k is not None and n is not None:
                plain_k.append(k)
                plain_n.append(n)
                if lr is not None:
                    weighted_k, weighted_n, weights = weighted_k + lr * k, weighted_n + lr * n, weights + lr
    return {
        "runs": len(runs),
        "steps": sum(len(t) for _, t in runs),
        "tokens_per_kept_rollout": statistics.median(per_rollout) if per_rollout else None,
        "range": (min(per_rollout), max(per_rollout)) if per_rollout else None,
        "bands": {b: statistics.mean(v) for b, v in bands.items()},
        "fewer_tokens_than_rollouts": _share(few),
        "one_sided": _share(one_sided),
        "abs_loss_above_1": _share(big_loss),
        "grad_norm_median": statistics.median(norms) if norms else None,
        "clipped": _share(clipped),
        "k_lr_weighted": weighted_k / weights if weights else None,
        "n_lr_weighted": weighted_n / weights if weights else None,
        "k_mean": statistics.mean(plain_k) if plain_k else None,
        "n_mean": statistics.mean(plain_n) if plain_n else None,
    }


def lengths(runs: list[tuple[dict, list[dict]]], window: int = 5) -> dict:
    """Mean completion length over the first and the last `window` steps, and the share cut off at the
    length cap in the last `window`: means over steps, then over runs; per run, the last window's length."""
    def mean_of(train: list[dict], key: str) -> float | None:
        values = [r[key] for r in train if r.get(key) is not None]
        return statistics.mean(values) if values else None

    first, last, cut, per_run = [], [], [], []
    for _, train in runs:
        head, tail = train[:window], train[-window:]
        for into, part, key in ((first, head, "completions/mean_length"), (last, tail, "completions/mean_length"),
                                (cut, tail, "completions/clipped_ratio")):
            value = mean_of(part, key)
            if value is not None:
                into.append(value)
        per_run.append(mean_of(tail, "completions/mean_length"))
    return {"first": statistics.mean(first) if first else None, "last": statistics.mean(last) if last else None,
            "cut_last": 100.0 * statistics.mean(cut) if cut else None, "per_run_last": per_run}


def table(folder: Path) -> str:
    runs = runs_in(folder)
    if not runs:
        raise SystemExit(f"no run folder (metrics.jsonl with run_config.json) below {folder}")
    lines = [
        f"# Token cut and update size: {folder}",
        "",
        "Pooled over each name's runs (seeds). Tokens per kept rollout: median over steps [range], then the mean "
        "by K band. One-sided: tokens of one sign of advantage only while the kept rollouts had both "
        "(`d3s/one_sided`; '-' where the runs did not log it). Clipped: steps with a gradient whose norm before "
        "clipping exceeded `max_grad_norm`. K, N: weighted by the learning rate of each step (plain mean over "
        "steps in brackets).",
        "",
        "| name | runs | steps | tokens / kept rollout | by K: <=10% / 10-15% / >15% | steps with fewer tokens than "
        "rollouts | one-sided steps | \\|loss\\| > 1 | median grad norm | clipped | K (lr-weighted) | N (lr-weighted) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(runs):
        d = diagnose(runs[name])
        rng = f" [{d['range'][0]:.1f}-{d['range'][1]:.1f}]" if d["range"] else ""
        bands = " / ".join(_fmt(d["bands"].get(b)) for b in ("<=10%", "10-15%", ">15%"))
        lines.append(
            f"| {name} | {d['runs']} | {d['steps']} | {_fmt(d['tokens_per_kept_rollout'])}{rng} | {bands} | "
            f"{_fmt(d['fewer_tokens_than_rollouts'], '.0f', '%')} | {_fmt(d['one_sided'], '.0f', '%')} | "
            f"{_fmt(d['abs_loss_above_1'], '.0f', '%')} | {_fmt(d['grad_norm_median'])} | "
            f"{_fmt(d['clipped'], '.0f', '%')} | {_fmt(d['k_lr_weighted'], '.3f')} ({_fmt(d['k_mean'], '.3f')}) | "
            f"{_fmt(d['n_lr_weighted'])} ({_fmt(d['n_mean'])}) |"
        )
    lines += [
        "",
        "## Completion length",
        "",
        "Mean completion length (tokens) over the first 5 and the last 5 training steps, and the share of "
        "completions cut off at `max_completion_length` over the last 5; means over each name's runs, then the "
        "last 5 steps' length run by run (in the order of the run folders' names).",
        "",
        "| name | runs | length, first 5 steps | length, last 5 steps | cut off at the cap, last 5 steps | "
        "last 5 steps, per run |",
        "|---|---|---|---|---|---|",
    ]
    for name in sorted(runs):
        d = lengths(runs[name])
        lines.append(f"| {name} | {len(runs[name])} | {_fmt(d['first'])} | {_fmt(d['last'])} | "
                     f"{_fmt(d['cut_last'], '.0f', '%')} | {', '.join(_fmt(x) for x in d['per_run_last'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a campaign folder (d3s compare --output_dir) or any folder of runs")
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    text = table(args.folder)
    sys.stdout.write(text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
