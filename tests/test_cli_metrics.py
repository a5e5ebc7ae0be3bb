"""`d3s train --config smoke` logs the paper's quantities, and its schedule reaches the final values."""

import json

import pytest

pytest.importorskip("trl")

from d3s.app.cli import main  # noqa: E402


def test_smoke_run_logs_kl_entropies_and_ends_at_the_final_schedule(tmp_path):
    out = tmp_path / "smoke"
    assert main(["train", "--config", "smoke", "--output_dir", str(out), "--eval_every", "0",
                 "--kl_log_every", "1"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"]
    assert len(train) == 4
    for r in train:
        assert r["kl"] >= 0.0  # beta = 0: KL to the initial policy
        assert r["entropy/generated"] > 0.0  # every generated token
        # the trained tokens' entropy, unless the step had no signal and skipped its forward
        assert "entropy/trained" in r or r["d3s/skipped_forwards"] == 1.0
    assert train[0]["kl"] == 0.0  # the initial policy itself
    assert (train[0]["d3s/progress"], train[-1]["d3s/progress"]) == (0.0, 1.0)
    assert (train[-1]["d3s/n_keep"], train[-1]["d3s/k_fraction"]) == (4.0, 0.2)  # N = G, K = K_final
