"""Reading the JSON and JSON-lines files of the `d3s` command: one parser, errors that say where.

Datasets (`d3s train --dataset`), benchmark files (`d3s eval`), the evaluation cache and a run's
`metrics.jsonl` are read here. Each caller turns `NotUtf8` / `BadJsonLine` into its own one-line
message (which names its file and option).
"""

from __future__ import annotations

import json
from typing import Any, Iterator


class NotUtf8(ValueError):
    """Bytes that are not UTF-8 text, at `line` (1-based), `offset` (byte `byte`)."""

    def __init__(self, line: int, offset: int, byte: int) -> None:
        self.line, self.offset, self.byte = line, offset, byte
        super().__init__(f"line {line}: not UTF-8 text (byte {byte:#04x} at offset {offset}); save the file as UTF-8")


class BadJsonLine(ValueError):
    """Line `line` (1-based) is not JSON: `msg` at `column`."""

    def __init__(self, line: int, column: int, msg: str) -> None:
        self.line, self.column, self.msg = line, column, msg
        super().__init__(f"line {line} column {column}: not valid JSON ({msg})")


def utf8_text(raw: bytes) -> str:
    """`raw` decoded as UTF-8; `NotUtf8` names the first bad byte's line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise NotUtf8(raw[: err.start].count(b"\n") + 1, err.start, raw[err.start]) from None


def json_lines(text: str) -> Iterator[tuple[int, Any]]:
    """`(line number, value)` of each non-blank line; `BadJsonLine` at the first line that is not JSON."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise BadJsonLine(number, err.colno, err.msg) from None


def json_document(text: str) -> Any:
    """A whole-file JSON value; `BadJsonLine` names the line of the error."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BadJsonLine(err.lineno, err.colno, err.msg) from None
