"""`python -m d3s.cli`, with vLLM's CPU backend prepared the way tests/with_vllm prepares it.

For `test_recipe_launch.py`'s vLLM runs on a CPU: the launcher starts this file instead of `-m d3s.cli`
with the same arguments. Each process sets the environment vLLM's CPU backend needs
(`vllm_tiny.set_vllm_cpu_env`) and, unless D3S_VLLM_CPU_WEIGHT_WORKAROUND=0, keeps the engine's linear
weights where TRL's weight sync can write them (`vllm_tiny.keep_linear_weights_on_cpu`, see its docstring),
then runs the `d3s` command.
"""

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "with_vllm"))

import vllm_tiny  # noqa: E402

vllm_tiny.set_vllm_cpu_env(os.environ.get("VLLM_CACHE_ROOT") or tempfile.mkdtemp(prefix="vllm_cache_"))
if os.environ.get("D3S_VLLM_CPU_WEIGHT_WORKAROUND", "1") != "0":
    vllm_tiny.keep_linear_weights_on_cpu()

from d3s.app.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
