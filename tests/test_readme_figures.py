"""`scripts/readme_figures.py`: the figures README.md and docs/*.md quote are the ones the committed campaigns
give, and a figure edited by hand is caught."""

import importlib.util
import json
import re
import shutil
import statistics
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "scripts" / "readme_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)


def test_the_pages_quote_what_the_committed_data_gives():
    assert figures.run(ROOT, check=True) == []
    assert figures.main(["--check"]) == 0


def test_every_block_is_used_by_a_page():
    used = {m.group("name") for page in figures.pages(ROOT) for m in figures.BLOCK.finditer(page.read_text())}
    assert used == set(figures.FIGURES)


def _page_copies(tmp_path: Path) -> Path:
    """A root with copies of README.md and docs/*.md over the committed data (so `--check` reads the copies)."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    for page in figures.pages(ROOT):
        shutil.copy(page, root / page.relative_to(ROOT))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / "benchmarks").symlink_to(ROOT / "benchmarks")
    return root


@pytest.mark.parametrize("page,name,old,new", [
    ("README.md", "readme-results", "62.2%", "64.2%"),
    ("README.md", "readme-lead", "no arm beat tuned GRPO", "D1S-C beat tuned GRPO"),
    ("docs/results.md", "race-default", "64.9%", "66.9%"),
    ("docs/results.md", "campaign5-default", "65.8%", "68.5%"),
])
def test_a_figure_edited_by_hand_fails_the_check_and_is_named(tmp_path, monkeypatch, capsys, page, name, old, new):
    root = _page_copies(tmp_path)
    copy = root / page
    text = copy.read_text()
    block = re.search(rf"<!-- figures:{name} -->\n(.*?)<!-- /figures:{name} -->", text, re.S)
    edited = block.group(1).replace(old, new, 1)
    assert edited != block.group(1)
    copy.write_text(text.replace(block.group(1), edited))
    monkeypatch.setattr(figures, "ROOT", root)
    assert figures.main(["--check"]) == 1
    assert f"{copy.name}: {name}" in capsys.readouterr().out
    assert new in copy.read_text()  # --check leaves the page as it is
    assert figures.run(root, check=False, files=[copy]) == [f"{copy.name}: {name}"]
    assert copy.read_text() == text
    assert figures.main(["--check"]) == 0


def test_the_trl_field_table_lists_every_d3s_config_field():
    import dataclasses

    from d3s.integrations.trl import D3SConfig
    from d3s.integrations.trl.compat import GRPOConfig

    ours = [f.name for f in dataclasses.fields(D3SConfig) if f.init]
    ours = [n for n in ours if n not in {f.name for f in dataclasses.fields(GRPOConfig)}]
    text = (ROOT / "docs" / "trl.md").read_text()
    block = re.search(r"<!-- figures:d3s-config-fields -->\n(.*?)<!-- /figures:d3s-config-fields -->", text, re.S)
    rows = re.findall(r"^\| `(\w+)` \|", block.group(1), re.M)
    assert rows == ours
    for name in ("token_cut", "min_tokens_per_rollout", "keep_last_in_loss", "schedule_clock"):
        assert name in rows
    # a field dropped from the page fails the check
    line = next(line for line in block.group(1).splitlines() if line.startswith("| `schedule_clock`"))
    stale = text.replace(line + "\n", "")
    assert figures.render(stale, ROOT, "../")[1] == ["d3s-config-fields"]


def test_a_difference_is_shown_only_where_the_interval_and_the_corrected_test_agree():
    assert figures.paired(0.022, (-0.105, 0.149), 0.3) == "+2.2 points [-10.5, +14.9], not shown"
    assert figures.paired(0.09, (0.016, 0.164), 0.02) == "+9.0 points [+1.6, +16.4], corrected p = 0.02"
    assert figures.paired(0.09, (0.016, 0.164), 0.07) == "+9.0 points [+1.6, +16.4], not shown (corrected p = 0.07)"
    # five seeds, all above: the interval excludes zero, but the exact test cannot go below 2/32
    assert figures.paired_between([0.6, 0.62, 0.61, 0.65, 0.6], [0.5] * 5).endswith(", not shown (p = 0.062)")
    assert figures.verdict(0.09, [0.016, 0.164], 0.07) == "not shown (corrected p = 0.07)"
    assert figures.verdict(-0.09, [-0.164, -0.016], 0.01) == "lower"


def test_a_compare_json_written_before_the_tests_gets_them_from_its_per_seed_values():
    c = {"reference": "grpo", "seeds": [1, 2, 3, 4, 5, 6],
         "variants": {"grpo": {"final_accuracy_per_seed": [0.5] * 6},
                      "a": {"final_accuracy_per_seed": [0.6, 0.55, 0.57, 0.6, 0.62, 0.58]},
                      "b": {"final_accuracy_per_seed": [0.52, 0.48, 0.5, 0.51, 0.49, 0.53]}}}
    tests = figures.arm_tests(c, "final")
    assert tests["a"]["p_value"] == 2 / 64 and tests["a"]["p_value_holm"] == 2 * 2 / 64
    c["variants"]["a"].update(diff_to_reference_p_value=0.5, diff_to_reference_p_value_holm=0.9)
    c["variants"]["b"].update(diff_to_reference_p_value=0.5, diff_to_reference_p_value_holm=0.9)
    assert figures.arm_tests(c, "final")["a"] == {"p_value": 0.5, "p_value_holm": 0.9}  # stored: read as written


# --- the race blocks, on a made-up compare.json ------------------------------------------------------------

MACHINE = {"cpu_vendor": "AuthenticAMD", "cpu": "AMD EPYC", "cpu_family": 25, "cpu_model": 17, "cpu_stepping": 1,
           "cpu_flags": ["avx2"], "cpu_count": 2, "accelerator": None, "processes": 1, "torch": "2.13.0",
           "torch_threads": 2}


def _variant(finals, ci, diffs_ci, reach, wall, machines, p_holm=0.01):
    seeds = [11, 12, 13, 14]
    return {"final_accuracy_mean": sum(finals) / 4, "seed_ci95": ci,
            "per_seed": [{"seed": s, "steps": 20, "train_wall_s": w, "machine": m}
                         for s, w, m in zip(seeds, wall, machines)],
            "budget": {"diff_at_budget_mean": None if diffs_ci is None else sum(diffs_ci) / 2,
                       "diff_at_budget_ci": diffs_ci, "diff_at_budget_mdd": 0.1, "probability_of_improvement": 0.5,
                       "p_value": p_holm, "p_value_holm": p_holm, "auc_p_value": 0.5, "auc_p_value_holm": 0.5,
                       "auc_diff_mean": 0.01, "auc_diff_ci": [-0.02, 0.04],
                       "seeds_reaching_target": sum(r is not None for r in reach),
                       "compute_to_target_median": None,
                       "per_seed": {str(s): {"compute_to_target": r, "curve": _curve(r)} for s, r in zip(seeds, reach)}}}


def _curve(held):
    """A budget curve evaluated at the shares a 20-step reference gives, below 0.6 until `held`, then 0.7."""
    shares = (0.0, 0.2, 0.42, 0.62, 0.82, 1.0)
    return [(x, 0.7 if held is not None and x >= held else 0.5) for x in shares]


def _race_root(tmp_path, variants, folder="race-default"):
    folder = tmp_path / figures.RESULTS / folder
    folder.mkdir(parents=True)
    (folder / "compare.json").write_text(json.dumps(
        {"mode": "budget", "reference": "grpo", "seeds": [11, 12, 13, 14], "variants": variants}))
    return tmp_path


def test_the_race_verdict_says_higher_lower_or_not_shown_and_counts_the_compute_target(tmp_path, monkeypatch):
    monkeypatch.setitem(figures.RACE_SEEDS, "race-default", 4)  # a finished campaign of 4 seeds
    other = dict(MACHINE, cpu_model=1)
    grpo = _variant([0.6] * 4, [0.5, 0.7], None, [0.82, 0.82, None, 1.0], [100, 100, 100, 100], [MACHINE] * 4)
    up = _variant([0.7] * 4, [0.6, 0.8], [0.01, 0.19], [0.2, 0.2, 0.2, 0.62], [50, 60, 70, 80],
                  [MACHINE, MACHINE, MACHINE, other])
    down = _variant([0.5] * 4, [0.4, 0.6], [-0.2, -0.01], [0.2, None, None, None], [50] * 4, [MACHINE] * 4)
    flat = _variant([0.6] * 4, [0.5, 0.7], [-0.05, 0.05], [0.2, 0.42, 0.42, 0.62], [50] * 4, [MACHINE] * 4)
    # an interval above zero that the corrected test does not confirm
    unconfirmed = _variant([0.7] * 4, [0.6, 0.8], [0.01, 0.19], [None] * 4, [50] * 4, [MACHINE] * 4, p_holm=0.07)
    root = _race_root(tmp_path, {"grpo": grpo, "d3s": up, "d1s-c": down, "d3s+min_tokens_per_rollout=0": flat,
                                 "d3s+max_grad_norm=0": unconfirmed})
    text = figures.race_verdict(root)
    # held from 0.2 in three seeds: 3 of 4 meets the target of 75% of seeds; held from 0.62 after 0.42 below: not
    assert "D3S + floor: higher, meets the compute target (3 of 4)" in text
    assert "D1S-C: lower, misses the compute target (1 of 4)" in text
    # held from 0.42 after 0.2 below: crossed somewhere in (0.2, 0.42], on either side of 0.4
    assert "paper's D3S: not shown, may meet the compute target (1 (+2 can't tell) of 4)" in text
    assert figures.target_counts(flat["budget"]) == (1, 2, 1)
    assert "D3S + floor, no gradient clipping: not shown (corrected p = 0.07), misses" in text
    table = figures.race_table(root, "race-default")
    # wall-clock: the seed timed on another machine is left out, the mean of 50/100, 60/100, 70/100 remains
    assert "| 0.60 (1 pairs left out) |" in table
    assert "+10.0 points [+1.0, +19.0], corrected p = 0.01 |" in table
    assert "-10.5 points [-20.0, -1.0], corrected p = 0.01 |" in table
    assert "+10.0 points [+1.0, +19.0], not shown (corrected p = 0.07) |" in table
    assert "+0.0 points [-5.0, +5.0], not shown" in table


def test_the_race_headline_names_a_task_not_run_yet(tmp_path):
    grpo = _variant([0.6] * 4, [0.5, 0.7], None, [0.9] * 4, [100] * 4, [MACHINE] * 4)
    root = _race_root(tmp_path, {"grpo": grpo, "d3s": _variant([0.7] * 4, [0.6, 0.8], [0.01, 0.19],
                                                                  [0.3] * 4, [50] * 4, [MACHINE] * 4)})
    text = figures.race_headline(root)
    assert text.startswith("- The default task, 4 of 8 seeds so far (11-14), paired: GRPO ended at 60.0%")
    assert "  - D3S + floor: 70.0%, +10.0 points [+1.0, +19.0], corrected p = 0.01;" in text
    assert text.endswith("- Not run yet: arith-2digit.")


def test_the_race_verdict_covers_each_task_with_data_and_says_how_far_it_is(tmp_path):
    grpo = _variant([0.6] * 4, [0.5, 0.7], None, [0.9] * 4, [100] * 4, [MACHINE] * 4)
    up = _variant([0.7] * 4, [0.6, 0.8], [0.01, 0.19], [0.2] * 4, [50] * 4, [MACHINE] * 4)
    down = _variant([0.5] * 4, [0.4, 0.6], [-0.2, -0.01], [None] * 4, [50] * 4, [MACHINE] * 4)
    root = _race_root(tmp_path, {"grpo": grpo, "d3s": up})
    assert "arith-2digit" not in figures.race_verdict(root)  # no data there yet: not named
    _race_root(tmp_path, {"grpo": grpo, "d3s": down}, folder="race-arith2digit")
    text = figures.race_verdict(root)
    assert text.startswith("At GRPO's compute on the default task (4 of 8 seeds so far, ")
    # 4 met of 8 planned: the 4 seeds still to run decide
    assert "D3S + floor: higher, may meet the compute target (4 of 4)" in text
    assert "on arith-2digit (4 of 6 seeds so far, " in text
    assert "paper's D3S (its recipe's): lower, misses the compute target (0 of 4)" in text
    assert figures.seeds_so_far("race-arith2digit", 6) == "6 seeds"


def test_the_compute_target_of_a_campaign_under_way_counts_the_seeds_still_to_run():
    held = _variant([0.7] * 4, [0.6, 0.8], [0.01, 0.19], [0.2, 0.2, 0.2, 0.2], [50] * 4, [MACHINE] * 4)["budget"]
    missed = _variant([0.5] * 4, [0.4, 0.6], [-0.2, -0.01], [None] * 4, [50] * 4, [MACHINE] * 4)["budget"]
    # 4 of 4 met: enough for 75% of 4 seeds, and of 5 (3.75); of 8 they need 6, and 4 seeds still to run may give them
    assert [figures.target_verdict(held, n) for n in (4, 5, 8)] == ["meets", "meets", "may meet"]
    # none of 4: out of reach with 4 more seeds of 8 (4 < 6), still within reach with 20 more of 24 (20 >= 18)
    assert [figures.target_verdict(missed, n) for n in (4, 8, 24)] == ["misses", "misses", "may meet"]


def test_the_step_time_ratio_pairs_seeds_timed_on_one_machine():
    other = dict(MACHINE, cpu="Intel Xeon", cpu_vendor="GenuineIntel", cpu_family=6, cpu_model=207)

    def runs(seconds, machines):
        return {"per_seed": [{"seed": s, "step_seconds": {"step": x}, "machine": m}
                             for s, x, m in zip([1, 2, 3], seconds, machines)]}
    c = {"variants": {"grpo": runs([40, 40, 20], [MACHINE, MACHINE, other]),
                      "d3s": runs([20, 10, 30], [MACHINE, MACHINE, MACHINE]),
                      "d1s-c": runs([10, 10, 10], [other, other, MACHINE])}}
    assert figures.step_ratio(c, "d3s") == (0.375, 1)  # (20/40 + 10/40) / 2; seed 3 timed on two machines
    assert figures.step_ratio(c, "d1s-c") == (None, 3)  # no seed's pair on one machine: not compared
    assert figures.load_note(c).startswith("No run here recorded its load average")  # unverified, said once


def test_a_pair_with_a_loaded_run_is_left_out_of_the_wall_clock_ratios():
    def runs(seconds, loads):
        return {"per_seed": [{"seed": s, "step_seconds": {"step": x}, "machine": MACHINE, "quiet": q}
                             for s, x, q in zip([1, 2, 3], seconds, loads)]}
    c = {"variants": {"grpo": runs([40, 40, 40], [True, True, None]), "d3s": runs([20, 10, 30], [True, False, True])}}
    # seed 2's d3s ran loaded: left out; seed 3's grpo recorded no load: kept, unverified
    assert figures.step_ratio(c, "d3s") == ((20 / 40 + 30 / 40) / 2, 1)
    assert figures.load_note(c) == ("1 of 6 runs ran on a loaded machine; pairs with them are left out. 1 of 6 runs "
                                    "recorded no load average: ratios with them are unverified.")
    c["variants"]["d3s"]["per_seed"][1]["quiet"] = True
    c["variants"]["grpo"]["per_seed"][2]["quiet"] = True
    assert figures.step_ratio(c, "d3s") == ((20 / 40 + 10 / 40 + 30 / 40) / 3, 0) and figures.load_note(c) == ""


def test_the_d3s_settings_are_paired_against_the_recipes_d3s_seed_by_seed(tmp_path):
    def arm(acc, auc):
        v = _variant([0.6] * 4, [0.5, 0.7], [-0.1, 0.1], [None] * 4, [50] * 4, [MACHINE] * 4)
        for s, a, u in zip(["11", "12", "13", "14"], acc, auc):
            v["budget"]["per_seed"][s].update(accuracy_at_budget=a, auc=u)
        return v
    root = _race_root(tmp_path, {"grpo": arm([0.5] * 4, [0.4] * 4),
                                 "d3s": arm([0.60, 0.62, 0.58, 0.60], [0.5] * 4),
                                 "d1s-c": arm([0.70, 0.72, 0.70, 0.68], [0.5, 0.6, 0.5, 0.6])})
    text = figures.race_settings(root, "race-default")
    # differences 0.10, 0.10, 0.12, 0.08: mean 0.10, sd 0.0163, t(3) 3.182 -> +/- 0.0260; all four above zero,
    # so the sign-flip p is 2/16: four seeds cannot show it, the interval alone would
    assert "D1S-C +10.0 points [+7.4, +12.6], not shown (p = 0.12) at the budget" in text
    # area differences 0, 0.1, 0, 0.1: mean 0.05, sd 0.0577 -> +/- 0.0919
    assert "+5.0 points [-4.2, +14.2], not shown in area under the curve" in text
    assert "GRPO" not in text  # the reference is not a D3S setting


def _decision_root(tmp_path, d1s_acc, floor_acc, d1s_vs_grpo_ci, p_holm=0.01):
    """A finished (4-seed) arith-2digit race whose D1S-C and D3S + floor end at the given accuracies."""
    def arm(acc, ci):
        v = _variant([0.4] * 4, [0.3, 0.5], ci, [None] * 4, [50] * 4, [MACHINE] * 4, p_holm=p_holm)
        for s, a in zip(["11", "12", "13", "14"], acc):
            v["budget"]["per_seed"][s].update(accuracy_at_budget=a, auc=a)
        return v
    return _race_root(tmp_path, {"grpo": arm([0.4] * 4, None), "d3s": arm([0.3] * 4, [-0.2, -0.1]),
                                 figures.FLOOR: arm(floor_acc, [-0.1, 0.1]), "d1s-c": arm(d1s_acc, d1s_vs_grpo_ci)},
                      folder="race-arith2digit")


def test_the_default_recipe_decision_follows_the_rule_decided_before_the_runs(tmp_path, monkeypatch):
    monkeypatch.setitem(figures.RACE_SEEDS, "race-arith2digit", 4)
    # D1S-C above the floor in the paired mean (+0.5 points) and not shown below GRPO: D1S-C
    root = _decision_root(tmp_path / "a", [0.41, 0.40, 0.42, 0.39], [0.40, 0.40, 0.40, 0.40], [-0.05, 0.06])
    assert figures.race_decision_variant(root) == "d1s-c"
    assert "the default recipe's variant is now D1S-C" in figures.race_decision(root)
    # a tie counts for D1S-C ("at or above")
    root = _decision_root(tmp_path / "b", [0.40] * 4, [0.40] * 4, [-0.05, 0.06])
    assert figures.race_decision_variant(root) == "d1s-c"
    # below the floor in the paired mean (-0.5 points), though above GRPO: the floor stays
    root = _decision_root(tmp_path / "c", [0.39, 0.40, 0.40, 0.39], [0.40] * 4, [0.01, 0.06])
    assert figures.race_decision_variant(root) == "d3s"
    assert "D1S-C against D3S + floor -0.5 points" in figures.race_decision(root)
    assert "stays D3S + floor" in figures.race_decision(root)
    # above the floor but shown below GRPO: the floor stays
    root = _decision_root(tmp_path / "d", [0.41] * 4, [0.40] * 4, [-0.09, -0.01])
    assert figures.race_decision_variant(root) == "d3s"
    # the rule reads "shown below" as it was fixed, by the interval alone: a corrected test added since does not
    # change it (it could only turn a "below" into "not shown", never the other way)
    root = _decision_root(tmp_path / "e", [0.41] * 4, [0.40] * 4, [-0.09, -0.01], p_holm=0.5)
    assert figures.race_decision_variant(root) == "d3s"
    assert "against GRPO -5.0 points [-9.0, -1.0], not shown (corrected p = 0.5)" in figures.race_decision(root)


def test_the_decision_waits_for_every_seed(tmp_path):
    root = _decision_root(tmp_path, [0.41] * 4, [0.40] * 4, [-0.05, 0.06])  # 4 of the planned 6 seeds
    assert figures.race_decision_variant(root) is None
    assert "decided when the 6 seeds are in" in figures.race_decision(root)


def test_the_task_recipes_run_the_setting_the_latest_rule_decided():
    default, arith = (yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())
                      for name in ("default", "arith-2digit"))
    assert default["min_tokens_per_rollout"] == 4  # `--variant d3s` on it is the floor the races ran
    shipped = figures.credit_shipped_setting(ROOT)
    if shipped is None:  # the controls are not all in: the first race's rule holds, arith-2digit keeps its D3S
        decided = figures.race_decision_variant(ROOT)
        assert decided is not None  # the campaign it was decided on is finished
        assert default["variant"] == decided and arith["variant"] == "d3s"
        assert default["learning_rate"] == arith["learning_rate"] == 3e-5
        return
    for recipe in (default, arith):  # the controls' rule (benchmarks/results/credit-rule.md): both task recipes
        assert (recipe["variant"], recipe["learning_rate"]) == (shipped["variant"], shipped["learning_rate"])


# --- the controls' race: the rule of benchmarks/results/credit-rule.md, applied to made-up races ---------------

def _credit_race(root: Path, folder: str, accuracies: dict[str, list[float]]) -> None:
    """A budget compare.json whose arms end at `accuracies` per seed (the first arm the reference), with the paired
    interval and the Holm-corrected sign-flip p-values `d3s compare` writes."""
    from d3s.app.intervals import mean_interval

    ref = next(iter(accuracies))
    seeds = list(range(21, 21 + len(accuracies[ref])))
    diffs = {v: [a - r for a, r in zip(accs, accuracies[ref])] for v, accs in accuracies.items() if v != ref}
    tests = figures.paired_tests(diffs)
    variants = {}
    for v, accs in accuracies.items():
        budget = {"per_seed": {str(s): {"accuracy_at_budget": a} for s, a in zip(seeds, accs)}}
        if v != ref:
            budget.update(diff_at_budget_mean=sum(diffs[v]) / len(diffs[v]), diff_at_budget_ci=list(mean_interval(diffs[v])),
                          **tests[v])
        variants[v] = {"budget": budget, "per_seed": [{"seed": s, "steps": 20 if v == ref else 60} for s in seeds],
                       "prompts_checked_seeds": len(seeds), "same_prompts_seeds": len(seeds)}
    out = root / figures.RESULTS / folder
    out.mkdir(parents=True)
    (out / "compare.json").write_text(json.dumps({"mode": "budget", "reference": ref, "seeds": seeds,
                                                  "variants": variants}))


GRPO, D1SC, RANDOM = "grpo+learning_rate=6e-05", "d1s-c", "d1s-c+sample_selection=random"
SMALL = "grpo+num_generations=4+per_device_train_batch_size=8+learning_rate=6e-05"
NOISE = [0.01, -0.01, 0.02, 0.0, -0.02, 0.01, 0.0, -0.01]


def _credit_races(root: Path, d1s_c_gain: float, random_gain: float) -> None:
    """Both races, and the flat-start task's 9 runs, none below its start."""
    for v in (GRPO, D1SC, "d1s-c+skip_steps_without_signal=false"):
        for seed in (21, 22, 23):
            run = root / figures.RESULTS / "credit-flat" / f"{v}-seed{seed}"
            run.mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps({"below_start": []}))
    base = [0.6 + n for n in NOISE]
    _credit_race(root, "credit-race-default", {
        GRPO: base, D1SC: [b + d1s_c_gain + n / 2 for b, n in zip(base, NOISE[::-1])],
        RANDOM: [b + random_gain + n for b, n in zip(base, NOISE)], SMALL: [b - 0.005 * (i % 3) for i, b in enumerate(base)]})
    _credit_race(root, "credit-race-arith2digit", {
        GRPO: base[:5], D1SC: [b + n for b, n in zip(base, NOISE[2:])], RANDOM: [b - n for b, n in zip(base, NOISE)],
        SMALL: [b + n / 2 for b, n in zip(base, NOISE[1:])]})


