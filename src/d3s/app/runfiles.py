"""The files a run writes, written so that nothing saved is lost, and read back one way, so that a damaged
one is never used.

- `run_config.json` (the run's settings, recipe, code version, machine and its load at the start), `summary.json`
  (written last: the run is finished) and `metrics.jsonl` (one record per step and kind). A file that exists and cannot be used
  is *damaged*, whatever the reason: unreadable, not UTF-8, not JSON, or without the fields its readers need
  (`{}` is as damaged as `{broken`). `read_run_config` and `read_summary` say why in one short phrase, and
  every reader of these files goes through them; `read_run_records` keeps one record per step and kind.
- Writes: `atomic_write_text` and `atomic_write_bytes` replace a file (a reader or a kill sees the old file or
  the new one, never a part), `append_line` appends a record (`RunLog`, `d3s eval`'s `samples.jsonl`). A write
  that fails (a full disk, a read-only folder) raises `RunFileError` naming the file and why, in one line; what
  was written before stays as it was. `write_failure` is the one test of "a full disk" for every writer, however
  the library that wrote says it (an `OSError`, torch's `RuntimeError`, safetensors' `SafetensorError`), and
  `writing(path)` turns one into that line.

What the records say of a run (seconds per step, steps without signal, the token cut, `summary.json`'s content)
is `d3s.app.records`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator

from d3s.app.errors import RunFolderError


class RunFileError(RunFolderError):
    """An output file that cannot be written (a full disk, a read-only folder), however the library that wrote it
    said so (`write_failure`); the message names it and why, in one line. `hint` replaces the default ending."""

    def __init__(self, path: Path, err: BaseException | str, hint: str = "what was saved before is intact"):
        reason = err if isinstance(err, str) else write_failure(err) or getattr(err, "strerror", None)
        self.path, self.reason = Path(path), reason or type(err).__name__
        super().__init__(f"{path} cannot be written ({self.reason}); {hint}")


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO}

_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\]|os error (\d+)\)|code: (\d+)")
"""An errno inside a library's message: Python's `[Errno 28]`, Rust's `(os error 28)` (safetensors) and `code: 28`."""

_TORCH_WRITE_FAILED = ("unexpected pos", "PytorchStreamWriter failed", "file write failed")
"""What torch's archive writer (`torch.save`: `inline_container.cc`) says when the file system stops taking bytes."""

_WRITE_PHRASES = ("No space left on device", "Disk quota exceeded", "Read-only file system", "File too large")


def write_failure(err: BaseException) -> str | None:
    """Why a file could not be written, if that is what `err` (or what caused it) says, else None: the one test of
    "a full disk or a folder that cannot be written" for every writer of a run, compare or eval output.

    Recognised: an `OSError` of a full disk, a quota, a read-only or unwritable folder, a file too large, an I/O
    error (`_WRITE_ERRNOS`); torch's `RuntimeError` of a failed archive write (`unexpected pos ...`,
    `PytorchStreamWriter failed ...`: "file write failed", torch does not say why); safetensors'
    `SafetensorError` (`... No space left on device (os error 28)`) and any other library error that carries
    such an errno or phrase."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno is not None:
            if err.errno in _WRITE_ERRNOS:
                return err.strerror or os.strerror(err.errno)
        elif isinstance(err, (OSError, RuntimeError)) or type(err).__name__ == "SafetensorError":
            text = str(err)
            if any(phrase in text for phrase in _TORCH_WRITE_FAILED):
                return "file write failed"
            found = _ERRNO_IN_TEXT.search(text)
            code = int(next(g for g in found.groups() if g)) if found else None
            if code in _WRITE_ERRNOS:
                return os.strerror(code)
            phrase = next((p for p in _WRITE_PHRASES if p in text), None)
            if phrase:
                return phrase
        err = err.__cause__ or err.__context__
    return None


@contextlib.contextmanager
def writing(path: Path, hint: str = "what was saved before is intact") -> Iterator[None]:
    """Inside, an `OSError` or an error that `write_failure` recognises (a full disk, however the library says it)
    is a `RunFileError` naming `path`; any other error passes unchanged."""
    try:
        yield
    except RunFileError:
        raise
    except Exception as err:
        if not isinstance(err, OSError) and write_failure(err) is None:
            raise
        raise RunFileError(path, err, hint) from None


def _write(path: Path, text: str | bytes, mode: str) -> None:
    """Write (`mode` "w", "wb") or append ("a") `text` to `path`: every run, compare and eval file is written here.
    A replaced file is on the disk before it returns (it is renamed into place next)."""
    with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        f.write(text)
        if mode != "a":
            f.flush()
            os.fsync(f.fileno())


def append_line(path: Path, line: str, *, sync: bool = False) -> None:
    """Append `line` to `path` (a record of `metrics.jsonl`, a problem of `samples.jsonl`); with `sync`, on the disk
    before it returns. A write that fails raises `RunFileError`; a part of the line may be left at the end of the
    file, which its readers drop (a cut-off last line)."""
    with writing(path):
        _write(path, line, "a")
        if sync:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename in the folder `path` durable (where the platform can open a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms that cannot open a folder
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """`atomic_write_text` for bytes (a plot)."""
    _atomic_write(Path(path), data, "wb")


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` by `text` so that a reader (or a kill) sees the old file or the new one, never a part.

    The text goes to a temporary file beside it, which is renamed over `path` once written in full; a
    write that fails (`RunFileError`) or is interrupted removes the temporary file and leaves `path` as it was."""
    _atomic_write(Path(path), text, "w")


