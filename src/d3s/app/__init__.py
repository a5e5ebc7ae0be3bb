"""The `d3s` command: recipes, tasks and models around `D3SGRPOTrainer`, and the jobs built on them.

    cli          the command line: `d3s train | compare | eval | eval-table`
    recipe       recipes (YAML + command-line overrides) -> `RunArgs` and `D3SConfig`; recipes/*.yaml
    tasks        the verifiable tasks: embedded arithmetic and a math dataset (problems, prompts, rewards)
    models       the embedded SmolLM2 model and the tiny test model, converted once and cached
    train        `d3s train`: one run with held-out accuracy, records, checkpoints and resume
    compare      `d3s compare`: variants x seeds, side by side
    runfolder    a run's output folder: lock, atomic writes, complete checkpoints
    plots        PNG plots from `metrics.jsonl`
    evaluation/  `d3s eval`: benchmarks, prompts, samplers, scoring, pass@k / Avg@n, reports
    errors       `UsageError`: a bad value from the user, reported in one line
"""