def test_the_controls_verdict_says_what_is_running_until_both_races_are_in(tmp_path):
    assert "provisional" in figures.credit_verdict(tmp_path)
    _credit_races(tmp_path, 0.1, 0.0)
    (tmp_path / figures.RESULTS / "credit-race-arith2digit" / "compare.json").unlink()
    assert "is being tested" in figures.credit_verdict(tmp_path)


def test_the_controls_verdict_credits_the_selection_only_against_its_controls(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.10, random_gain=0.0)
    text = figures.credit_verdict(tmp_path)
    assert text.startswith("On a 135M model learning arithmetic, at the compute of a GRPO whose learning rate was "
                           "tuned (every arm at its own tuned rate), D1S-C beat tuned GRPO.")
    assert "Max-variance selection beat random selection of as many rollouts." in text
    assert "So the recipes run D1S-C at its tuned rate" in text


def test_when_random_selection_does_as_well_the_selection_gets_no_credit(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.10, random_gain=0.10)
    text = figures.credit_verdict(tmp_path)
    assert "D1S-C and random selection beat tuned GRPO" in text
    assert "Max-variance selection was not shown to differ from random selection" in text


def test_no_arm_above_tuned_grpo_ships_grpo_and_says_so_first(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.0, random_gain=0.0)
    text = figures.credit_verdict(tmp_path)
    assert text.startswith("On a 135M model learning arithmetic, at the compute of a GRPO whose learning rate was "
                           "tuned (every arm at its own tuned rate), no arm beat tuned GRPO.")
    assert "So the recipes run tuned GRPO" in text


