"""The numbers of `d3s compare`: its finished runs summarised per variant (the `compare.json` it writes).

- Final held-out accuracy per variant (the paper's Table 2 at this scale): mean over seeds with a 95%
  t-interval over seeds and the 95% Wilson interval of the pooled held-out answers (`d3s.app.intervals`);
  the difference to the reference variant (`grpo` if present) with a paired 95% t-interval over seeds, the
  exact sign-flip p-value (raw and Holm-corrected over the non-reference arms) and the leave-one-out range.
- Cost to reach the reference's final accuracy (Table 3): training wall-clock, tokens in the loss and
  training-forward positions computed, at the first held-out evaluation at or above it, per seed; seed by
  seed, that wall-clock and those positions as a share of the same seed's whole reference run, with whether
  both runs were timed on one machine (`run_config.json`'s `machine`) and both were quiet (`summary.json`'s
  `load`: nothing else loaded the machine at start or end; `d3s.app.machine.quiet`). A wall-clock ratio is given
  only between runs of one machine of which none is known to have been loaded; runs that recorded no load
  (made before runs did) still get theirs, marked unverified.
- The share of steps with no signal (every group's rewards equal: a zero gradient for every variant), what
  generation bought (prompts skipped, flat groups generated, generation seconds per group with signal), the
  seconds per step and its timed parts, the code version of every run.
- Whether each run is paired in fact with the reference run of its seed (`d3s.app.compare.pairing`): the same
  prompts in the same order over the steps both took, and the correlation over seeds of their accuracies.
- The convention the runs' FLOPs are in (`flops_convention`: one of `d3s.app.budget.FLOPS_CONVENTIONS`, or
  "mixed"); a FLOP share is given only between two runs of one convention.
"""

from __future__ import annotations

import hashlib
import statistics
import string
from pathlib import Path

from d3s.app.budget import flops_convention
from d3s.app.compare.budget import budget_summary
from d3s.app.compare.pairing import correlation, prompt_stream, same_prompts
from d3s.app.compare.stats import minimum_detectable_difference, paired_tests
from d3s.app.intervals import mean_interval, wilson_interval
from d3s.app.machine import all_quiet, one_machine, quiet, same_machine
from d3s.app.records import generation_summary, no_signal_share, step_seconds, zero_gradient_steps
from d3s.app.runfiles import finished_summary, read_run_config, read_run_records, with_computed_tokens


SAFE_NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "._+=,@-")
"""The characters of a run setting kept as they are in its folder's name; every other byte is written `%XX`."""

NAME_BYTES = 240
"""The longest folder name `run_folder_name` gives (file systems allow 255 bytes)."""


def run_folder_name(setting: str, seed: int) -> str:
    """The name of the folder of run setting `setting` with `seed`: `<setting>-seed<seed>`, one folder inside the
    comparison's `--output_dir` whatever the setting holds.

    A setting of plain characters (`SAFE_NAME_CHARACTERS`: `d3s+token_cut=sign`) is its own name. Any other byte of
    its UTF-8 (`/`, a NUL, a space, `%`, a leading `.`) is written `%XX`, so `..` or `/x` never leaves the folder,
    no name is hidden, and two settings never share one. A name longer than `NAME_BYTES` keeps its start, then
    `%-` and 16 hex digits of the setting's SHA-256 (a `%` followed by `-` is never an escape, so a shortened
    name equals no other)."""
    raw = setting.encode("utf-8", "surrogatepass")
    name = "".join(chr(b) if chr(b) in SAFE_NAME_CHARACTERS else f"%{b:02X}" for b in raw)
    if name.startswith("."):
        name = "%2E" + name[1:]
    suffix = f"-seed{seed}"
    room = NAME_BYTES - len(suffix)
    if len(name) > room:
        name = name[: room - 18] + "%-" + hashlib.sha256(raw).hexdigest()[:16]
    return name + suffix


def run_dir(root: Path, variant: str, seed: int) -> Path:
    """The folder of run setting `variant` with `seed` in the comparison folder `root` (`run_folder_name`)."""
    return Path(root) / run_folder_name(variant, seed)


def _reach(records: list[dict], target: float) -> dict | None:
    """The first held-out evaluation after training began (step > 0) at or above `target` accuracy."""
    return next((r for r in records if r.get("type") == "eval" and r["step"] > 0 and r["accuracy"] >= target - 1e-12),
                None)


def _run_version(folder: Path, summary: dict) -> str:
    if summary.get("code_version"):
        return summary["code_version"]
    return (read_run_config(folder)[0] or {}).get("code_version") or "not recorded"


def _run_machine(folder: Path) -> dict | None:
    """The machine the run recorded (`run_config.json`'s `machine`); None for runs made before it was."""
    return (read_run_config(folder)[0] or {}).get("machine")


def _spread(values: list[float]) -> list[float] | None:
    return [min(values), max(values)] if values else None


