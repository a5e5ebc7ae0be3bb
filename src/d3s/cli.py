"""The `d3s` command: one subcommand per job, dispatched on the first argument.

    d3s eval --model PATH_OR_NAME --benchmarks gsm8k,math500 --n 32 --k 1,8,16
    d3s eval-table base/results.json grpo/results.json d3s/results.json --labels base,grpo,d3s

Each subcommand owns its own argument parser (`COMMANDS` maps a name to `fn(argv) -> exit code`),
so a command with a different configuration style (a YAML recipe, dataclass fields) is added as
one more entry. Bad input ends with a one-line `d3s <command>: error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Callable, Sequence

USAGE_EXIT = 2


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    return values


def _eval_parser() -> argparse.ArgumentParser:
    """Options of `d3s eval`; unset options take `EvalConfig`'s defaults (shown in the help)."""
    from dataclasses import fields

    from d3s.evaluation.benchmarks import BENCHMARKS
    from d3s.evaluation.runner import EvalConfig

    d = {f.name: f.default for f in fields(EvalConfig)}
    p = argparse.ArgumentParser(
        prog="d3s eval",
        description="Sample n completions per problem, score them with math-verify, and report "
        "unbiased pass@k and Avg@n per benchmark (paper sec. 4.1, Table 1). Resumable: rerun "
        "the same command to continue an interrupted evaluation.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--model", required=True,
                   help="local checkpoint folder or hub model name; `embedded`: the base model "
                   "of the default `d3s train` run (SmolLM2-135M-Instruct)")
    p.add_argument(
        "--benchmarks",
        help=f"comma-separated names from {', '.join(BENCHMARKS)}; NAME=PATH reads a benchmark "
        f"from a local file/folder (default: the paper's seven, {','.join(d['benchmarks'])})",
    )
    p.add_argument("--n", type=int, help=f"completions per problem (default {d['n']})")
    p.add_argument(
        "--k", dest="ks", type=_int_list, metavar="K",
        help=f"pass@k values, each <= n (default {','.join(map(str, d['ks']))})",
    )
    p.add_argument("--output", help="output folder (default eval_results/<model name>)")
    p.add_argument("--max-new-tokens", type=int, help=f"default {d['max_new_tokens']}")
    p.add_argument("--temperature", type=float, help=f"0 = greedy (default {d['temperature']})")
    p.add_argument("--top-p", type=float, help=f"default {d['top_p']}")
    p.add_argument("--top-k", type=int, help=f"0 = off (default {d['top_k']})")
    p.add_argument("--seed", type=int, help=f"default {d['seed']}")
    p.add_argument("--data-dir", help="folder with local benchmark copies (no hub access then)")
    p.add_argument("--limit", type=int, help="only the first N problems of each benchmark")
    p.add_argument("--batch-size", type=int,
                   help=f"sequences per generate call (default {d['batch_size']})")
    p.add_argument("--backend", choices=("auto", "transformers", "vllm"),
                   help=f"default {d['backend']}: vLLM when installed and a GPU is present")
    p.add_argument("--device", help=f"auto, cpu, cuda, cuda:1, ... (default {d['device']})")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                   help=f"default {d['dtype']}: bfloat16 on GPU, float32 on CPU")
    p.add_argument(
        "--prompt-template",
        help="user message with a {question} placeholder (default: a \\boxed{} instruction)",
    )
    p.add_argument("--chat", choices=("auto", "on", "off"),
                   help=f"use the model's chat template (default {d['chat']}: when it has one)")
    p.add_argument("--system-prompt", help="optional system message")
    p.add_argument("--require-boxed", action="store_true",
                   help="score 0 for completions without \\boxed{}")
    p.add_argument("--verify-timeout", type=int,
                   help=f"seconds per math-verify call (default {d['verify_timeout']})")
    p.add_argument("--score-workers", type=int,
                   help="processes scoring in parallel (default: half the cores, at most 8)")
    p.add_argument("--label", help="row label in tables (default: the model name)")
    p.add_argument("--overwrite", action="store_true", help="discard cached samples and restart")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p


def cmd_eval(argv: Sequence[str]) -> int:
    """`d3s eval`: evaluate one model; prints the Table-1-style markdown."""
    options = vars(_eval_parser().parse_args(argv))
    from d3s.evaluation.report import render_report
    from d3s.evaluation.runner import EvalConfig, run_eval

    progress = not options.pop("no_progress", False)
    config = EvalConfig(**options)
    results = run_eval(config, progress=progress)
    print(render_report(results))
    print(f"results: {config.output}/results.json, {config.output}/results.md")
    return 0


def cmd_eval_table(argv: Sequence[str]) -> int:
    """`d3s eval-table`: render results files side by side (e.g. base vs GRPO vs D3S)."""
    p = argparse.ArgumentParser(
        prog="d3s eval-table",
        description="Render d3s eval results files (or their folders) as one markdown table "
        "laid out like the paper's Table 1, one row per file.",
    )
    p.add_argument("results", nargs="+", help="results.json files or d3s eval output folders")
    p.add_argument("--labels", help="comma-separated row labels (default: each file's label)")
    p.add_argument("--k", type=_int_list, default=(1, 8),
                   help="pass@k values in each cell (default 1,8 as in Table 1)")
    p.add_argument("--output", help="also write the table to this file")
    args = p.parse_args(argv)
    from d3s.evaluation.report import load_results, render_table

    results = [load_results(path) for path in args.results]
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    table = render_table(results, labels=labels, ks=args.k)
    print(table, end="")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(table)
    return 0


def cmd_train(argv: Sequence[str]) -> int:
    from d3s.train import cmd_train as run

    return run(argv)


def cmd_compare(argv: Sequence[str]) -> int:
    from d3s.compare import cmd_compare as run

    return run(argv)


COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "train": (cmd_train, "D3S fine-tuning from a recipe (no arguments: the embedded CPU default)"),
    "compare": (cmd_compare, "several variants x seeds on the same budget, curves and summary table"),
    "eval": (cmd_eval, "pass@k / Avg@n of a model on math benchmarks"),
    "eval-table": (cmd_eval_table, "side-by-side table of several eval results"),
}


def _usage() -> str:
    lines = ["usage: d3s COMMAND [options]   (d3s COMMAND --help for details)", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `d3s` console script; returns the exit status."""
    from d3s.evaluation.benchmarks import UsageError
    from d3s.recipe import RecipeError

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else USAGE_EXIT
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"d3s: error: unknown command {name!r}; valid: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return USAGE_EXIT
    fn, _ = COMMANDS[name]
    # transformers 5 renames gradient_checkpointing; TRL and the recipes still use the old name, which
    # works. Its deprecation notice says nothing a d3s user can act on.
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.* is deprecated", category=FutureWarning)
    try:
        return fn(rest)
    except (UsageError, RecipeError) as e:
        print(f"d3s {name}: error: {e}", file=sys.stderr)
        return USAGE_EXIT
    except SystemExit as e:  # argparse: --help (0) or a bad option (2, message already printed)
        return e.code if isinstance(e.code, int) else USAGE_EXIT
    except KeyboardInterrupt:
        print(f"d3s {name}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