def test_a_winner_that_fell_below_its_start_does_not_ship(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.10, random_gain=0.0)
    run = tmp_path / figures.RESULTS / "credit-flat" / "d1s-c-seed22"
    (run / "summary.json").write_text(json.dumps({"below_start": [{"step": 40}]}))
    text = figures.credit_verdict(tmp_path)
    assert "The recipes run tuned GRPO" in text and "fell below its own start in credit-flat/d1s-c-seed22" in text


# --- the course of a run: docs/method.md's table of what the runs that fell below their start did ---------------

def _run_course(run: Path, rates: list[float], norms: list[float], flat: list[int], clipped: list[float],
                lengths: list[float], accuracies: list[float], below: bool, moved: bool = False,
                budget: dict | None = None) -> None:
    run.mkdir(parents=True)
    records = [{"type": "eval", "step": 0, "accuracy": accuracies[0]}]
    for i, (rate, norm, f, c, n) in enumerate(zip(rates, norms, flat, clipped, lengths), 1):
        records.append({"type": "train", "step": i, "learning_rate": rate, "grad_norm": norm, "d3s/no_signal_step": f,
                        "completions/clipped_ratio": c, "completions/mean_length": n,
                        "d3s/weights_moved": 1.0 if moved or not f else 0.0})
    records += [{"type": "eval", "step": len(rates), "accuracy": a} for a in accuracies[1:]]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "run_config.json").write_text(json.dumps({"trainer": {"max_grad_norm": 1.0, "learning_rate": rates[0]}}))
    fall = {"step": len(rates), "accuracy": accuracies[-1], "no_signal_share": statistics.fmean(flat),
            "truncation_rate": statistics.fmean(clipped), "completion_length": statistics.fmean(lengths)}
    (run / "summary.json").write_text(json.dumps({"below_start": [fall] if below else [],
                                                  **({"budget": budget} if budget else {})}))


