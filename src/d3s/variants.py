"""The named variants of the paper (sec. 4.1, appendix D; docs/method.md section 6) as validated settings.

| name   | sample level | token level | schedule | objective |
|--------|--------------|-------------|----------|-----------|
| grpo   | none         | none        | -        | GRPO      |
| gspo   | none         | none        | -        | GSPO-token|
| pods   | pods         | none        | constant | GRPO      |
| d1s    | intra        | none        | constant | GRPO      |
| d1s-c  | cross        | none        | constant | GRPO      |
| d2s    | cross        | abs(A) * H  | constant | GRPO      |
| d3s    | cross        | abs(A) * H  | linear   | GRPO      |
| d3s-i  | intra        | abs(A) * H  | linear   | GRPO      |

Every variant combines with either objective: `VARIANTS["d3s"].replace(importance_sampling_level=
"sequence_token")` is GSPO + D3S. Defaults are the paper's Table 5 (G = 32, N 8 -> 32, K 5% -> 20%);
constant-schedule variants hold the initial values (N = 8, K = 5%) throughout.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from d3s.loss import ImportanceSamplingLevel, Normalizer
from d3s.rollout_selection import SAMPLE_SELECTIONS, SampleSelection
from d3s.schedule import SCHEDULE_CLOCKS, linear_schedule
from d3s.token_selection import TOKEN_CUTS

Schedule = Literal["constant", "linear"]


@dataclass(frozen=True)
class Variant:
    """One D3S configuration. Validated on construction (and on `replace`)."""

    name: str
    """Display name, e.g. "d3s"."""
    sample_selection: SampleSelection = "none"
    """Rollout selection: "none" (keep all), "intra" (N per group), "cross" (N*B over the batch),
    "pods" (N per group by reward variance, re-normalised); the controls "random" (as many as "cross", chosen at
    random) and "random-intra" (as many as "intra", at random), docs/method.md section 9.3."""
    token_selection: bool = False
    """Keep only the top-K fraction of tokens by |A| * H (paper eq. 8)."""
    schedule: Schedule = "constant"
    """"constant": N = n_init and K = k_init throughout (n_final/k_final must equal them);
    "linear": interpolate from the init to the final values over training (eq. 9)."""
    num_generations: int = 32
    """G, rollouts per prompt."""
    n_init: int = 8
    """Rollouts kept per group at the start, in [2, G]."""
    n_final: int = 32
    """Rollouts kept per group at the end, in [2, G]."""
    k_init: float = 0.05
    """Fraction of tokens kept at the start, in (0, 1]."""
    k_final: float = 0.20
    """Fraction of tokens kept at the end, in (0, 1]."""
    allow_tightening: bool = False
    """A linear schedule whose final value is below its initial one (it keeps LESS as training goes
    on) is refused unless this is set: the paper's schedule relaxes, so a tightening one must be
    intended."""
    importance_sampling_level: ImportanceSamplingLevel = "token"
    """"token" (GRPO ratio) or "sequence_token" (GSPO-token ratio)."""
    normalizer: Normalizer = "selected"
    """Token-loss divisor: "selected" (kept tokens) or "all" (all valid tokens)."""
    token_cut: str = "batch"
    """Where the token cut is taken (docs/method.md section 9.2): "batch" (the paper), "sign", "rollout"."""
    min_tokens_per_rollout: int = 0
    """A floor of tokens per kept rollout with a non-zero advantage, on top of the cut (0: none, the paper)."""
    keep_last_in_loss: bool = False
    """Every kept rollout with a non-zero advantage also keeps its last token, its end-of-sequence token when it
    stopped (False: the paper)."""
    schedule_clock: str = "steps"
    """What progress p counts: "steps" (the paper) or "learning_rate" (section 9.2)."""

    def __post_init__(self) -> None:
        if self.sample_selection not in SAMPLE_SELECTIONS:
            raise ValueError(
                f"{self.name}: sample_selection={self.sample_selection!r}; valid: {', '.join(map(repr, SAMPLE_SELECTIONS))}"
            )
        if self.schedule not in ("constant", "linear"):
            raise ValueError(f"{self.name}: schedule={self.schedule!r}; valid: 'constant', 'linear'")
        if self.importance_sampling_level not in ("token", "sequence_token"):
            raise ValueError(
                f"{self.name}: importance_sampling_level={self.importance_sampling_level!r}; "
                "valid: 'token', 'sequence_token'"
            )
        if self.normalizer not in ("selected", "all"):
            raise ValueError(f"{self.name}: normalizer={self.normalizer!r}; valid: 'selected', 'all'")
        if self.token_cut not in TOKEN_CUTS:
            raise ValueError(f"{self.name}: token_cut={self.token_cut!r}; valid: {', '.join(map(repr, TOKEN_CUTS))}")
        floor = self.min_tokens_per_rollout
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise ValueError(f"{self.name}: min_tokens_per_rollout={floor!r} must be an integer >= 0 (0: no floor)")
        if not isinstance(self.keep_last_in_loss, bool):
            raise ValueError(f"{self.name}: keep_last_in_loss={self.keep_last_in_loss!r} must be True or False")
        if self.schedule_clock not in SCHEDULE_CLOCKS:
            raise ValueError(
                f"{self.name}: schedule_clock={self.schedule_clock!r}; valid: {', '.join(map(repr, SCHEDULE_CLOCKS))}"
            )
        G = self.num_generations
        if isinstance(G, bool) or not isinstance(G, int) or G < 2:
            raise ValueError(f"{self.name}: num_generations={G!r} must be an integer >= 2")
        if self.sample_selection != "none":
            for field in ("n_init", "n_final"):
                value = getattr(self, field)
                if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= G:
                    raise ValueError(
                        f"{self.name}: {field}={value!r} must be an integer in [2, num_generations={G}]"
                    )
            self._check_pair("n_init", "n_final")
        if self.token_selection:
            for field in ("k_init", "k_final"):
                value = getattr(self, field)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
                    raise ValueError(f"{self.name}: {field}={value!r} must be a fraction in (0, 1]")
            self._check_pair("k_init", "k_final")

    def _check_pair(self, init: str, final: str) -> None:
        a, b = getattr(self, init), getattr(self, final)
        if self.schedule == "constant" and a != b:
            raise ValueError(
                f"{self.name}: schedule='constant' uses {init} throughout, but {init}={a} != {final}={b}; "
                f"set {final}={a}, or schedule='linear'"
            )
        if self.schedule == "linear" and b < a and not self.allow_tightening:
            raise ValueError(
                f"{self.name}: {final}={b} < {init}={a} makes the schedule keep less as training goes on; "
                "set allow_tightening=True if that is intended"
            )

    def replace(self, **changes) -> Variant:
        """A copy with `changes` applied, validated again; a ValueError names an unknown field."""
        fields = [f.name for f in dataclasses.fields(self)]
        for field, value in changes.items():
            if field not in fields:
                raise ValueError(f"{self.name}: {field}={value!r} is not a Variant field; valid: {', '.join(fields)}")
        return dataclasses.replace(self, **changes)

    def schedule_at(self, progress: float, *, multiple_of: int = 1) -> tuple[int, float]:
        """`(n_keep, fraction)` at training progress p in [0, 1] (paper eq. 9).

        Without sample selection n_keep = G; without token selection fraction = 1.
        """
        n, k = linear_schedule(
            progress,
            self.n_init if self.sample_selection != "none" else self.num_generations,
            self.n_final if self.sample_selection != "none" else self.num_generations,
            self.k_init if self.token_selection else 1.0,
            self.k_final if self.token_selection else 1.0,
            self.num_generations,
            multiple_of=multiple_of,
        )
        return n, k


def _constant(name: str, sample_selection: SampleSelection, token_selection: bool) -> Variant:
    return Variant(name, sample_selection, token_selection, "constant", n_final=8, k_final=0.05)


VARIANTS: dict[str, Variant] = {
    "grpo": _constant("grpo", "none", False),
    "gspo": _constant("gspo", "none", False).replace(importance_sampling_level="sequence_token"),
    "pods": _constant("pods", "pods", False),
    "d1s": _constant("d1s", "intra", False),
    "d1s-c": _constant("d1s-c", "cross", False),
    "d2s": _constant("d2s", "cross", True),
    "d3s": Variant("d3s", "cross", True, "linear"),
    "d3s-i": Variant("d3s-i", "intra", True, "linear"),
}
"""The paper's variants with its Table 5 values (G = 32)."""


