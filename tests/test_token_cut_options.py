"""The token-cut options beyond the paper (docs/method.md section 9.2) against plain-loop references:
`token_cut` 'sign' and 'rollout', the `min_per_rollout` floor, the one-sided metric and the learning-rate clock."""

import math
import statistics
from fractions import Fraction

import pytest
import torch

import d3s
from d3s.metrics import advantage_balance, token_cut_warnings
from d3s.schedule import generation_progress, learning_rate_progress
from d3s.token_selection import select_tokens, token_scores

INF = float("inf")


def ceil_k(fraction, n):
    return 0 if n == 0 else min(n, max(1, math.ceil(round(fraction * n, 9))))


def top(scores, items, k):
    """The k highest of `items` ((i, t) pairs), ties by flattened position: a plain sort."""
    T = scores.shape[1]
    return set(sorted(items, key=lambda it: (-float(scores[it]), it[0] * T + it[1]))[:k])


def loop_reference(scores, fraction, adv, cut, floor, keep_last=False):
    S, T = scores.shape
    a = adv.unsqueeze(1).expand(S, T) if adv.dim() == 1 else adv.expand(S, T)
    valid = [(i, t) for i in range(S) for t in range(T) if scores[i, t] > -INF]
    rows = [[(i, t) for (i, t) in valid if i == r] for r in range(S)]
    keep = set()
    if cut == "batch":
        keep = top(scores, valid, ceil_k(fraction, len(valid)))
    elif cut == "rollout":
        for row in rows:
            keep |= top(scores, row, ceil_k(fraction, len(row)))
    else:
        pos = [it for it in valid if a[it] > 0]
        neg = [it for it in valid if a[it] < 0]
        k = ceil_k(fraction, len(valid))
        if not pos and not neg:
            keep = top(scores, valid, k)
        else:
            share = Fraction(k * len(pos), len(pos) + len(neg))
            k_pos = math.floor(share + Fraction(1, 2))
            k_pos = min(len(pos), max(k_pos, 1 if pos else 0))
            k_neg = min(len(neg), max(k - k_pos, 1 if neg else 0))
            k_pos = min(len(pos), max(k_pos, k - k_neg))
            keep = top(scores, pos, k_pos) | top(scores, neg, k_neg)
    for r, row in enumerate(rows):
        if floor and any(a[it] != 0 for it in row):
            keep |= top(scores, row, min(floor, len(row)))
        if keep_last and row and any(a[it] != 0 for it in row):
            keep.add(max(row))  # the row's last valid (i, t)
    mask = torch.zeros(S, T, dtype=torch.bool)
    for it in keep:
        mask[it] = True
    return mask