def test_the_course_table_sums_the_rate_and_counts_clipped_and_signal_free_steps(tmp_path):
    ten = [1e-5] * 10
    _run_course(tmp_path / "a", ten, [2.0] * 5 + [0.5] * 5, [0] * 8 + [1] * 2, [0.2] * 5 + [0.0] * 5,
                [30.0] * 5 + [10.0] * 5, [0.4, 0.5, 0.6], below=False)
    rising = [4e-5] * 6  # a larger rate, fewer steps: 2.4x the first run's summed rate
    _run_course(tmp_path / "b", rising, [3.0, 0.0, 3.0, 0.0, 3.0, 3.0], [0, 1, 0, 1, 0, 0], [0.1] * 6,
                [20.0] * 6, [0.4, 0.1, 0.05], below=True)
    table = figures.dynamics_table([("A, 1x", [tmp_path / "a"]), ("B, 4x", [tmp_path / "b"])], unit=1e-4)
    rows = table.splitlines()[2:]
    # a: 10 steps, summed rate 1e-4 (1.0x), half the steps clipped, 2 of 10 without signal, truncation 20% -> 0%
    assert rows[0] == "| A, 1x | 10 | 1.0x | 50.0% | 20.0% | 20.0% -> 0.0% | 30 -> 10 | 60.0% | 40.0% | 0 of 1 |"
    # b: the last five steps overlap its first five; 4 of 6 norms above 1.0
    assert rows[1] == "| B, 4x | 6 | 2.4x | 66.7% | 33.3% | 10.0% -> 10.0% | 20 -> 20 | 5.0% | 5.0% | 1 of 1 |"