def _mean_parts(parts: list[dict | None], skip_none: bool = False) -> dict[str, float] | None:
    """Mean over runs of each part that every run recorded (with `skip_none`, a part None in every run is
    left out and one None in some runs is the mean of the others)."""
    if not parts or any(p is None for p in parts):
        return None
    common = [k for k in parts[0] if all(k in p for p in parts)]
    if not skip_none:
        return {k: statistics.mean(p[k] for p in parts) for k in common} or None
    values = {k: [p[k] for p in parts if p[k] is not None] for k in common}
    return {k: statistics.mean(v) for k, v in values.items() if v} or None


def _load_run(root: Path, variant: str, seed: int) -> dict:
    folder = run_dir(root, variant, seed)
    summary = finished_summary(folder)
    records = with_computed_tokens(read_run_records(folder / "metrics.jsonl"))
    return {"seed": seed, "folder": folder.name, "summary": summary, "records": records,
            "version": _run_version(folder, summary), "recipe_checked": read_run_config(folder)[0] is not None,
            "machine": _run_machine(folder), "load": summary.get("load")}


def _seed_row(run: dict, hit: dict | None) -> dict:
    """One run's line of the tables."""
    records, summary = run["records"], run["summary"]
    train = [x for x in records if x.get("type") == "train"]
    return {
        "seed": run["seed"],
        "folder": run["folder"],
        "final_accuracy": summary["after"]["accuracy"],
        "train_wall_s": summary["train_wall_s"],
        "trained_tokens": summary["trained_tokens"],
        "computed_tokens": records[-1]["computed_tokens"] if records else None,
        "flops": summary.get("flops"),
        "flops_convention": flops_convention(summary),
        "no_signal_steps": no_signal_share(records),
        "zero_gradient_steps": zero_gradient_steps(records),
        "generation": generation_summary(records),
        "steps": len(train),
        "step_seconds": step_seconds(records),
        "command_wall_s": summary.get("command_wall_s"),
        "to_target": None if hit is None else {**{k: hit[k] for k in ("step", "wall_s", "trained_tokens",
                                                                       "computed_tokens")}, "flops": hit.get("flops")},
        "code_version": run["version"],
        "recipe_checked": run["recipe_checked"],
        "machine": run["machine"],
        "load_start": ((run["load"] or {}).get("start") or {}).get("load_1min"),
        "load_end": ((run["load"] or {}).get("end") or {}).get("load_1min"),
        "quiet": quiet(run["load"]),
    }


def _sum_counts(counts: list[dict | None]) -> dict | None:
    """The seeds' `zero_gradient_steps` added up; None unless every seed recorded them."""
    if not counts or any(c is None for c in counts):
        return None
    return {k: sum(c[k] for c in counts) for k in counts[0]}


