"""Results files (JSON) and markdown tables laid out like the paper's Table 1.

A results file stores, per benchmark, the number of correct samples of every problem, so tables
can be re-rendered for any k <= n without re-running the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from d3s.app.datafiles import BadJsonLine, NotUtf8, json_document, read_text
from d3s.app.runfiles import atomic_write_text

from .aggregate import average_metrics, benchmark_metrics
from .benchmarks import BENCHMARKS, PAPER_BENCHMARKS, BenchmarkError

RESULTS_FORMAT = "d3s-eval/1"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (`atomic_write_text`: temp file, fsync, rename) so an interrupted run never leaves half a
    file; a full disk is one `RunFileError` line."""
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


EXPECTED = "eval-table reads the results.json that d3s eval writes (or the folder holding it)"


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a results file written by `d3s eval` (BenchmarkError when it is not one, saying what is expected)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise BenchmarkError(f"results file {path} does not exist; {EXPECTED}")
    try:
        data = json_document(read_text(path))
    except NotUtf8 as e:  # d3s eval writes UTF-8: this is another kind of file
        raise BenchmarkError(f"{path} is not a d3s eval results file ({e.where}); {EXPECTED}") from None
    except BadJsonLine as e:
        raise BenchmarkError(f"{path} is not a d3s eval results file (line {e.line}: not valid JSON, {e.msg}); "
                             f"{EXPECTED}") from None
    if not isinstance(data, dict) or data.get("format") != RESULTS_FORMAT:
        raise BenchmarkError(f"{path} is not a d3s eval results file (format {RESULTS_FORMAT}); {EXPECTED}")
    problem = results_problem(data)
    if problem:
        raise BenchmarkError(f"{path}: incomplete d3s eval results file ({problem}); rerun its d3s eval")
    return data


def results_problem(data: dict[str, Any]) -> str | None:
    """What is missing or inconsistent in a results dict (one phrase), or None."""
    benchmarks = data.get("benchmarks")
    if not isinstance(benchmarks, dict) or not benchmarks:
        return "no 'benchmarks'"
    if not isinstance(data.get("ks"), list) or not data["ks"]:
        return "no 'ks'"
    for name, bench in benchmarks.items():
        if not isinstance(bench, dict):
            return f"benchmark {name!r} is not a mapping"
        n, counts = bench.get("n"), bench.get("n_correct")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            return f"benchmark {name!r} has n={n!r}; expected an integer >= 1"
        if not isinstance(counts, list) or not counts:
            return f"benchmark {name!r} has no 'n_correct' counts"
        if bench.get("num_problems", len(counts)) != len(counts):
            return f"benchmark {name!r} has {len(counts)} counts for {bench.get('num_problems')} problems"
        bad = [c for c in counts if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c <= n]
        if bad:
            return f"benchmark {name!r} has correct counts {bad[:3]} outside 0..n={n}"
    return None


def _ordered(names: Sequence[str]) -> list[str]:
    """Paper column order first, then any others in registry order."""
    order = list(PAPER_BENCHMARKS) + [b for b in BENCHMARKS if b not in PAPER_BENCHMARKS]
    return sorted(set(names), key=lambda b: order.index(b) if b in order else len(order))


def _title(name: str) -> str:
    return BENCHMARKS[name].title if name in BENCHMARKS else name


def metrics_for(result: dict[str, Any], ks: Sequence[int]) -> dict[str, dict[str, float]]:
    """Per-benchmark metrics for these k, recomputed from the stored correct counts."""
    out = {}
    for name, bench in result["benchmarks"].items():
        n = bench["n"]
        bad = [k for k in ks if k > n]
        if bad:
            raise BenchmarkError(
                f"k={bad} > n={n} for {name} in {result.get('label', '?')}; valid k: 1..{n}"
            )
        out[name] = benchmark_metrics(bench["n_correct"], n, ks)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def render_table(
    results: Sequence[dict[str, Any]],
    labels: Sequence[str] | None = None,
    ks: Sequence[int] = (1, 8),
) -> str:
    """Markdown table like Table 1: one row per results file, cells `pass@k1/pass@k2/...` in %.

    The Average column is the unweighted mean over the benchmarks a row has.
    """
    if labels is not None and len(labels) != len(results):
        raise BenchmarkError(f"{len(labels)} labels for {len(results)} results files")
    labels = labels or [r.get("label") or r.get("model", "?") for r in results]
    columns = _ordered([b for r in results for b in r["benchmarks"]])
    metric_names = [f"pass@{k}" for k in ks]
    head = ["Model"] + [_title(b) for b in columns] + ["Average"]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + [":---:"] * (len(head) - 1)) + "|",
    ]
    incomplete = False
    for label, result in zip(labels, results):
        per = metrics_for(result, ks)
        avg = average_metrics(per)
        cells = [label]
        for b in columns:
            if b in per:
                cells.append("/".join(_pct(per[b][m]) for m in metric_names))
            else:
                cells.append("-")
                incomplete = True
        cells.append("/".join(_pct(avg.get(m)) for m in metric_names))
        lines.append("| " + " | ".join(cells) + " |")
    caption = "/".join(f"Pass@{k}" for k in ks) + " (%)"
    ns = sorted({b["n"] for r in results for b in r["benchmarks"].values()})
    caption += f", from n={'/'.join(map(str, ns))} samples per problem."
    if incomplete:
        caption += " '-': not evaluated; Average is over the benchmarks each row has."
    return caption + "\n\n" + "\n".join(lines) + "\n"


def render_details(result: dict[str, Any]) -> str:
    """Markdown table of every metric of one results file, one row per benchmark."""
    ks = result["ks"]
    per = metrics_for(result, ks)
    names = _ordered(list(per))
    n_values = {result["benchmarks"][b]["n"] for b in names}
    avg_name = f"avg@{next(iter(n_values))}" if len(n_values) == 1 else None
    metric_names = [f"pass@{k}" for k in ks] + ([avg_name] if avg_name else [])
    head = ["Benchmark", "Problems", "n"] + [m.replace("avg", "Avg").replace("pass", "Pass")
                                            for m in metric_names] + ["Verify failures"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for b in names:
        bench = result["benchmarks"][b]
        lines.append(
            "| "
            + " | ".join(
                [_title(b), str(len(bench["n_correct"])), str(bench["n"])]
                + [_pct(per[b].get(m)) for m in metric_names]
                + [str(bench["verify_failures"])]
            )
            + " |"
        )
    avg = average_metrics(per)
    lines.append(
        "| " + " | ".join(["Average", "", ""] + [_pct(avg.get(m)) for m in metric_names] + [""])
        + " |"
    )
    return "\n".join(lines) + "\n"


def render_report(result: dict[str, Any]) -> str:
    """The `results.md` of one run: settings, the Table-1 row and the full metrics."""
    s = result["settings"]
    table_ks = [k for k in (1, 8) if k in result["ks"]] or result["ks"][:2]
    return (
        f"# d3s eval: {result['label']}\n\n"
        f"Model `{result['model']}`; n={s['n']}, temperature={s['temperature']}, "
        f"top_p={s['top_p']}, max_new_tokens={s['max_new_tokens']}, seed={s['seed']}.\n\n"
        + render_table([result], ks=table_ks)
        + "\n"
        + render_details(result)
    )
