"""`D3SConfig`: TRL's `GRPOConfig` plus the D3S fields, resolved and validated once, before any model loads.

A named `variant` fills the D3S fields left unset (`d3s.variants`); the result is available as a
validated `d3s.Variant` (`d3s_settings`). TRL options the D3S path does not support are refused here
with a message naming the value and what would be valid.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field

from d3s.integrations.trl.compat import GRPOConfig
from d3s.integrations.trl.decoding import check_generation_settings
from d3s.variants import Variant, get_variant, paired, scaled_count

DEFAULT_KL_LOG_EVERY = 5
"""`kl_log_every` when it is not set and the model is not sharded."""

SUPPORTED_LOSS_TYPES = ("grpo", "dapo", "bnpo", "dr_grpo")


def _h(text: str) -> dict:
    return {"help": text}


def _check_bool_fields(config) -> None:
    """Refuse a value that is not True, False (or None) in every field annotated `bool` or `bool | None`, TRL's
    included: a string such as `"false"` is truthy and would silently turn the option on."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        if f.init and hints.get(f.name) in (bool, bool | None, typing.Optional[bool]):
            value = getattr(config, f.name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{f.name}={value!r} must be True or False")


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
            "re-normalised); the controls 'random' (as many as 'cross' would keep, chosen uniformly at random, seeded per "
            "step) and 'random-intra' (as many as 'intra', at random), which are not methods but the test of whether "
            "max-variance selection matters (docs/method.md section 9.3). Default 'none'."
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
    # Options beyond the paper (docs/method.md section 9.2); the defaults are the paper's method
    token_cut: str | None = field(
        default=None,
        metadata=_h(
            "Where the top-K token cut is taken (with token selection): 'batch' (the paper: one threshold over all "
            "kept tokens), 'sign' (the budget split between positive and negative advantages in proportion to their "
            "token counts, so an update stays two-sided), 'rollout' (the top K of each kept rollout). Default: the "
            "variant's, else 'batch'."
        ),
    )
    min_tokens_per_rollout: int | None = field(
        default=None,
        metadata=_h(
            "With token selection: every kept rollout with a non-zero advantage also keeps its top this-many tokens "
            "(a floor for short completions). Default: the variant's, else 0 (the paper): no floor."
        ),
    )
    keep_last_in_loss: bool | None = field(
        default=None,
        metadata=_h(
            "With token selection: every kept rollout with a non-zero advantage also keeps its last token (its "
            "end-of-sequence token when it stopped, so the loss always holds the choice to stop). Default: the "
            "variant's, else False (the paper)."
        ),
    )
    schedule_clock: str | None = field(
        default=None,
        metadata=_h(
            "What the linear N/K schedule's progress counts: 'steps' (the paper) or 'learning_rate' (the share of the "
            "learning-rate schedule already spent, so the cuts relax while the steps are still large). Default: the "
            "variant's, else 'steps'."
        ),
    )
    kl_log_every: int | None = field(
        default=None,
        metadata=_h(
            "At beta=0, log `kl` (k3 KL of the current to the initial policy) every this many generation batches; "
            "0 turns it off. Default 5, and 0 under DeepSpeed or FSDP (the frozen copy of the initial weights is "
            "not sharded there). Cost per measurement: two no-grad forwards of `kl_log_rollouts` rollouts per "
            "process, and a frozen copy of the initial weights in memory (none with PEFT). At beta != 0 the KL to "
            "the reference is logged every step at no extra cost."
        ),
    )
    kl_log_rollouts: int = field(
        default=8, metadata=_h("Rollouts per process (the first of each generation batch) the KL metric is measured on.")
    )
    # Which prompts a generation batch holds (docs/method.md section 9.1): departures from the paper, off by default
    prompt_skip: bool = field(
        default=False,
        metadata=_h(
            "Skip, before generating, prompts whose recent groups all had equal rewards (GRESO, arXiv 2506.02177): "
            "a prompt flat in its last z generation batches in a row is skipped with probability "
            "1 - prompt_skip_explore**z and replaced by another prompt of the dataset, so the batch keeps its size."
        ),
    )
    prompt_skip_explore: float = field(
        default=0.5,
        metadata=_h("GRESO's exploration probability p_e in (0, 1]: a prompt flat z times in a row is still generated "
                    "with probability p_e**z (1 never skips)."),
    )
    prompt_skip_history: int = field(
        default=8,
        metadata=_h("Most flat generation batches in a row a prompt's history counts (z is capped there, so a prompt "
                    "is always retried with probability at least prompt_skip_explore**prompt_skip_history)."),
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata=_h(
            "DAPO's dynamic sampling (arXiv 2503.14476): after scoring, drop the groups whose rewards are all equal "
            "and generate more prompts until the generation batch holds as many groups with signal as it has "
            "prompts, or dynamic_sampling_max_rounds extra rounds were generated (then flat groups fill the rest)."
        ),
    )
    dynamic_sampling_max_rounds: int = field(
        default=3, metadata=_h("Extra generation rounds one generation batch may take with dynamic_sampling (>= 0).")
    )
    skip_steps_without_signal: bool = field(
        default=False,
        metadata=_h(
            "Skip the optimizer step when the step's gradient is exactly zero (every trained rollout has advantage 0 "
            "and no KL or router term): the weights and the optimizer's state stay as they were, where Adam would "
            "still move them on its momentum. Off: TRL's behaviour. Not with DeepSpeed or FSDP (docs/method.md "
            "section 9.4)."
        ),
    )

    shared_prefill_generation: bool = field(
        default=False,
        metadata=_h(
            "Generate with transformers (no vLLM) prefilling each distinct prompt once for its rollouts and "
            "dropping finished rollouts from the decode batch: the same completions' distribution as TRL's "
            "generate, less work (docs/trl.md). Off: TRL's generate exactly."
        ),
    )

    def __post_init__(self):
        _check_bool_fields(self)  # before TRL's own checks read them: `"false"` would count as true
        super().__post_init__()
        self._resolve_d3s()
        self._check_trl_options()
        self._check_prompt_options()
        self._check_step_options()
        self._check_generation_options()

    def _check_generation_options(self) -> None:
        if not self.shared_prefill_generation:
            return
        for name in ("use_vllm", "use_transformers_continuous_batching"):
            if getattr(self, name, False):
                raise ValueError(
                    f"shared_prefill_generation=True and {name}=True: both choose how completions are generated; "
                    f"set one of them False"
                )
        check_generation_settings({"repetition_penalty": self.repetition_penalty,
                                   "cache_implementation": self.cache_implementation,
                                   **(self.generation_kwargs or {})})

    def _check_step_options(self) -> None:
        if self.skip_steps_without_signal and self.d3s_sharded:
            raise ValueError(
                "skip_steps_without_signal=True under DeepSpeed or FSDP: the engine owns the gradients and the "
                "optimizer step there; set skip_steps_without_signal=False"
            )

    def _check_prompt_options(self) -> None:
        if isinstance(self.prompt_skip_explore, bool) or not 0.0 < float(self.prompt_skip_explore) <= 1.0:
            raise ValueError(f"prompt_skip_explore={self.prompt_skip_explore!r} must be a probability in (0, 1]")
        for name in ("prompt_skip_history", "dynamic_sampling_max_rounds"):
            value, low = getattr(self, name), 1 if name == "prompt_skip_history" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} must be an integer >= {low}")

    @property
    def d3s_chooses_prompts(self) -> bool:
        """Whether the trainer changes which prompts a generation batch holds (`prompt_skip`, `dynamic_sampling`)."""
        return bool(self.prompt_skip or self.dynamic_sampling)

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

            defaults = {
                "sample_selection": v.sample_selection,
                "token_selection": v.token_selection,
                "schedule": v.schedule,
                "normalizer": v.normalizer,
                "token_cut": v.token_cut,
                "min_tokens_per_rollout": v.min_tokens_per_rollout,
                "keep_last_in_loss": v.keep_last_in_loss,
                "schedule_clock": v.schedule_clock,
            }
            for name, value in defaults.items():
                if getattr(self, name) is None:
                    setattr(self, name, value)
            # Explicit values follow `d3s.variants.paired`; the variant's N (given for G = 32) is scaled to G
            pairs = []
            if v.sample_selection != "none" and self.sample_selection != "none":
                pairs.append(("n_init", "n_final", scaled_count(v.n_init, G, v.num_generations),
                              scaled_count(v.n_final, G, v.num_generations)))
            if v.token_selection and self.token_selection:
                pairs.append(("k_init", "k_final", v.k_init, v.k_final))
            for init, final, init_default, final_default in pairs:
                a, b = paired(getattr(self, init), getattr(self, final), self.schedule)
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
        if self.token_cut is None:
            self.token_cut = "batch"
        if self.min_tokens_per_rollout is None:
            self.min_tokens_per_rollout = 0
        if self.keep_last_in_loss is None:
            self.keep_last_in_loss = False
        if self.schedule_clock is None:
            self.schedule_clock = "steps"
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
        if self.kl_log_every is None:
            self.kl_log_every = 0 if self.d3s_sharded else DEFAULT_KL_LOG_EVERY
            self._d3s_kl_default = True  # not the user's choice: the trainer may still turn it off (sharding)
        for name in ("kl_log_every", "kl_log_rollouts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} must be an integer >= 0 (0 turns the KL metric off)")
        _ = self.d3s_settings  # Variant validates: ranges, constant schedule with init != final, the token-cut options

    @property
    def d3s_sharded(self) -> bool:
        """Whether the model will be sharded (DeepSpeed or FSDP), as far as the arguments and `accelerate launch`'s
        environment tell before the trainer exists."""
        launched = any(
            os.environ.get(name, "false").lower() in ("1", "true", "yes")
            for name in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP")
        )
        return bool(self.deepspeed or self.fsdp or launched)

    @property
    def d3s_active(self) -> bool:
        """Whether anything is down-sampled. When not (no variant, `grpo`, `gspo`), the trainer runs TRL's own
        computation and accepts every option TRL does."""
        return self.sample_selection != "none" or bool(self.token_selection)

    def _check_trl_options(self) -> None:
        """TRL options the D3S path does not implement are refused while something is down-sampled."""
        if not self.d3s_active:
            return
        what = f"with D3S down-sampling on (variant={self.variant!r})"
        if self.loss_type not in SUPPORTED_LOSS_TYPES:
            raise ValueError(
                f"loss_type={self.loss_type!r} is not supported {what}; valid: "
                f"{', '.join(map(repr, SUPPORTED_LOSS_TYPES))} (or variant='grpo' for TRL's own loss)"
            )
        if self.top_entropy_quantile != 1.0:
            if self.token_selection:
                raise ValueError(
                    f"top_entropy_quantile={self.top_entropy_quantile} (TRL's entropy mask) and D3S "
                    "token_selection=True both mask tokens; use one: D3S's k_init/k_final, or "
                    "top_entropy_quantile=1.0"
                )
            raise ValueError(
                f"top_entropy_quantile={self.top_entropy_quantile} is not supported {what}; use "
                "token_selection=True with k_init/k_final, or top_entropy_quantile=1.0"
            )
        if self.delta is not None:
            raise ValueError(f"delta={self.delta} (two-sided clipping) is not supported {what}; use None")
        if self.entropy_coef != 0.0 or self.use_adaptive_entropy:
            raise ValueError(
                f"entropy_coef={self.entropy_coef}, use_adaptive_entropy={self.use_adaptive_entropy}: the entropy "
                f"bonus is not supported {what}; use entropy_coef=0.0, use_adaptive_entropy=False"
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
            token_cut=self.token_cut,
            min_tokens_per_rollout=self.min_tokens_per_rollout,
            keep_last_in_loss=self.keep_last_in_loss,
            schedule_clock=self.schedule_clock,
        )


D3SGRPOConfig = D3SConfig
"""The config's name beside `D3SGRPOTrainer`, as TRL pairs `GRPOConfig` with `GRPOTrainer`."""