def test_the_tuning_table_waits_for_the_choice_of_rates(tmp_path):
    tuning = tmp_path / figures.RESULTS / "credit-tuning"
    for folder, arm in (("credit-tuning-grpo", "grpo"), ("credit-tuning", "d1s-c")):
        for multiple in (1, 4):
            rate = 3e-5 * multiple
            name = arm if multiple == 1 else f"{arm}+learning_rate={rate!r}"
            steps = 4 if arm == "grpo" else 8
            _run_course(tmp_path / figures.RESULTS / folder / f"{name}-seed1", [rate] * steps, [2.0] * steps,
                        [0] * steps, [0.1] * steps, [20.0] * steps, [0.4, 0.5 if multiple == 1 else 0.1],
                        below=multiple == 4)
    assert "not all in yet" in figures.collapse_tuning(tmp_path)
    (tuning / "choice.json").write_text("{}")
    rows = figures.collapse_tuning(tmp_path).splitlines()[2:6]
    assert [r.split(" | ")[0] for r in rows] == ["| GRPO, 1x", "| GRPO, 4x", "| D1S-C, 1x", "| D1S-C, 4x"]
    assert [r.split(" | ")[2] for r in rows] == ["1.0x", "4.0x", "2.0x", "8.0x"]  # in GRPO 1x's summed rate


