"""Whether two runs of one seed are paired in fact, read from their files.

A paired difference removes what the two runs of a seed share; it helps only where they share something. Two
things are checked:

- **The prompts.** Every train record of `metrics.jsonl` lists the step's distinct prompts (`prompt_hashes`, in
  order). A run's prompt stream is those lists one after another (a list repeated by the next record, as when a
  generation batch serves several steps, counted once). Two runs saw the same prompts when their streams agree over
  the length both reached: an arm that ran longer saw a longer prefix of the same stream (docs/compare.md).
- **The outcome.** The Pearson correlation over seeds of the two arms' accuracies: near zero, a paired interval is
  no narrower than an unpaired one.
"""

from __future__ import annotations

import statistics
from typing import Sequence


def prompt_stream(records: list[dict]) -> list[str] | None:
    """The run's prompts in the order it trained on them; None when a train record does not list its prompts (a run
    made before records did)."""
    stream: list[str] = []
    previous = None
    for record in records:
        if record.get("type") != "train":
            continue
        hashes = record.get("prompt_hashes")
        if hashes is None:
            return None
        if hashes != previous:
            stream += hashes
        previous = hashes
    return stream


def same_prompts(a: list[str] | None, b: list[str] | None) -> bool | None:
    """Whether two prompt streams agree over the length both reached; None when either is unknown or empty."""
    if not a or not b:
        return None
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's r of paired values; None with fewer than three pairs or where one side does not vary."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    try:
        return statistics.correlation(list(xs), list(ys))
    except statistics.StatisticsError:  # a side that does not vary
        return None
