"""Two processes (accelerate, gloo on CPU) against one, with cross-group and token selection.

The same data reaches both runs (deterministic rollouts, dataset read in order); flat rewards on
some prompts make the cross-group selection keep 8 rollouts of rank 0 and none of rank 1 in the
first step, and unequal numbers later (see `trl_multiprocess_run.py`).

Note: `accelerate launch --cpu` always starts ONE process; several CPU processes need the
torchrun-based launcher (`--multi_gpu`, which falls back to gloo when `use_cpu=True`) or torchrun.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402

SCRIPT = Path(__file__).with_name("trl_multiprocess_run.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(out: Path, world: int, micro_batches: int, loss_type: str, options: dict | None = None, **env_extra) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "D3S_TEST_OPTIONS": json.dumps(options or {}),
           **env_extra}
    args = [str(SCRIPT), str(out), str(micro_batches), loss_type]
    if world == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(world),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), *args]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]


def _load(out: Path, name: str):
    return json.loads((out / name).read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    "micro_batches, loss_type, options",
    [(1, "grpo", None), (2, "dapo", None),  # one or two micro-batches per generation batch
     (2, "dapo", {"token_cut": "sign", "min_tokens_per_rollout": 2, "keep_last_in_loss": True}),  # beyond the paper (9.2)
     (1, "grpo", {"token_cut": "rollout", "schedule_clock": "learning_rate", "lr_scheduler_type": "cosine"})],
)
def test_two_processes_match_one(tmp_path, micro_batches, loss_type, options):
    _run(tmp_path, 1, micro_batches, loss_type, options)
    _run(tmp_path, 2, micro_batches, loss_type, options)

    single = _load(tmp_path, "selection_world1_rank0.json")
    rank0 = _load(tmp_path, "selection_world2_rank0.json")
    rank1 = _load(tmp_path, "selection_world2_rank1.json")
    assert len(single) == len(rank0) == len(rank1) == 3
    for step, (one, r0, r1) in enumerate(zip(single, rank0, rank1)):
        # every rank made the same choice, and the single process made it too
        assert r0["kept"] == r1["kept"] == one["kept"], step
        assert r0["token_mask"] == r1["token_mask"], step  # one global threshold
        assert r0["tokens_in_loss"] == r1["tokens_in_loss"] == one["tokens_in_loss"], step
        assert sum(map(sum, r0["token_mask"])) == r0["tokens_in_loss"]
        # the kept rollouts were dealt out evenly: rows_per_rank = ceil(K / 2) rounded to the micro-batches
        assert r0["rows_per_rank"] == r1["rows_per_rank"] >= len(r0["kept"]) / 2
        if micro_batches > 1:  # mask built before TRL shuffles: same layout as the single process
            K = len(one["kept"])
            m1, m2 = torch.tensor(one["token_mask"])[:K], torch.tensor(r0["token_mask"])[:K]
            width = min(m1.size(1), m2.size(1))
            assert torch.equal(m1[:, :width], m2[:, :width]) and m1[:, width:].sum() == m2[:, width:].sum() == 0
    # uneven selections happened, including a rank that kept none of its own rollouts
    before = [r["kept_per_rank_before"] for r in rank0]
    assert before[0] == [8, 0]
    assert any(a != b for a, b in before[1:])

    logs1, logs2 = _load(tmp_path, "logs_world1.json"), _load(tmp_path, "logs_world2.json")
    # (abs: a two-sided update can have a loss of ~1e-8, where float rounding is all of it)
    assert [h["loss"] for h in logs2] == pytest.approx([h["loss"] for h in logs1], rel=1e-5, abs=1e-6)
    for key in ["d3s/rollouts_kept", "d3s/tokens_in_loss", "d3s/n_keep", "d3s/k_fraction"]:
        assert [h[key] for h in logs2] == [h[key] for h in logs1], key
    # Gradients at every step and the final parameters: equal up to float rounding (fp32)
    g1, g2 = torch.load(tmp_path / "grads_world1.pt"), torch.load(tmp_path / "grads_world2.pt")
    assert g1.shape == g2.shape and g1.size(0) == 3
    for step in range(3):
        assert ((g2[step] - g1[step]).norm() / g1[step].norm()) < 1e-5, step
    p1, p2 = torch.load(tmp_path / "params_world1.pt"), torch.load(tmp_path / "params_world2.pt")
    torch.testing.assert_close(p2, p1, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_two_processes_choose_the_same_prompts(tmp_path):
    """prompt_skip and dynamic_sampling: every rank makes the same choice, and the one a single process makes."""
    _run(tmp_path, 1, 1, "dapo", D3S_TEST_PROMPT_OPTIONS="1")
    _run(tmp_path, 2, 1, "dapo", D3S_TEST_PROMPT_OPTIONS="1")
    single = _load(tmp_path, "prompts_world1_rank0.json")
    rank0, rank1 = _load(tmp_path, "prompts_world2_rank0.json"), _load(tmp_path, "prompts_world2_rank1.json")
    assert len(single) == len(rank0) == len(rank1) > 5  # refill rounds happened
    for one, r0, r1 in zip(single, rank0, rank1):
        assert r0 + r1 == one  # rank 0 holds the first half of the generation batch, rank 1 the second
    logs1, logs2 = _load(tmp_path, "logs_world1.json"), _load(tmp_path, "logs_world2.json")
    assert sum(h["d3s/prompts_skipped"] for h in logs1) > 0
    for key in ["d3s/prompts_skipped", "d3s/flat_groups_generated", "d3s/generation_rounds", "d3s/signal_groups",
                "d3s/rollouts_kept", "d3s/tokens_in_loss"]:
        assert [h[key] for h in logs2] == [h[key] for h in logs1], key
    assert [h["loss"] for h in logs2] == pytest.approx([h["loss"] for h in logs1], rel=1e-5)
    p1, p2 = torch.load(tmp_path / "params_world1.pt"), torch.load(tmp_path / "params_world2.pt")
    torch.testing.assert_close(p2, p1, rtol=1e-5, atol=1e-6)