def scaled_count(n: int, num_generations: int, reference_generations: int = 32) -> int:
    """A rollout count given for G = `reference_generations` (the paper's 32), scaled to G = `num_generations`.

    Round half up, then clip to [2, G]: the paper's N 8 -> 32 of 32 is N 4 -> 16 of 16, 2 -> 8 of 8.
    """
    G = num_generations
    return min(G, max(2, math.floor(n * G / reference_generations + 0.5)))


def paired(init, final, schedule: str) -> tuple:
    """The one rule for explicitly given ends of a schedule (`None` = not given).

    With a constant schedule, an init or a final value given alone sets the constant: both ends
    take it. With a linear one each value sets its own end, and the other stays unset.
    """
    if schedule == "constant" and (init is None) != (final is None):
        init = final = init if init is not None else final
    return init, final


def get_variant(name: str, **overrides) -> Variant:
    """`VARIANTS[name]` with `overrides` applied; a clear error for an unknown name.

    Explicit values follow `paired`: under a constant schedule (the variant's, or the one the
    overrides set), `n_init` or `n_final` (likewise `k_init` or `k_final`) given alone sets the
    constant, so `get_variant("d1s", n_init=4)` and `get_variant("d1s", n_final=4)` both keep 4 per
    group throughout; under a linear one each sets its own end of the schedule.
    """
    if not isinstance(name, str) or name not in VARIANTS:
        raise ValueError(f"variant={name!r}; valid: {', '.join(VARIANTS)}")
    base = VARIANTS[name]
    schedule = overrides.get("schedule", base.schedule)
    for init, final in (("n_init", "n_final"), ("k_init", "k_final")):
        a, b = paired(overrides.get(init), overrides.get(final), schedule)
        overrides.update({key: value for key, value in ((init, a), (final, b)) if value is not None})
    return base.replace(**overrides) if overrides else base
