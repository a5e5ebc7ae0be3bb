"""`d3s compare`'s tables from run folders: intervals over seeds, paired differences, cost to target,
steps with no signal, code versions (synthetic runs with known numbers, checked by hand)."""

import json
import math
import os
import statistics
from pathlib import Path

import pytest

from d3s.app.compare.markdown import render_markdown
from d3s.app.compare.summary import summarize
from d3s.app.intervals import mean_interval, wilson_interval
from d3s.app.records import no_signal_share


def _write_run(folder, final, curve, version="0.1.0+gabc", zero_std=(0.5, 0.5, 1.0, 0.0), times=None, flops=None,
               flops_convention=None):
    """A finished run: train steps 1-4 (each computing 100 positions; `flops` in all, a quarter per step, in
    `flops_convention`, None: as runs recorded before they recorded one), evaluations at 0, 2 and 4; `times`:
    per-step timing fields, the same at every step."""
    folder.mkdir(parents=True)
    spent = {} if flops is None else {"flops": 0.0}
    records = [{"type": "eval", "step": 0, "wall_s": 0.0, "trained_tokens": 0.0, **spent, "accuracy": curve[0]}]
    for step in range(1, 5):
        spent = {} if flops is None else {"flops": flops * step / 4}
        records.append({"type": "train", "step": step, "wall_s": 60.0 * step, "trained_tokens": 10.0 * step, **spent,
                        "d3s/tokens_computed": 100.0, "frac_reward_zero_std": zero_std[step - 1], **(times or {})})
        if step % 2 == 0:
            records.append({"type": "eval", "step": step, "wall_s": 60.0 * step, "trained_tokens": 10.0 * step,
                            **spent, "accuracy": curve[step // 2]})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"steps": 4, "after": {"accuracy": final, "correct": round(final * 200), "n": 200},
               "before": {"accuracy": 0.4},
               "train_wall_s": 240.0, "trained_tokens": 40.0, "code_version": version, "flops": flops}
    if flops_convention is not None:
        summary["flops_convention"] = flops_convention
    (folder / "summary.json").write_text(json.dumps(summary))


def _run_config(machine: dict) -> dict:
    """A run's `run_config.json` with the machine it was timed on (its settings do not matter here)."""
    return {"run": {}, "trainer": {}, "machine": machine}


def test_t_interval_against_the_closed_form():
    # Student t quantiles in closed form: tan(pi (p - 1/2)) with 1 degree of freedom, (2p - 1) / sqrt(2p(1 - p)) with 2
    p = 0.975
    for values, t975 in (([0.5, 0.7], math.tan(math.pi * (p - 0.5))),
                         ([0.5, 0.6, 0.7], (2 * p - 1) / math.sqrt(2 * p * (1 - p)))):
        low, high = mean_interval(values)
        m, half = statistics.mean(values), t975 * statistics.stdev(values) / math.sqrt(len(values))
        assert (low, high) == pytest.approx((m - half, m + half), rel=1e-9)
    assert mean_interval([0.5]) is None
    low, high = mean_interval([0.65 - 0.6, 0.7 - 0.65, 0.05])  # equal but for float noise: no width, no warning
    assert low == high == pytest.approx(0.05)


def test_an_accuracy_interval_is_cut_to_the_possible_range():
    wide = mean_interval([0.1, 0.9])  # 0.5 +- 12.7 * 0.4: far past both ends
    assert wide[0] < 0.0 and wide[1] > 1.0
    assert mean_interval([0.1, 0.9], bounds=(0.0, 1.0)) == (0.0, 1.0)
    low, high = mean_interval([0.55, 0.6, 0.65], bounds=(0.0, 1.0))  # inside the range: unchanged
    assert (low, high) == pytest.approx(mean_interval([0.55, 0.6, 0.65]))
    assert mean_interval([0.02, 0.3, 0.04], bounds=(0.0, 1.0))[0] == 0.0


def test_wilson_interval_against_the_score_formula():
    z = 1.959963984540054  # the standard normal 97.5% quantile
    for correct, n in ((0, 200), (1, 10), (130, 200), (200, 200), (7, 7)):
        p = correct / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        expected = (max(0.0, centre - half), min(1.0, centre + half))
        assert wilson_interval(correct, n) == pytest.approx(expected, abs=1e-12)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_no_signal_share_counts_steps_where_every_group_is_flat():
    records = [{"type": "train", "frac_reward_zero_std": v} for v in (1.0, 0.5, 1.0, 0.0)] + [{"type": "eval"}]
    assert no_signal_share(records) == 0.5


def test_summary_tables(tmp_path):
    finals = {"grpo": [0.60, 0.50, 0.70], "d3s": [0.65, 0.50, 0.80]}
    parts = ("generation", "selection", "kl_monitor", "forward", "backward")
    for seed in (1, 2, 3):
        _write_run(tmp_path / f"grpo-seed{seed}", finals["grpo"][seed - 1], [0.4, 0.5, finals["grpo"][seed - 1]],
                   times={"step_time": 40.0 + seed})  # recorded before the parts were timed
        d3s_times = {"step_time": 20.0, **{f"d3s/time/{p}": 2.0 * i + seed for i, p in enumerate(parts)}}
        _write_run(tmp_path / f"d3s-seed{seed}", finals["d3s"][seed - 1], [0.4, 0.7, finals["d3s"][seed - 1]],
                   version="0.1.0+gdef" if seed == 3 else "0.1.0+gabc", times=d3s_times)
    summary = summarize(tmp_path, ["grpo", "d3s"], [1, 2, 3])
    d3s = summary["variants"]["d3s"]
    assert summary["target_accuracy"] == pytest.approx(0.6)
    assert d3s["final_accuracy_mean"] == pytest.approx(0.65)
    diffs = [0.05, 0.0, 0.10]  # paired by seed
    assert d3s["diff_to_reference_mean"] == pytest.approx(statistics.mean(diffs))
    assert d3s["diff_to_reference_ci95"] == pytest.approx(list(mean_interval(diffs)))
    # MDD: (t_{0.975, 2} + t_{0.8, 2}) sd / sqrt(3), the t quantiles in closed form for 2 degrees of freedom
    t2 = [(2 * p - 1) / math.sqrt(2 * p * (1 - p)) for p in (0.975, 0.8)]
    assert d3s["diff_to_reference_mdd"] == pytest.approx(sum(t2) * statistics.stdev(diffs) / math.sqrt(3))
    # sign flips of (0.05, 0, 0.10): only +-(0.05 + 0.10) are as far from zero, twice each (0 flips to itself)
    assert d3s["diff_to_reference_p_value"] == 0.5 and d3s["diff_to_reference_p_value_holm"] == 0.5
    assert d3s["diff_to_reference_leave_one_out"] == pytest.approx([0.025, 0.075])
    assert summary["variants"]["grpo"]["diff_to_reference_p_value"] is None
    # d3s reaches 60% at its step-2 evaluation in every seed: 120 s, 2 steps x 100 positions
    assert d3s["seeds_reaching_target"] == 3
    assert d3s["wall_s_to_target_mean"] == 120.0 and d3s["computed_to_target_mean"] == 200.0
    # grpo: 0.5 at step 2 everywhere, so it reaches 60% at step 4 in seeds 1 and 3 only
    grpo = summary["variants"]["grpo"]
    assert grpo["seeds_reaching_target"] == 2 and grpo["computed_to_target_mean"] == 400.0
    # no run recorded its machine: the wall-clock speedup is not computed, the positions-computed one is
    assert d3s["speedup_computed"] == pytest.approx(2.0) and d3s["speedup_wall"] is None
    assert d3s["no_signal_share_mean"] == 0.25
    assert d3s["computed_tokens_mean"] == 400.0
    assert summary["code_versions"] == ["0.1.0+gabc", "0.1.0+gdef"]
    md = render_markdown(summary, "d3s compare ...")
    assert "**The runs were made by different code versions**" in md and "seed 3 `0.1.0+gdef`" in md
    assert "| d3s | 65.0% |" in md and "| +5.0 |" in md
    assert "| +5.0 | [-7.4, +17.4] (not shown) | 0.5 |" in md  # paired interval, then the Holm-corrected p
    assert "Recipe not recorded, so not checked against this command: grpo seed 1" in md
    # where a step's time goes: means over steps and seeds; parts only where every run timed them
    assert grpo["step_seconds_mean"] == {"step": 42.0}
    assert d3s["step_seconds_mean"] == {"step": 20.0, **{p: 2.0 * i + 2.0 for i, p in enumerate(parts)}}
    assert "| variant | step | generation | selection | kl monitor | forward | backward | step vs grpo |" in md
    assert "| d3s | 20.0 | 2.0 | 4.0 | 6.0 | 8.0 | 10.0 | not compared: machine unknown |" in md
    assert "| grpo | 42.0 | - | - | - | - | - | not compared: machine unknown |" in md
    assert "| not compared: machine unknown | 2.00x |" in md  # the cost table: speedup (wall), (computed)
    assert "| d3s seed 3 | 80.0% | 4.0 min | - | 25.0% (flat) | `0.1.0+gdef` |" in md


def test_generation_columns_and_run_settings(tmp_path):
    """What generation bought: per-step means over the runs, the seconds per group with signal over the whole run;
    `d3s/no_signal_step` (the groups handed to training) wins over TRL's `frac_reward_zero_std`."""
    gen = {"d3s/groups_generated": 8.0, "d3s/flat_groups_generated": 2.0, "d3s/prompts_skipped": 1.0,
           "d3s/time/generation": 3.0}
    for seed in (1, 2):
        _write_run(tmp_path / f"d3s-seed{seed}", 0.6, [0.4, 0.5, 0.6], times={"d3s/signal_groups": 2.0,
                   "d3s/groups_generated": 4.0, "d3s/flat_groups_generated": 2.0, "d3s/time/generation": 1.0})
        _write_run(tmp_path / f"d3s+prompt_skip-seed{seed}", 0.7, [0.4, 0.6, 0.7],
                   times={**gen, "d3s/signal_groups": 3.0 * seed, "d3s/no_signal_step": 0.0})
    summary = summarize(tmp_path, ["d3s", "d3s+prompt_skip"], [1, 2])
    plain, skip = summary["variants"]["d3s"], summary["variants"]["d3s+prompt_skip"]
    assert plain["generation_mean"] == {"flat_groups_per_step": 2.0, "groups_generated_per_step": 4.0,
                                        "generation_s_per_signal_group": 0.5}
    # seconds per group with signal: 12 s / 12 groups (seed 1), 12 s / 24 groups (seed 2)
    assert skip["generation_mean"] == pytest.approx({"prompts_skipped_per_step": 1.0, "flat_groups_per_step": 2.0,
                                                     "groups_generated_per_step": 8.0,
                                                     "generation_s_per_signal_group": 0.75})
    assert plain["no_signal_share_mean"] == 0.25 and skip["no_signal_share_mean"] == 0.0
    md = render_markdown(summary, "d3s compare ...")
    assert "| d3s | 4.0 | - | 2.0 | 0.500 | 25.0% |" in md
    assert "| d3s+prompt_skip | 8.0 | 1.0 | 2.0 | 0.750 | 0.0% |" in md


def test_a_run_setting_is_a_variant_with_switches_on():
    from d3s.app.compare.command import run_setting
    from d3s.app.errors import RecipeError

    assert run_setting("d3s") == ["--variant", "d3s"]
    assert run_setting("d3s+prompt_skip+dynamic_sampling") == [
        "--variant", "d3s", "--prompt_skip", "true", "--dynamic_sampling", "true"]
    assert run_setting("d3s+token_cut=sign+min_tokens_per_rollout=4+prompt_skip") == [
        "--variant", "d3s", "--token_cut", "sign", "--min_tokens_per_rollout", "4", "--prompt_skip", "true"]
    for bad in ("d4s+prompt_skip", "d3s+prompt_skip+prompt_skip", "d3s+seed", "d3s+", "d3s+token_cut=",
                "d3s+seed=3", "d3s+token_cut=sign+token_cut=rollout"):
        with pytest.raises(RecipeError):
            run_setting(bad)


def test_records_made_before_the_prompt_options_are_reusable():
    from d3s.app.recipe_changes import training_changes

    now = {"trainer": {"variant": "d3s", "prompt_skip": False, "dynamic_sampling_max_rounds": 3}}
    assert training_changes({"trainer": {"variant": "d3s"}}, now) == ([], [])
    changed, _ = training_changes({"trainer": {"variant": "d3s"}}, {"trainer": {"variant": "d3s", "prompt_skip": True}})
    assert changed == ["prompt_skip: False -> True"]


_XEON = {"cpu_vendor": "GenuineIntel", "cpu": "Intel(R) Xeon(R) Processor", "cpu_family": 6, "cpu_model": 207,
         "cpu_stepping": 2, "cpu_count": 2, "cpu_flags": ["avx2", "avx512f", "avx512_bf16"], "accelerator": None,
         "processes": 1, "torch": "2.13.0", "torch_threads": 2}
_EPYC = {"cpu_vendor": "AuthenticAMD", "cpu": "AMD EPYC", "cpu_family": 25, "cpu_model": 1, "cpu_stepping": 1,
         "cpu_count": 2, "cpu_flags": ["avx2"], "accelerator": None, "processes": 1, "torch": "2.13.0"}


def test_cost_seed_by_seed_against_the_same_seeds_reference_and_its_machine(tmp_path):
    # grpo: 60% final in every seed (target 60%), 240 s and 4 x 100 positions per run.
    # d3s seed 1 reaches 60% at step 2 (120 s, 200 positions): half of grpo seed 1's run, timed on one machine;
    # seed 2 reaches it at step 4 on another machine; seed 3 never does; seed 4 recorded no machine; seed 5's
    # record lacks family, model and stepping (made before they were recorded): unknown, though it names the Xeon.
    old_xeon = {k: v for k, v in _XEON.items() if k not in ("cpu_vendor", "cpu_family", "cpu_model", "cpu_stepping")}
    machines = {1: (_XEON, _XEON), 2: (_XEON, _EPYC), 3: (_XEON, _XEON), 4: (_XEON, None), 5: (_XEON, old_xeon)}
    curves = {1: [0.4, 0.6, 0.6], 2: [0.4, 0.5, 0.65], 3: [0.4, 0.5, 0.55], 4: [0.4, 0.7, 0.7], 5: [0.4, 0.7, 0.7]}
    for seed, (ref_machine, machine) in machines.items():
        _write_run(tmp_path / f"grpo-seed{seed}", 0.6, [0.4, 0.5, 0.6])
        _write_run(tmp_path / f"d3s-seed{seed}", curves[seed][-1], curves[seed])
        for name, m in (("grpo", ref_machine), ("d3s", machine)):
            if m is not None:
                (tmp_path / f"{name}-seed{seed}" / "run_config.json").write_text(json.dumps(_run_config(m)))
    summary = summarize(tmp_path, ["grpo", "d3s"], [1, 2, 3, 4, 5])
    per_seed = {p["seed"]: p for p in summary["variants"]["d3s"]["per_seed"]}
    assert per_seed[1]["to_target_vs_reference"] == {"wall_share": 0.5, "computed_share": 0.5, "flops_share": None,
                                                       "same_machine": True, "quiet": None}  # no FLOPs, no load
    # wall-clock shares only on one machine; positions computed always
    assert per_seed[2]["to_target_vs_reference"] == {"wall_share": None, "computed_share": 1.0, "flops_share": None,
                                                       "same_machine": False, "quiet": None}
    assert per_seed[3]["to_target_vs_reference"] is None
    for seed in (4, 5):
        assert per_seed[seed]["to_target_vs_reference"] == {"wall_share": None, "computed_share": 0.5, "flops_share": None,
                                                           "same_machine": None, "quiet": None}
    d3s = summary["variants"]["d3s"]
    assert d3s["one_machine_with_reference"] is False and d3s["speedup_wall"] is None
    assert d3s["speedup_computed"] is not None
    assert "to_target_vs_reference" not in summary["variants"]["grpo"]["per_seed"][0]
    md = render_markdown(summary, "d3s compare ...")
    assert "## Cost to reach grpo's final accuracy, seed by seed" in md
    # one machine, but no run recorded its load: the share is given, marked unverified
    assert "| d3s | 1 | 2 | 2.0 min | 0.50 of 4.0 min (unverified: no load record) | 0.50 | - | one machine |" in md
    assert ("| d3s | 2 | 4 | 4.0 min | not compared: different machines | 1.00 | - | **different machines** |"
            in md)
    assert "| d3s | 3 | not reached (55.0% at the end) |" in md
    for seed in (4, 5):
        assert f"| d3s | {seed} | 2 | 2.0 min | not compared: machine unknown | 0.50 | - | machine unknown |" in md
    assert "| not compared: different machines |" in md  # the cost table's speedup (wall)
    # the runs' table names each machine, and the notes say that the timings mix machines
    assert "| d3s seed 2 | 65.0% | 4.0 min |" in md and "AMD EPYC (25/1/1), 2 CPUs, AVX2 |" in md
    assert "Intel(R) Xeon(R) Processor (6/207/2), 2 CPUs, AVX-512 bf16 |" in md and "| not recorded |" in md
    assert "Intel(R) Xeon(R) Processor, 2 CPUs, AVX-512 bf16 |" in md  # seed 5's: no family, model, stepping
    assert "**The runs were not all timed on one machine**" in md


def test_one_machine_and_no_second_variant_add_no_notes(tmp_path):
    for seed in (1, 2):
        _write_run(tmp_path / f"grpo-seed{seed}", 0.6, [0.4, 0.5, 0.6])
        (tmp_path / f"grpo-seed{seed}" / "run_config.json").write_text(json.dumps(_run_config(_XEON)))
    md = render_markdown(summarize(tmp_path, ["grpo"], [1, 2]), "d3s compare ...")
    assert "seed by seed" not in md and "not all timed on one machine" not in md


def _load(start: float, end: float, cpus: int = 2) -> dict:
    """A summary's `load`: the 1-minute load averages at start and end (the 5-minute ones do not decide)."""
    return {"start": {"load_1min": start, "load_5min": 1.0, "cpu_count": cpus},
            "end": {"load_1min": end, "load_5min": 1.0, "cpu_count": cpus}}


def _with_load(folder: Path, load: dict | None) -> None:
    path = folder / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "load": load}))


