"""The `d3s` command: one subcommand per job, dispatched on the first argument.

    d3s eval --model PATH_OR_NAME --benchmarks gsm8k,math500 --n 32 --ks 1,8,16
    d3s eval-table base/results.json grpo/results.json d3s/results.json --labels base,grpo,d3s

`d3s eval`'s options are the fields of `EvalConfig`, spelled like `d3s train`'s (`--max_new_tokens`,
`--output_dir`); the former spellings (`--max-new-tokens`, `--output`, `--k`) still work, with a note.

Each subcommand owns its own argument parser (`COMMANDS` maps a name to `fn(argv) -> exit code`),
so a command with a different configuration style (a YAML recipe, dataclass fields) is added as
one more entry. Bad input ends with a one-line `d3s <command>: error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from d3s.app.evaluation.runner import EvalConfig

USAGE_EXIT = 2


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    return values


def _str_list(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    return values


def _number(kind: type, what: str) -> Callable[[str], Any]:
    """`kind(text)`, or an argparse error saying what a valid value is (`'x' is not an integer`)."""

    def convert(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None

    convert.__name__ = kind.__name__
    return convert


def _boolean(text: str) -> bool:
    """`true`/`false` (also yes/no, 1/0), the values `d3s train` takes for its switches."""
    from transformers.hf_argparser import string_to_bool

    try:
        return string_to_bool(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false") from None


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's docstring (the string right under the field), on one line; `{}` when the
    source is not available. Field docstrings are the help of options derived from dataclass fields."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


@dataclass
class EvalCommandArgs:
    """Options of `d3s eval` that are about the command, not the evaluation (`EvalConfig` holds those)."""

    progress: bool = True
    """Show a progress bar."""


# Option spellings of `d3s eval` that changed other than by `-` -> `_` (those are derived).
EVAL_RENAMED = {"--output": "--output_dir", "--k": "--ks"}
EVAL_TABLE_RENAMED = {"--k": "--ks"}


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


def eval_parser() -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """The `d3s eval` parser, derived from the fields of `EvalConfig` and `EvalCommandArgs` the way
    `d3s train` derives its own (`HfArgumentParser`: `--field value`, switches `--flag [true|false]`,
    `--no_flag` for those on by default), and the old option spellings mapped to the new ones.

    Types become converters that name what is valid, tuples are comma-separated lists, and each
    field's docstring is its help.
    """
    import dataclasses
    from typing import get_type_hints

    from d3s.app.evaluation.benchmarks import BENCHMARKS
    from d3s.app.evaluation.runner import EvalConfig

    try:
        from transformers import HfArgumentParser
    except ImportError as e:
        raise ImportError("d3s eval needs transformers: pip install 'd3s[eval]'") from e

    parser = HfArgumentParser(
        (EvalConfig, EvalCommandArgs),
        prog="d3s eval",
        description="Sample n completions per problem, score them with math-verify, and report "
        "unbiased pass@k and Avg@n per benchmark (paper sec. 4.1, Table 1). Resumable: rerun "
        "the same command to continue an interrupted evaluation.",
        formatter_class=argparse.HelpFormatter,
    )
    docs = {**field_docs(EvalConfig), **field_docs(EvalCommandArgs)}
    docs["benchmarks"] = f"{docs.get('benchmarks', '')} Valid names: {', '.join(BENCHMARKS)}.".strip()
    hints = {**get_type_hints(EvalConfig), **get_type_hints(EvalCommandArgs)}
    defaults = {f.name: f.default for cls in (EvalConfig, EvalCommandArgs) for f in dataclasses.fields(cls)}
    renamed = dict(EVAL_RENAMED)
    for action in parser._actions:
        # HfArgumentParser also accepts `--kebab-case`; here those are old spellings, rewritten with a note.
        for option in [o for o in action.option_strings if o.startswith("--") and "-" in o[2:]]:
            renamed[option] = "--" + option[2:].replace("-", "_")
            action.option_strings.remove(option)
            del parser._option_string_actions[option]
        name = action.dest
        if name not in hints or not action.option_strings:
            continue
        if isinstance(action, argparse._StoreFalseAction):  # --no_progress
            action.help = f"same as --{name} false"
            continue
        hint = hints[name]
        if getattr(hint, "__origin__", None) is tuple:
            action.type = _int_list if hint.__args__[0] is int else _str_list
        elif action.type is int:
            action.type = _number(int, "an integer")
        elif action.type is float:
            action.type = _number(float, "a number")
        elif action.const is True:  # a switch: --flag, --flag true, --flag false
            action.type = _boolean
            action.metavar = "true|false"
        help_ = docs.get(name, "").replace("`", "").replace("%", "%%")
        default = defaults.get(name)
        if action.required:
            help_ += " (required)"
        elif default is not None and default is not dataclasses.MISSING:
            help_ += f" (default: {_shown(default)})"
        action.help = help_
    return parser, renamed


def apply_renames(argv: Sequence[str], renamed: dict[str, str], prog: str) -> list[str]:
    """`argv` with old option spellings replaced by the new ones, one note on stderr per old spelling."""
    out, noted = [], set()
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + list(argv[i:])
        name, eq, value = arg.partition("=")
        new = renamed.get(name) if arg.startswith("--") else None
        if new is not None:
            if name not in noted:
                print(f"{prog}: note: {name} is now {new}", file=sys.stderr)
                noted.add(name)
            arg = new + eq + value
        out.append(arg)
    return out


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """argparse errors (a bad value, an unknown option) raise a `UsageError`: `d3s` prints one line."""
    from d3s.app.errors import UsageError

    def error(message: str):
        raise UsageError(message)

    parser.error = error


def parse_eval_args(argv: Sequence[str]) -> tuple[EvalConfig, EvalCommandArgs]:
    """`(EvalConfig, EvalCommandArgs)` from `d3s eval`'s command line; old spellings work with a note."""
    from d3s.app.evaluation.runner import EvalConfig

    parser, renamed = eval_parser()
    _one_line_errors(parser)
    values = vars(parser.parse_args(apply_renames(argv, renamed, parser.prog)))
    command = EvalCommandArgs(**{f.name: values.pop(f.name) for f in fields(EvalCommandArgs)})
    return EvalConfig(**values), command


def cmd_eval(argv: Sequence[str]) -> int:
    """`d3s eval`: evaluate one model; prints the Table-1-style markdown."""
    config, command = parse_eval_args(argv)
    from d3s.app.evaluation.report import render_report
    from d3s.app.evaluation.runner import run_eval

    results = run_eval(config, progress=command.progress)
    print(render_report(results))
    print(f"results: {config.output_dir}/results.json, {config.output_dir}/results.md")
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
    p.add_argument("--ks", type=_int_list, default=(1, 8),
                   help="pass@k values in each cell (default 1,8 as in Table 1)")
    p.add_argument("--output", help="also write the table to this file (a file, not a folder)")
    args = p.parse_args(apply_renames(argv, EVAL_TABLE_RENAMED, p.prog))
    from d3s.app.evaluation.report import load_results, render_table

    results = [load_results(path) for path in args.results]
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    table = render_table(results, labels=labels, ks=args.ks)
    print(table, end="")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(table)
    return 0


def cmd_train(argv: Sequence[str]) -> int:
    from d3s.app.train import cmd_train as run

    return run(argv)


def cmd_compare(argv: Sequence[str]) -> int:
    from d3s.app.compare import cmd_compare as run

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
    from d3s.app.errors import UsageError

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
    except KeyboardInterrupt:
        print(f"d3s {name}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