def _atomic_write(path: Path, data: str | bytes, mode: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        _write(tmp, data, mode)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) or isinstance(err, Exception) and write_failure(err):
            raise RunFileError(path, err) from None
        raise
    fsync_dir(path.parent)


# ---------------------------------------------------------------------------------------------
# run_config.json and summary.json
# ---------------------------------------------------------------------------------------------

RUN_CONFIG_SECTIONS = ("run", "trainer")
"""What a `run_config.json` must hold to be a d3s run's: the run's and the trainer's settings (objects)."""

SUMMARY_FIELDS = ("steps", "before", "after", "train_wall_s", "trained_tokens")
"""What a `summary.json` must hold for its readers (`d3s train --resume`, `d3s compare`)."""

RESULT_FIELDS = ("accuracy", "correct", "n")
"""What the held-out result of a finished run (its summary's `after`) must hold."""


def _read_json_object(path: Path) -> tuple[Any, str | None]:
    """`(value, None)` of a JSON file, `(None, None)` when it does not exist, `(None, why)` when it cannot be
    read or parsed."""
    if not path.is_file():
        return None, None
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except ValueError as err:
        return None, f"not valid JSON: {err}"
    except OSError as err:
        return None, f"cannot be read: {err.strerror}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_summary(out: Path) -> tuple[dict | None, str | None]:
    """`(summary, problem)` of a run's `summary.json`, which marks it finished: the summary when it is a valid
    one, else None and, when the file exists, why it is damaged (one short phrase): not JSON, not an object,
    or without the fields of `SUMMARY_FIELDS` (a step count >= 1, the held-out results, numbers)."""
    summary, problem = _read_json_object(Path(out) / "summary.json")
    if problem is not None or summary is None:
        return None, problem
    if not isinstance(summary, dict):
        return None, f"not a run summary: a JSON {type(summary).__name__}"
    missing = [k for k in SUMMARY_FIELDS if k not in summary]
    if missing:
        return None, f"not a run summary: it lacks {', '.join(missing)}"
    steps = summary["steps"]
    if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1):
        return None, f"not a run summary: its steps is {steps!r}, not a step count >= 1"
    after, problem = summary["after"], None
    if not (isinstance(after, dict) and all(_is_number(after.get(k)) for k in RESULT_FIELDS)):
        problem = f"its after is not a held-out result (numbers {', '.join(RESULT_FIELDS)})"
    elif not isinstance(summary["before"], dict):
        problem = "its before is not an object"
    elif not all(_is_number(summary[k]) for k in ("train_wall_s", "trained_tokens")):
        problem = "its train_wall_s and trained_tokens are not both numbers"
    return (None, f"not a run summary: {problem}") if problem else (summary, None)


def finished_summary(out: Path) -> dict:
    """The summary of a run that `d3s compare` has finished or reused: valid, else a `RunFolderError` naming the
    file and why (it was changed since)."""
    summary, damaged = read_summary(out)
    if summary is None:
        raise RunFolderError(f"{Path(out) / 'summary.json'} is {f'damaged ({damaged})' if damaged else 'missing'}; "
                             "rerun the same d3s compare command to finish that run")
    return summary