def test_wall_clock_ratios_only_between_quiet_runs(tmp_path):
    # every run on one machine, each reaching 60% where the seed's grpo ends; seed 2's d3s ran with another job
    # (load 5.3 on 2 CPUs at the end): its share and the ratios over seeds are withheld, seed 1's pair is given
    loads = {1: (_load(2.0, 2.3), _load(1.2, 2.4)), 2: (_load(2.1, 2.0), _load(2.0, 5.3))}
    for seed, (ref_load, load) in loads.items():
        for name, curve, run_load in (("grpo", [0.4, 0.5, 0.6], ref_load), ("d3s", [0.4, 0.6, 0.6], load)):
            _write_run(tmp_path / f"{name}-seed{seed}", curve[-1], curve)
            (tmp_path / f"{name}-seed{seed}" / "run_config.json").write_text(json.dumps(_run_config(_XEON)))
            _with_load(tmp_path / f"{name}-seed{seed}", run_load)
    summary = summarize(tmp_path, ["grpo", "d3s"], [1, 2])
    per_seed = {p["seed"]: p for p in summary["variants"]["d3s"]["per_seed"]}
    assert (per_seed[1]["load_start"], per_seed[1]["load_end"], per_seed[1]["quiet"]) == (1.2, 2.4, True)
    assert (per_seed[2]["load_end"], per_seed[2]["quiet"]) == (5.3, False)
    assert per_seed[1]["to_target_vs_reference"]["wall_share"] == 0.5  # a quiet pair: shown
    assert per_seed[1]["to_target_vs_reference"]["quiet"] is True
    assert per_seed[2]["to_target_vs_reference"]["wall_share"] is None  # a loaded run: withheld
    d3s = summary["variants"]["d3s"]
    assert d3s["quiet_with_reference"] is False and d3s["speedup_wall"] is None
    assert d3s["speedup_computed"] is not None  # positions computed do not depend on the load
    md = render_markdown(summary, "d3s compare ...")
    assert "| d3s | 1 | 2 | 2.0 min | 0.50 of 4.0 min | 0.50 | - | one machine |" in md
    assert "| d3s | 2 | 2 | 2.0 min | wall-clock withheld: seed 2's d3s ran with load 5.3 on 2 CPUs |" in md
    assert "| wall-clock withheld: seed 2's d3s ran with load 5.3 on 2 CPUs | 2.00x |" in md  # the cost table
    assert "| d3s seed 2 | 60.0% | 4.0 min |" in md and "| 2.0 / 5.3 (loaded) |" in md and "| 1.2 / 2.4 |" in md
    assert "**Some runs ran on a loaded machine**" in md and "d3s seed 2 (5.3)" in md
    assert "recorded no load average" not in md


