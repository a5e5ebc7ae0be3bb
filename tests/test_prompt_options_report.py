"""`benchmarks/prompt_options_report.py`: its numbers against hand-computed ones on made-up run folders."""

import importlib.util
import json
from pathlib import Path

import pytest


def _module():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "prompt_options_report.py"
    spec = importlib.util.spec_from_file_location("prompt_options_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summary(final: float, train_wall_s: float, steps: int) -> dict:
    """A valid `summary.json` (`d3s.app.runfiles.SUMMARY_FIELDS`) with the numbers the report reads."""
    return {"steps": steps, "before": {}, "after": {"accuracy": final, "correct": round(final * 100), "n": 100},
            "train_wall_s": train_wall_s, "trained_tokens": 0.0}


MACHINE = {"cpu_vendor": "AuthenticAMD", "cpu": "AMD EPYC", "cpu_family": 25, "cpu_model": 17, "cpu_stepping": 1,
           "cpu_flags": ["avx2"], "cpu_count": 2, "accelerator": None, "processes": 1, "torch": "2.13.0",
           "torch_threads": 2}


def _run(root, name, seed, final, train_wall_s, steps, evals=(), machine=MACHINE):
    """A finished run folder: `steps` = [(generation s, groups generated, groups with signal, flat generated,
    prompts skipped)], `evals` = [(step, accuracy, wall_s)]; `machine` recorded in `run_config.json` (None: no
    record)."""
    folder = root / f"{name}-seed{seed}"
    folder.mkdir()
    if machine is not None:
        (folder / "run_config.json").write_text(json.dumps({"run": {}, "trainer": {}, "machine": machine}))
    (folder / "summary.json").write_text(json.dumps(_summary(final, train_wall_s, len(steps))))
    rows = [{"type": "eval", "step": 0, "accuracy": 0.1, "wall_s": 0.0}]
    for i, (seconds, generated, signal, flat, skipped) in enumerate(steps, 1):
        rows.append({"type": "train", "step": i, "d3s/time/generation": seconds, "d3s/groups_generated": generated,
                     "d3s/signal_groups": signal, "d3s/flat_groups_generated": flat, "d3s/prompts_skipped": skipped,
                     "d3s/no_signal_step": float(signal == 0)})
    rows += [{"type": "eval", "step": s, "accuracy": a, "wall_s": w} for s, a, w in evals]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_pairs_each_setting_with_the_baseline(tmp_path):
    m = _module()
    # baseline: 2 steps of 4 groups; seed 1 gets 1 + 0 groups with signal in 10 + 10 s, seed 2 gets 2 + 2 in 8 + 8 s
    _run(tmp_path, "d3s", 1, 0.30, 100.0, [(10, 4, 1, 3, 0), (10, 4, 0, 4, 0)], [(1, 0.2, 40.0), (2, 0.3, 90.0)])
    _run(tmp_path, "d3s", 2, 0.50, 100.0, [(8, 4, 2, 2, 0), (8, 4, 2, 2, 0)], [(1, 0.5, 40.0), (2, 0.5, 90.0)])
    # skip: seed 1 gets 2 + 2 in 10 + 10 s (2 prompts skipped), seed 2 gets 4 + 4 in 8 + 8 s
    _run(tmp_path, "d3s+prompt_skip", 1, 0.40, 100.0, [(10, 4, 2, 2, 1), (10, 4, 2, 2, 1)],
         [(1, 0.45, 30.0), (2, 0.4, 80.0)])
    _run(tmp_path, "d3s+prompt_skip", 2, 0.60, 100.0, [(8, 4, 4, 0, 0), (8, 4, 4, 0, 0)],
         [(1, 0.4, 30.0), (2, 0.6, 80.0)])
    _run(tmp_path, "grpo", 1, 0.40, 200.0, [(10, 4, 1, 3, 0)] * 2, [(2, 0.4, 200.0)])
    _run(tmp_path, "grpo", 2, 0.50, 100.0, [(10, 4, 1, 3, 0)] * 2, [(2, 0.5, 100.0)])
    _run(tmp_path, "d1s", 1, 0.4, 1.0, [(1, 4, 1, 3, 0)])  # one seed only: left out

    table, seeds, left_out = m.settings_in(tmp_path, None, "d3s")
    assert seeds == [1, 2] and set(table) == {"d3s", "d3s+prompt_skip", "grpo"} and left_out == {"d1s": [2]}
    base, skip = table["d3s"], table["d3s+prompt_skip"]
    assert base[1]["no_signal"] == 0.5 and base[2]["no_signal"] == 0.0
    assert base[1]["gen_s_signal"] == pytest.approx(20 / 1) and base[2]["gen_s_signal"] == pytest.approx(16 / 4)
    assert skip[1]["gen_s_signal"] == pytest.approx(20 / 4) and skip[2]["gen_s_signal"] == pytest.approx(16 / 8)
    assert base[1]["generated_per_signal"] == pytest.approx(8 / 1) and skip[1]["skipped"] == pytest.approx(1.0)
    assert m._ratio_mean(base, skip, "gen_s_signal") == pytest.approx((4.0 * 2.0) ** 0.5)  # 20/5 and 4/2

    text = m.report(tmp_path, "d3s", None)
    row = next(line for line in text.splitlines() if line.startswith("| `d3s+prompt_skip` | 0.0%"))
    assert "| 2.83x |" in row and "| +10.0 |" in row  # both seeds 10 points up: a zero-width interval
    assert "[+10.0, +10.0]" in row
    assert "Left out, for want of a seed: `d1s` (no seed 2)." in text and "`d1s` |" not in text
    # GRPO's final mean is 45%: the baseline reaches it in seed 2 only (40 s of GRPO's 100 s), the skip in both
    # (30 s of 200 s, 80 s of 100 s); GRPO itself at its end in seed 2 only
    assert "| `d3s+prompt_skip` | 0.5 min (0.15x) | 1.3 min (0.80x) | 2/2 |" in text
    assert "| `d3s` | - | 0.7 min (0.40x) | 1/2 |" in text
    assert "| `grpo` | - | 1.7 min (1.00x) | 1/2 |" in text


def test_report_gives_a_wall_clock_ratio_only_between_runs_timed_on_one_machine(tmp_path):
    m = _module()
    for seed, machine in ((1, dict(MACHINE, cpu_model=1)), (2, None), (3, MACHINE)):
        _run(tmp_path, "d3s", seed, 0.5, 100.0, [(10, 4, 1, 3, 0)], [(1, 0.5, 30.0)], machine=machine)
        _run(tmp_path, "grpo", seed, 0.5, 100.0, [(10, 4, 1, 3, 0)], [(1, 0.5, 60.0)])
    text = m.report(tmp_path, "d3s", None)
    assert "| `d3s` | 0.5 min (different machines) | 0.5 min (machine unknown) | 0.5 min (0.30x) | 3/3 |" in text


def test_report_refuses_a_missing_baseline_and_old_records(tmp_path):
    m = _module()
    _run(tmp_path, "d3s", 1, 0.3, 1.0, [(1, 4, 1, 3, 0)])
    with pytest.raises(SystemExit, match="--baseline 'grpo' has no run for every seed"):
        m.report(tmp_path, "grpo", None)
    old = tmp_path / "old"
    old.mkdir()
    (old / "grpo-seed1").mkdir()
    (old / "grpo-seed1" / "summary.json").write_text(json.dumps(_summary(0.1, 1.0, 1)))
    (old / "grpo-seed1" / "metrics.jsonl").write_text(json.dumps({"type": "train", "step": 1, "loss": 0.0}) + "\n")
    with pytest.raises(SystemExit, match="no generation metrics"):
        m.report(old, "grpo", None)