def read_run_config(out: Path) -> tuple[dict | None, str | None]:
    """`(run_config, problem)` of a run's `run_config.json`: its content when it is a d3s run's (a JSON object
    with the sections of `RUN_CONFIG_SECTIONS`, each an object), else None and, when the file exists, why it
    is damaged (one short phrase)."""
    saved, problem = _read_json_object(Path(out) / "run_config.json")
    if problem is not None or saved is None:
        return None, problem
    if not isinstance(saved, dict):
        return None, f"not a run config: a JSON {type(saved).__name__}"
    missing = [k for k in RUN_CONFIG_SECTIONS if not isinstance(saved.get(k), dict)]
    if missing:
        return None, f"not a run config: it lacks the {' and '.join(missing)} settings"
    return saved, None


# ---------------------------------------------------------------------------------------------
# metrics.jsonl
# ---------------------------------------------------------------------------------------------


RECORD_FIELDS = ("type", "step", "wall_s", "trained_tokens", "generated_tokens", "computed_tokens", "flops")
"""The fields every record of `metrics.jsonl` starts with (`flops` since it was counted); an `eval` record adds the
evaluation's result."""


def eval_result(record: dict) -> dict:
    """The held-out result an `eval` record holds (accuracy, counts, interval), without the record's fields."""
    return {k: v for k, v in record.items() if k not in RECORD_FIELDS}


def read_run_records(path: Path, *, warn: Callable[[str], None] | None = None) -> list[dict]:
    """The records of a `metrics.jsonl`, one per step and kind. A cut-off LAST line (a kill during its write)
    is dropped, with a note through `warn(message)`; any other line that is not a record is an error naming
    file and line. A step recorded twice (per kind) keeps its last record, the one written last, in the place of
    its first, with a note."""
    path = Path(path)
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    except OSError as err:
        raise RunFolderError(f"{path} cannot be read ({err.strerror})") from None
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not (isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec.get("type") in ("train", "eval")):
            if not any(rest.strip() for rest in lines[i:]):
                if warn is not None:
                    warn(f"{path} line {i} is cut off (a write was interrupted); that record is dropped")
                break
            raise RunFolderError(f"{path} line {i} is not a d3s record (JSON with 'type' and 'step'); "
                                 "remove or repair that line")
        records.append(rec)
    kept: dict[tuple[str, int], dict] = {}  # in the order first recorded, each the last record written
    for rec in records:
        kept[rec["type"], rec["step"]] = rec
    if len(kept) < len(records):
        if warn is not None:
            twice = sorted({key for key in kept if sum((r["type"], r["step"]) == key for r in records) > 1},
                           key=lambda key: (key[1], key[0] == "eval"))
            shown = ", ".join(f"{kind} step {step}" for kind, step in twice)
            warn(f"{path} records {shown} more than once; the last record of each is kept")
        records = list(kept.values())
    return records


class RunLog:
    """Appends one JSON object per line to `metrics.jsonl`; on resume keeps the records up to the
    checkpoint (`read_run_records`: one per step and kind; a cut-off last line is dropped, with a note through
    `warn`) and rewrites the file atomically. In a multi-process run every process keeps the records in memory
    and only the main one (`writer`) writes the file."""

    def __init__(self, path: Path, resume_step: int | None, writer: bool = True,
                 warn: Callable[[str], None] | None = None):
        self.path, self.writer = Path(path), writer
        self.records: list[dict] = []
        if resume_step is not None and self.path.is_file():
            self.records = [r for r in read_run_records(self.path, warn=warn) if r["step"] <= resume_step]
        if writer:
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.records))

    def add(self, record: dict) -> None:
        """Append `record`; a failed write raises `RunFileError` and leaves the record out of memory too."""
        if self.writer:
            append_line(self.path, json.dumps(record) + "\n")
        self.records.append(record)

    def drop(self, kind: str, step: int) -> None:
        """Remove the records of `kind` at `step` (an evaluation about to run again) and rewrite the file."""
        kept = [r for r in self.records if not (r["type"] == kind and r["step"] == step)]
        if len(kept) != len(self.records):
            if self.writer:
                atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
            self.records = kept

    def last(self, kind: str) -> dict | None:
        return next((r for r in reversed(self.records) if r["type"] == kind), None)


def with_computed_tokens(records: list[dict]) -> list[dict]:
    """Records with the cumulative `computed_tokens` (training-forward positions so far). Runs recorded
    before `d3s train` wrote it get it summed here from each step's `d3s/tokens_computed`."""
    if all("computed_tokens" in r for r in records):
        return records
    total, out = 0.0, []
    for r in records:
        if r.get("type") == "train":
            total += r.get("d3s/tokens_computed") or 0.0
        out.append({**r, "computed_tokens": total})
    return out