def test_a_quiet_pair_gets_its_ratio_and_a_run_without_a_load_record_is_unverified(tmp_path):
    for name, curve, load in (("grpo", [0.4, 0.5, 0.6], _load(2.0, 2.5)), ("d3s", [0.4, 0.6, 0.6], _load(0.3, 2.1))):
        _write_run(tmp_path / f"{name}-seed1", curve[-1], curve)
        (tmp_path / f"{name}-seed1" / "run_config.json").write_text(json.dumps(_run_config(_XEON)))
        _with_load(tmp_path / f"{name}-seed1", load)
    summary = summarize(tmp_path, ["grpo", "d3s"], [1])
    d3s = summary["variants"]["d3s"]
    assert d3s["quiet_with_reference"] is True and d3s["speedup_wall"] == 2.0  # 240 s against 120 s
    md = render_markdown(summary, "d3s compare ...")
    assert "| 2.00x | 2.00x |" in md and "unverified" not in md and "loaded machine" not in md
    _with_load(tmp_path / "d3s-seed1", None)  # a run made before runs recorded their load
    md = render_markdown(summarize(tmp_path, ["grpo", "d3s"], [1]), "d3s compare ...")
    assert "| 2.00x (unverified: no load record) | 2.00x |" in md
    assert "1 of 2 runs recorded no load average" in md