def test_the_flat_start_table_waits_for_every_run_then_names_each_arm(tmp_path):
    folder = tmp_path / figures.RESULTS / "credit-flat"
    variants = ["grpo", "d1s-c", "d1s-c+skip_steps_without_signal=false"]
    for i, v in enumerate(variants):
        for s in (21, 22, 23):
            if (v, s) != (variants[2], 23):
                _run_course(folder / f"{v}-seed{s}", [1e-5] * 5 * (i + 1), [2.0] * 5 * (i + 1), [0] * 5 * (i + 1),
                            [0.1] * 5 * (i + 1), [20.0] * 5 * (i + 1), [0.1, 0.2 - 0.1 * i], below=i == 2)
    at_budget = {"grpo": [0.1, 0.1, 0.1], "d1s-c": [0.2, 0.15, 0.1], variants[2]: [0.0, 0.05, 0.1]}
    (folder / "compare.json").write_text(json.dumps({"reference": "grpo", "seeds": [21, 22, 23], "variants": {
        v: {"budget": {"per_seed": {str(s): {"accuracy_at_budget": a} for s, a in zip((21, 22, 23), at_budget[v])},
                       "diff_at_budget_mean": statistics.fmean(at_budget[v]) - 0.1, "diff_at_budget_ci": ci,
                       "p_value_holm": p}}
        for v, ci, p in (("grpo", None, None), ("d1s-c", [0.01, 0.09], 0.25), (variants[2], [-0.2, 0.1], 1.0))}}))
    assert "not all in yet" in figures.collapse_flat(tmp_path)
    # the last run: every step without signal, 10 of its 15 moving the weights; it reached its step cap early
    _run_course(folder / f"{variants[2]}-seed23", [1e-5] * 15, [2.0] * 15, [1] * 15, [0.1] * 15, [20.0] * 15,
                [0.1, 0.0], below=True, moved=True, budget={"share": 0.875, "stopped_by": "max_steps"})
    records = [json.loads(line) for line in (folder / f"{variants[2]}-seed23" / "metrics.jsonl").open()]
    for r in records[1:6]:
        r["d3s/weights_moved"] = 0.0
    (folder / f"{variants[2]}-seed23" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    text = figures.collapse_flat(tmp_path)
    header, rows = text.splitlines()[0], text.splitlines()[2:5]
    assert "| steps without signal | steps without signal that moved the weights |" in header
    assert rows[0].startswith("| GRPO (the reference) | 5 / 5 / 5 | 1.0x | 100.0% | 0.0% | 0.0% |")
    assert rows[0].endswith("| 0 of 3 |")
    assert rows[1].startswith("| D1S-C with the recipes' step skip | 10 / 10 / 10 | 2.0x |")
    # seeds 21 and 22: 10 steps, none without signal; seed 23: 15 without signal, 10 moved
    assert rows[2].startswith("| D1S-C without the step skip | 15 / 15 / 15 | 3.0x | 100.0% | 33.3% | 22.2% |")
    assert rows[2].endswith("| 3 of 3 |")
    assert "every run started at 10.0% held-out accuracy (D1S-C without the step skip seed 23 reached its step " \
           "cap (15 steps) after 87.5% of GRPO's compute)." in text
    # every run of the last arm fell: seed 23's report, all its 15 steps without signal, 10% truncated, 20 tokens
    assert "First below its start: D1S-C without the step skip seed 21 at step 15 (0.0%; " in text
    assert ("D1S-C without the step skip seed 23 at step 15 (0.0%; until then 100.0% of its steps without signal, "
            "10.0% of completions truncated, 20 tokens a completion).") in text
    # the interval excludes zero but the corrected p does not agree: not shown
    assert ("At GRPO's compute, paired by seed (Holm over the arms): GRPO 10.0%; D1S-C with the recipes' step skip "
            "15.0% (+5.0 points [+1.0, +9.0], not shown (corrected p = 0.25)); D1S-C without the step skip 5.0% "
            "(-5.0 points [-20.0, +10.0], not shown).") in text


def test_a_controls_table_waits_for_its_race_then_tests_d1s_c_against_each_control(tmp_path):
    assert "Not in yet: the default task, 8 seeds x 4 arms" in figures.credit_table(tmp_path, "credit-race-default")
    _credit_races(tmp_path, d1s_c_gain=0.10, random_gain=0.0)
    table = figures.credit_table(tmp_path, "credit-race-default")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    c = json.loads((tmp_path / figures.RESULTS / "credit-race-default" / "compare.json").read_text())
    b = c["variants"][D1SC]["budget"]
    assert figures.paired(b["diff_at_budget_mean"], b["diff_at_budget_ci"], b["p_value_holm"]) in rows["D1S-C"]
    assert rows["D1S-C"].endswith("| 60 | 8 of 8 |") and rows["tuned GRPO"].endswith("| - | - | - | 20 | - |")
    assert set(rows) == {"arm", "tuned GRPO", "D1S-C", "random selection", "GRPO generating only what D1S-C trains on"}
    accs = {v: [c["variants"][v]["budget"]["per_seed"][str(s)]["accuracy_at_budget"] for s in c["seeds"]]
            for v in (D1SC, RANDOM, SMALL)}
    assert (f"D1S-C against random selection of as many rollouts (the same N and rate), paired, one comparison: "
            f"{figures.paired_between(accs[D1SC], accs[RANDOM])}.") in table
    assert f"trains on: {figures.paired_between(accs[D1SC], accs[SMALL])}." in table
    assert ", not shown" not in figures.paired_between(accs[D1SC], accs[RANDOM])  # a 10-point gain over 8 seeds


def test_the_verdict_waits_for_the_flat_start_runs_the_rule_reads(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.10, random_gain=0.0)
    (tmp_path / figures.RESULTS / "credit-flat" / "d1s-c-seed23" / "summary.json").unlink()
    assert "is being tested" in figures.credit_verdict(tmp_path)
    assert figures.credit_shipped_setting(tmp_path) is None


def test_the_shipped_setting_is_the_winner_at_its_tuned_rate_and_a_falling_grpo_is_said(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.10, random_gain=0.0)
    choice = {"grpo": {"learning_rate": 6e-05}, "d1s-c": {"learning_rate": 3e-05}}
    (tmp_path / figures.RESULTS / "credit-tuning").mkdir(parents=True)
    (tmp_path / figures.RESULTS / "credit-tuning" / "choice.json").write_text(json.dumps(choice))
    assert figures.credit_shipped_setting(tmp_path) == {"variant": "d1s-c", "learning_rate": 3e-05}
    flat = tmp_path / figures.RESULTS / "credit-flat"
    (flat / "d1s-c-seed21" / "summary.json").write_text(json.dumps({"below_start": [{"step": 30}]}))
    (flat / f"{GRPO}-seed22" / "summary.json").write_text(json.dumps({"below_start": [{"step": 4}]}))
    assert figures.credit_shipped_setting(tmp_path) == {"variant": "grpo", "learning_rate": 6e-05}
    text = figures.credit_verdict(tmp_path)
    assert text.endswith(f"Tuned GRPO too fell below its own start in credit-flat/{GRPO}-seed22.")
    # a control's run that fell (small-G GRPO on arith-2digit) is not the shipped GRPO's
    small = tmp_path / figures.RESULTS / "credit-race-arith2digit" / f"{SMALL}-seed21"
    small.mkdir()
    (small / "summary.json").write_text(json.dumps({"below_start": [{"step": 8}]}))
    assert f"{SMALL}-seed21" not in figures.credit_verdict(tmp_path)


# --- the README's lead and results: the first race until the controls are in, then the controls' rule ---------------

def test_the_lead_says_what_d3s_does_then_the_first_race_until_the_controls_are_in(tmp_path):
    lead = figures.readme_lead(ROOT) if figures.credit_shipped_setting(ROOT) is None else None
    if lead is not None:  # the committed data: the first race's D1S-C, from its compare.json
        c = json.loads((ROOT / figures.RESULTS / "race-default" / "compare.json").read_text())
        b = c["variants"]["d1s-c"]["budget"]
        said = figures.paired(b["diff_at_budget_mean"], b["diff_at_budget_ci"],
                              figures.arm_tests(c, "budget")["d1s-c"]["p_value_holm"])
        assert lead.startswith(figures.WHAT + " On a 135M model at GRPO's compute, D1S-C")
        assert f"GRPO on 1-digit arithmetic ({said})" in lead and lead.endswith("is provisional.")
    _credit_races(tmp_path, d1s_c_gain=0.10, random_gain=0.0)  # no first race here: the controls alone speak
    (tmp_path / figures.RESULTS / "credit-flat" / "d1s-c-seed23" / "summary.json").unlink()
    pending = figures.readme_lead(tmp_path)
    assert pending.startswith(figures.WHAT + " Whether its selection rule buys that") and "provisional" in pending


def test_the_lead_is_the_rules_verdict_once_the_controls_are_in(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.0, random_gain=0.0)
    lead = figures.readme_lead(tmp_path)
    assert lead == figures.WHAT + " " + figures.credit_verdict(tmp_path)
    # in plain words, in the rule's order: any arm above tuned GRPO, selection against random, what ships and why
    assert lead.index("no arm beat tuned GRPO") < lead.index("Max-variance selection was not shown to differ from "
                                                             "random selection") < lead.index("So the recipes run tuned GRPO")


def test_the_results_show_each_arm_of_both_controls_races_paired_against_tuned_grpo(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.10, random_gain=0.0)
    text = figures.readme_results(tmp_path)
    assert "credit-race-default/compare-budget.png" in text.splitlines()[0]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| arm")}
    assert list(rows) == ["tuned GRPO", "D1S-C", "random selection", "GRPO generating only what D1S-C trains on"]
    for task, folder, first in (("default", "credit-race-default", 0), ("arith", "credit-race-arith2digit", 2)):
        c = json.loads((tmp_path / figures.RESULTS / folder / "compare.json").read_text())
        accs = {v: [c["variants"][v]["budget"]["per_seed"][str(s)]["accuracy_at_budget"] for s in c["seeds"]]
                for v in c["variants"]}
        assert rows["D1S-C"][first] == figures.accuracy_cell(accs[D1SC])
        b = c["variants"][D1SC]["budget"]
        assert rows["D1S-C"][first + 1].rstrip(" |") == figures.paired(b["diff_at_budget_mean"], b["diff_at_budget_ci"],
                                                                       b["p_value_holm"])
        assert rows["tuned GRPO"][first + 1].rstrip(" |") == "-"
        assert figures.paired_between(accs[D1SC], accs[RANDOM]) in text
    assert "default task (8 seeds)" in text and "arith-2digit (5 seeds)" in text


def test_the_results_show_the_first_race_until_the_controls_are_in(tmp_path):
    if figures.credit_outcome(ROOT) is None:
        assert "](benchmarks/results/race-default/compare-budget.png)" in figures.readme_results(ROOT)
    _credit_races(tmp_path, d1s_c_gain=0.10, random_gain=0.0)
    (tmp_path / figures.RESULTS / "credit-race-arith2digit" / "compare.json").unlink()
    assert "race-default/compare-budget.png" in figures.readme_results(tmp_path).splitlines()[0]


# --- a verdict no run still to come can change -------------------------------------------------------------------

def test_sign_flip_p_of_five_seeds_never_reaches_the_threshold_so_arith_2digit_cannot_show_a_difference():
    from d3s.app.compare.stats import sign_flip_p_value

    assert sign_flip_p_value([0.2, 0.3, 0.1, 0.4, 0.25]) == pytest.approx(2 / 32)  # the best 5 seeds can do
    assert figures.cannot_be_shown("credit-race-arith2digit")  # its planned 5 seeds
    assert not figures.cannot_be_shown("credit-race-default")  # 8 seeds: 2/256


def test_a_race_too_small_to_show_anything_does_not_hold_up_the_verdict_it_cannot_change(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.0, random_gain=0.0)
    shutil.rmtree(tmp_path / figures.RESULTS / "credit-race-arith2digit")
    shutil.rmtree(tmp_path / figures.RESULTS / "credit-flat")
    (tmp_path / figures.RESULTS / "credit-tuning").mkdir(parents=True)
    (tmp_path / figures.RESULTS / "credit-tuning" / "choice.json").write_text(
        json.dumps({"grpo": {"learning_rate": 6e-05}, "d1s-c": {"learning_rate": 3e-05}}))
    o = figures.credit_outcome(tmp_path)
    assert o["ships"] == "grpo" and not any(o["beats"].values()) and o["pending"] == ["credit-race-arith2digit"]
    assert figures.credit_shipped_setting(tmp_path) == {"variant": "grpo", "learning_rate": 6e-05}
    text = figures.credit_verdict(tmp_path)
    assert text.startswith("On a 135M model learning arithmetic, at the compute of a GRPO whose learning rate was "
                           "tuned (every arm at its own tuned rate), no arm beat tuned GRPO.")
    assert text.endswith("The arith-2digit race (5 seeds) is still to run; with so few seeds no difference there "
                         "can be shown, so it cannot change this.")
    assert figures.readme_lead(tmp_path) == figures.WHAT + " " + text
    results = figures.readme_results(tmp_path)
    assert "| arm | default task (8 seeds) | vs tuned GRPO, paired |" in results
    assert "Arith-2digit (5 seeds) is still to run." in results
    assert "credit-race-arith2digit/" not in results


def test_an_unfinished_race_says_how_many_of_its_seeds_have_every_arm_in(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.0, random_gain=0.0)
    arith = tmp_path / figures.RESULTS / "credit-race-arith2digit"
    shutil.rmtree(arith)
    arith.mkdir()  # the compare of seed 21 alone (benchmarks/credit.sh compares each seed once its runs are in)
    (arith / "compare.json").write_text(json.dumps({"mode": "budget", "reference": GRPO, "seeds": [21],
                                                    "variants": {v: {} for v in (GRPO, D1SC, RANDOM, SMALL)}}))
    for v in (GRPO, D1SC, RANDOM, SMALL):  # seed 21 complete; seed 22 only GRPO's run, seed 23 an unfinished one
        (arith / f"{v}-seed21").mkdir()
        (arith / f"{v}-seed21" / "summary.json").write_text(json.dumps({"below_start": []}))
    (arith / f"{GRPO}-seed22").mkdir()
    (arith / f"{GRPO}-seed22" / "summary.json").write_text(json.dumps({"below_start": []}))
    (arith / f"{D1SC}-seed23").mkdir()
    assert figures.seeds_in(tmp_path, "credit-race-arith2digit") == 1
    assert figures.still_to_run(tmp_path, "credit-race-arith2digit") == "has 1 of its 5 seeds in"
    assert figures.credit_verdict(tmp_path).endswith(
        "The arith-2digit race (5 seeds) has 1 of its 5 seeds in; with so few seeds no difference there can be shown, "
        "so it cannot change this.")
    assert "Arith-2digit (5 seeds) has 1 of its 5 seeds in." in figures.readme_results(tmp_path)
    for v in (D1SC, RANDOM, SMALL):
        (arith / f"{v}-seed22").mkdir()
        (arith / f"{v}-seed22" / "summary.json").write_text(json.dumps({"below_start": []}))
    assert figures.still_to_run(tmp_path, "credit-race-arith2digit") == "has 2 of its 5 seeds in"
    shutil.rmtree(arith)
    assert figures.still_to_run(tmp_path, "credit-race-arith2digit") == "is still to run"


def test_the_shipped_grpo_falling_below_its_start_is_said_before_the_last_race_is_in(tmp_path):
    _credit_races(tmp_path, d1s_c_gain=0.0, random_gain=0.0)
    shutil.rmtree(tmp_path / figures.RESULTS / "credit-race-arith2digit")
    (tmp_path / figures.RESULTS / "credit-tuning").mkdir(parents=True)
    (tmp_path / figures.RESULTS / "credit-tuning" / "choice.json").write_text(
        json.dumps({"grpo": {"learning_rate": 3e-05}, "d1s-c": {"learning_rate": 3e-05}}))
    flat = tmp_path / figures.RESULTS / "credit-flat"
    assert "fell below its own start" not in figures.credit_verdict(tmp_path)
    (flat / f"{GRPO}-seed22" / "summary.json").write_text(json.dumps({"below_start": [{"step": 4}]}))
    o = figures.credit_outcome(tmp_path)
    assert o["ships"] == "grpo" and o["pending"] == ["credit-race-arith2digit"]
    assert o["grpo_collapsed"] == [f"credit-flat/{GRPO}-seed22"]
    assert f"Tuned GRPO too fell below its own start in credit-flat/{GRPO}-seed22." in figures.credit_verdict(tmp_path)


def test_a_winner_waits_for_every_run_and_a_race_that_could_show_a_difference_is_waited_for(tmp_path, monkeypatch):
    _credit_races(tmp_path, d1s_c_gain=0.10, random_gain=0.0)  # D1S-C above on the default task
    shutil.rmtree(tmp_path / figures.RESULTS / "credit-race-arith2digit")
    assert figures.credit_outcome(tmp_path) is None  # whether it fell below its start there is not known yet
    assert "is being tested" in figures.credit_verdict(tmp_path)
    _credit_races(tmp_path / "b", d1s_c_gain=0.0, random_gain=0.0)
    shutil.rmtree(tmp_path / "b" / figures.RESULTS / "credit-race-arith2digit")
    monkeypatch.setitem(figures.CREDIT_RACES, "credit-race-arith2digit", ("arith-2digit", 6, 4))  # 2/64 < 0.05
    assert figures.credit_outcome(tmp_path / "b") is None