def random_case(seed):
    g = torch.Generator().manual_seed(seed)
    S, T = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 14, (1,), generator=g))
    lengths = torch.randint(0, T + 1, (S,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if seed % 3 == 0:  # ties everywhere, zero advantages
        adv = torch.randint(-1, 2, (S,), generator=g).float()
        ent = torch.randint(0, 3, (S, T), generator=g).float()
    elif seed % 3 == 1:  # the 1-correct-of-G shape: one large positive, many small negatives
        adv = torch.full((S,), -0.25)
        adv[int(torch.randint(0, S, (1,), generator=g))] = 3.75
        ent = torch.rand(S, T, generator=g)
    else:
        adv = torch.randn(S, generator=g)
        ent = torch.rand(S, T, generator=g) * 4
    return adv, ent, mask


@pytest.mark.parametrize("cut", ["batch", "sign", "rollout"])
@pytest.mark.parametrize("floor", [0, 1, 3])
@pytest.mark.parametrize("keep_last", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_select_tokens_matches_a_plain_loop(cut, floor, keep_last, seed):
    adv, ent, mask = random_case(seed)
    fraction = [0.05, 0.1, 0.2, 0.5, 1.0][seed % 5]
    scores = token_scores(adv, ent, mask)
    got = select_tokens(scores, fraction, advantages=adv, cut=cut, min_per_rollout=floor, keep_last=keep_last)
    assert torch.equal(got, loop_reference(scores, fraction, adv, cut, floor, keep_last))
    assert not (got & ~mask).any()  # never padding
    assert torch.equal(d3s.token_mask(adv, ent, mask, fraction, cut=cut, min_per_rollout=floor, keep_last=keep_last),
                       got)


def test_keep_last_keeps_the_end_token_the_paper_cut_leaves_out():
    # Three rollouts that stopped (lengths 5, 3, 6) and one with no signal; the last tokens score lowest.
    adv = torch.tensor([1.5, -0.5, 0.0, -1.0])
    lengths = torch.tensor([5, 3, 4, 6])
    mask = torch.arange(8)[None, :] < lengths[:, None]
    ent = torch.ones(4, 8)
    ent[torch.arange(4), lengths - 1] = 0.01  # a confident end-of-sequence token
    paper = d3s.token_mask(adv, ent, mask, 0.2)
    assert not paper[torch.arange(4), lengths - 1].any()
    kept = d3s.token_mask(adv, ent, mask, 0.2, keep_last=True)
    assert kept[[0, 1, 3], [4, 2, 5]].all() and not kept[2, 3]  # A = 0: nothing to learn, nothing added
    assert torch.equal(kept & ~paper, torch.zeros_like(kept).index_put_((torch.tensor([0, 1, 3]), torch.tensor([4, 2, 5])),
                                                                         torch.tensor(True)))
    with pytest.raises(ValueError, match="keep_last=1 must be True or False"):
        select_tokens(token_scores(adv, ent, mask), 0.2, advantages=adv, keep_last=1)
    with pytest.raises(ValueError, match="need the advantages"):
        select_tokens(token_scores(adv, ent, mask), 0.2, keep_last=True)


@pytest.mark.parametrize("seed", range(20))
def test_the_paper_cut_is_unchanged(seed):
    adv, ent, mask = random_case(seed)
    scores = token_scores(adv, ent, mask)
    n = int(mask.sum())
    paper = d3s.top_tokens_mask(scores, d3s.num_tokens_to_keep(n, 0.1), n_valid=n)
    assert torch.equal(select_tokens(scores, 0.1, cut="batch"), paper)
    assert torch.equal(d3s.token_mask(adv, ent, mask, 0.1), paper)


def test_sign_cut_keeps_both_signs_in_proportion():
    # One correct rollout of 16 (A = 3.75) against 15 wrong (A = -0.25), 20 tokens each, K = 5%: 16 tokens.
    adv = torch.tensor([3.75] + [-0.25] * 15)
    ent = torch.rand(16, 20, generator=torch.Generator().manual_seed(0)) + 0.5
    mask = torch.ones(16, 20, dtype=torch.bool)
    batch = d3s.token_mask(adv, ent, mask, 0.05)
    assert int(batch.sum()) == 16 and batch[1:].sum() == 0  # the paper's cut: all 16 from the one rollout
    assert advantage_balance(adv, batch, mask) == (1.0, True)
    sign = d3s.token_mask(adv, ent, mask, 0.05, cut="sign")
    assert int(sign.sum()) == 16 and int(sign[0].sum()) == 1  # 16 * 20 / 320 = 1 positive token, 15 negative
    balance, one_sided = advantage_balance(adv, sign, mask)
    assert not one_sided and balance == pytest.approx((3.75 - 15 * 0.25) / (3.75 + 15 * 0.25))


def test_rollout_cut_and_floor_give_every_kept_rollout_tokens():
    adv = torch.tensor([2.0, -1.0, 0.0, 0.5])
    ent = torch.ones(4, 10)
    ent[0] = 10.0
    mask = torch.ones(4, 10, dtype=torch.bool)
    assert d3s.token_mask(adv, ent, mask, 0.1).sum(dim=1).tolist() == [4, 0, 0, 0]
    assert d3s.token_mask(adv, ent, mask, 0.1, cut="rollout").sum(dim=1).tolist() == [1, 1, 1, 1]
    assert d3s.token_mask(adv, ent, mask, 0.1, min_per_rollout=2).sum(dim=1).tolist() == [4, 2, 0, 2]  # A = 0: no floor


def test_select_tokens_refuses_bad_options():
    scores = token_scores(torch.ones(2), torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="cut='top'.*'batch', 'sign', 'rollout'"):
        select_tokens(scores, 0.5, cut="top")
    with pytest.raises(ValueError, match="min_per_rollout"):
        select_tokens(scores, 0.5, advantages=torch.ones(2), min_per_rollout=-1)
    with pytest.raises(ValueError, match="need the advantages"):
        select_tokens(scores, 0.5, cut="sign")
    with pytest.raises(ValueError, match=r"advantages \(3,\)"):
        select_tokens(scores, 0.5, advantages=torch.ones(3), cut="sign")


def balance_loop(adv, tokens, offered):
    S, T = tokens.shape
    total = mass = 0.0
    signs_kept, signs_offered = set(), set()
    for i in range(S):
        for t in range(T):
            a = float(adv[i])
            if offered[i, t] and a != 0:
                signs_offered.add(a > 0)
            if tokens[i, t]:
                total, mass = total + a, mass + abs(a)
                if a != 0:
                    signs_kept.add(a > 0)
    return (total / mass if mass else 0.0), (len(signs_offered) == 2 and len(signs_kept) < 2)


@pytest.mark.parametrize("seed", range(20))
def test_advantage_balance_matches_a_plain_loop(seed):
    adv, ent, mask = random_case(seed)
    tokens = d3s.token_mask(adv, ent, mask, 0.1)
    got = advantage_balance(adv, tokens, mask)
    want = balance_loop(adv, tokens, mask)
    assert got[0] == pytest.approx(want[0], abs=1e-12) and got[1] == want[1]


def lr_progress_loop(index, rates, ga, every):
    J = math.ceil(len(rates) * ga / every)
    if J <= 1:
        return 0.0
    start = [min(g * every // ga, len(rates)) for g in range(J)]
    whole = sum(rates[: start[-1]])
    return 0.0 if whole <= 0 else min(1.0, sum(rates[: start[min(index, J - 1)]]) / whole)


@pytest.mark.parametrize("ga,every", [(1, 1), (2, 2), (2, 1), (1, 2), (4, 2)])
def test_learning_rate_clock_matches_a_plain_loop(ga, every):
    steps = 20
    cosine = [3e-5 * 0.5 * (1 + math.cos(math.pi * s / steps)) for s in range(steps)]
    J = math.ceil(steps * ga / every)
    got = [learning_rate_progress(g, cosine, ga, every) for g in range(J)]
    assert got == pytest.approx([lr_progress_loop(g, cosine, ga, every) for g in range(J)], abs=1e-12)
    assert got[0] == 0.0 and got[-1] == pytest.approx(1.0) and got == sorted(got)
    # A constant rate, one optimizer step per generation batch: exactly the paper's clock
    flat = [1e-5] * steps
    assert [learning_rate_progress(g, flat, 1, 1) for g in range(steps)] == pytest.approx(
        [generation_progress(g, steps, 1, 1) for g in range(steps)])


def test_learning_rate_clock_runs_ahead_under_cosine():
    steps = 20
    cosine = [0.5 * (1 + math.cos(math.pi * s / steps)) for s in range(steps)]
    p = [learning_rate_progress(g, cosine, 1, 1) for g in range(steps)]
    assert p[6] > 0.5 > p[5] and p[10] > 0.8  # half the step size is spent by step 6 of 20, 80% by step 10


def test_token_cut_warnings_name_the_setting_to_change():
    assert token_cut_warnings([1.0, 1.5], [1, 1], k_init=0.05, k_final=0.2) == {}  # too early to say
    found = token_cut_warnings([1.0, 1.5, 3.0], [1, 1, 0], k_init=0.05, k_final=0.2)
    assert set(found) == {"few_tokens", "one_sided"}
    assert "1.5 tokens per kept rollout" in found["few_tokens"] and "min_tokens_per_rollout" in found["few_tokens"]
    assert "67% of steps" in found["one_sided"] and "token_cut='sign'" in found["one_sided"]
    assert token_cut_warnings([5.0, 6.0, 7.0, 8.0], [0, 0, 0, 1], k_init=0.2, k_final=0.2) == {}  # 25%: not above
    assert token_cut_warnings([5.0, 6.0, 7.0], [1, 1, 1], k_init=0.2, k_final=0.2, token_cut="sign") == {}


def test_few_tokens_under_a_floor_and_masked_truncation_names_the_cause():
    """With `mask_truncated_completions` a kept rollout cut off at the length cap has no token in the loss, which
    a floor cannot change: the warning says so, and does not advise the floor the run already has."""
    few = [0.5, 1.0, 0.9, 2.5]
    found = token_cut_warnings(few, [0] * 4, k_init=0.05, k_final=0.2, min_tokens_per_rollout=4)["few_tokens"]
    assert "a floor of 4" in found and "min_tokens_per_rollout" not in found and "raise k_init" in found
    found = token_cut_warnings(few, [0] * 4, k_init=0.05, k_final=0.2, min_tokens_per_rollout=4, mask_truncated=True,
                               clipped=[0.5, 0.7, 0.6, 0.8])["few_tokens"]
    assert "0.9 tokens per kept rollout" in found and "(65% of completions were)" in found
    assert found.index("mask_truncated_completions off") < found.index("raise k_init")  # the cause first
    plain = token_cut_warnings(few, [0] * 4, k_init=0.05, k_final=0.2)["few_tokens"]
    assert "mask_truncated_completions" not in plain and "set min_tokens_per_rollout (e.g. 4)" in plain


def test_a_drift_to_the_length_cap_is_said_with_what_to_compare():
    ok = [8.0] * 10
    drift = [0.0, 0.1, 0.0, 0.1, 0.0] + [0.3, 0.5, 0.7, 0.8, 0.9]  # last 5: 64% against 4%
    found = token_cut_warnings(ok, [0] * 10, k_init=0.05, k_final=0.2, clipped=drift)
    assert set(found) == {"length_cap"}
    assert "64% cut off over the last 5 generation batches (4% over the first 5)" in found["length_cap"]
    advice = found["length_cap"]
    assert "keep_last_in_loss=True" in advice and "(d1s-c)" in advice
    assert advice.index("(d1s-c)") < advice.index("keep_last_in_loss=True")  # the variant without a token cut first
    assert "keep_last_in_loss" not in token_cut_warnings(ok, [0] * 10, k_init=0.05, k_final=0.2, clipped=drift,
                                                       keep_last_in_loss=True)["length_cap"]
    # said from the length record alone, before the token record is long enough for the other warnings
    assert set(token_cut_warnings([8.0], [0], k_init=0.05, k_final=0.2, clipped=drift)) == {"length_cap"}
    for quiet in (drift[1:],  # fewer than two windows
                  [0.9] * 5 + [0.55] * 5,  # half cut off, but falling: learning to answer shorter
                  [0.0] * 5 + [0.45] * 5,  # rising, below half
                  [0.9] * 5 + [0.0] * 5):  # away from the cap
        assert token_cut_warnings(ok, [0] * 10, k_init=0.05, k_final=0.2, clipped=quiet) == {}
    assert set(token_cut_warnings(ok, [0] * 10, k_init=0.05, k_final=0.2, clipped=[0.5] * 10)) == {
        "length_cap"}  # at the thresholds: half cut off from start to end


def test_the_live_diagnosis_says_the_drift_once(capsys):
    from types import SimpleNamespace

    from d3s.integrations.trl.step_metrics import TokenCutDiagnosis

    diagnosis = TokenCutDiagnosis(SimpleNamespace(k_init=0.05, k_final=0.2, token_cut="batch", keep_last_in_loss=False,
                                                  min_tokens_per_rollout=0, mask_truncated_completions=False))
    for share in [0.0] * 5 + [0.6] * 7:
        diagnosis.update(8.0, False, True, clipped=share)
    assert capsys.readouterr().err.count("stay at max_completion_length") == 1
    diagnosis.update(8.0, False, False, clipped=1.0)  # a step without a token cut is not recorded
    assert diagnosis.clipped == [0.0] * 5 + [0.6] * 7


def _records(per_rollout, one_sided, norms, clipped=None):
    return [{"type": "eval", "step": 0}] + [
        {"type": "train", "step": i + 1, "d3s/tokens_per_kept_rollout": t, "d3s/one_sided": o, "grad_norm": n,
         **({"completions/clipped_ratio": clipped[i]} if clipped else {})}
        for i, (t, o, n) in enumerate(zip(per_rollout, one_sided, norms))
    ]


def test_summary_json_says_what_the_token_cut_did():
    from d3s.app.records import token_cut_summary

    records = _records([1.0, 1.5, 3.0, 0.5], [1.0, 1.0, 0.0, 1.0], [24.0, 0.5, 3.0, 0.0])
    got = token_cut_summary(records, token_selection=True, k_init=0.05, k_final=0.2, token_cut="batch", max_grad_norm=1.0)
    assert got["tokens_per_kept_rollout"] == 1.25 and got["one_sided_steps"] == 0.75
    assert got["clipped_steps"] == 0.5  # 2 of 4 logged norms above 1.0 (a norm of 0: no gradient, not clipped)
    assert len(got["warnings"]) == 2 and "min_tokens_per_rollout" in got["warnings"][0]
    plain = token_cut_summary(records, token_selection=False, k_init=None, k_final=None, token_cut="batch",
                              max_grad_norm=0.0)
    assert plain["warnings"] == [] and plain["clipped_steps"] is None  # no clipping configured
    assert token_cut_summary([{"type": "eval"}], token_selection=True, k_init=0.1, k_final=0.1, token_cut="batch",
                             max_grad_norm=1.0) is None
    drifted = _records([8.0] * 10, [0.0] * 10, [2.0] * 10, clipped=[0.0] * 5 + [0.8] * 5)
    got = token_cut_summary(drifted, token_selection=True, k_init=0.05, k_final=0.2, token_cut="batch", max_grad_norm=1.0)
    assert len(got["warnings"]) == 1 and "80% cut off" in got["warnings"][0]
    assert token_cut_summary(drifted, token_selection=False, k_init=None, k_final=None, token_cut="batch",
                             max_grad_norm=1.0)["warnings"] == []  # GRPO's drift is not the token cut's


def test_the_diagnosis_script_recomputes_a_campaign(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "token_cut_diagnosis.py"
    spec = importlib.util.spec_from_file_location("token_cut_diagnosis", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for seed, loss in ((1, -3.75), (2, 0.1)):
        run = tmp_path / f"d2s-seed{seed}"
        run.mkdir()
        (run / "run_config.json").write_text(json.dumps({"trainer": {"max_grad_norm": 1.0}}))
        rows = [{"type": "train", "step": s, "d3s/rollouts_kept": 8, "d3s/tokens_in_loss": 4 + 8 * (s - 1),
                 "d3s/k_fraction": 0.05 + 0.1 * (s - 1), "d3s/n_keep": 4, "learning_rate": [3.0, 1.0][s - 1],
                 "loss": loss, "grad_norm": [30.0, 0.5][s - 1], "d3s/one_sided": float(s == 1)} for s in (1, 2)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = module.diagnose(module.runs_in(tmp_path)["d2s"])
    assert d["runs"] == 2 and d["steps"] == 4
    assert d["tokens_per_kept_rollout"] == pytest.approx((0.5 + 1.5) / 2) and d["range"] == (0.5, 1.5)
    assert d["bands"] == {"<=10%": 0.5, "10-15%": 1.5}
    assert d["fewer_tokens_than_rollouts"] == 50.0 and d["one_sided"] == 50.0 and d["abs_loss_above_1"] == 50.0
    assert d["clipped"] == 50.0 and d["grad_norm_median"] == pytest.approx(15.25)
    assert d["k_lr_weighted"] == pytest.approx((3 * 0.05 + 1 * 0.15) / 4) and d["k_mean"] == pytest.approx(0.1)
    assert "| d2s | 2 | 4 |" in module.table(tmp_path)
    # completion length: first and last steps (a window of 1 here), the share cut off at the cap in the last
    for seed, (start, end) in ((1, (20.0, 46.0)), (2, (30.0, 12.0))):
        path = tmp_path / f"d2s-seed{seed}" / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row, length, cut in zip(rows, (start, end), (0.0, 0.5 * seed)):
            row.update({"completions/mean_length": length, "completions/clipped_ratio": cut})
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = module.runs_in(tmp_path)["d2s"]
    assert module.lengths(runs, window=1) == {"first": 25.0, "last": 29.0, "cut_last": 75.0,
                                              "per_run_last": [46.0, 12.0]}
    assert module.lengths(runs)["first"] == pytest.approx(statistics.mean([33.0, 21.0]))  # both steps, each run
    assert "| d2s | 2 | 27.0 | 27.0 | 38% | 33.0, 21.0 |" in module.table(tmp_path)


def test_runs_recorded_before_the_options_existed_stay_reusable():
    from d3s.app.recipe_changes import training_changes

    old = {"trainer": {"variant": "d3s", "token_selection": True, "schedule": "linear", "k_init": 0.05}}
    same = {"trainer": {**old["trainer"], "token_cut": "batch", "min_tokens_per_rollout": 0,
                        "schedule_clock": "steps", "keep_last_in_loss": False}}
    assert training_changes(old, same) == ([], [])
    changed, _ = training_changes(old, {"trainer": {**same["trainer"], "token_cut": "sign"}})
    assert changed == ["token_cut: 'batch' -> 'sign'"]


def test_options_a_run_cannot_use_are_no_reason_to_retrain_it():
    from d3s.app.recipe_changes import training_changes

    grpo = {"trainer": {"variant": "grpo", "token_selection": False, "schedule": "constant",
                        "min_tokens_per_rollout": 0, "keep_last_in_loss": False, "schedule_clock": "steps"}}
    floor = {"trainer": {**grpo["trainer"], "min_tokens_per_rollout": 4, "keep_last_in_loss": True,
                         "schedule_clock": "learning_rate"}}
    assert training_changes(grpo, floor) == ([], ["keep_last_in_loss: False -> True",
                                                 "min_tokens_per_rollout: 0 -> 4",
                                                 "schedule_clock: 'steps' -> 'learning_rate'"])
    d3s_paper = {"trainer": {**grpo["trainer"], "variant": "d3s", "token_selection": True, "schedule": "linear"}}
    d3s_floor = {"trainer": {**d3s_paper["trainer"], "min_tokens_per_rollout": 4}}
    assert training_changes(d3s_paper, d3s_floor) == (["min_tokens_per_rollout: 0 -> 4"], [])
    # a token cut on one side only: the option matters there
    assert training_changes(d3s_floor, floor)[0] == ["keep_last_in_loss: False -> True", "schedule: 'linear' -> 'constant'",
                                                    "schedule_clock: 'steps' -> 'learning_rate'",
                                                    "token_selection: True -> False", "variant: 'd3s' -> 'grpo'"]


def test_the_default_recipe_runs_grpo_and_d1s_c_d3s_with_the_floor_or_the_paper_cut_are_one_flag_away():
    from d3s.app.recipe import parse_train_args

    _, config, _ = parse_train_args([])
    assert config.variant == "grpo" and not config.token_selection and config.sample_selection == "none"
    _, config, _ = parse_train_args(["--variant", "d1s-c"])
    assert config.variant == "d1s-c" and not config.token_selection  # the floor is inert there
    assert config.d3s_settings == d3s.VARIANTS["d1s-c"].replace(num_generations=16, n_init=4, n_final=4, k_init=1.0,
                                                                 k_final=1.0, min_tokens_per_rollout=4)
    _, floor, _ = parse_train_args(["--variant", "d3s"])
    assert (floor.variant, floor.min_tokens_per_rollout, floor.token_cut) == ("d3s", 4, "batch")
    _, paper, _ = parse_train_args(["--variant", "d3s", "--min_tokens_per_rollout", "0"])
    assert paper.d3s_settings == d3s.VARIANTS["d3s"].replace(num_generations=16, n_init=4, n_final=16)


def test_a_variant_carries_the_options_and_validates_them():
    v = d3s.get_variant("d3s", token_cut="sign", min_tokens_per_rollout=2, schedule_clock="learning_rate")
    assert (v.token_cut, v.min_tokens_per_rollout, v.schedule_clock) == ("sign", 2, "learning_rate")
    assert (d3s.VARIANTS["d3s"].token_cut, d3s.VARIANTS["d3s"].min_tokens_per_rollout) == ("batch", 0)  # the paper's
    for field, value, match in (("token_cut", "top", "token_cut='top'; valid"),
                                ("min_tokens_per_rollout", True, "min_tokens_per_rollout=True must be an integer"),
                                ("keep_last_in_loss", "yes", "keep_last_in_loss='yes' must be True or False"),
                                ("schedule_clock", "epochs", "schedule_clock='epochs'; valid")):
        with pytest.raises(ValueError, match=match):
            d3s.get_variant("d3s", **{field: value})
