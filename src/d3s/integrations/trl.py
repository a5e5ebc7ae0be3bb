"""TRL glue: `D3SConfig` and `D3SGRPOTrainer`, drop-ins for TRL's `GRPOConfig` and `GRPOTrainer`.

Thin on purpose: the maths (selection, token mask, schedule, loss) is the core's (`d3s.sampling`,
`d3s.tokens`, `d3s.schedule`, `d3s.loss`); this module only moves TRL's tensors in and out of it.
Three `GRPOTrainer` methods are overridden (their TRL signatures are pinned in
`OVERRIDDEN_TRL_METHODS`, and a test fails if TRL changes them):

- `_calculate_rewards`: unchanged, it also keeps the rewards of all processes for the selection.
- `_generate_and_score_completions`: after TRL has generated and scored the generation batch, the
  sample selection (METHOD section 2) runs on the advantages gathered from ALL processes, so every
  rank computes the same kept set. The kept rollouts are then dealt out again so that every rank
  holds the same number of rows, `rows_per_rank = steps_per_generation * ceil(K / (P *
  steps_per_generation))` for K kept rollouts on P processes; the other rollouts are dropped here,
  so the training forward/backward never sees them. Cross-group selection keeps unequal numbers per
  rank (a rank may keep none of its own rollouts); re-dealing makes that a non-issue, and when K
  does not divide evenly the last rank(s) get zero-weight padding rows (completion mask 0,
  advantage 0; fewer than P * steps_per_generation of them, counted in `d3s/padding_rows`).
- `_compute_loss`: `d3s.policy_loss` with the token mask and global denominators.

Token level (METHOD section 3): ONE threshold over the whole generation batch of all ranks.
- `steps_per_generation == 1` and `num_iterations == 1`: a batch's only micro-batch is its first
  update, so the (detached) entropies of that training forward are the ones METHOD asks for; the
  scores of all ranks are gathered inside `_compute_loss` — no extra forward.
- otherwise the entropies come from a no-grad forward of the kept rows right after generation (the
  weights of the first update on that batch), and the mask travels with the batch.

Denominators are global counts over the generation batch (kept rows for `loss_type="grpo"`, tokens
in the loss for `"dapo"`), shared by every micro-batch and rank, so the update does not depend on
how TRL splits the rows over micro-batches and processes. With `sample_selection="none"` and no
token selection the loss equals TRL's.

Evaluation (`eval_strategy`) scores TRL's full eval batch with the same objective and no
down-sampling.
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import dataclass, field

import torch

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing
except ImportError as err:  # pragma: no cover - exercised only without trl
    raise ImportError('d3s.integrations.trl needs TRL: pip install "d3s[trl]"') from err

from packaging.version import Version

from d3s import (
    Variant,
    get_variant,
    num_tokens_to_keep,
    policy_loss,
    population_variance,
    sample_usefulness_rate,
    select_rollouts,
    token_scores,
    top_tokens_mask,
)

TRL_VERSION_RANGE = (Version("1.16.0"), Version("1.17"))
"""TRL versions this glue was verified against: [1.16.0, 1.17)."""

OVERRIDDEN_TRL_METHODS = {
    "_calculate_rewards": "(self, inputs, prompts, completions, completion_ids_list)",
    "_generate_and_score_completions": "(self, inputs)",
    "_compute_loss": "(self, model, inputs)",
}
"""GRPOTrainer methods this module overrides, with the parameters they were written against."""

USED_TRL_METHODS = {
    "_get_per_token_logps_and_entropies": (
        "(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, "
        "compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, "
        "pixel_attention_mask=None, spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None, "
        "mm_token_type_ids=None, image_position_ids=None)"
    ),
    "_prepare_inputs": "(self, generation_batch)",
    "get_off_policy_mask": "(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold)",
}
"""GRPOTrainer methods this module calls or relies on (`_prepare_inputs` shuffles the generation
batch and splits it into `steps_per_generation` micro-batches), with their verified parameters."""


def _parameters(method) -> str:
    """A method's parameters with defaults, without annotations: "(self, model, inputs)"."""
    params = [p.replace(annotation=inspect.Parameter.empty) for p in inspect.signature(method).parameters.values()]
    return str(inspect.Signature(params))


