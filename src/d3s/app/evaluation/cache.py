"""The resume cache of `d3s eval`: `OUTPUT/samples.jsonl`, one line per finished problem after a header line
with the settings that change completions or scores (`d3s.app.evaluation.runner`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from d3s.app.datafiles import BadJsonLine, json_lines
from d3s.app.errors import UsageError
from d3s.app.runfiles import append_line, writing

from .benchmarks import Problem

CACHE_NAME = "samples.jsonl"


class SampleCache:
    """Append-only JSONL of finished problems, keyed by (benchmark, problem_id)."""

    def __init__(self, path: Path, fingerprint: dict[str, Any], overwrite: bool) -> None:
        self.path = path
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        if overwrite and path.exists():
            with writing(path):
                path.unlink()
        if path.exists():
            self._load(fingerprint)
        else:
            self._append({"type": "header", "fingerprint": fingerprint})

    def _load(self, fingerprint: dict[str, Any]) -> None:
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):  # the last line was cut off by an interrupt
            keep = raw.rfind(b"\n") + 1
            print(f"d3s eval: dropping an incomplete last line of {self.path}", file=sys.stderr)
            with writing(self.path), self.path.open("r+b") as f:
                f.truncate(keep)
            raw = raw[:keep]
        try:
            parsed = [record for _, record in json_lines(raw.decode("utf-8"))]
        except BadJsonLine as e:
            raise UsageError(f"{self.path}:{e.line}: corrupt cache line ({e.msg}); use --overwrite") from e
        if not parsed or parsed[0].get("type") != "header":
            raise UsageError(f"{self.path} is not a d3s eval cache; use --overwrite")
        old = parsed[0]["fingerprint"]
        diff = [f"{k}: cached {old.get(k)!r} != now {v!r}" for k, v in fingerprint.items()
                if old.get(k) != v]
        if diff:
            raise UsageError(
                f"{self.path} was written with other settings ({'; '.join(diff)}); "
                "pass --overwrite to discard it or choose another --output_dir"
            )
        for rec in parsed[1:]:
            self.records[(rec["benchmark"], rec["problem_id"])] = rec

    def _append(self, record: dict[str, Any]) -> None:
        """One line, on the disk before it returns; a full disk is one `RunFileError` line (a part of the line
        left at the end is dropped by the next run)."""
        append_line(self.path, json.dumps(record) + "\n", sync=True)

    def get(self, problem: Problem) -> dict[str, Any] | None:
        rec = self.records.get((problem.benchmark, problem.problem_id))
        if rec is not None and rec["digest"] != problem.digest:
            raise UsageError(
                f"{self.path}: cached {problem.benchmark} problem {problem.problem_id} differs "
                "from the dataset now loaded (another dataset version?); use --overwrite"
            )
        return rec

    def put(self, record: dict[str, Any]) -> None:
        self._append(record)
        self.records[(record["benchmark"], record["problem_id"])] = record
