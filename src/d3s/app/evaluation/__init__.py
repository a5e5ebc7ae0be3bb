"""Evaluation of checkpoints on the paper's benchmarks: pass@k and Avg@n (paper sec. 4.1).

Layout: `benchmarks` (the one field map + loaders), `scoring` (math-verify with a guard),
`prompts`, `generation` (transformers / vLLM samplers), `aggregate` (pass@k, Avg@n),
`report` (results JSON, Table-1 markdown), `runner` (the `d3s eval` loop with its resume cache).
"""

from .aggregate import average_metrics, benchmark_metrics
from .benchmarks import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    BenchmarkError,
    BenchmarkSpec,
    Problem,
    UsageError,
    extract_gold,
    load_benchmark,
)
from .report import load_results, render_table
from .runner import EvalConfig, run_eval
from .scoring import Score, score_completion

__all__ = [
    "BENCHMARKS",
    "PAPER_BENCHMARKS",
    "BenchmarkError",
    "BenchmarkSpec",
    "EvalConfig",
    "Problem",
    "Score",
    "UsageError",
    "average_metrics",
    "benchmark_metrics",
    "extract_gold",
    "load_benchmark",
    "load_results",
    "render_table",
    "run_eval",
    "score_completion",
]
