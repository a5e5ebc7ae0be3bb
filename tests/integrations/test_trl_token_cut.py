"""The token-cut options beyond the paper in the trainer (docs/method.md section 9.2): the mask the trainer
trains on is `d3s.token_selection.select_tokens`'s (checked against a plain loop), the selective forward
still equals the full masked computation, the learning-rate clock moves N and K, and with every option off
the paper's `d3s` is bit-identical to the trainer that only knows the paper's cut."""

import math

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from test_token_cut_options import loop_reference  # noqa: E402
from test_trl_compute import CheckingTrainer  # noqa: E402
from trl_tiny import flat_params, run_training, step_logs  # noqa: E402

from d3s import linear_schedule, num_tokens_to_keep, top_tokens_mask  # noqa: E402
from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # noqa: E402
from d3s.integrations.trl.rows import gather_rows  # noqa: E402
from d3s.metrics import advantage_balance  # noqa: E402
from d3s.schedule import learning_rate_progress  # noqa: E402
from d3s.token_selection import LOWEST_SCORE, token_scores  # noqa: E402

SMALL = dict(per_device_train_batch_size=8, gradient_accumulation_steps=2)


class RecordingMaskTrainer(D3SGRPOTrainer):
    """Keeps what every token cut saw and chose."""

    def _d3s_token_mask(self, advantages, entropies, mask, fraction):
        out = super()._d3s_token_mask(advantages, entropies, mask, fraction)
        self.cuts.append((advantages.clone(), entropies.float().clone(), mask.clone(), fraction, out[1].clone(), out[3]))
        return out


def _setup(trainer):
    trainer.cuts = []


@pytest.mark.parametrize("cut, floor, last", [("sign", 0, False), ("rollout", 0, False), ("batch", 2, False),
                                             ("sign", 1, False), ("batch", 0, True), ("sign", 2, True)])
def test_the_trainer_trains_on_the_options_mask(tmp_path, cut, floor, last):
    run = run_training(RecordingMaskTrainer, D3SConfig, tmp_path, variant="d3s", token_cut=cut,
                       min_tokens_per_rollout=floor, keep_last_in_loss=last, max_steps=3, kl_log_every=0, setup=_setup,
                       **SMALL)
    logs = step_logs(run)
    assert len(run.cuts) == 3
    for (adv, ent, mask, fraction, chosen, balance), h in zip(run.cuts, logs):
        want = loop_reference(token_scores(adv, ent, mask), fraction, adv, cut, floor, last)
        assert torch.equal(chosen, want)
        assert h["d3s/tokens_in_loss"] == int(want.sum())
        assert h["d3s/tokens_per_kept_rollout"] == pytest.approx(int(want.sum()) / h["d3s/rollouts_kept"])
        assert (h["d3s/advantage_balance"], h["d3s/one_sided"]) == pytest.approx(
            (advantage_balance(adv, want, mask.bool())[0], float(advantage_balance(adv, want, mask.bool())[1])))
    assert int(run.d3s_last_selection["token_mask"].sum()) == run.d3s_last_selection["tokens_in_loss"]
    # the length-cap watch sees each generation batch's share of completions cut off, as TRL logs it
    assert run._d3s_diagnosis.clipped == pytest.approx([h["completions/clipped_ratio"] for h in logs])


@pytest.mark.parametrize("cut, floor, last, loss_type", [("sign", 0, False, "dapo"), ("rollout", 0, False, "grpo"),
                                                         ("batch", 2, False, "bnpo"), ("sign", 2, False, "dr_grpo"),
                                                         ("batch", 0, True, "dapo")])
def test_the_options_train_exactly_as_the_full_masked_computation(tmp_path, cut, floor, last, loss_type):
    run = run_training(CheckingTrainer, D3SConfig, tmp_path, variant="d3s", token_cut=cut, min_tokens_per_rollout=floor,
                       keep_last_in_loss=last, loss_type=loss_type, max_steps=3, kl_log_every=0, learning_rate=0.05,
                       setup=lambda t: setattr(t, "checked", []), **SMALL)
    assert len(run.checked) == 3 * 2 and max(run.checked) > 0  # every micro-batch compared, some with a gradient


class PaperCutTrainer(D3SGRPOTrainer):
    """The token cut as the paper's code path has it, written out: one threshold over every rank's kept tokens."""

    def _d3s_token_mask(self, advantages, entropies, mask, fraction):
        scores = token_scores(advantages, entropies.float(), mask)
        R, T = scores.shape
        all_scores = gather_rows(self.accelerator, scores, -float("inf"), False)
        n_valid = int((all_scores > -float("inf")).sum())
        all_mask = top_tokens_mask(all_scores, num_tokens_to_keep(n_valid, fraction), n_valid=n_valid)
        n_nonfinite = int((all_scores == LOWEST_SCORE).sum())
        all_advantages = gather_rows(self.accelerator, advantages, 0.0, False)
        balance = advantage_balance(all_advantages, all_mask, all_scores > -float("inf"))
        return all_mask[:R, :T], all_mask, n_nonfinite, balance