def trl_signature_mismatches() -> dict[str, tuple[str, str]]:
    """`{method: (expected, found)}` for every overridden or used TRL method that changed or vanished."""
    out = {}
    for name, expected in {**OVERRIDDEN_TRL_METHODS, **USED_TRL_METHODS}.items():
        method = getattr(GRPOTrainer, name, None)
        found = "<missing>" if method is None else _parameters(method)
        if found != expected:
            out[name] = (expected, found)
    return out


if not TRL_VERSION_RANGE[0] <= Version(trl.__version__) < TRL_VERSION_RANGE[1]:
    warnings.warn(
        f"d3s.integrations.trl was verified with trl>={TRL_VERSION_RANGE[0]},<{TRL_VERSION_RANGE[1]}, found "
        f"trl=={trl.__version__}; it overrides private GRPOTrainer methods, check `trl_signature_mismatches()`",
        stacklevel=2,
    )

# Per-row tensors of TRL's generation batch that sample selection re-indexes, with how their second
# axis is padded when gathered across processes: (padding value, pad on the left). `None` = the
# tokenizer's pad token. Anything else per-row (images, ...) is refused rather than silently dropped.
_ROW_KEYS = {
    "prompt_ids": (None, True),
    "prompt_mask": (0, True),
    "completion_ids": (None, False),
    "completion_mask": (0, False),
    "advantages": (0.0, False),
    "old_per_token_logps": (0.0, False),
    "ref_per_token_logps": (0.0, False),
    "sampling_per_token_logps": (0.0, False),
    "importance_sampling_ratio": (0.0, False),
    "tool_mask": (0, False),
}
_COMPLETION_AXIS_KEYS = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "tool_mask",
)
_SUPPORTED_LOSS_TYPES = ("grpo", "dapo", "bnpo", "dr_grpo")


def _h(text: str) -> dict:
    return {"help": text}