def _variant_row(items: list[dict], ref_final: dict[int, float], target: float) -> dict:
    """A variant's line of the tables: its seeds' runs against the reference's final accuracies."""
    accs = [r["summary"]["after"]["accuracy"] for r in items]
    correct = sum(r["summary"]["after"]["correct"] for r in items)
    n = sum(r["summary"]["after"]["n"] for r in items)
    diffs = [r["summary"]["after"]["accuracy"] - ref_final[r["seed"]] for r in items]
    hits = [_reach(r["records"], target) for r in items]
    reached = [h for h in hits if h is not None]
    per_seed = [_seed_row(r, hit) for r, hit in zip(items, hits)]
    lo, hi = wilson_interval(correct, n)
    shares = [p["no_signal_steps"] for p in per_seed if p["no_signal_steps"] is not None]
    return {
        "final_accuracy_mean": statistics.mean(accs),
        "final_accuracy_per_seed": accs,
        "seed_ci95": mean_interval(accs, bounds=(0.0, 1.0)),
        "pooled_ci95": [lo, hi],
        "diff_to_reference_mean": statistics.mean(diffs),
        "diff_to_reference_ci95": mean_interval(diffs),
        "diff_to_reference_mdd": (minimum_detectable_difference(statistics.stdev(diffs), len(diffs))
                                  if len(diffs) > 1 else None),
        "base_accuracy": (items[0]["summary"].get("before") or {}).get("accuracy"),
        "train_wall_s_mean": statistics.mean(r["summary"]["train_wall_s"] for r in items),
        "trained_tokens_mean": statistics.mean(r["summary"]["trained_tokens"] for r in items),
        "computed_tokens_mean": statistics.mean(p["computed_tokens"] or 0.0 for p in per_seed),
        "flops_mean": (statistics.mean(p["flops"] for p in per_seed)
                       if all(p["flops"] is not None for p in per_seed) else None),
        "no_signal_share_mean": statistics.mean(shares) if shares else None,
        "zero_gradient_steps": _sum_counts([p["zero_gradient_steps"] for p in per_seed]),
        "generation_mean": _mean_parts([p["generation"] for p in per_seed], skip_none=True),
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


def _against_reference(run: dict, ref: dict) -> dict | None:
    """A run's cost to the target as a share of the same seed's whole reference run: training wall-clock and
    positions computed, and whether both were timed on one machine (`d3s.app.machine.same_machine`: the wall-clock
    share only when they were); the FLOP share only when both counted FLOPs in one convention. None when the run
    never reached it."""
    hit = run["to_target"]
    if hit is None:
        return None
    one = same_machine(run["machine"], ref["machine"])
    calm = all_quiet([run["quiet"], ref["quiet"]])
    flops = run["flops_convention"] == ref["flops_convention"] and hit.get("flops") is not None and ref.get("flops")
    return {"wall_share": hit["wall_s"] / ref["train_wall_s"] if ref["train_wall_s"] and one and calm is not False
            else None,
            "computed_share": (hit["computed_tokens"] / ref["computed_tokens"]
                               if hit.get("computed_tokens") is not None and ref["computed_tokens"] else None),
            "flops_share": hit["flops"] / ref["flops"] if flops else None,
            "same_machine": one, "quiet": calm}


def _pairing(runs: dict[str, list[dict]], table: dict[str, dict], reference: str) -> None:
    """Each run's `same_prompts_as_reference` (`d3s.app.compare.pairing`), and each variant's count of the seeds
    checked and agreeing and the correlation over seeds of its final accuracy with the reference's."""
    ref_streams = {r["seed"]: prompt_stream(r["records"]) for r in runs[reference]}
    ref_final = {r["seed"]: r["summary"]["after"]["accuracy"] for r in runs[reference]}
    for v, items in runs.items():
        row = table[v]
        for run, p in zip(items, row["per_seed"]):
            p["same_prompts_as_reference"] = same_prompts(prompt_stream(run["records"]), ref_streams[run["seed"]])
        verdicts = [p["same_prompts_as_reference"] for p in row["per_seed"]]
        row["prompts_checked_seeds"] = sum(x is not None for x in verdicts)
        row["same_prompts_seeds"] = sum(x is True for x in verdicts)
        row["correlation_with_reference"] = (correlation([r["summary"]["after"]["accuracy"] for r in items],
                                                         [ref_final[r["seed"]] for r in items]) if v != reference
                                             else None)


def summarize(root: Path, variants: list[str], seeds: list[int], reference: str | None = None,
              budget: bool = False) -> dict:
    """The summary of the finished runs `root/<variant>-seed<seed>/` (what `compare.json` holds); the reference
    is `reference` (default: grpo if present, else the first variant). With `budget` (runs of `d3s compare --budget
    reference`), each variant also gets its `budget` object (`d3s.app.compare.budget.budget_summary`)."""
    runs = {v: [_load_run(root, v, s) for s in seeds] for v in variants}
    reference = reference or ("grpo" if "grpo" in variants else variants[0])
    ref_final = {r["seed"]: r["summary"]["after"]["accuracy"] for r in runs[reference]}
    target = statistics.mean(ref_final.values())
    table = {v: _variant_row(items, ref_final, target) for v, items in runs.items()}
    tests = paired_tests({v: [r["summary"]["after"]["accuracy"] - ref_final[r["seed"]] for r in items]
                          for v, items in runs.items() if v != reference})  # Holm over the non-reference arms
    for v, row in table.items():
        for test in ("p_value", "p_value_holm", "leave_one_out"):
            row[f"diff_to_reference_{test}"] = tests[v][test] if v in tests else None
    ref = table[reference]
    for row in table.values():
        # wall-clock ratios only between runs of one machine; positions computed do not depend on it
        row["one_machine_with_reference"] = one_machine([p["machine"] for p in row["per_seed"] + ref["per_seed"]])
        # and only between runs none of which is known to have run on a loaded machine (None: not recorded)
        row["quiet_with_reference"] = all_quiet([p["quiet"] for p in row["per_seed"] + ref["per_seed"]])
        for kind, key in (("wall", "wall_s_to_target_mean"), ("tokens", "tokens_to_target_mean"),
                          ("computed", "computed_to_target_mean")):
            mine, theirs = row[key], ref[key]
            comparable = kind != "wall" or (row["one_machine_with_reference"]
                                            and row["quiet_with_reference"] is not False)
            row[f"speedup_{kind}"] = theirs / mine if mine and theirs and comparable else None
    ref_runs = {p["seed"]: p for p in ref["per_seed"]}
    for v, row in table.items():
        if v != reference:
            for p in row["per_seed"]:
                p["to_target_vs_reference"] = _against_reference(p, ref_runs[p["seed"]])
    _pairing(runs, table, reference)
    if budget:
        for v, row in budget_summary(runs, reference).items():
            table[v]["budget"] = row
    versions = sorted({p["code_version"] for row in table.values() for p in row["per_seed"]})
    conventions = {p["flops_convention"] for row in table.values() for p in row["per_seed"]}
    return {"reference": reference, "mode": "budget" if budget else "steps", "target_accuracy": target, "seeds": seeds,
            "variants": table, "code_versions": versions,
            "flops_convention": conventions.pop() if len(conventions) == 1 else "mixed"}
