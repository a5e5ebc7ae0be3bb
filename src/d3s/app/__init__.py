"""The `d3s` command: recipes, tasks and models around `D3SGRPOTrainer`, and the jobs built on them.

Bottom-up, in import order (docs/architecture.md draws it; tests/test_imports.py checks it):

    errors            `UsageError`, `RecipeError`, `SettingsError`: bad input, reported in one line
    datafiles         JSON and question/answer files (JSON, JSON lines, parquet), read one way
    scoring           answers and their scores (numeric, math-verify), for rewards and evaluation
    intervals         Wilson and t-intervals
    options           the command-line convention: options from dataclass fields
    runfiles          a run's files: atomic writes, one reading of run_config/summary/records (damaged = unusable)
    runfolder         a run's output folder: lock, complete checkpoints, pruning
    recipe_changes    which recipe changes may resume a run
    child_process     a run as compare's child: waited for through a Ctrl-C, stopped when compare dies
    models            the embedded SmolLM2 model and the tiny test model, converted once and cached
    plots             PNG plots from `metrics.jsonl`
    tasks             the verifiable tasks: embedded arithmetic and a math dataset (problems, prompts, rewards)
    recipe            recipes (YAML + command-line overrides) -> `RunArgs` and `D3SConfig`; recipes/*.yaml
    evaluation/       `d3s eval`: benchmarks, prompts, samplers, pass@k / Avg@n, reports; held-out accuracy
    train             `d3s train`: one run with held-out accuracy, records, checkpoints and resume
    resume            where a run continues from (finished, newest complete checkpoint, start), what it refuses
    run_trainer       the run's trainer and callback (imports TRL; loaded when a run starts)
    compare           `d3s compare`: variants x seeds, side by side (a package: command, summary, markdown)
    cli               the command line: `d3s train | compare | eval | eval-table`
"""