def test_steps_without_signal_are_counted_per_run_and_added_up_per_variant():
    from d3s.app.compare.markdown import _zero_gradient
    from d3s.app.compare.summary import _sum_counts
    from d3s.app.records import zero_gradient_steps

    records = [{"type": "train", "step": i + 1, "d3s/zero_gradient": z, "d3s/weights_moved": m,
                "d3s/optimizer_skipped": k} for i, (z, m, k) in enumerate([(0, 1, 0), (1, 1, 0), (1, 0, 1), (1, 1, 0)])]
    counts = zero_gradient_steps(records)
    assert counts == {"steps": 4, "zero_gradient": 3, "moved": 2, "skipped": 1}
    assert _zero_gradient(counts, 0.5) == "3 of 4 (moved 2, skipped 1)"
    assert _sum_counts([counts, counts]) == {"steps": 8, "zero_gradient": 6, "moved": 4, "skipped": 2}
    assert _sum_counts([counts, None]) is None  # a seed without the count: no total


def test_flop_shares_only_between_runs_of_one_convention(tmp_path):
    """grpo and d3s seed 1 counted FLOPs as runs did before they recorded a convention (estimate-v1); d3s seed 2 as
    computed-v2: its FLOP share to the target is not given, and the tables say the runs mix conventions."""
    for seed in (1, 2):
        _write_run(tmp_path / f"grpo-seed{seed}", 0.6, [0.4, 0.5, 0.6], flops=400.0)
    _write_run(tmp_path / "d3s-seed1", 0.6, [0.4, 0.6, 0.6], flops=200.0)
    _write_run(tmp_path / "d3s-seed2", 0.6, [0.4, 0.6, 0.6], flops=200.0, flops_convention="computed-v2")
    summary = summarize(tmp_path, ["grpo", "d3s"], [1, 2])
    per_seed = {p["seed"]: p for p in summary["variants"]["d3s"]["per_seed"]}
    assert [per_seed[s]["flops_convention"] for s in (1, 2)] == ["estimate-v1", "computed-v2"]
    assert per_seed[1]["to_target_vs_reference"]["flops_share"] == 0.25  # 100 of 400 FLOPs at step 2
    assert per_seed[2]["to_target_vs_reference"]["flops_share"] is None
    assert summary["flops_convention"] == "mixed"
    md = render_markdown(summary, "d3s compare ...")
    assert "| d3s | 1 | 2 | 2.0 min | not compared: machine unknown | 0.50 | 0.25 | machine unknown |" in md
    assert "| d3s | 2 | 2 | 2.0 min | not compared: machine unknown | 0.50 | - | machine unknown |" in md
    assert "**The runs counted their FLOPs in different conventions**" in md
    assert "- d3s: seed 1 `estimate-v1`, seed 2 `computed-v2`" in md

    one = summarize(tmp_path, ["grpo"], [1, 2])
    assert one["flops_convention"] == "estimate-v1"
    assert "FLOPs are `estimate-v1`: estimated model FLOPs" in render_markdown(one, "d3s compare ...")
