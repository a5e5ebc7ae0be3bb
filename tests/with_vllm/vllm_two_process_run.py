"""One D3S run with colocated vLLM on every process, for `test_vllm_two_processes.py`:

    accelerate launch --multi_gpu --num_processes 2 ... vllm_two_process_run.py OUT_DIR MODEL_DIR

Each rank builds its own engine (TRL colocate, tensor_parallel_size 1) and generates its share of
the generation batch; D3S selects across both ranks. Each rank writes OUT_DIR/rank{r}.json: the
engine-vs-trainer weight mismatch before every generation, a checksum of its final parameters and
the step logs.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vllm_tiny as vt  # noqa: E402

vt.set_vllm_cpu_env(tempfile.mkdtemp(prefix="vllm_cache_"))
vt.keep_linear_weights_on_cpu()

from d3s.integrations.trl import D3SConfig, D3SGRPOTrainer  # noqa: E402


def main(out: Path, model_path: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    args = vt.make_config(D3SConfig, out / "trainer", sample_selection="cross", n_init=2, token_selection=True,
                          k_init=0.5, per_device_train_batch_size=4, max_steps=2)  # 2 ranks x 4 = 2 prompts x 4
    trainer = vt.build(D3SGRPOTrainer, args, model_path)
    engine, mismatches = trainer.vllm_generation, []
    generate = engine.generate

    def checking_generate(*a, **kw):
        mismatches.append(vt.vllm_weight_mismatch(trainer))
        return generate(*a, **kw)

    engine.generate = checking_generate
    trainer.train()
    params = vt.flat_params(trainer.model)
    record = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "mismatches": mismatches,
        "param_sum": float(params.double().sum()),
        "param_abs_sum": float(params.double().abs().sum()),
        "logs": vt.step_logs(trainer),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
