"""Reading the data files of the `d3s` command: one JSON parser, one reader of question/answer files.

`read_rows` reads the rows of a local data file (JSON, JSON lines, parquet): the datasets of
`d3s train --task math --dataset FILE` and the local benchmark copies of `d3s eval`. The evaluation
cache is read with `json_lines`. Errors say where (`NotUtf8`, `BadJsonLine`: the line; `DataFileError`:
what is wrong with the file); each caller turns them into its own one-line message, which names its
file and option.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

SUFFIXES = (".jsonl", ".json", ".parquet")
"""The kinds of file `read_rows` reads."""


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


class DataFileError(ValueError):
    """A file that holds no rows `read_rows` can read: another kind of file, a broken parquet file, a JSON
    document of another shape. The message does not name the file; the caller does."""


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


def _is_json_lines(text: str) -> bool:
    """Several non-blank lines, the first one a JSON value by itself (a JSON document spread over lines
    starts with a line that is not)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        return False
    try:
        json.loads(lines[0])
    except json.JSONDecodeError:
        return False
    return True


def _document_rows(data: Any) -> list[Any]:
    """The rows of a JSON document: a list of rows, `{key: [rows]}` or `{column: [values]}`."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1 and all(isinstance(r, dict) for r in lists[0]):
            return lists[0]  # {"data": [rows]}
        if lists and len(lists) == len(data) and len({len(v) for v in lists}) == 1:
            return [dict(zip(data, values)) for values in zip(*data.values())]  # columns
    raise DataFileError("expected a list of records, {key: [records]} or {column: [values]}")


def read_rows(path: Path) -> list[tuple[int, Any]]:
    """`(line, row)` of each row of a data file, in file order; `line` is the 1-based line of a row of JSON
    lines, 0 for a row of a JSON document or a parquet file.

    `.jsonl`: JSON lines. `.json`: one JSON document (a list of rows, `{key: [rows]}` or
    `{column: [values]}`), or JSON lines. `.parquet`: its rows, read with pyarrow. Rows are returned as
    they are (a caller checks that each is a mapping with the fields it needs).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".json", ".jsonl"):
        text = utf8_text(path.read_bytes())
        if suffix == ".jsonl" or _is_json_lines(text):
            return list(json_lines(text))
        return [(0, row) for row in _document_rows(json_document(text))]
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError("reading parquet needs pyarrow: pip install pyarrow") from err
        try:
            return [(0, row) for row in pq.read_table(path).to_pylist()]
        except Exception as err:  # noqa: BLE001 - pyarrow raises many kinds for a broken file
            raise DataFileError(f"not a readable parquet file ({type(err).__name__})") from None
    raise DataFileError(f"unsupported file type {suffix!r}; use one of {', '.join(SUFFIXES)}")
