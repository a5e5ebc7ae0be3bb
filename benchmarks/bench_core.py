"""Speed of the core selection maths, measured side by side with its floors and the naive method.

    python benchmarks/bench_core.py                # full table, ~5 min on 2 CPU cores
    python benchmarks/bench_core.py --quick        # sizes up to 10^5 only

For each size it times, on the same input and in the same process:
- `max_variance_subset(x, m // 4)` (N = 8 of G = 32) against one `torch.sort(x)` — the floor of any
  sort-based exact method — and against the naive method of the PODS reference code: sort, then for
  each of the n + 1 splits build the subset and call `.var()` (skipped where it would take minutes);
- `select_rollouts` in `intra` (B groups of 32, N = 8 per group) and `cross` (N * B over the batch);
- `token_mask` at K = 5% on up to 64M tokens against one `torch.topk` and one `torch.kthvalue`.

Medians of repeated runs are reported; ratios are of medians measured in this one run. Results go
to stdout (a table) and to `benchmarks/results/core.json`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import d3s

RESULTS = Path(__file__).parent / "results"


def paired(*fns, min_time: float = 0.5, max_reps: int = 50) -> list[float]:
    """Median seconds per call of each function, called round-robin so that they share the noise
    of a busy machine; at least 3 rounds, more while under `min_time` in total."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < 3 or (time.perf_counter() - start < min_time and len(times[0]) < max_reps):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def naive_pods_subset(x: torch.Tensor, n: int) -> torch.Tensor:
    """The PODS reference-code approach: one `.var()` per candidate split, in a Python loop."""
    xs, order = torch.sort(x)
    m = x.numel()
    best, best_k = -1.0, 0
    for k in range(n + 1):
        v = torch.cat([xs[: n - k], xs[m - k :]]).var().item()
        if v > best:
            best, best_k = v, k
    return torch.sort(torch.cat([order[: n - best_k], order[m - best_k :]])).values


def bench_subset(sizes: list[int], naive_limit: int) -> list[dict]:
    rows = []
    for m in sizes:
        g = torch.Generator().manual_seed(m)
        x = torch.randn(m, generator=g)
        n = max(1, m // 4)
        ours, sort = paired(lambda: d3s.max_variance_subset(x, n), lambda: torch.sort(x))
        naive = paired(lambda: naive_pods_subset(x, n), min_time=0.0)[0] if m <= naive_limit else None
        if naive is not None:  # same answer (variance), the naive loop as an independent check
            a, b = d3s.max_variance_subset(x, n), naive_pods_subset(x, n)
            assert abs(x[a].var().item() - x[b].var().item()) <= 1e-5 * x[b].var().item()
        rows.append({"m": m, "n": n, "ours_s": ours, "sort_s": sort, "naive_s": naive,
                     "ours_over_sort": ours / sort, "naive_over_ours": None if naive is None else naive / ours})
        print(f"max_variance_subset  m={m:>10,}  n={n:>9,}  ours {ours*1e3:9.3f} ms  sort {sort*1e3:9.3f} ms  "
              f"ours/sort {ours/sort:5.2f}x  "
              + (f"naive {naive*1e3:10.1f} ms  naive/ours {naive/ours:8.1f}x" if naive else "naive  (skipped)"),
              flush=True)
    return rows


def bench_select(batches: list[int], G: int = 32, N: int = 8) -> list[dict]:
    rows = []
    for B in batches:
        g = torch.Generator().manual_seed(B)
        rewards = torch.randint(0, 2, (B * G,), generator=g).float()  # binary verifier rewards
        adv = d3s.group_advantages(rewards, G)
        t_adv, t_intra, t_cross, t_sort = paired(
            lambda: d3s.group_advantages(rewards, G),
            lambda: d3s.select_rollouts(adv, rewards, G, N, "intra"),
            lambda: d3s.select_rollouts(adv, rewards, G, N, "cross"),
            lambda: torch.sort(adv),
        )
        rows.append({"B": B, "G": G, "N": N, "m": B * G, "advantages_s": t_adv, "intra_s": t_intra,
                     "cross_s": t_cross, "sort_s": t_sort, "cross_over_sort": t_cross / t_sort,
                     "intra_over_sort": t_intra / t_sort})
        print(f"select_rollouts      B*G={B*G:>10,}  advantages {t_adv*1e3:8.3f} ms  intra {t_intra*1e3:8.3f} ms  "
              f"cross {t_cross*1e3:8.3f} ms  sort {t_sort*1e3:8.3f} ms  cross/sort {t_cross/t_sort:5.2f}x  "
              f"intra/sort {t_intra/t_sort:5.2f}x", flush=True)
    return rows


def bench_tokens(sizes: list[tuple[int, int]], fraction: float = 0.05) -> list[dict]:
    rows = []
    for S, T in sizes:
        g = torch.Generator().manual_seed(S * T)
        adv = torch.randn(S, generator=g)
        ent = torch.rand(S, T, generator=g)
        lengths = torch.randint(T // 4, T + 1, (S,), generator=g)
        mask = torch.arange(T)[None] < lengths[:, None]
        n_valid = int(mask.sum())
        k = d3s.num_tokens_to_keep(n_valid, fraction)
        scores = d3s.token_scores(adv, ent, mask).view(-1)
        ours, topk, kth = paired(
            lambda: d3s.token_mask(adv, ent, mask, fraction),
            lambda: torch.topk(scores, k, sorted=False),
            lambda: torch.kthvalue(scores, scores.numel() - k + 1),
            min_time=0.0,
        )
        rows.append({"tokens": S * T, "S": S, "T": T, "k": k, "ours_s": ours, "topk_s": topk, "kthvalue_s": kth,
                     "ours_over_topk": ours / topk})
        print(f"token_mask           S*T={S*T:>10,}  k={k:>9,}  ours {ours*1e3:9.1f} ms  topk {topk*1e3:9.1f} ms  "
              f"kthvalue {kth*1e3:9.1f} ms  ours/topk {ours/topk:5.2f}x", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="sizes up to 10^5 only")
    parser.add_argument("--out", type=Path, default=RESULTS / "core.json")
    args = parser.parse_args()

    sizes = [1_000, 10_000, 16_384, 100_000] + ([] if args.quick else [1_000_000, 10_000_000])
    batches = [32, 512, 4096] + ([] if args.quick else [32_768, 312_500])
    tok = [(512, 2048), (4096, 2048)] + ([] if args.quick else [(32_768, 2048)])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    result = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "max_variance_subset": bench_subset(sizes, naive_limit=100_000),
        "select_rollouts": bench_select(batches),
        "token_mask": bench_tokens(tok),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