@dataclass
class D3SConfig(GRPOConfig):
    """`GRPOConfig` plus the D3S settings (METHOD sections 2-4, 6).

    Set `variant` to one of `d3s.VARIANTS` (grpo, gspo, pods, d1s, d1s-c, d2s, d3s, d3s-i) to fill
    every D3S field you leave unset; fields you set win. The variants' rollout counts are the
    paper's for G = 32 (N 8 -> 32) and are scaled to your `num_generations` (round half up, kept in
    [2, G]): G = 16 gives N 4 -> 16. The GSPO objective is TRL's `importance_sampling_level=
    "sequence"`, computed with the GSPO-token ratio (METHOD section 5) so a token mask really masks
    tokens; `variant="gspo"` sets it, and every other variant combines with it.
    """

    variant: str | None = field(
        default=None,
        metadata=_h("Named D3S variant filling the unset D3S fields: grpo, gspo, pods, d1s, d1s-c, d2s, d3s, d3s-i."),
    )
    sample_selection: str | None = field(
        default=None,
        metadata=_h(
            "Rollout selection (METHOD section 2): 'none' (keep all, TRL's GRPO), 'intra' (max-variance N per group), "
            "'cross' (max-variance N*B over the whole generation batch), 'pods' (max reward variance N per group, "
            "re-normalised). Default 'none'."
        ),
    )
    n_init: int | None = field(
        default=None, metadata=_h("Rollouts kept per group at the start of training, in [2, num_generations].")
    )
    n_final: int | None = field(
        default=None, metadata=_h("Rollouts kept per group at the end (linear schedule); default n_init.")
    )
    token_selection: bool | None = field(
        default=None, metadata=_h("Keep only the top-K fraction of tokens by |advantage| x entropy. Default False.")
    )
    k_init: float | None = field(default=None, metadata=_h("Token fraction K at the start, in (0, 1]."))
    k_final: float | None = field(
        default=None, metadata=_h("Token fraction K at the end (linear schedule); default k_init.")
    )
    schedule: str | None = field(
        default=None,
        metadata=_h("'constant' (N, K fixed at the init values) or 'linear' (paper eq. 9). Default 'constant'."),
    )
    normalizer: str | None = field(
        default=None,
        metadata=_h(
            "Token-loss divisor with token selection: 'selected' (kept tokens, paper eq. 10; default) or 'all' "
            "(all valid tokens of the kept rollouts, like TRL's top_entropy_quantile)."
        ),
    )
    allow_tightening: bool = field(
        default=False, metadata=_h("Allow a linear schedule whose final N or K is below the initial one.")
    )
    def __post_init__(self):
        super().__post_init__()
        self._resolve_d3s()
        self._check_trl_options()

    def _resolve_d3s(self) -> None:
        G = self.num_generations
        if self.importance_sampling_level == "sequence_token":
            self.importance_sampling_level = "sequence"  # the D3S name of the same objective
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(
                f"importance_sampling_level={self.importance_sampling_level!r}; valid: 'token' (GRPO), "
                "'sequence' (GSPO, computed with the GSPO-token ratio)"
            )
        if self.variant is not None:
            v = get_variant(self.variant)  # ValueError naming the valid names
            if v.importance_sampling_level == "sequence_token":
                self.importance_sampling_level = "sequence"
            elif self.variant == "grpo" and self.importance_sampling_level == "sequence":
                raise ValueError(
                    "variant='grpo' is the GRPO objective but importance_sampling_level='sequence' asks for GSPO; "
                    "use variant='gspo'"
                )

            def scaled(n: int) -> int:  # the paper's N for G = 32, scaled to this run's G
                return min(G, max(2, math.floor(n * G / v.num_generations + 0.5)))

            defaults = {
                "sample_selection": v.sample_selection,
                "token_selection": v.token_selection,
                "schedule": v.schedule,
                "normalizer": v.normalizer,
            }
            if v.sample_selection != "none":
                defaults.update(n_init=scaled(v.n_init), n_final=scaled(v.n_final))
            if v.token_selection:
                defaults.update(k_init=v.k_init, k_final=v.k_final)
            for name, value in defaults.items():
                if getattr(self, name) is None:
                    setattr(self, name, value)

        if self.sample_selection is None:
            self.sample_selection = "none"
        if self.token_selection is None:
            self.token_selection = False
        if self.schedule is None:
            self.schedule = "constant"
        if self.normalizer is None:
            self.normalizer = "selected"
        if self.sample_selection == "none":
            if self.n_init is not None or self.n_final is not None:
                raise ValueError(
                    f"n_init={self.n_init}, n_final={self.n_final} have no effect with sample_selection='none'; "
                    "set sample_selection to 'intra', 'cross' or 'pods', or leave them unset"
                )
        elif self.n_init is None:
            raise ValueError(
                f"sample_selection={self.sample_selection!r} needs n_init (rollouts kept per group, an integer in "
                f"[2, num_generations={G}])"
            )
        elif self.n_final is None:
            self.n_final = self.n_init
        if not self.token_selection:
            if self.k_init is not None or self.k_final is not None:
                raise ValueError(
                    f"k_init={self.k_init}, k_final={self.k_final} have no effect with token_selection=False; "
                    "set token_selection=True, or leave them unset"
                )
        elif self.k_init is None:
            raise ValueError("token_selection=True needs k_init (the fraction of tokens kept, in (0, 1])")
        elif self.k_final is None:
            self.k_final = self.k_init
        _ = self.d3s_settings  # Variant validates: ranges, constant schedule with init != final, ...

    def _check_trl_options(self) -> None:
        if self.loss_type not in _SUPPORTED_LOSS_TYPES:
            raise ValueError(
                f"loss_type={self.loss_type!r} is not supported by D3SGRPOTrainer; valid: "
                f"{', '.join(map(repr, _SUPPORTED_LOSS_TYPES))}"
            )
        if self.top_entropy_quantile != 1.0:
            if self.token_selection:
                raise ValueError(
                    f"top_entropy_quantile={self.top_entropy_quantile} (TRL's entropy mask) and D3S "
                    "token_selection=True both mask tokens; use one: D3S's k_init/k_final, or "
                    "top_entropy_quantile=1.0"
                )
            raise ValueError(
                f"top_entropy_quantile={self.top_entropy_quantile} is not supported by D3SGRPOTrainer; use "
                "token_selection=True with k_init/k_final, or top_entropy_quantile=1.0"
            )
        if self.delta is not None:
            raise ValueError(f"delta={self.delta} (two-sided clipping) is not supported by D3SGRPOTrainer; use None")
        if self.entropy_coef != 0.0 or self.use_adaptive_entropy:
            raise ValueError(
                f"entropy_coef={self.entropy_coef}, use_adaptive_entropy={self.use_adaptive_entropy}: the entropy "
                "bonus is not supported by D3SGRPOTrainer; use entropy_coef=0.0, use_adaptive_entropy=False"
            )

    @property
    def d3s_settings(self) -> Variant:
        """The resolved D3S settings as a validated `d3s.Variant` (built from the fields on each call)."""
        G = self.num_generations
        return Variant(
            name=self.variant or "custom",
            sample_selection=self.sample_selection,
            token_selection=bool(self.token_selection),
            schedule=self.schedule,
            num_generations=G,
            n_init=G if self.n_init is None else self.n_init,
            n_final=G if self.n_final is None else self.n_final,
            k_init=1.0 if self.k_init is None else self.k_init,
            k_final=1.0 if self.k_final is None else self.k_final,
            allow_tightening=self.allow_tightening,
            importance_sampling_level="sequence_token" if self.importance_sampling_level == "sequence" else "token",
            normalizer=self.normalizer,
        )


