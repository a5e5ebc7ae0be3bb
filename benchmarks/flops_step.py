"""One step of the default recipe counted in both FLOP conventions: docs/compare.md's table, reproduced.

Trains grpo, d1s-c and d3s (the default recipe otherwise) for one step on seed 0, each in its own run folder under
OUT, and writes OUT/shape.json: the embedded model's parameters as each convention counts them. The table in
docs/compare.md (block `flops-step`) is computed from these files by `scripts/readme_figures.py`; this script
prints it too.

    python benchmarks/flops_step.py                          # -> benchmarks/results/flops-step
    python benchmarks/flops_step.py --out DIR --d3s "d3s"    # another folder, another command

A finished run is reused; `--fresh` trains all three again. Each run keeps its records, not its checkpoints.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from d3s.app.runfolder import prune_checkpoints

VARIANTS = ("grpo", "d1s-c", "d3s")
SEED = 0
HELDOUT = 16  # the held-out set is not what is measured: a small one keeps the command short


def model_shapes() -> dict[str, int]:
    """The embedded model's parameters: `n_body` and `n_head` (`d3s.app.budget.model_shape`, computed-v2) and
    `n_legacy` (`d3s.app.budget.non_embedding_parameters`, estimate-v1)."""
    from transformers import AutoModelForCausalLM

    from d3s.app.budget import model_shape, non_embedding_parameters
    from d3s.app.models import embedded_model_path

    model = AutoModelForCausalLM.from_pretrained(str(embedded_model_path()))
    shape = model_shape(model)
    return {"n_body": shape.n_body, "n_head": shape.n_head, "n_legacy": non_embedding_parameters(model)}


def train(d3s: str, out: Path, variant: str, fresh: bool) -> None:
    run = out / variant
    if (run / "summary.json").is_file() and not fresh:
        print(f"flops_step: {run} is finished; reused")
    else:
        if run.exists():
            shutil.rmtree(run)
        command = [*shlex.split(d3s), "train", "--variant", variant, "--seed", str(SEED), "--max_steps", "1",
                   "--heldout_size", str(HELDOUT), "--plots", "false", "--output_dir", str(run)]
        print("flops_step: " + shlex.join(command), flush=True)
        subprocess.run(command, check=True)
    prune_checkpoints(run, "none")  # the records are what is measured; the model is 1.6 GB a run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/flops-step"))
    parser.add_argument("--d3s", default=".venv/bin/d3s" if Path(".venv/bin/d3s").exists() else "d3s",
                        help="the d3s command (default: .venv/bin/d3s where scripts/setup.sh made it)")
    parser.add_argument("--fresh", action="store_true", help="train every variant again")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for variant in VARIANTS:
        train(args.d3s, args.out, variant, args.fresh)
    (args.out / "shape.json").write_text(json.dumps(model_shapes(), indent=2) + "\n")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from readme_figures import flops_step_table

    print(flops_step_table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
