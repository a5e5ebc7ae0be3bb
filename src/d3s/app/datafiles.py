"""Reading the files the user hands to the `d3s` command: one text reader, one JSON parser, one reader of
question/answer files.

`read_text` is the one way a text file from the user is decoded: recipes (`d3s train --config`), datasets,
local benchmark copies, `d3s eval-table`'s results files. It takes UTF-8 (a leading byte-order mark is
dropped) and anything else is one `NotUtf8` error naming the file, the line and the byte.

`read_rows` reads the rows of a local data file (JSON, JSON lines, parquet): the datasets of
`d3s train --task math --dataset FILE` and the local benchmark copies of `d3s eval`. The evaluation
cache is read with `json_lines`. Errors say where (`NotUtf8`: the file, line and byte; `BadJsonLine`: the
line; `DataFileError`: what is wrong with the file); a caller raises its own error type with `NotUtf8`'s
message as it is, and names its file in the others. `yaml_loader` is the safe YAML loader of recipes; it refuses
a key set twice (`DuplicateKey`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

SUFFIXES = (".jsonl", ".json", ".parquet")
"""The kinds of file `read_rows` reads."""


class NotUtf8(ValueError):
    """Bytes of the file `path` that are not UTF-8 text, at `line` (1-based), `offset` (byte `byte`); `where` says
    so without the file's name."""

    def __init__(self, path: str | Path, line: int, offset: int, byte: int) -> None:
        self.path, self.line, self.offset, self.byte = Path(path), line, offset, byte
        hint = " (it looks like UTF-16)" if byte in (0xFE, 0xFF) and offset < 2 else ""
        self.where = f"line {line}: not UTF-8 text (byte {byte:#04x} at offset {offset}){hint}"
        super().__init__(f"{path} {self.where}; d3s reads text files as UTF-8: save it as UTF-8")


class BadJsonLine(ValueError):
    """Line `line` (1-based) is not JSON: `msg` at `column`."""

    def __init__(self, line: int, column: int, msg: str) -> None:
        self.line, self.column, self.msg = line, column, msg
        super().__init__(f"line {line} column {column}: not valid JSON ({msg})")


class DataFileError(ValueError):
    """A file that holds no rows `read_rows` can read: another kind of file, a broken parquet file, a JSON
    document of another shape. The message does not name the file; the caller does."""


_BOM = b"\xef\xbb\xbf"


def utf8_text(raw: bytes, path: str | Path) -> str:
    """`raw`, the bytes of the file `path`, decoded as UTF-8 without a leading byte-order mark (editors on
    Windows write one); `NotUtf8` names the file and the first bad byte's line and offset."""
    start = len(_BOM) if raw.startswith(_BOM) else 0
    try:
        return raw[start:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = start + err.start
        raise NotUtf8(path, raw[:at].count(b"\n") + 1, at, raw[at]) from None


def read_text(path: str | Path) -> str:
    """The text of a file the user handed in (`utf8_text`); OSError (missing, a folder) as `open` raises it."""
    return utf8_text(Path(path).read_bytes(), path)


class _KeyTwice(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs as a dict; a key set twice (which `json` resolves silently, keeping the last) raises."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        raise _KeyTwice(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def _twice(key: str) -> str:
    return f"key {key!r} is set twice in one object"


def json_lines(text: str) -> Iterator[tuple[int, Any]]:
    """`(line number, value)` of each non-blank line; `BadJsonLine` at the first line that is not JSON or sets a
    key twice in one object."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            raise BadJsonLine(number, err.colno, err.msg) from None
        except _KeyTwice as err:
            raise BadJsonLine(number, 1, _twice(err.key)) from None


def json_document(text: str) -> Any:
    """A whole-file JSON value; `BadJsonLine` names the line of the error, or of the start of an object that sets a
    key twice."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise BadJsonLine(err.lineno, err.colno, err.msg) from None
    except _KeyTwice as err:
        line, column = _object_start(text)
        raise BadJsonLine(line, column, _twice(err.key)) from None


def _object_start(text: str) -> tuple[int, int]:
    """`(line, column)` of the `{` of the first object that sets a key twice: `text` parsed again with the
    pure-Python scanner, whose object parser is given the position (the fast one is not)."""
    import json.decoder
    import json.scanner

    decoder = json.JSONDecoder()
    where: list[int] = []

    def parse_object(s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
        pairs, stop = json.decoder.JSONObject(s_and_end, strict, scan_once, None, list, memo)
        keys = [k for k, _ in pairs]
        if not where and len(set(keys)) != len(keys):
            where.append(s_and_end[1] - 1)
        return dict(pairs), stop

    decoder.parse_object = parse_object
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    decoder.decode(text)
    at = where[0] if where else 0
    return text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)


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
    `{column: [values]}`), or JSON lines. `.parquet`: its rows, read with pyarrow, a binary cell decoded as UTF-8
    (`cell_text`). Rows are returned as they are (a caller checks that each is a mapping with the fields it needs).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".json", ".jsonl"):
        text = read_text(path)
        if suffix == ".jsonl" or _is_json_lines(text):
            return list(json_lines(text))
        return [(0, row) for row in _document_rows(json_document(text))]
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError("reading parquet needs pyarrow: pip install pyarrow") from err
        try:
            with _stderr_held() as held:
                table = pq.read_table(path)
        except Exception as err:  # noqa: BLE001 - pyarrow raises many kinds for a broken file
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise DataFileError(f"not a readable parquet file ({first})") from None
        sys.stderr.write(held.text)  # a file that reads: what the library said is kept
        rows = table.to_pylist()
        for i, row in enumerate(rows):  # a binary column: its text, never `str(bytes)` ("b'What is...'")
            for key, value in row.items():
                if isinstance(value, (bytes, bytearray)):
                    row[key] = cell_text(value, f"row {i} column {key!r}")
        return [(0, row) for row in rows]
    raise DataFileError(f"unsupported file type {suffix!r}; use one of {', '.join(SUFFIXES)}")


def cell_text(value: bytes | bytearray, where: str) -> str:
    """A binary cell of a data file (a parquet `binary` column, a hub dataset's bytes) as UTF-8 text;
    `DataFileError` names `where` (its row and column) and the first byte that is not UTF-8."""
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataFileError(f"{where} holds bytes that are not UTF-8 text (byte {value[err.start]:#04x} at offset "
                            f"{err.start}); store the column as text (a string column)") from None


class _Held:
    text = ""


@contextlib.contextmanager
def _stderr_held() -> Iterator[_Held]:
    """What is written to the standard error (file descriptor 2, where pyarrow's C++ code logs) inside the
    block, held back in `.text`: a broken file then shows one error line, not a library's log line above it."""
    held = _Held()
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no standard error to hold back
        yield held
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield held
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            held.text = sink.read().decode("utf-8", errors="replace")


class DuplicateKey(ValueError):
    """A YAML mapping that sets `key` twice: on line `first` and again on line `line` (1-based)."""

    def __init__(self, key: Any, line: int, first: int) -> None:
        self.key, self.line, self.first = key, line, first
        super().__init__(f"line {line}: {key!r} is set twice (first on line {first}); keep one")


def yaml_loader():
    """PyYAML's safe loader (plain data only: no tag constructs an object) that refuses a mapping setting a key
    twice, which plain YAML loading resolves silently by keeping the last value."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: overriding it is the point
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        hash(key)
                    except TypeError:  # an unhashable key: the safe loader refuses it itself
                        continue
                    if key in seen:
                        raise DuplicateKey(key, line, seen[key])
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader
