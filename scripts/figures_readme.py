"""The README's generated lead and results (`scripts/readme_figures.py`): its first paragraph, what d3s does and then
what the data say of it, and its figure and table. Until the controls of `benchmarks/credit.sh` are in, both come
from the first race at GRPO's compute; then from the controls' races, by the rule fixed before they ran
(`benchmarks/results/credit-rule.md`)."""

from __future__ import annotations

from pathlib import Path

from figures_common import RESULTS, _compare, _link, arm_tests, paired, paired_between
from figures_credit import (CREDIT_RACES, CREDIT_ROLES, _at_budget, _word, accuracy_cell, credit_outcome,
                            credit_race_finished, credit_roles, credit_verdict, still_to_run)
from figures_race import race_has_data, race_table_short

WHAT = ("`d3s` adds the down-sampling of D3S, Dynamic Dual-Level Down-Sampling "
        "([arXiv 2509.22115](https://arxiv.org/abs/2509.22115)), to Hugging Face TRL's GRPO trainer: after each batch "
        "of rollouts it trains only on the rollouts whose advantages vary most and, in the full method, only on the "
        "tokens with the highest |advantage| x entropy, so a step's training phase costs less while its generation "
        "stays the same.")
FIRST_RACE = {"race-default": "1-digit arithmetic", "race-arith2digit": "2-digit arithmetic"}
SAID = {"above": "ended above", "below": "ended below", "not shown": "was not shown to differ from"}


def _first_race_d1s_c(root: Path, folder: str) -> str:
    """'ended above GRPO on 1-digit arithmetic (+10.6 points [+4.5, +16.7], corrected p = 0.023)': D1S-C against
    GRPO in one campaign of the first race, at GRPO's compute, Holm-corrected over that campaign's arms."""
    c = _compare(root, folder)
    b = c["variants"]["d1s-c"]["budget"]
    p = arm_tests(c, "budget")["d1s-c"]["p_value_holm"]
    return (f"{SAID[_word(b['diff_at_budget_ci'], p)]} GRPO on {FIRST_RACE[folder]} "
            f"({paired(b['diff_at_budget_mean'], b['diff_at_budget_ci'], p)})")


def readme_lead(root: Path, prefix: str = "") -> str:
    """The README's first paragraph: what d3s does, then the controls' verdict once they are in
    (`credit_verdict`: whether any arm beat tuned GRPO, whether max-variance selection beat random selection,
    which setting the recipes run and why); until then the first race's result for D1S-C and what is being tested."""
    if credit_outcome(root) is not None:
        return WHAT + " " + credit_verdict(root, prefix)
    rule = f"[fixed before they ran]({prefix}{RESULTS}/credit-rule.md)"
    races = [f for f in FIRST_RACE if race_has_data(root, f)]
    first = ""
    if races:
        first = ("On a 135M model at GRPO's compute, D1S-C, the rollout selection alone, "
                 + " and ".join(_first_race_d1s_c(root, f) for f in races) + ". ")
    return (WHAT + " " + first + "Whether its selection rule buys that, or only its cheaper and more numerous steps, "
            "is being tested: against random selection of as many rollouts, GRPO generating only what D1S-C trains on, "
            f"and every arm at its own tuned learning rate (`bash benchmarks/credit.sh`, the rule {rule}). Until they "
            "are in, the recipes' choice of D1S-C is provisional.")


def readme_results(root: Path, prefix: str = "") -> str:
    """The README's figure and table: the first race (every variant at GRPO's compute) until the controls are in;
    then both controls' races, one row per arm at its tuned rate paired against tuned GRPO (Holm over the arms of
    each task), and D1S-C against random selection per task (one comparison each)."""
    if credit_outcome(root) is None:
        return "\n".join([
            f"![Held-out accuracy against the share of GRPO's compute, default task]({prefix}{RESULTS}/race-default/"
            "compare-budget.png)",
            "",
            "The variants: GRPO; D1S-C, the paper's rollout selection alone; the paper's D3S, rollouts and tokens; "
            "D3S + floor, the paper's D3S keeping at least 4 tokens of each kept rollout in the loss (not in the "
            "paper).",
            "",
            race_table_short(root, prefix),
            "",
            "The figure is the default task (1-digit arithmetic): held-out accuracy against the share of GRPO's "
            "compute spent, thin lines one seed each."])
    head, rule, cells, against = ["| arm"], ["|---"], {role: [] for role in CREDIT_ROLES}, []
    finished = [f for f in CREDIT_RACES if credit_race_finished(root, f)]
    for folder in finished:
        task = CREDIT_RACES[folder][0]
        c = _compare(root, folder)
        roles, tests = credit_roles(c), arm_tests(c, "budget")
        head.append(f" {task.removeprefix('the ')} ({len(c['seeds'])} seeds) | vs tuned GRPO, paired")
        rule.append("|---|---")
        for role in CREDIT_ROLES:
            if role not in roles:
                cells[role] += ["-", "-"]
                continue
            v = roles[role]
            b = c["variants"][v]["budget"]
            diff = "-" if role == "grpo" else paired(b["diff_at_budget_mean"], b["diff_at_budget_ci"],
                                                     tests[v]["p_value_holm"])
            cells[role] += [accuracy_cell(_at_budget(c, v)), diff]
        against.append(f"{task.removeprefix('the ')} "
                       f"{paired_between(_at_budget(c, roles['d1s-c']), _at_budget(c, roles['random']))}")
    lines = [f"![Held-out accuracy against the share of tuned GRPO's compute, default task]({prefix}{RESULTS}/"
             "credit-race-default/compare-budget.png)", "",
             " |".join(head) + " |", "".join(rule) + "|"]
    lines += [f"| {CREDIT_ROLES[role]} | " + " | ".join(cells[role]) + " |"
              for role in CREDIT_ROLES if any(cell != "-" for cell in cells[role])]
    lines += ["",
              "Held-out accuracy once every arm, at its own tuned learning rate, has spent the same seed's tuned GRPO "
              "compute (estimated model FLOPs, generation included): mean [95% interval over seeds]; the difference "
              "paired by seed, \"not shown\" unless its interval excludes zero and its Holm-corrected sign-flip test "
              f"agrees ([terms]({prefix}docs/results.md#terms)). D1S-C against random selection of as many rollouts, "
              "paired, one comparison per task: " + "; ".join(against) + ". Sources: "
              + ", ".join(_link(f, prefix) for f in finished) + "."
              + "".join(f" {CREDIT_RACES[f][0].capitalize()} ({CREDIT_RACES[f][1]} seeds) {still_to_run(root, f)}."
                        for f in CREDIT_RACES if f not in finished),
              "",
              "The figure is the default task (1-digit arithmetic): held-out accuracy against the share of tuned "
              "GRPO's compute spent, thin lines one seed each."]
    return "\n".join(lines)
