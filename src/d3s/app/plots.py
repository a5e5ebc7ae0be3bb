"""PNG plots of runs from their `metrics.jsonl` (the paper's figures 1-4 for a run of your own).

`plot_run`: one run, a grid of panels. `plot_compare`: several runs overlaid, one colour per variant,
one line style per seed.
"""

from __future__ import annotations

from pathlib import Path

from d3s.app.runfiles import read_run_records, with_computed_tokens

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



def _series(records: list[dict], key: str, x: str) -> tuple[list[float], list[float]]:
    kind = "eval" if key == "accuracy" else "train"
    pts = [(r[x], r[key]) for r in records if r.get("type") == kind and key in r and r[key] is not None]
    xs = [p[0] / 60 if x == "wall_s" else p[0] for p in pts]
    return xs, [p[1] for p in pts]


def _figure(n_panels: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
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
    fig.savefig(out, dpi=110)
    plt.close(fig)
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
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
