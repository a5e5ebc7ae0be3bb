"""Evaluation of checkpoints on the paper's benchmarks: pass@k and Avg@n (paper sec. 4.1).

Layout: `benchmarks` (the one field map + loaders), `prompts`, `generation` (transformers / vLLM
samplers), `aggregate` (pass@k, Avg@n), `report` (results JSON, Table-1 markdown), `runner` (the
`d3s eval` loop with its resume cache), `heldout` (the held-out accuracy of `d3s train`). Completions
are scored by `d3s.app.scoring`, which the training rewards use too.

The names below are the Python API of `d3s eval` (docs/eval.md).
"""

from d3s.app.scoring import Score, score_completion

from .aggregate import average_metrics, benchmark_metrics
from .benchmarks import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    BenchmarkError,
    BenchmarkSpec,
    Problem,
    extract_gold,
    load_benchmark,
)
from .report import load_results, render_table
from .runner import run_eval
from .settings import EvalConfig

__all__ = [
    "BENCHMARKS",
    "PAPER_BENCHMARKS",
    "BenchmarkError",
    "BenchmarkSpec",
    "EvalConfig",
    "Problem",
    "Score",
    "average_metrics",
    "benchmark_metrics",
    "extract_gold",
    "load_benchmark",
    "load_results",
    "render_table",
    "run_eval",
    "score_completion",
]