def test_with_the_options_off_the_paper_d3s_is_bit_identical(tmp_path):
    config = dict(variant="d3s", max_steps=3, kl_log_every=0, lr_scheduler_type="cosine", optim="adamw_torch",
                  learning_rate=0.01, **SMALL)
    ours = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "ours", **config)
    paper = run_training(PaperCutTrainer, D3SConfig, tmp_path / "paper", **config)
    explicit = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "explicit", token_cut="batch", min_tokens_per_rollout=0,
                            keep_last_in_loss=False, schedule_clock="steps", **config)
    for other in (paper, explicit):
        assert torch.equal(flat_params(ours.model), flat_params(other.model))
        assert step_logs(ours) == step_logs(other) or _same_but_time(step_logs(ours), step_logs(other))


def _same_but_time(a, b):
    drop = ("step_time", "d3s/time/", "d3s/generation_s_per_signal_group")  # wall-clock
    strip = [{k: v for k, v in h.items() if not k.startswith(drop)} for h in a + b]
    return strip[: len(a)] == strip[len(a):]


def test_learning_rate_clock_moves_the_schedule_with_the_learning_rate(tmp_path):
    steps = 5
    config = dict(sample_selection="cross", n_init=2, n_final=4, token_selection=True, k_init=0.1, k_final=0.5,
                  schedule="linear", max_steps=steps, kl_log_every=0, **SMALL)
    cosine = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "cos", schedule_clock="learning_rate",
                          lr_scheduler_type="cosine", **config)
    rates = [h["learning_rate"] for h in step_logs(cosine)]
    assert rates[0] > rates[-1] > 0  # the scheduler really decays
    for g, h in enumerate(step_logs(cosine)):
        p = learning_rate_progress(g, rates, 2, 2)
        assert h["d3s/progress"] == pytest.approx(p)
        n_keep, fraction = linear_schedule(p, 2, 4, 0.1, 0.5, 4)
        assert (h["d3s/n_keep"], h["d3s/k_fraction"]) == (n_keep, pytest.approx(fraction))
    progress = [h["d3s/progress"] for h in step_logs(cosine)]
    assert progress[0] == 0.0 and progress[-1] == pytest.approx(1.0) and progress[2] > 2 / 4  # ahead of the steps
    constant = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "const", schedule_clock="learning_rate",
                            lr_scheduler_type="constant", **config)
    assert [h["d3s/progress"] for h in step_logs(constant)] == pytest.approx([s / (steps - 1) for s in range(steps)])


def test_a_degenerate_cut_is_said_once_with_the_setting_to_change(tmp_path, capfd):
    run_training(D3SGRPOTrainer, D3SConfig, tmp_path, variant="d2s", k_init=0.01, max_steps=4, kl_log_every=0, **SMALL)
    err = capfd.readouterr().err
    assert err.count("tokens per kept rollout") == 1 and "min_tokens_per_rollout" in err
    run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "floor", variant="d2s", k_init=0.01, min_tokens_per_rollout=3,
                 max_steps=4, kl_log_every=0, **SMALL)
    assert "tokens per kept rollout" not in capfd.readouterr().err


@pytest.mark.parametrize("field, value, match", [
    ("token_cut", "top", "token_cut='top'; valid: 'batch', 'sign', 'rollout'"),
    ("min_tokens_per_rollout", -1, "min_tokens_per_rollout=-1 must be an integer >= 0"),
    ("min_tokens_per_rollout", 2.5, "min_tokens_per_rollout=2.5 must be an integer >= 0"),
    ("schedule_clock", "lr", "schedule_clock='lr'; valid: 'steps', 'learning_rate'"),
    ("keep_last_in_loss", 2, "keep_last_in_loss=2 must be True or False"),
])
def test_bad_option_values_are_refused_with_the_valid_ones(tmp_path, field, value, match):
    with pytest.raises(ValueError, match=match):
        D3SConfig(str(tmp_path), variant="d3s", use_cpu=True, **{field: value})


def test_options_are_inert_where_they_do_not_apply(tmp_path):
    # a recipe that turns them on still runs every variant (`d3s compare` shares one recipe): they modify a token
    # cut and a linear schedule, and a variant without one trains as before
    config = dict(token_cut="sign", min_tokens_per_rollout=2, keep_last_in_loss=True, schedule_clock="learning_rate",
                  max_steps=2, kl_log_every=0, **SMALL)
    a = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "a", variant="d1s-c", **config)
    b = run_training(D3SGRPOTrainer, D3SConfig, tmp_path / "b", variant="d1s-c", max_steps=2, kl_log_every=0, **SMALL)
    assert torch.equal(flat_params(a.model), flat_params(b.model))
    assert math.isfinite(step_logs(a)[-1]["loss"])
