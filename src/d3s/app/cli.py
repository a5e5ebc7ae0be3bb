"""The `d3s` command: one subcommand per job, dispatched on the first argument.

    d3s train [--config RECIPE] [--field value ...]
    d3s compare --variants grpo,d3s --seeds 1,2 [--config RECIPE] [--field value ...]
    d3s eval --model PATH_OR_NAME --benchmarks gsm8k,math500 --n 32 --ks 1,8,16
    d3s eval-table base/results.json grpo/results.json d3s/results.json --labels base,grpo,d3s

Every subcommand's options are the fields of its dataclasses, spelled as the fields (`--max_new_tokens`,
`--output_dir`): `RunArgs` and `D3SConfig` for `d3s train` (`d3s.app.recipe`), `CompareArgs` for
`d3s compare`, `EvalConfig` and `EvalCommandArgs` for `d3s eval`, `EvalTableArgs` for `d3s eval-table`
(the convention: `d3s.app.options`).

`COMMANDS` maps a name to `fn(argv) -> exit code`. Bad input ends with a one-line
`d3s <command>: error: ...` and exit status 2.
"""

from __future__ import annotations

import signal
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from d3s.app.compare import cmd_compare
from d3s.app.errors import Terminated, UsageError
from d3s.app.evaluation.report import load_results, render_report, render_table
from d3s.app.evaluation.runner import run_eval
from d3s.app.evaluation.settings import EvalConfig
from d3s.app.options import dataclass_parser, parse_command, parse_dataclasses
from d3s.app.runfiles import RunFileError, atomic_write_text
from d3s.app.train import cmd_train

USAGE_EXIT = 2


@dataclass
class EvalCommandArgs:
    """Options of `d3s eval` that are about the command, not the evaluation (`EvalConfig` holds those)."""

    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})


@dataclass
class EvalTableArgs:
    """Options of `d3s eval-table`."""

    results: tuple[str, ...] = field(metadata={"help": "results.json files or d3s eval output folders",
                                               "operand": True})
    labels: tuple[str, ...] | None = field(default=None, metadata={
        "help": "comma-separated row labels (default: each file's label)"})
    ks: tuple[int, ...] = field(default=(1, 8), metadata={"help": "pass@k values in each cell, as in Table 1"})
    output: str | None = field(default=None, metadata={
        "help": "also write the table to this file (a file, not a folder)"})

    def __post_init__(self) -> None:
        bad = [k for k in self.ks if k < 1]
        if bad:
            raise UsageError(f"--ks {','.join(map(str, self.ks))}: every k must be >= 1 (and <= each file's n)")


def eval_parser():
    """The `d3s eval` parser: the fields of `EvalConfig` and `EvalCommandArgs`."""
    return dataclass_parser(
        (EvalConfig, EvalCommandArgs),
        prog="d3s eval",
        description="Sample n completions per problem, score them with math-verify, and report "
        "unbiased pass@k and Avg@n per benchmark (paper sec. 4.1, Table 1). Resumable: rerun "
        "the same command to continue an interrupted evaluation.",
    )


def parse_eval_args(argv: Sequence[str]) -> tuple[EvalConfig, EvalCommandArgs]:
    """`(EvalConfig, EvalCommandArgs)` from `d3s eval`'s command line."""
    (config, command), _ = parse_dataclasses(eval_parser(), (EvalConfig, EvalCommandArgs), argv)
    return config, command


def cmd_eval(argv: Sequence[str]) -> int:
    """`d3s eval`: evaluate one model; prints the Table-1-style markdown."""
    config, command = parse_eval_args(argv)
    results = run_eval(config, progress=command.progress)
    print(render_report(results))
    print(f"results: {config.output_dir}/results.json, {config.output_dir}/results.md")
    return 0


def cmd_eval_table(argv: Sequence[str]) -> int:
    """`d3s eval-table`: render results files side by side (e.g. base vs GRPO vs D3S)."""
    (args,), _ = parse_command(
        (EvalTableArgs,), argv, prog="d3s eval-table",
        description="Render d3s eval results files (or their folders) as one markdown table laid out like the "
        "paper's Table 1, one row per file.",
    )
    output = Path(args.output).expanduser() if args.output else None
    if output is not None and (output.is_dir() or not output.parent.is_dir()):
        problem = "is a folder" if output.is_dir() else f"is in {str(output.parent)!r}, which is not a folder"
        raise UsageError(f"--output {args.output!r} {problem}; give a file path in an existing folder")
    results = [load_results(path) for path in args.results]
    table = render_table(results, labels=args.labels, ks=args.ks)
    print(table, end="")
    if output is not None:
        try:
            atomic_write_text(output, table)
        except RunFileError as err:
            raise UsageError(f"--output {args.output!r} cannot be written ({err.reason})") from None
    return 0


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
    except UsageError as e:  # RecipeError, BenchmarkError, ModelLoadError, RunFolderError
        print(f"d3s {name}: error: {e}", file=sys.stderr)
        return USAGE_EXIT
    except SystemExit as e:  # argparse: --help (0) or a bad option (2, message already printed)
        return e.code if isinstance(e.code, int) else USAGE_EXIT
    except KeyboardInterrupt as stop:
        what, code = ("terminated (SIGTERM)", 143) if isinstance(stop, Terminated) else ("interrupted", 130)
        print(f"d3s {name}: {what}; rerun the same command to resume", file=sys.stderr)
        return code


def run() -> NoReturn:
    """The `d3s` console script and `python -m d3s.cli`: `main`, then exit with its status. A Ctrl-C after the
    command has said how it ended is ignored: it would interrupt the interpreter's shutdown (torch's exit
    handlers) with a traceback."""
    code = None
    try:
        code = main()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:  # the Ctrl-C came as the command returned, before it could be ignored
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        code = 130 if code is None else code
    sys.exit(code)


if __name__ == "__main__":
    run()