class D3SGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` that trains on the D3S-selected rollouts and tokens. Thin glue over `d3s`.

    Use it exactly like `GRPOTrainer` with a `D3SConfig`. After every generation,
    `d3s_last_selection` holds what was chosen (kept rollout indices, N, K, token count), for
    inspection. See the module docstring for how rows, ranks and micro-batches are handled.
    """

    _tag_names = ["trl", "grpo", "d3s"]
    _name = "D3S-GRPO"

    def __init__(self, model, reward_funcs, args: D3SConfig | None = None, *rest, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = D3SConfig(f"{name.split('/')[-1]}-D3S")
        if not isinstance(args, D3SConfig):
            raise TypeError(f"D3SGRPOTrainer needs a D3SConfig (a GRPOConfig subclass), got {type(args).__name__}")
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        self._d3s_rewards_per_func = None
        self.d3s_last_selection: dict = {}

    # -- schedule (METHOD section 4) ---------------------------------------------------------------

    def d3s_progress(self) -> float:
        """Training progress p = global_step / max_steps in [0, 1]; restored with the trainer state on resume."""
        max_steps = self.state.max_steps
        return min(max(self.state.global_step / max_steps, 0.0), 1.0) if max_steps > 0 else 0.0

    # -- sample level -------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._d3s_rewards_per_func = rewards_per_func  # (B*G, F), all processes (TRL gathers them)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return batch  # evaluation: TRL's batch, no down-sampling
        return self._d3s_select(batch)

    def _d3s_gather(self, tensor: torch.Tensor, pad_value, pad_first: bool) -> torch.Tensor:
        """Every rank's rows, rank order; the second axis padded to a common width first."""
        if self.accelerator.num_processes == 1:
            return tensor
        if tensor.dim() > 1:
            tensor = self.accelerator.pad_across_processes(tensor, dim=1, pad_index=pad_value, pad_first=pad_first)
        return self.accelerator.gather(tensor)

    def _d3s_select(self, batch: dict) -> dict:
        settings = self.args.d3s_settings
        device = self.accelerator.device
        G, P = self.num_generations, self.accelerator.num_processes
        n_keep, fraction = settings.schedule_at(self.d3s_progress())

        rewards_per_func = self._d3s_rewards_per_func  # (B*G, F)
        rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)  # (B*G,)
        unscorable = torch.isnan(rewards_per_func).all(dim=1)  # (B*G,)
        rewards[unscorable] = float("nan")
        advantages = self.accelerator.gather(batch["advantages"])  # (B*G,) TRL's, rank order
        loss_mask = batch["completion_mask"]
        if batch.get("tool_mask") is not None:
            loss_mask = loss_mask * batch["tool_mask"]
        valid_per_row = self.accelerator.gather(loss_mask.sum(dim=1))  # (B*G,) loss tokens per rollout
        tokens_generated = valid_per_row.sum()

        if settings.sample_selection == "none":
            # TRL's rows as they are (unscorable ones included, advantage 0), so D3S off == TRL.
            kept = torch.arange(advantages.numel(), device=device)  # (B*G,)
            kept_advantages = advantages
            padding_rows = 0
        else:
            selection = select_rollouts(
                advantages, rewards, G, n_keep, settings.sample_selection, scale_rewards=self.scale_rewards
            )
            kept, kept_advantages = selection.indices, selection.advantages  # (K,), (K,)
            batch, padding_rows = self._d3s_redeal(batch, kept, kept_advantages)
            loss_mask = batch["completion_mask"]
            if batch.get("tool_mask") is not None:
                loss_mask = loss_mask * batch["tool_mask"]

        n_valid = int(valid_per_row[kept].sum())  # loss tokens of the kept rollouts, all ranks
        n_rows = kept.numel()
        n_tokens = num_tokens_to_keep(n_valid, fraction) if settings.token_selection else n_valid
        self.d3s_last_selection = {
            "kept": kept.cpu(),
            "n_keep": n_keep,
            "fraction": fraction,
            "tokens_in_loss": n_tokens,
            "rows_per_rank": batch["completion_mask"].size(0),
            "kept_per_rank_before": torch.bincount(
                torch.div(kept, advantages.numel() // P, rounding_mode="floor"), minlength=P
            ).cpu(),
        }

        if settings.token_selection and not self._d3s_mask_in_loss():
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                _, entropies, _ = self._get_per_token_logps_and_entropies(
                    self.model,
                    torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
                    torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
                    batch["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size,
                    compute_entropy=True,
                )
            token_mask, rows_used = self._d3s_token_mask(batch["advantages"], entropies, loss_mask, fraction)
            batch["d3s_token_mask"] = token_mask  # (S, T)
            if settings.normalizer == "selected":
                n_rows = rows_used

        # Global counts shared by every micro-batch (0-dim tensors survive TRL's shuffle and split)
        denominator_tokens = n_tokens if settings.normalizer == "selected" else n_valid
        batch["d3s_num_rows"] = torch.tensor(float(n_rows), device=device)
        batch["d3s_num_tokens"] = torch.tensor(float(denominator_tokens), device=device)
        batch["d3s_fraction"] = torch.tensor(fraction, dtype=torch.float64, device=device)
        batch["num_items_in_batch"] = torch.tensor(float(n_valid), device=device)

        # METHOD section 7 (reward mean, entropy, KL and grad norm are TRL's own `reward`, `entropy`,
        # `kl`, `grad_norm`)
        kept_mask = torch.zeros_like(advantages, dtype=torch.bool)
        kept_mask[kept] = True
        trained_advantages = torch.zeros_like(advantages)
        trained_advantages[kept] = kept_advantages
        metrics = self._metrics["train"]
        metrics["d3s/n_keep"].append(float(n_keep))
        metrics["d3s/k_fraction"].append(float(fraction))
        metrics["d3s/progress"].append(self.d3s_progress())
        metrics["d3s/rollouts_kept"].append(float(kept.numel()))
        metrics["d3s/rollout_ratio"].append(kept.numel() / advantages.numel())
        metrics["d3s/padding_rows"].append(float(padding_rows))
        metrics["d3s/tokens_in_loss"].append(float(n_tokens))
        metrics["d3s/token_consumption_ratio"].append(n_tokens / max(float(tokens_generated), 1.0))
        metrics["d3s/sample_usefulness_rate"].append(
            sample_usefulness_rate(trained_advantages, kept_mask, G).item()
        )
        metrics["d3s/advantage_variance"].append(population_variance(kept_advantages).item())
        metrics["d3s/unscorable_rollouts"].append(float(unscorable.sum()))
        metrics["d3s/empty_completions"].append(float((valid_per_row == 0).sum()))
        return batch

    def _d3s_redeal(self, batch: dict, kept: torch.Tensor, kept_advantages: torch.Tensor) -> tuple[dict, int]:
        """Keep only the `kept` rows (global indices) and deal them out evenly over the ranks."""
        unknown = sorted(k for k, v in batch.items() if v is not None and k not in (*_ROW_KEYS, "num_items_in_batch"))
        if unknown:
            raise NotImplementedError(
                f"sample selection cannot re-index the batch keys {unknown} (multimodal inputs are not supported "
                "yet); use sample_selection='none'"
            )
        device = self.accelerator.device
        P, rank = self.accelerator.num_processes, self.accelerator.process_index
        spg = self.args.steps_per_generation
        total = batch["advantages"].size(0) * P  # B*G
        K = kept.numel()
        rows_per_rank = spg * max(1, math.ceil(K / (P * spg)))  # equal on every rank, splits into spg micro-batches
        slots = torch.full((P * rows_per_rank,), -1, dtype=torch.long, device=device)
        slots[:K] = kept
        mine = slots[rank * rows_per_rank : (rank + 1) * rows_per_rank]  # (R,) global row, -1 = padding
        real = mine >= 0  # (R,)
        rows = mine.clamp(min=0)  # (R,)
        advantages = torch.zeros(total, dtype=kept_advantages.dtype, device=device)  # (B*G,)
        advantages[kept] = kept_advantages

        out = {}
        for key, (pad_value, pad_first) in _ROW_KEYS.items():
            if batch.get(key) is None:
                continue
            if key == "advantages":
                out[key] = advantages[rows] * real  # (R,)
                continue
            pad_value = self._tokenizer.pad_token_id if pad_value is None else pad_value
            out[key] = self._d3s_gather(batch[key], pad_value, pad_first)[rows]  # (R, ...)
        out["completion_mask"] = out["completion_mask"] * real.unsqueeze(1)  # padding rows: no loss token
        # Drop completion columns that no kept row uses (right padding: no effect on the real tokens)
        if self.pad_to_multiple_of is None:
            used_cols = out["completion_mask"].any(dim=0).nonzero()
            width = int(used_cols.max()) + 1 if used_cols.numel() > 0 else 1
            for key in _COMPLETION_AXIS_KEYS:
                if key in out and out[key].dim() > 1 and out[key].size(1) > width:
                    out[key] = out[key][:, :width]
        out["num_items_in_batch"] = batch["num_items_in_batch"]
        out["d3s_real"] = real
        return out, P * rows_per_rank - K

    # -- token level --------------------------------------------------------------------------------

    def _d3s_mask_in_loss(self) -> bool:
        """Whether the training forward of the only micro-batch provides the entropies (no extra forward)."""
        return self.args.steps_per_generation == 1 and self.num_iterations == 1

    def _d3s_token_mask(
        self, advantages: torch.Tensor, entropies: torch.Tensor, loss_mask: torch.Tensor, fraction: float
    ) -> tuple[torch.Tensor, int]:
        """Top-K% |A| x H over the rows of ALL ranks: one threshold, identical on every rank (eq. 8).

        Returns this rank's `(S, T)` mask and the number of rows (all ranks) with a kept token.
        """
        scores = token_scores(advantages, entropies.detach(), loss_mask)  # (S, T), -inf at padding
        S, T = scores.shape
        all_scores = self._d3s_gather(scores, -float("inf"), False)  # (P*S, T_max)
        k = num_tokens_to_keep(int((all_scores > -float("inf")).sum()), fraction)
        all_mask = top_tokens_mask(all_scores, k)  # (P*S, T_max)
        self.d3s_last_selection["token_mask"] = all_mask.cpu()
        rank = self.accelerator.process_index
        return all_mask[rank * S : (rank + 1) * S, :T], int(all_mask.any(dim=1).sum())

    # -- loss (METHOD section 5) --------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        settings = self.args.d3s_settings
        mode = "train" if self.model.training else "eval"
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)  # (S, P+T)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)  # (S, P+T)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]  # (S, T)
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
        )  # (S, T), (S, T)
        advantages = inputs["advantages"]  # (S,)
        old_per_token_logps = inputs.get("old_per_token_logps")  # (S, T) or None (on-policy)

        token_mask = inputs.get("d3s_token_mask")  # (S, T) or None
        num_rows = inputs.get("d3s_num_rows")
        if mode == "train" and settings.token_selection and token_mask is None:
            token_mask, rows_used = self._d3s_token_mask(advantages, entropies, mask, float(inputs["d3s_fraction"]))
            if settings.normalizer == "selected":
                num_rows = rows_used

        # Multiplicative per-token weights of the surrogate that TRL applies (vLLM IS correction, OPSM)
        weights = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            weights = inputs["importance_sampling_ratio"]  # (S, T) or (S, 1)
        if self.off_policy_mask_threshold is not None:
            sampling = inputs.get("sampling_per_token_logps")
            if sampling is None:
                sampling = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
            off_policy_mask = self.get_off_policy_mask(
                advantages.unsqueeze(1), per_token_logps, sampling, mask, self.off_policy_mask_threshold
            )  # (S, 1)
            weights = off_policy_mask if weights is None else weights * off_policy_mask

        aggregation, denominator, accumulation = self._loss_denominator(inputs, mode, num_rows)
        loss, metrics = policy_loss(
            per_token_logps,
            old_per_token_logps,
            advantages,
            mask,
            token_mask=token_mask,
            importance_sampling_level=settings.importance_sampling_level,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            ref_per_token_logps=inputs.get("ref_per_token_logps"),
            normalizer=settings.normalizer,
            aggregation=aggregation,
            denominator=denominator,
            importance_sampling_ratio=weights,
            kl_importance_weighted=self.args.use_bias_correction_kl,
        )
        loss = loss / accumulation
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / (
                self.current_gradient_accumulation_steps if mode == "train" else 1.0
            )
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        # Metrics, reduced over all ranks like TRL's (every rank calls the same reductions in order)
        used = metrics["tokens_used"]
        sums = [(entropies.detach() * mask).sum(), mask.sum().to(entropies.dtype), used]
        names = ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]
        if self.beta != 0.0:
            names.append("kl")
        sums += [metrics[name] * used for name in names]
        totals = self.accelerator.reduce(torch.stack([s.float() for s in sums]), reduction="sum")
        self._metrics[mode]["entropy"].append((totals[0] / totals[1].clamp(min=1.0)).item())
        for i, name in enumerate(names):
            self._metrics[mode][name].append((totals[3 + i] / totals[2].clamp(min=1.0)).item())
        return loss

    def _loss_denominator(self, inputs: dict, mode: str, num_rows) -> tuple[str, float | None, float]:
        """`(aggregation, denominator, accumulation divisor)` for TRL's `loss_type`.

        `grpo`/`dapo` divide by the kept rows / tokens of the whole generation batch (all ranks), as a
        per-rank share of one optimizer step: the gradients of the micro-batches are summed and
        averaged over the P ranks, so each rank divides by count / P * (ga / steps_per_generation).
        With nothing selected these are TRL's divisors. `bnpo`/`dr_grpo` keep TRL's per-micro-batch
        divisors (over the real, non-padding rows).
        """
        P = self.accelerator.num_processes
        S = inputs["completion_ids"].size(0)
        if mode == "train":
            ga = self.current_gradient_accumulation_steps
            share = ga / self.args.steps_per_generation / P
        else:
            ga, share = 1.0, 1.0 / P
        if self.loss_type == "grpo":
            rows = float(num_rows) if num_rows is not None else float(S * P)  # eval: TRL's per-micro-batch mean
            return "sequence", max(rows, 1.0) * share, 1.0
        if self.loss_type == "dapo":
            tokens = inputs.get("d3s_num_tokens", inputs["num_items_in_batch"])
            return "token", max(float(tokens), 1.0) * share, 1.0
        if self.loss_type == "bnpo":
            return "token", None, float(ga)
        if self.loss_type == "dr_grpo":
            real = inputs.get("d3s_real")
            n_real = S if real is None else int(real.sum())
            return "token", float(max(n_real, 1) * self.max_completion_length), float(ga)
        raise ValueError(f"loss_type={self.loss_type!r}; valid: {', '.join(_SUPPORTED_LOSS_TYPES)}")
