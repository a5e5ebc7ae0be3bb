"""The command line of every `d3s` subcommand: its options are the fields of its dataclasses.

    --field value          one option per field, spelled as the field (snake_case); help: `metadata["help"]`
    --flag [true|false]    a bool field; bare `--flag` is true; `--no_flag` too for one that is on by default
    --ks 1,8,16            a tuple field: comma-separated values
    --backend vllm         a Literal field: its values are the choices

`d3s train` reads its fields (`RunArgs` and the ~200 TRL fields of `D3SConfig`) with transformers'
`HfArgumentParser`, which TRL's fields are declared for (`d3s.app.recipe`). `dataclass_parser` builds the
same options for the other subcommands with argparse alone, so that their `--help` loads no framework.
A value is checked as it is read: a bad one, or an unknown option, is a one-line `UsageError` naming the
option and what is valid. A field with `metadata={"operand": True}` is a positional argument
(`d3s eval-table FILE ...`).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
from typing import Any, Callable, Literal, Sequence, Union, get_args, get_origin, get_type_hints

from d3s.app.errors import UsageError


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


def boolean(text: str) -> bool:
    """`true`/`false` (also yes/no, t/f, y/n, 1/0), the values `d3s train` takes for its switches."""
    if text.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if text.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


def _without_none(hint: Any) -> Any:
    """`X` for `X | None`, else `hint`."""
    if get_origin(hint) in (Union, types.UnionType):
        rest = [a for a in get_args(hint) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint


def _converter(name: str, hint: Any) -> dict[str, Any]:
    """The `add_argument` settings that read a value of type `hint`."""
    if hint is bool:
        return {"type": boolean, "nargs": "?", "const": True, "metavar": "true|false"}
    if get_origin(hint) is tuple:
        return {"type": _int_list if get_args(hint)[0] is int else _str_list}
    if get_origin(hint) is Literal:
        return {"choices": get_args(hint)}
    if hint is int:
        return {"type": _number(int, "an integer")}
    if hint is float:
        return {"type": _number(float, "a number")}
    if hint is str:
        return {}
    raise TypeError(f"field {name!r}: no command-line form for {hint}")


def _add_field(parser: argparse.ArgumentParser, field: dataclasses.Field, hint: Any) -> None:
    hint = _without_none(hint)
    help_ = field.metadata.get("help", "").replace("`", "").replace("%", "%%")
    if field.metadata.get("operand"):
        parser.add_argument(field.name, nargs="+" if get_origin(hint) is tuple else None, help=help_)
        return
    kwargs = _converter(field.name, hint)
    if field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    else:
        default = dataclasses.MISSING
    if default is dataclasses.MISSING:
        kwargs["required"] = True
        help_ += " (required)"
    else:
        kwargs["default"] = default
        if default is not None:
            help_ += f" (default: {_shown(default)})"
    parser.add_argument(f"--{field.name}", help=help_.strip(), **kwargs)
    if hint is bool and default is True:
        parser.add_argument(f"--no_{field.name}", action="store_false", dest=field.name,
                            help=f"same as --{field.name} false")


def dataclass_parser(classes: Sequence[type], *, prog: str, description: str) -> argparse.ArgumentParser:
    """The parser whose options are the init fields of `classes`, in order (see the module docstring)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)

    def error(message: str):
        raise UsageError(message)

    parser.error = error
    for cls in classes:
        hints = get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if field.init:
                _add_field(parser, field, hints[field.name])
    return parser


def refuse_repeated(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """A `UsageError` when two options of `argv` set one field (`--n 2 --n 4`, `--no_plots --plots`), which argparse
    would resolve silently by keeping the last."""
    dests = {s: a.dest for a in parser._actions for s in a.option_strings if s.startswith("--")}
    seen: dict[str, str] = {}
    for arg in argv:
        if arg == "--":
            break
        option = arg.split("=", 1)[0]
        dest = dests.get(option)
        if dest is None:
            continue
        if dest in seen:
            if option == seen[dest]:
                raise UsageError(f"{option} is given twice on the command line; give it once")
            raise UsageError(f"{seen[dest]} and {option} both set {dest} on the command line; give one")
        seen[dest] = option


def parse_dataclasses(parser: argparse.ArgumentParser, classes: Sequence[type], argv: Sequence[str], *,
                      known_only: bool = False) -> tuple[tuple[Any, ...], list[str]]:
    """`(one instance per class, the arguments left over)` from `argv`; with `known_only`, arguments that are
    not options of `parser` are left over (for another parser), else they are an error."""
    refuse_repeated(parser, argv)
    if known_only:
        namespace, rest = parser.parse_known_args(list(argv))
    else:
        namespace, rest = parser.parse_args(list(argv)), []
    values = vars(namespace)
    out = []
    for cls in classes:
        kwargs = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.init}
        out.append(cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}))
    return tuple(out), rest


def parse_command(classes: Sequence[type], argv: Sequence[str], *, prog: str, description: str,
                  known_only: bool = False) -> tuple[tuple[Any, ...], list[str]]:
    """`parse_dataclasses` with the parser of `classes`: one instance per class, and what is left over."""
    parser = dataclass_parser(classes, prog=prog, description=description)
    return parse_dataclasses(parser, classes, argv, known_only=known_only)
