"""D3S with colocated vLLM on two processes (accelerate, gloo on CPU): one engine per rank.

Each rank generates its own share with its own engine (sampling seeded by the rank), so the run is
not compared with a one-process run; what must hold is what DDP and the weight sync promise: both
ranks end with the same parameters, and before every generation each engine holds its trainer's
weights, after steps in which D3S dropped rollouts and tokens across ranks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

# part of scripts/test_vllm.sh and CI's vLLM stage: about 75 s on 2 CPU cores
pytestmark = [pytest.mark.vllm]

SCRIPT = Path(__file__).with_name("vllm_two_process_run.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_colocated(tmp_path, tiny_model_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    # `accelerate launch --cpu` starts ONE process; several CPU processes need the torchrun-based
    # launcher (`--multi_gpu`, gloo when the config says use_cpu).
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), str(SCRIPT), str(tmp_path), tiny_model_path]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    for r in ranks:
        assert r["mismatches"] == [0.0, 0.0], f"rank {r['rank']}: engine weights differ from the trainer's"
        assert all(h["d3s/rollout_ratio"] < 1 for h in r["logs"])
    assert ranks[0]["param_sum"] == ranks[1]["param_sum"]
    assert ranks[0]["param_abs_sum"] == ranks[1]["param_abs_sum"]
