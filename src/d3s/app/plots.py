"""PNG plots of runs from their `metrics.jsonl` (the paper's figures 1-4 for a run of your own).

`plot_run`: one run, a grid of panels. `plot_compare`: several runs overlaid, one colour per variant,
one line style per seed. Every plot is written atomically (`_save`).
"""

from __future__ import annotations

import io
from pathlib import Path

from d3s.app.runfiles import atomic_write_bytes, read_run_records, with_computed_tokens

# (record key, panel title, x axis)
_PANELS = [
    ("reward", "reward (mean)", "step"),
    ("accuracy", "held-out accuracy", "step"),
    ("accuracy", "held-out accuracy", "wall_s"),
    ("accuracy", "held-out accuracy", "trained_tokens"),
    ("accuracy", "held-out accuracy", "computed_tokens"),
    ("d3s/token_consumption_ratio", "token consumption ratio", "step"),
    ("d3s/sample_usefulness_rate", "sample usefulness rate", "step"),
    ("grad_norm", "policy gradient norm", "step"),
    ("entropy", "policy entropy (all generated tokens)", "step"),
    ("kl", "KL to reference (beta = 0: to the initial policy)", "step"),
    ("d3s/advantage_variance", "advantage variance (kept)", "step"),
    ("d3s/n_keep", "N(p), K(p)", "step"),
]
_XLABEL = {"step": "step", "wall_s": "training wall-clock (min)", "trained_tokens": "tokens in the loss",
           "computed_tokens": "positions computed (training forward)"}



def _save(plt, fig, out: Path) -> None:
    """Write the figure to `out` atomically (`atomic_write_bytes`): a kill or a full disk leaves the old plot or
    none, never a truncated one beside finished tables; a write that fails is a `RunFileError` naming it."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(fig)
    atomic_write_bytes(out, buffer.getvalue())


def _series(records: list[dict], key: str, x: str) -> tuple[list[float], list[float]]:
    kind = "eval" if key == "accuracy" else "train"
    pts = [(r[x], r[key]) for r in records if r.get("type") == kind and key in r and r[key] is not None]
    xs = [p[0] / 60 if x == "wall_s" else p[0] for p in pts]
    return xs, [p[1] for p in pts]


def _figure(n_panels: int, cols: int = 4):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = (n_panels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    return plt, fig, axes.flatten()


def _draw(ax, runs: list[tuple[str, list[dict], dict]], key: str, title: str, x: str) -> None:
    drawn = False
    for label, records, style in runs:
        xs, ys = _series(records, key, x)
        if key == "d3s/n_keep":
            ks = _series(records, "d3s/k_fraction", x)[1]
            if xs:
                ax.plot(xs, ys, label=f"{label} N", **style)
                twin = ax.twinx() if not hasattr(ax, "_d3s_twin") else ax._d3s_twin
                ax._d3s_twin = twin
                twin.plot(xs, ks, alpha=0.6, **{**style, "linestyle": ":"})
                twin.set_ylabel("K (dotted)")
                drawn = True
            continue
        if xs:
            marker = "o" if key == "accuracy" else None
            ax.plot(xs, ys, label=label, marker=marker, markersize=3, **style)
            drawn = True
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(_XLABEL[x], fontsize=8)
    if x == "step":
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if not drawn:
        note = "not logged (kl_log_every = 0)" if key == "kl" else "not logged"
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, fontsize=8, color="gray")


def plot_run(metrics: Path, out: Path, title: str = "") -> Path:
    """A grid of the run's curves (reward, held-out accuracy vs step / wall-clock / tokens, ...)."""
    records = with_computed_tokens(read_run_records(metrics))
    plt, fig, axes = _figure(len(_PANELS))
    for ax, (key, panel_title, x) in zip(axes, _PANELS):
        _draw(ax, [(title or "run", records, {"color": "C0"})], key, panel_title, x)
    fig.suptitle(title)
    fig.tight_layout()
    _save(plt, fig, out)
    return out


def plot_compare(runs: dict[str, list[tuple[int, Path]]], out: Path, title: str = "") -> Path:
    """Overlaid curves: `runs` maps a variant to its `(seed, metrics.jsonl)` list."""
    styles = ["-", "--", "-.", ":"]
    entries = []
    for i, (variant, seeds) in enumerate(runs.items()):
        for j, (seed, path) in enumerate(seeds):
            entries.append((f"{variant} s{seed}", with_computed_tokens(read_run_records(path)),
                            {"color": f"C{i}", "linestyle": styles[j % len(styles)]}))
    plt, fig, axes = _figure(len(_PANELS))
    for ax, (key, panel_title, x) in zip(axes, _PANELS):
        _draw(ax, entries, key, panel_title, x)
    axes[1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    _save(plt, fig, out)
    return out


def curve_at(points: list[tuple[float, float]], share: float) -> float:
    """A budget curve `[(compute share, accuracy), ...]` (shares increasing) at `share`: linear between two
    evaluations, the first value before the first and the last after the last (a run ends where it ended)."""
    if share <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if share <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (share - x0) / (x1 - x0)
    return points[-1][1]


def plot_budget(summary: dict, out: Path, title: str = "", grid_points: int = 101) -> Path:
    """`d3s compare --budget`: held-out accuracy against the share of the same seed's reference compute, one thin
    line per run and the mean over seeds thick (each run's curve taken at the same shares, `curve_at`); and beside
    it each variant's difference to the same seed's reference run, in points."""
    reference = summary["reference"]
    grid = [i / (grid_points - 1) for i in range(grid_points)]
    curves = {v: {s: p["curve"] for s, p in r["budget"]["per_seed"].items() if p["curve"]}
              for v, r in summary["variants"].items()}
    plt, fig, (acc, diff) = _figure(2, cols=2)
    for i, (v, by_seed) in enumerate(curves.items()):
        if not by_seed:
            continue
        color = f"C{i}"
        for points in by_seed.values():
            acc.plot([x for x, _ in points], [y for _, y in points], color=color, alpha=0.25, linewidth=0.8)
        mean = [sum(curve_at(p, x) for p in by_seed.values()) / len(by_seed) for x in grid]
        acc.plot(grid, mean, color=color, linewidth=2, label=f"{v} (mean of {len(by_seed)})")
        if v == reference:
            continue
        paired = [s for s in by_seed if s in curves[reference]]
        rows = [[100 * (curve_at(by_seed[s], x) - curve_at(curves[reference][s], x)) for x in grid] for s in paired]
        for row in rows:
            diff.plot(grid, row, color=color, alpha=0.25, linewidth=0.8)
        if rows:
            diff.plot(grid, [sum(col) / len(col) for col in zip(*rows)], color=color, linewidth=2, label=v)
    diff.axhline(0, color="black", linewidth=0.8)
    acc.set_title("held-out accuracy", fontsize=10)
    diff.set_title(f"difference to {reference}, same seed (points)", fontsize=10)
    for ax in (acc, diff):
        ax.set_xlabel(f"compute spent (share of the same seed's {reference} run's FLOPs)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    _save(plt, fig, out)
    return out
