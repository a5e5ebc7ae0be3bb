"""TRL glue: `D3SConfig` and `D3SGRPOTrainer`, drop-ins for TRL's `GRPOConfig` and `GRPOTrainer`.

Thin on purpose: the maths (selection, token mask, schedule, loss) is the core's (`d3s.rollout_selection`,
`d3s.token_selection`, `d3s.schedule`, `d3s.loss`) and the batch arithmetic is `d3s.batch`'s; this module
moves TRL's tensors in and out of them. See docs/method.md for the method and docs/trl.md for use.

With nothing down-sampled (`variant="grpo"` or `"gspo"`) the trainer IS TRL's: its generation,
advantages and loss run unchanged, and only metrics are added. Otherwise one generation batch goes
through these steps (the paper's order: select first, then compute):

1. TRL generates and scores every rollout. Its no-grad passes over all rollouts (old-policy and
   reference log-probs) are deferred: they return placeholders (`_DeferredPasses`). With
   transformers generation, the entropy of every generated token is read from the logits that
   `generate` computes anyway (`_GenerationEntropy`): no extra pass.
2. Advantages: TRL's, with exactly 0 for a group of equal rewards (as `d3s.group_advantages`).
3. Sample selection (docs/method.md section 2) on the advantages gathered from ALL processes, so
   every rank computes the same kept set; the kept rows are dealt out again evenly over the ranks
   (`d3s.batch.deal_rows`; zero-weight padding rows, counted in `d3s/padding_rows`).
4. For the kept rows only: the old-policy log-probs (when TRL needs them: vLLM's sampler
   correction, or generation not aligned with optimizer steps), the reference log-probs (beta != 0)
   and the sampler-correction ratio (`d3s.batch.sampler_correction_ratio`). Entropies for the token
   mask come from generation; else from the old-policy pass; else (vLLM without the correction,
   tool calling, a custom `rollout_func`) from one extra no-grad pass of the kept rows.
5. The token mask (section 3): ONE threshold over the kept rows of all ranks.
6. The training forward of each micro-batch stops at the last column holding a kept token and runs
   the LM head (with gradient) only at the kept tokens (`_add_selective_lm_head`). A micro-batch
   whose gradient is exactly zero (no kept token; or every kept advantage 0 with beta = 0) runs a
   1-token forward instead, so the optimizer still steps with zero gradients (`d3s/skipped_forwards`).
7. The loss (`d3s.policy_loss`) divides by global counts over the generation batch
   (`d3s.batch.loss_denominator`), so the update does not depend on how TRL splits the rows.

Given the same kept rows and token mask, steps 4-6 change the cost, never the update: the loss
and its gradients equal those of the full masked computation (tested).

Where a step's time goes is logged with its metrics (`d3s/time/*`, seconds per optimizer step):
generation (TRL's generation and reward scoring, with its no-grad passes when they are not deferred),
selection (steps 2-5), kl_monitor (the KL metric at beta = 0), forward (the loss forward) and backward
(the rest of TRL's `step_time`: the backward pass and its bookkeeping).

Four `GRPOTrainer` methods are overridden (signatures pinned in `OVERRIDDEN_TRL_METHODS`; a test
fails if TRL changes them). Evaluation (`eval_strategy`) scores TRL's full eval batch with TRL's
objective.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import time
import types
import warnings
from dataclasses import dataclass, field

import torch

try:
    import trl
    from trl import GRPOConfig, GRPOTrainer
    from accelerate.utils import is_peft_model
    from trl.kernels import ChunkedLogProbFunction
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE, maybe_gather_lm_head_ctx, nanmax, nanmin, use_adapter
except ImportError as err:  # pragma: no cover - exercised only without trl
    raise ImportError('d3s.integrations.trl needs TRL: pip install "d3s[trl]"') from err

from packaging.version import Version

from d3s import (
    Variant,
    get_variant,
    group_advantages,
    num_tokens_to_keep,
    policy_loss,
    population_variance,
    sample_usefulness_rate,
    select_rollouts,
    token_entropy,
    token_scores,
    top_tokens_mask,
)
from d3s.batch import deal_rows, last_used_column, loss_denominator, sampler_correction_ratio
from d3s.token_selection import LOWEST_SCORE

TRL_VERSION_RANGE = (Version("1.16.0"), Version("1.17"))
"""TRL versions this glue was verified against: [1.16.0, 1.17)."""

OVERRIDDEN_TRL_METHODS = {
    "_calculate_rewards": "(self, inputs, prompts, completions, completion_ids_list)",
    "_generate_and_score_completions": "(self, inputs)",
    "_compute_loss": "(self, model, inputs)",
    "training_step": "(self, model, inputs, num_items_in_batch)",
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
    "d3s_entropies": (0.0, False),  # entropies read from generation, when available
}
_COMPLETION_AXIS_KEYS = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "tool_mask",
    "d3s_entropies",
)
_SUPPORTED_LOSS_TYPES = ("grpo", "dapo", "bnpo", "dr_grpo")


def _h(text: str) -> dict:
    return {"help": text}


@dataclass
class D3SConfig(GRPOConfig):
    """`GRPOConfig` plus the D3S settings (docs/method.md sections 2-4, 6).

    Set `variant` to one of `d3s.VARIANTS` (grpo, gspo, pods, d1s, d1s-c, d2s, d3s, d3s-i) to fill
    every D3S field you leave unset; fields you set win. The variants' rollout counts are the
    paper's for G = 32 (N 8 -> 32) and are scaled to your `num_generations` (round half up, kept in
    [2, G]): G = 16 gives N 4 -> 16. The GSPO objective is TRL's `importance_sampling_level=
    "sequence"`, computed with the GSPO-token ratio (docs/method.md section 5) so a token mask really masks
    tokens; `variant="gspo"` sets it, and every other variant combines with it.
    """

    variant: str | None = field(
        default=None,
        metadata=_h("Named D3S variant filling the unset D3S fields: grpo, gspo, pods, d1s, d1s-c, d2s, d3s, d3s-i."),
    )
    sample_selection: str | None = field(
        default=None,
        metadata=_h(
            "Rollout selection (docs/method.md section 2): 'none' (keep all, TRL's GRPO), 'intra' (max-variance N per group), "
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
    kl_log_every: int = field(
        default=5,
        metadata=_h(
            "At beta=0, log `kl` (k3 KL of the current to the initial policy) every this many generation batches; "
            "0 turns it off. Cost per measurement: two no-grad forwards of `kl_log_rollouts` rollouts per process, "
            "and a frozen copy of the initial weights in memory (none with PEFT). At beta != 0 the KL to the "
            "reference is logged every step at no extra cost."
        ),
    )
    kl_log_rollouts: int = field(
        default=8, metadata=_h("Rollouts per process (the first of each generation batch) the KL metric is measured on.")
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
            for name, value in defaults.items():
                if getattr(self, name) is None:
                    setattr(self, name, value)
            # One rule for explicit values (as `d3s.get_variant`): with a constant schedule, n_init or
            # n_final given alone sets the constant (likewise k); with a linear one, each sets its end.
            pairs = []
            if v.sample_selection != "none" and self.sample_selection != "none":
                pairs.append(("n_init", "n_final", scaled(v.n_init), scaled(v.n_final)))
            if v.token_selection and self.token_selection:
                pairs.append(("k_init", "k_final", v.k_init, v.k_final))
            for init, final, init_default, final_default in pairs:
                a, b = getattr(self, init), getattr(self, final)
                if self.schedule == "constant" and (a is None) != (b is None):
                    a = b = a if a is not None else b
                setattr(self, init, init_default if a is None else a)
                setattr(self, final, final_default if b is None else b)

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
        for name in ("kl_log_every", "kl_log_rollouts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} must be an integer >= 0 (0 turns the KL metric off)")
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
    `d3s_last_selection` holds what was chosen (kept rollout indices, N, K, token count, where the
    entropies came from), for inspection. See the module docstring for the order of the passes and
    what each one costs.
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
        if getattr(self, "_is_vlm", False):
            raise NotImplementedError(
                "D3SGRPOTrainer does not support vision-language models yet: the images (pixel_values, ...) "
                "would have to follow every row it selects; use trl.GRPOTrainer for this model"
            )
        self._d3s_rewards_per_func = None
        self._d3s_step_times = dict.fromkeys(STEP_TIME_PARTS, 0.0)
        self.d3s_last_selection: dict = {}
        self._d3s_initial_model = None  # frozen copy of the starting weights, for the KL metric at beta = 0
        for target in (self.model, self.ref_model):
            if target is not None:
                _add_selective_lm_head(
                    target.get_base_model() if is_peft_model(target) else target,
                    self.temperature,
                    self.args.cast_lm_head_to_fp32,
                )

    @property
    def d3s_active(self) -> bool:
        """Whether anything is down-sampled; when not (`variant="grpo"`/`"gspo"`), TRL's own computation runs."""
        settings = self.args.d3s_settings
        return settings.sample_selection != "none" or settings.token_selection

    # -- schedule (paper eq. 9) ---------------------------------------------------------------------

    def d3s_progress(self) -> float:
        """Training progress p of the current generation batch: 0 for the first, 1 for the last.

        p = (generation index) / (generations in the run - 1), counting generation batches of
        `steps_per_generation * num_iterations` micro-batches over `max_steps` optimizer steps of
        `gradient_accumulation_steps` micro-batches; 0 for a run with one generation. A pure function of
        the trainer state, so a resumed run continues the schedule exactly.
        """
        ga = self.args.gradient_accumulation_steps
        every = self.args.steps_per_generation * self.num_iterations
        total = math.ceil(max(self.state.max_steps, 0) * ga / every)
        if total <= 1:
            return 0.0
        index = (self.state.global_step * ga + self._step % ga) // every
        return min(max(index / (total - 1), 0.0), 1.0)

    # -- generation and selection -------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._d3s_rewards_per_func = rewards_per_func  # (B*G, F), all processes (TRL gathers them)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        capture = _GenerationEntropy(self) if training and not self.tools else contextlib.nullcontext()
        defer = _DeferredPasses(self) if training and self.d3s_active else contextlib.nullcontext()
        with self._d3s_timed("generation"), capture, defer:
            batch = super()._generate_and_score_completions(inputs)
        if not training:
            return batch  # evaluation: TRL's batch, no down-sampling
        _check_row_keys(batch)
        T = batch["completion_ids"].size(1)
        entropies = capture.entropies(batch["completion_mask"], T) if isinstance(capture, _GenerationEntropy) else None
        with self._d3s_timed("selection"):
            if self.d3s_active:
                return self._d3s_select(batch, entropies)
            self._d3s_log_plain(batch, entropies)
        return batch

    # -- where a step's time goes -------------------------------------------------------------------

    @contextlib.contextmanager
    def _d3s_timed(self, part: str):
        """Adds the wall-clock of the block to this optimizer step's `part` (training only; the device is
        synchronised at both ends on CUDA, so that queued kernels are counted where they were issued)."""
        if not self.model.training:
            yield
            return
        cuda = self.accelerator.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if cuda:
                torch.cuda.synchronize()
            self._d3s_step_times[part] += time.perf_counter() - start

    def training_step(self, model, inputs, num_items_in_batch):
        output = super().training_step(model, inputs, num_items_in_batch)  # TRL counts self._step, step_time
        if self._step % self.current_gradient_accumulation_steps == 0:  # the optimizer step's last micro-batch
            times, self._d3s_step_times = self._d3s_step_times, dict.fromkeys(STEP_TIME_PARTS, 0.0)
            times["selection"] -= times["kl_monitor"]  # measured inside the selection block
            metrics = self._metrics["train"]
            step_time = metrics["step_time"][-1] if metrics["step_time"] else sum(times.values())
            times["backward"] = max(step_time - sum(times.values()), 0.0)
            for part, seconds in times.items():
                metrics[f"d3s/time/{part}"].append(seconds)
        return output

    def _d3s_gather(self, tensor: torch.Tensor, pad_value, pad_first: bool) -> torch.Tensor:
        """Every rank's rows, rank order; the second axis padded to a common width first."""
        if self.accelerator.num_processes == 1:
            return tensor
        if tensor.dim() > 1:
            tensor = self.accelerator.pad_across_processes(tensor, dim=1, pad_index=pad_value, pad_first=pad_first)
        return self.accelerator.gather(tensor)

    def _d3s_rewards(self) -> torch.Tensor:
        """`(B*G,)` weighted rewards of all processes, NaN where no reward function scored the rollout."""
        rewards_per_func = self._d3s_rewards_per_func  # (B*G, F)
        device = rewards_per_func.device
        rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)  # (B*G,)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = float("nan")
        return rewards

    def _d3s_log_plain(self, batch: dict, entropies: torch.Tensor | None) -> None:
        """Metrics of a run that trains on TRL's batch unchanged (`grpo`, `gspo`)."""
        G = self.num_generations
        rewards = self._d3s_rewards()
        advantages = self.accelerator.gather(batch["advantages"])  # (B*G,)
        mask = _loss_mask(batch)
        valid = self.accelerator.gather(mask.sum(dim=1))  # (B*G,)
        n_valid = int(valid.sum())
        metrics = self._metrics["train"]
        metrics["d3s/progress"].append(self.d3s_progress())
        metrics["d3s/n_keep"].append(float(G))
        metrics["d3s/k_fraction"].append(1.0)
        metrics["d3s/rollouts_kept"].append(float(advantages.numel()))
        metrics["d3s/rollout_ratio"].append(1.0)
        metrics["d3s/tokens_in_loss"].append(float(n_valid))
        metrics["d3s/token_consumption_ratio"].append(1.0)
        exact = self._d3s_exact_advantages(rewards, advantages)
        metrics["d3s/sample_usefulness_rate"].append(
            sample_usefulness_rate(exact, torch.ones_like(exact, dtype=torch.bool), G).item()
        )
        metrics["d3s/advantage_variance"].append(population_variance(advantages).item())
        metrics["d3s/unscorable_rollouts"].append(float(torch.isnan(rewards).sum()))
        metrics["d3s/empty_completions"].append(float((valid == 0).sum()))
        self._d3s_log_generated_entropy(entropies, mask)
        self._d3s_monitor_kl(batch)
        self.d3s_last_selection = {
            "kept": torch.arange(advantages.numel()),
            "n_keep": G,
            "fraction": 1.0,
            "tokens_in_loss": n_valid,
            "entropy_source": "training forward",
        }

    def _d3s_exact_advantages(self, rewards: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        """TRL's advantages with exactly 0 where `d3s.group_advantages` gives 0.

        Those are the rollouts of a group whose valid rewards are all equal (TRL's float arithmetic
        can leave 1e-5-sized residues there for rewards such as 0.1) and the unscorable ones. Only the
        `sum_then_normalize` aggregation has this property; the other is returned unchanged.
        """
        if self.multi_objective_aggregation != "sum_then_normalize":
            return advantages
        reference = group_advantages(rewards, self.num_generations, scale_rewards=self.scale_rewards)  # (B*G,)
        return torch.where(reference == 0, torch.zeros_like(advantages), advantages)

    def _d3s_select(self, batch: dict, generation_entropies: torch.Tensor | None) -> dict:
        """Rewards -> advantages -> rollouts kept -> every per-rollout pass for the kept ones -> token mask."""
        settings = self.args.d3s_settings
        device = self.accelerator.device
        G, P, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        n_keep, fraction = settings.schedule_at(self.d3s_progress())

        rewards = self._d3s_rewards()  # (B*G,)
        advantages = self._d3s_exact_advantages(rewards, self.accelerator.gather(batch["advantages"]))  # (B*G,)
        S_local = batch["advantages"].size(0)
        batch["advantages"] = advantages[rank * S_local : (rank + 1) * S_local]
        loss_mask = _loss_mask(batch)  # (S_local, T)
        valid_per_row = self.accelerator.gather(loss_mask.sum(dim=1))  # (B*G,) loss tokens per rollout
        tokens_generated = int(valid_per_row.sum())
        self._d3s_log_generated_entropy(generation_entropies, loss_mask)
        self._d3s_monitor_kl(batch)

        if settings.sample_selection == "none":
            kept = torch.arange(advantages.numel(), device=device)  # (B*G,)
            kept_advantages = advantages
        else:
            selection = select_rollouts(
                advantages, rewards, G, n_keep, settings.sample_selection, scale_rewards=self.scale_rewards
            )
            kept, kept_advantages = selection.indices, selection.advantages  # (K,), (K,)
        if generation_entropies is not None:
            batch["d3s_entropies"] = generation_entropies  # (S_local, T), travels with its rows
        for key in _DEFERRED_KEYS:
            batch.pop(key, None)  # placeholders of the deferred passes; recomputed below for the kept rows
        slots = deal_rows(kept, P, self.args.steps_per_generation)  # (P, R)
        batch = self._d3s_take_rows(batch, slots[rank], advantages, kept, kept_advantages)
        padding_rows = slots.numel() - kept.numel()
        loss_mask = _loss_mask(batch)  # (R, T')

        passes = self._d3s_kept_row_passes(batch, loss_mask, need_entropy=settings.token_selection)
        n_valid = int(valid_per_row[kept].sum())  # loss tokens of the kept rollouts, all ranks
        n_rows, n_tokens = kept.numel(), n_valid
        entropy_source = None
        if settings.token_selection:
            entropies = batch.pop("d3s_entropies", None)
            entropy_source = "generation"
            if entropies is None:
                entropies, entropy_source = passes["entropies"], passes["entropy_source"]
            token_mask, rows_used, n_tokens, n_nonfinite = self._d3s_token_mask(
                batch["advantages"], entropies, loss_mask, fraction
            )
            batch["d3s_token_mask"] = token_mask  # (R, T')
            self._metrics["train"]["d3s/nonfinite_scores"].append(float(n_nonfinite))
            if settings.normalizer == "selected":
                n_rows = rows_used
        batch.pop("d3s_entropies", None)

        # Global counts shared by every micro-batch (0-dim tensors survive TRL's shuffle and split)
        denominator_tokens = n_tokens if settings.normalizer == "selected" else n_valid
        batch["d3s_num_rows"] = torch.tensor(float(n_rows), device=device)
        batch["d3s_num_tokens"] = torch.tensor(float(denominator_tokens), device=device)
        batch["num_items_in_batch"] = torch.tensor(float(n_valid), device=device)

        kept_mask = torch.zeros_like(advantages, dtype=torch.bool)
        kept_mask[kept] = True
        trained_advantages = torch.zeros_like(advantages)
        trained_advantages[kept] = kept_advantages
        metrics = self._metrics["train"]
        metrics["d3s/progress"].append(self.d3s_progress())
        metrics["d3s/n_keep"].append(float(n_keep))
        metrics["d3s/k_fraction"].append(float(fraction))
        metrics["d3s/rollouts_kept"].append(float(kept.numel()))
        metrics["d3s/rollout_ratio"].append(kept.numel() / advantages.numel())
        metrics["d3s/padding_rows"].append(float(padding_rows))
        metrics["d3s/tokens_in_loss"].append(float(n_tokens))
        metrics["d3s/token_consumption_ratio"].append(n_tokens / max(float(tokens_generated), 1.0))
        metrics["d3s/sample_usefulness_rate"].append(sample_usefulness_rate(trained_advantages, kept_mask, G).item())
        metrics["d3s/advantage_variance"].append(population_variance(kept_advantages).item())
        metrics["d3s/unscorable_rollouts"].append(float(torch.isnan(rewards).sum()))
        metrics["d3s/empty_completions"].append(float((valid_per_row == 0).sum()))
        self.d3s_last_selection = {
            "kept": kept.cpu(),
            "n_keep": n_keep,
            "fraction": fraction,
            "tokens_in_loss": n_tokens,
            "rows_per_rank": batch["completion_mask"].size(0),
            "kept_per_rank_before": torch.bincount(torch.div(kept, S_local, rounding_mode="floor"), minlength=P).cpu(),
            "entropy_source": entropy_source,
            **({"token_mask": self._d3s_all_token_mask} if settings.token_selection else {}),
        }
        return batch

    def _d3s_take_rows(self, batch, rows_global, advantages, kept, kept_advantages) -> dict:
        """This rank's share of the kept rows (`rows_global`: global indices, -1 = padding)."""
        real = rows_global >= 0  # (R,)
        rows = rows_global.clamp(min=0)  # (R,)
        trained = torch.zeros_like(advantages)  # (B*G,)
        trained[kept] = kept_advantages
        out = {}
        for key, (pad_value, pad_first) in _ROW_KEYS.items():
            if batch.get(key) is None:
                continue
            if key == "advantages":
                out[key] = trained[rows] * real  # (R,)
                continue
            pad_value = self._tokenizer.pad_token_id if pad_value is None else pad_value
            out[key] = self._d3s_gather(batch[key], pad_value, pad_first)[rows]  # (R, ...)
        out["completion_mask"] = out["completion_mask"] * real.unsqueeze(1)  # padding rows: no loss token
        # Drop completion columns that no kept row uses (right padding: no effect on the real tokens)
        if self.pad_to_multiple_of is None:
            width = max(last_used_column(out["completion_mask"]), 1)
            for key in _COMPLETION_AXIS_KEYS:
                if key in out and out[key].dim() > 1 and out[key].size(1) > width:
                    out[key] = out[key][:, :width]
        out["d3s_real"] = real
        return out

    @torch.no_grad()
    def _d3s_kept_row_passes(self, batch: dict, loss_mask: torch.Tensor, need_entropy: bool) -> dict:
        """Old-policy, reference and sampler-correction terms of the kept rows only (what TRL computes
        for every rollout before the rewards exist), plus entropies when no pass that runs anyway gave them.
        """
        generate_every = self.args.steps_per_generation * self.num_iterations
        vllm_correction = self.use_vllm and self.vllm_importance_sampling_correction
        need_old = self.args.gradient_accumulation_steps % generate_every != 0 or vllm_correction
        need_entropy = need_entropy and "d3s_entropies" not in batch
        out = {"entropies": None, "entropy_source": None}
        if need_old or need_entropy:
            logps, entropies = self._d3s_no_grad_logps(self.model, batch, loss_mask, entropy=need_entropy)
            if need_old:
                batch["old_per_token_logps"] = logps  # (R, T')
            if need_entropy:
                out["entropies"] = entropies
                out["entropy_source"] = "old-policy pass" if need_old else "extra no-grad pass"
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = self._d3s_reference_logps(batch, loss_mask)
        if vllm_correction:
            ratio = sampler_correction_ratio(
                batch["old_per_token_logps"],
                batch["sampling_per_token_logps"],
                loss_mask,
                self.vllm_importance_sampling_mode,
                self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max,
            )
            batch["importance_sampling_ratio"] = ratio
            self._d3s_replace_sampling_metrics(batch, loss_mask, ratio)
        return out

    def _d3s_no_grad_logps(self, model, batch, loss_mask, entropy: bool = False):
        """Log-probs (and entropies) of the valid completion tokens, in chunks of the training batch size."""
        chunk = self.args.per_device_train_batch_size
        logps, entropies = [], []
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            for start in range(0, loss_mask.size(0), chunk):
                rows = slice(start, start + chunk)
                lp, ent = self._d3s_forward(
                    model,
                    batch["prompt_ids"][rows],
                    batch["prompt_mask"][rows],
                    batch["completion_ids"][rows],
                    batch["completion_mask"][rows],
                    grad_positions=None,
                    value_positions=loss_mask[rows].bool(),
                    entropy=entropy,
                )
                logps.append(lp)
                entropies.append(ent)
        return torch.cat(logps), (torch.cat(entropies) if entropy else None)

    def _d3s_reference_logps(self, batch, loss_mask):
        if self.ref_model is not None:
            return self._d3s_no_grad_logps(self.ref_model, batch, loss_mask)[0]
        # PEFT: the reference is the base model (adapters off) or the "ref" adapter, as in TRL
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._d3s_no_grad_logps(self.model, batch, loss_mask)[0]

    def _d3s_replace_sampling_metrics(self, batch, loss_mask, ratio) -> None:
        """TRL logged its sampler metrics from placeholders; replace them with the kept rows' values."""
        metrics = self._metrics["train"]
        device = ratio.device
        delta = torch.abs(batch["old_per_token_logps"] - batch["sampling_per_token_logps"])
        mask = loss_mask.bool()
        delta = delta[mask & ~torch.isnan(delta)]
        flat = ratio.flatten() if ratio.size(1) == 1 else ratio[mask]
        stats = {
            "sampling/sampling_logp_difference/mean": (delta.mean() if delta.numel() else torch.zeros((), device=device), "mean"),
            "sampling/sampling_logp_difference/max": (delta.max() if delta.numel() else torch.zeros((), device=device), "max"),
            "sampling/importance_sampling_ratio/min": (flat.min() if flat.numel() else torch.zeros((), device=device), "min"),
            "sampling/importance_sampling_ratio/mean": (flat.mean() if flat.numel() else torch.zeros((), device=device), "mean"),
            "sampling/importance_sampling_ratio/max": (flat.max() if flat.numel() else torch.zeros((), device=device), "max"),
        }
        for name, (value, how) in stats.items():
            gathered = self.accelerator.gather(value.float().reshape(1))
            value = {"mean": gathered.nanmean(), "max": gathered.max(), "min": gathered.min()}[how].item()
            if metrics[name]:
                metrics[name][-1] = value
            else:
                metrics[name].append(value)

    # -- token level (paper eq. 8) ------------------------------------------------------------------

    def _d3s_token_mask(self, advantages, entropies, loss_mask, fraction):
        """Top-K% |A| x H over the rows of ALL ranks: one threshold, identical on every rank.

        Returns this rank's `(R, T)` mask, the rows (all ranks) with a kept token, the tokens kept
        (all ranks) and the number of non-finite scores (all ranks).
        """
        scores = token_scores(advantages, entropies.float(), loss_mask)  # (R, T), -inf at padding
        R, T = scores.shape
        all_scores = self._d3s_gather(scores, -float("inf"), False)  # (P*R, T_max)
        n_valid = int((all_scores > -float("inf")).sum())
        all_mask = top_tokens_mask(all_scores, num_tokens_to_keep(n_valid, fraction), n_valid=n_valid)
        self._d3s_all_token_mask = all_mask.cpu()
        n_nonfinite = int((all_scores == LOWEST_SCORE).sum())
        rank = self.accelerator.process_index
        mask = all_mask[rank * R : (rank + 1) * R, :T]
        return mask, int(all_mask.any(dim=1).sum()), int(all_mask.sum()), n_nonfinite

    # -- metrics: entropy of everything generated, KL to the initial policy --------------------------

    def _d3s_log_generated_entropy(self, entropies, loss_mask) -> None:
        """`entropy/generated`: mean policy entropy over every generated token of every rollout (all ranks)."""
        if entropies is None:
            return
        mask = loss_mask.to(entropies.dtype)
        totals = self.accelerator.reduce(torch.stack([(entropies * mask).sum(), mask.sum()]).float(), reduction="sum")
        value = (totals[0] / totals[1].clamp(min=1.0)).item()
        self._metrics["train"]["entropy/generated"].append(value)
        if self.d3s_active:  # TRL's `entropy` (plain runs log it from their training forward, over every token)
            self._metrics["train"]["entropy"].append(value)

    @torch.no_grad()
    def _d3s_monitor_kl(self, batch: dict) -> None:
        """At beta = 0, every `kl_log_every` generations: k3 KL(current || initial policy), token mean over
        the valid tokens of the first `kl_log_rollouts` rollouts of each process's generation batch.

        Cost: two no-grad forwards of those rollouts (current and initial weights) per measurement, and a
        frozen copy of the starting weights in memory (none with PEFT: the adapters are switched off).
        """
        every, n = self.args.kl_log_every, self.args.kl_log_rollouts
        if self.beta != 0.0 or every <= 0 or n <= 0:
            return
        ga = self.args.gradient_accumulation_steps
        index = (self.state.global_step * ga + self._step % ga) // (self.args.steps_per_generation * self.num_iterations)
        if index % every != 0:
            return
        with self._d3s_timed("kl_monitor"):
            self._d3s_measure_kl(batch, n)

    def _d3s_measure_kl(self, batch: dict, n: int) -> None:
        rows = {key: batch[key][:n] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
        if batch.get("tool_mask") is not None:
            rows["tool_mask"] = batch["tool_mask"][:n]
        mask = _loss_mask(rows)
        current = self._d3s_no_grad_logps(self.model, rows, mask)[0]
        model = self.accelerator.unwrap_model(self.model)
        if is_peft_model(model):
            with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                initial = self._d3s_no_grad_logps(self.model, rows, mask)[0]
        else:
            if self._d3s_initial_model is None:
                raise RuntimeError("the initial weights were not kept; was the trainer built before train()?")
            initial = self._d3s_no_grad_logps(self._d3s_initial_model, rows, mask)[0]
        delta = (initial - current) * mask
        kl = (torch.exp(delta) - delta - 1) * mask  # (n, T), k3
        totals = self.accelerator.reduce(torch.stack([kl.sum(), mask.sum().float()]), reduction="sum")
        self._metrics["train"]["kl"].append((totals[0] / totals[1].clamp(min=1.0)).item())

    def train(self, *args, **kwargs):
        # Keep the starting weights for the KL metric at beta = 0 (a resumed run keeps them too: the copy is
        # taken before the checkpoint is loaded).
        if self.beta == 0.0 and self.args.kl_log_every > 0 and self._d3s_initial_model is None:
            model = self.accelerator.unwrap_model(self.model)
            if not is_peft_model(model):
                if self.is_deepspeed_enabled or self.is_fsdp_enabled:
                    raise ValueError(
                        "kl_log_every > 0 at beta=0 keeps a frozen copy of the model, which is not supported under "
                        "DeepSpeed/FSDP; set kl_log_every=0, or beta > 0 (the KL to the reference is then logged)"
                    )
                self._d3s_initial_model = copy.deepcopy(model).eval().requires_grad_(False)
        return super().train(*args, **kwargs)

    # -- the selective forward ----------------------------------------------------------------------

    def _d3s_forward(
        self,
        model,
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        *,
        grad_positions: torch.Tensor | None,
        value_positions: torch.Tensor | None,
        entropy: bool = False,
    ):
        """`(per_token_logps, entropies)`, `(S, T)`, scored only where asked, zeros elsewhere.

        The forward stops at the last column any row needs (a causal model's earlier outputs do not
        depend on later positions) and the LM head runs only at `grad_positions` (with gradient) and
        `value_positions` (without). Entropies are returned at every scored position when `entropy`.
        """
        S, T = completion_ids.shape
        wanted = grad_positions if value_positions is None else value_positions
        if grad_positions is not None and value_positions is not None:
            wanted = grad_positions | value_positions
        W = max(last_used_column(wanted), 1)
        input_ids = torch.cat([prompt_ids, completion_ids[:, :W]], dim=1)  # (S, P+W)
        attention_mask = torch.cat([prompt_mask, completion_mask[:, :W]], dim=1)  # (S, P+W)
        positions = {
            "labels": completion_ids[:, :W],
            "grad": None if grad_positions is None else grad_positions[:, :W].bool(),
            "values": None if value_positions is None else value_positions[:, :W].bool(),
            "entropy": entropy,
        }
        with self.accelerator.autocast():
            logps, entropies = model(input_ids=input_ids, attention_mask=attention_mask, d3s_positions=positions)
        if grad_positions is not None:
            self._d3s_count_computed(input_ids.numel())
        if W < T:  # (S, W) -> (S, T)
            logps = torch.nn.functional.pad(logps, (0, T - W))
            entropies = None if entropies is None else torch.nn.functional.pad(entropies, (0, T - W))
        return logps, entropies

    def _d3s_count_computed(self, positions: int) -> None:
        """`d3s/tokens_computed`: positions of the training forward (with gradient), all ranks, summed over
        the step's micro-batches (TRL averages a step's values, hence the factor)."""
        total = self.accelerator.reduce(torch.tensor(float(positions), device=self.accelerator.device), reduction="sum")
        self._metrics["train"]["d3s/tokens_computed"].append(float(total) * self.current_gradient_accumulation_steps)

    # -- loss (paper eqs. 1, 3, 10) -----------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        with self._d3s_timed("forward"):
            return self._d3s_compute_loss(model, inputs)

    def _d3s_compute_loss(self, model, inputs):
        if not self.d3s_active or not self.model.training:
            loss = super()._compute_loss(model, inputs)  # TRL's own computation (plain GRPO/GSPO, evaluation)
            if self.model.training:
                self._d3s_count_computed(inputs["prompt_ids"].numel() + inputs["completion_ids"].numel())
                if self._metrics["train"]["entropy"]:
                    self._metrics["train"]["entropy/trained"].append(self._metrics["train"]["entropy"][-1])
            return loss
        settings = self.args.d3s_settings
        completion_mask = inputs["completion_mask"]
        mask = _loss_mask(inputs)  # (S, T)
        token_mask = inputs.get("d3s_token_mask")  # (S, T) or None
        used = mask.bool() if token_mask is None else mask.bool() & token_mask  # (S, T)
        advantages = inputs["advantages"]  # (S,)
        old_per_token_logps = inputs.get("old_per_token_logps")  # (S, T) or None (on-policy)
        gspo = settings.importance_sampling_level == "sequence_token"

        # A micro-batch whose gradient is exactly zero runs a 1-token forward instead (same update)
        dead = not used.any() or (
            self.beta == 0.0 and not self.aux_loss_enabled and bool((advantages[used.any(dim=1)] == 0).all())
        )
        if dead:
            return self._d3s_zero_loss(model, inputs)

        # Where the log-probs must exist: with gradient at the used tokens (all valid tokens when the
        # GSPO sequence ratio carries gradient into the KL), values at every valid token when a term
        # reads them (GSPO's sequence ratio off-policy, TRL's off-policy mask).
        kl_through_sequence = gspo and self.beta != 0.0 and self.args.use_bias_correction_kl
        grad_positions = mask.bool() if kl_through_sequence else used
        needs_values = (gspo and old_per_token_logps is not None) or self.off_policy_mask_threshold is not None
        value_positions = mask.bool() if needs_values else None
        logps, entropies = self._d3s_forward(
            model,
            inputs["prompt_ids"],
            inputs["prompt_mask"],
            inputs["completion_ids"],
            completion_mask,
            grad_positions=grad_positions,
            value_positions=value_positions,
            entropy=True,
        )
        # Positions that were not scored read as "no change" (ratio 1, KL 0): they never enter the loss
        scored = grad_positions if value_positions is None else grad_positions | value_positions
        fill = torch.zeros_like(logps) if old_per_token_logps is None else old_per_token_logps.to(logps.dtype)
        per_token_logps = torch.where(scored, logps, fill)  # (S, T)
        ref = inputs.get("ref_per_token_logps")
        if ref is not None:
            ref = torch.where(scored, ref, per_token_logps.detach())

        weights = None  # multiplicative per-token weights TRL applies to the surrogate
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

        real = inputs.get("d3s_real")
        aggregation, denominator, accumulation = loss_denominator(
            self.loss_type,
            num_rows=int(inputs["d3s_num_rows"]),
            num_tokens=int(inputs["d3s_num_tokens"]),
            num_processes=self.accelerator.num_processes,
            gradient_accumulation_steps=self.current_gradient_accumulation_steps,
            steps_per_generation=self.args.steps_per_generation,
            rows_in_micro_batch=int(real.sum()) if real is not None else completion_mask.size(0),
            max_completion_length=self.max_completion_length,
        )
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
            ref_per_token_logps=ref,
            normalizer=settings.normalizer,
            aggregation=aggregation,
            denominator=denominator,
            importance_sampling_ratio=weights,
            kl_importance_weighted=self.args.use_bias_correction_kl,
        )
        loss = loss / accumulation
        self._d3s_log_loss_metrics(metrics, per_token_logps, old_per_token_logps, advantages, used, entropies)
        return loss

    def _d3s_zero_loss(self, model, inputs):
        """A loss of exactly 0 whose backward reaches every parameter: a 1-token forward of the first row.

        The update then equals that of the full computation (zero gradients, the optimizer still steps:
        AdamW's moments decay and move the weights), through the same model call as every other micro-batch,
        so DDP/DeepSpeed/FSDP see an ordinary backward.
        """
        one = torch.ones(1, 1, dtype=torch.bool, device=inputs["completion_ids"].device)
        logps, _ = self._d3s_forward(
            model,
            inputs["prompt_ids"][:1, -1:],
            torch.ones_like(inputs["prompt_mask"][:1, -1:]),
            inputs["completion_ids"][:1, :1],
            torch.ones_like(inputs["completion_mask"][:1, :1]),
            grad_positions=one,
            value_positions=None,
        )
        advantages = inputs["advantages"]
        self._d3s_log_loss_metrics(None, None, None, advantages, None, None)
        return (logps * 0.0).sum()

    def _d3s_log_loss_metrics(self, metrics, per_token_logps, old_per_token_logps, advantages, used, entropies):
        """TRL's loss metrics over the tokens in the loss, reduced over all ranks.

        Every rank makes the same collective calls in the same order, also a rank whose micro-batch
        skipped its forward (`metrics` None: it contributes no token).
        """
        device = advantages.device
        names = ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]
        if self.beta != 0.0:
            names.append("kl")
        if metrics is None:
            sums = torch.zeros(2 + len(names), device=device)
            low = high = torch.full((1,), float("nan"), device=device)
        else:
            u = used.to(per_token_logps.dtype)
            n_used = metrics["tokens_used"]
            sums = torch.stack(
                [(entropies.detach().float() * u).sum(), n_used.float()] + [(metrics[n] * n_used).float() for n in names]
            )
            # TRL's per-sequence extremes: the lowest share of low-clipped and the highest of high-clipped tokens
            with torch.no_grad():
                old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
                coef = torch.exp(per_token_logps.detach() - old)  # (S, T)
                adv = advantages.unsqueeze(1)
                count = u.sum(1).clamp(min=1.0)
                low = (((coef < 1 - self.epsilon_low) & (adv < 0)).to(u.dtype) * u).sum(1) / count
                high = (((coef > 1 + self.epsilon_high) & (adv > 0)).to(u.dtype) * u).sum(1) / count
                rows = used.any(dim=1)
                low = torch.where(rows, low, torch.full_like(low, float("nan"))).float()
                high = torch.where(rows, high, torch.full_like(high, float("nan"))).float()
        train = self._metrics["train"]
        skipped = self.accelerator.reduce(torch.tensor(float(metrics is None), device=device), reduction="mean")
        train["d3s/skipped_forwards"].append(float(skipped))  # share of (rank, micro-batch) forwards skipped
        totals = self.accelerator.reduce(sums, reduction="sum")
        n = totals[1].clamp(min=1.0)
        if float(totals[1]) > 0:
            train["entropy/trained"].append((totals[0] / n).item())
            if "entropy/generated" not in train:
                train["entropy"].append((totals[0] / n).item())
            for i, name in enumerate(names):
                train[name].append((totals[2 + i] / n).item())
        low_all = self.accelerator.gather(self.accelerator.pad_across_processes(low, pad_index=float("nan")))
        high_all = self.accelerator.gather(self.accelerator.pad_across_processes(high, pad_index=float("nan")))
        if not torch.isnan(low_all).all():
            train["clip_ratio/low_min"].append(nanmin(low_all).item())
            train["clip_ratio/high_max"].append(nanmax(high_all).item())


_DEFERRED_KEYS = ("old_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio")


STEP_TIME_PARTS = ("generation", "selection", "kl_monitor", "forward")
"""Parts of an optimizer step timed directly; `backward` is TRL's `step_time` minus these."""


def _loss_mask(batch: dict) -> torch.Tensor:
    mask = batch["completion_mask"]
    return mask if batch.get("tool_mask") is None else mask * batch["tool_mask"]


def _check_row_keys(batch: dict) -> None:
    unknown = sorted(k for k, v in batch.items() if v is not None and k not in (*_ROW_KEYS, "num_items_in_batch"))
    if unknown:
        raise NotImplementedError(
            f"D3SGRPOTrainer cannot carry the batch keys {unknown} (multimodal inputs are not supported yet); "
            "use trl.GRPOTrainer for this model"
        )


class _DeferredPasses:
    """While TRL generates and scores, its per-rollout no-grad passes (old-policy and reference log-probs)
    return placeholders: they run afterwards for the kept rollouts only (`_d3s_kept_row_passes`)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def __enter__(self):
        def placeholder(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            zeros = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
            return zeros, None, None

        self.trainer._get_per_token_logps_and_entropies = placeholder  # shadows the method on this instance
        return self

    def __exit__(self, *exc):
        del self.trainer._get_per_token_logps_and_entropies
        return False


class _GenerationEntropy:
    """Records the policy entropy of every generated token from the logits that transformers' `generate`
    computes anyway: a forward hook on the model, one `(rows,)` entropy per decoding step.

    These are the rollout policy's entropies, i.e. the current policy's at the first update on the
    batch (generation uses the weights of that update). Unavailable (None) under vLLM, a custom
    `rollout_func` or tool calling, where no such logits pass through the model.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.steps: list[torch.Tensor] = []
        self.handle = None

    def __enter__(self):
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        model = model.get_base_model() if is_peft_model(model) else model
        temperature = self.trainer.temperature

        def hook(module, args, output):
            logits = getattr(output, "logits", None)
            if logits is None or logits.dim() != 3 or torch.is_grad_enabled():
                return
            z = logits[:, -1].float() / temperature  # (rows, V)
            self.steps.append(token_entropy(z))  # (rows,)

        self.handle = model.register_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
        return False

    def entropies(self, completion_mask: torch.Tensor, width: int) -> torch.Tensor | None:
        """`(S, width)` entropies aligned with the completion tokens, or None if generation gave none."""
        if not self.steps or any(s.numel() != completion_mask.size(0) for s in self.steps):
            return None
        entropies = torch.stack(self.steps, dim=1).to(completion_mask.device)  # (S, steps)
        lengths = completion_mask.sum(dim=1)
        if lengths.numel() and int(lengths.max()) > entropies.size(1):
            return None  # a completion longer than what was observed: not this batch's generation
        if entropies.size(1) >= width:
            return entropies[:, :width]
        return torch.nn.functional.pad(entropies, (0, width - entropies.size(1)))


def _head_scales(config) -> tuple[float | None, float]:
    """`(final_logit_softcapping, logit_scale)` the LM head applies, read from the model config as TRL does."""
    text_config = config.get_text_config()
    softcap = getattr(text_config, "final_logit_softcapping", None)
    scale = getattr(text_config, "logit_scale", None)
    if scale is None:
        scale = getattr(text_config, "output_multiplier", None)
    if scale is None:
        scale = getattr(text_config, "lm_head_multiplier", None)
    if scale is None and getattr(text_config, "logits_scaling", None) is not None:
        scale = text_config.logits_scaling if text_config.model_type == "hyperclovax" else 1 / text_config.logits_scaling
    return softcap, 1.0 if scale is None else scale


def _add_selective_lm_head(model, temperature: float, cast_lm_head_to_fp32: bool) -> None:
    """Let `model(..., d3s_positions=...)` return `(per_token_logps, entropies)` scored at chosen positions.

    The backbone runs once over the given columns; the LM head and its log-softmax (TRL's chunked
    kernel, so the values are TRL's) run with gradient at `d3s_positions["grad"]` and without at
    `d3s_positions["values"]`, nowhere else. Any other call goes to the previous forward unchanged.
    Installed through `forward`, so the call passes through DDP/DeepSpeed/FSDP wrappers as usual.
    """
    if getattr(model, "_d3s_selective_head", False):
        return
    previous = model.forward
    softcap, logit_scale = _head_scales(model.config)

    @functools.wraps(type(model).forward)
    def forward(self, *args, d3s_positions=None, **kwargs):
        if d3s_positions is None:
            return previous(*args, **kwargs)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state  # (S, L, H)
        labels = d3s_positions["labels"]  # (S, W)
        W = labels.size(1)
        hidden = hidden[:, -W - 1 : -1]  # (S, W, H): position t predicts completion token t
        lm_head = self.get_output_embeddings()
        weight, bias = lm_head.weight, lm_head.bias
        if hasattr(weight, "full_tensor"):  # FSDP2 DTensor
            weight = weight.full_tensor()
            bias = None if bias is None else bias.full_tensor()
        outputs = ("log_probs", "entropy") if d3s_positions["entropy"] else ("log_probs",)

        def score(where: torch.Tensor):
            h = hidden[where]  # (n, H)
            ctx = contextlib.nullcontext()
            if cast_lm_head_to_fp32:
                h, ctx = h.float(), torch.autocast(h.device.type, enabled=False)
            with ctx, maybe_gather_lm_head_ctx(weight, bias):
                logps, ent, *_ = ChunkedLogProbFunction.apply(
                    h, weight, bias, labels[where], temperature, _CHUNKED_LOGPROB_CHUNK_SIZE, softcap, logit_scale,
                    outputs,
                )
            return logps, ent

        zeros = torch.zeros(labels.shape, dtype=torch.float32, device=labels.device)
        logps, entropies = zeros, (zeros if d3s_positions["entropy"] else None)
        grad, values = d3s_positions["grad"], d3s_positions["values"]
        if grad is not None and grad.any():
            lp, ent = score(grad)
            logps = zeros.masked_scatter(grad, lp.float())  # keeps the graph
            if ent is not None:
                entropies = zeros.masked_scatter(grad, ent.detach().float())
        rest = values if grad is None else (values & ~grad if values is not None else None)
        if rest is not None and rest.any():
            with torch.no_grad():
                lp, ent = score(rest)
            logps = logps + zeros.masked_scatter(rest, lp.float())
            if ent is not None:
                entropies = entropies + zeros.masked_scatter(rest, ent.float())
        return logps, entropies

    model.forward = types.MethodType(forward, model)
    model._d3s_selective_head = True
