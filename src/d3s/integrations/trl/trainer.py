"""`D3SGRPOTrainer`: TRL's `GRPOTrainer` that trains on the D3S-selected rollouts and tokens. The algorithm path only.

With nothing down-sampled (`variant="grpo"` or `"gspo"`) the trainer IS TRL's: its generation,
advantages and loss run unchanged, and only metrics are added. Otherwise one generation batch goes
through these steps (the paper's order: select first, then compute; docs/architecture.md has the
whole data flow):

1. TRL generates and scores every rollout (with `shared_prefill_generation`, through `decoding`: each
   distinct prompt prefilled once); its per-rollout no-grad passes are deferred, and the entropies of
   the generated tokens come from generation's own logits (`generation`).
2. Advantages: TRL's, with exactly 0 for a group of equal rewards (`d3s.advantages.zero_where_flat`).
3. Sample selection (docs/method.md section 2) on the advantages of ALL processes, so every rank
   computes the same kept set; the kept rows are dealt out again evenly (`d3s.batch.deal_rows`, `rows`).
4. The no-grad passes for the kept rows only (`passes`).
5. The token mask (section 3): ONE threshold over the kept rows of all ranks.
6. The training forward stops at the last column holding a kept token and runs the LM head (with gradient)
   only at the kept tokens (`selective_head`); a micro-batch whose gradient is exactly zero runs a 1-token
   forward instead (`d3s/skipped_forwards`).
7. The loss (`d3s.policy_loss`) divides by global counts over the generation batch (`loss_denominator`),
   so the update does not depend on how TRL splits the rows.

Steps 2-5 run in `selection`. Given the same kept rows and token mask, steps 4-6 change the cost, never the update
(tested). What every pass computes: `positions` (`d3s_positions`, from which `d3s train` counts FLOPs). Metrics and
step timing: `step_metrics`; the KL metric at beta = 0: `kl_monitor`; reward functions' outputs checked: `rewards`;
the TRL methods overridden, called or read: `compat.PRIVATE_TRL_API`. Evaluation (`eval_strategy`) scores TRL's
full eval batch with TRL's objective.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import ProcessorMixin

from d3s.advantages import weighted_rewards
from d3s.batch import loss_denominator
from d3s.integrations.trl import optimizer_steps, passes, positions, prompts, selection, step_metrics, token_mask
from d3s.integrations.trl.compat import GRPOTrainer, is_peft_model
from d3s.integrations.trl.config import D3SConfig
from d3s.integrations.trl.generation import (CountedPasses, DeferredPasses, GenerationEntropy, counted_rollout_func,
                                             shared_prefill_turn, turn_positions)
from d3s.integrations.trl.kl_monitor import KLMonitor
from d3s.integrations.trl.rewards import checked_reward_funcs
from d3s.integrations.trl.rows import check_row_keys, loss_mask
from d3s.integrations.trl.selective_head import add_selective_lm_head, selective_forward
from d3s.loss import policy_loss
from d3s.prompt_filter import flat_groups
from d3s.schedule import generation_index, generation_progress, learning_rate_progress


class D3SGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` that trains on the D3S-selected rollouts and tokens. Thin glue over `d3s`.

    Use it exactly like `GRPOTrainer` with a `D3SConfig`. After every generation,
    `d3s_last_selection` holds what was chosen (kept rollout indices, N, K, token count, where the
    entropies came from), for inspection. See the module docstring for the order of the passes and
    what each one costs.
    """

    _tag_names = ["trl", "grpo", "d3s"]
    _name = "D3S-GRPO"

    def __init__(self, model, reward_funcs=None, args: D3SConfig | None = None, *rest, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = D3SConfig(f"{name.split('/')[-1]}-D3S")
        if not isinstance(args, D3SConfig):
            raise TypeError(f"D3SGRPOTrainer needs a D3SConfig (a GRPOConfig subclass), got {type(args).__name__}")
        super().__init__(model, checked_reward_funcs(reward_funcs), args, *rest, **kwargs)
        if isinstance(self.processing_class, ProcessorMixin):  # TRL's test of a vision-language model
            raise NotImplementedError(
                "D3SGRPOTrainer does not support vision-language models yet: the images (pixel_values, ...) "
                "would have to follow every row it selects; use trl.GRPOTrainer for this model"
            )
        self.d3s_last_selection: dict = {}
        self._d3s_rewards_per_func: torch.Tensor | None = None  # (B*G, F) of the current generation batch
        self._d3s_timer = step_metrics.StepTimer(self.accelerator.device)
        self.add_callback(step_metrics.StepEnd(self._d3s_timer, self._metrics["train"]))
        self._d3s_kl = KLMonitor(self.args.kl_log_every, self.args.kl_log_rollouts)
        self.d3s_positions = positions.Positions()  # positions computed: `d3s train`'s FLOPs are read from them
        if self.rollout_func is not None:  # a custom generation: counted from the ids it returns
            self.rollout_func = counted_rollout_func(self, self.rollout_func)
        self._d3s_prompts = None  # which prompts a generation batch holds (`prompts`), when an option is on
        self.d3s_prompt_hashes: list[str] = []  # the current generation batch's distinct prompts (`prompts.hashes`)
        if self.args.d3s_chooses_prompts:
            self._d3s_prompts = prompts.PromptChooser(
                self.train_dataset, seed=self.args.seed, explore=self.args.prompt_skip_explore,
                history=self.args.prompt_skip_history, skip=self.args.prompt_skip,
            )
        self._d3s_diagnosis = step_metrics.TokenCutDiagnosis(self.args)
        for target in (self.model, self.ref_model):
            if target is not None:
                add_selective_lm_head(
                    target.get_base_model() if is_peft_model(target) else target,
                    self.temperature,
                    self.args.cast_lm_head_to_fp32,
                )

    @property
    def d3s_active(self) -> bool:
        """Whether anything is down-sampled; when not (`variant="grpo"`/`"gspo"`), TRL's own computation runs."""
        return self.args.d3s_active

    # -- schedule (paper eq. 9) ---------------------------------------------------------------------

    def d3s_generation_index(self) -> int:
        """Index (from 0) of the current generation batch (`d3s.schedule.generation_index`)."""
        return generation_index(self.state.global_step, self._step, self.args.gradient_accumulation_steps,
                                self.args.steps_per_generation * self.num_iterations)

    def d3s_progress(self) -> float:
        """Training progress p of the current generation batch: 0 for the first, 1 for the last.
        `d3s.schedule.generation_progress` of the trainer's counters: a resumed run continues the schedule exactly."""
        every = self.args.steps_per_generation * self.num_iterations
        if self.args.schedule_clock == "learning_rate":
            return learning_rate_progress(self.d3s_generation_index(), self._d3s_learning_rates(),
                                          self.args.gradient_accumulation_steps, every)
        return generation_progress(self.d3s_generation_index(), self.state.max_steps,
                                   self.args.gradient_accumulation_steps, every)

    def _d3s_learning_rates(self) -> list[float]:
        """The learning rate of every optimizer step of the run, from a replay of the run's scheduler."""
        max_steps = self.state.max_steps
        if getattr(self, "_d3s_rates", (None, None))[0] != max_steps:
            self._d3s_rates = (max_steps, step_metrics.learning_rates(self.args, max_steps))
        return self._d3s_rates[1]

    # -- generation and selection -------------------------------------------------------------------

    def _d3s_timed(self, part: str):
        return self._d3s_timer.timed(part, self.model.training)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._d3s_rewards_per_func = rewards_per_func  # (B*G, F), all processes (TRL gathers them)
        return rewards_per_func

    def _d3s_generate_once(self, inputs):
        """TRL's generation and scoring of `inputs`: `(batch, generation entropies (S, T) or None)`."""
        training = self.model.training
        capture = contextlib.nullcontext()
        if training and not self.tools:
            capture = GenerationEntropy(self.accelerator.unwrap_model(self.model), self.temperature)
        defer = contextlib.nullcontext()
        if training:  # TRL's per-rollout no-grad passes: deferred to the kept rows, or counted as TRL runs them
            defer = DeferredPasses(self) if self.d3s_active else CountedPasses(self)
        self._d3s_capture = capture if isinstance(capture, GenerationEntropy) else None
        with capture, defer:
            batch = super()._generate_and_score_completions(inputs)
        self._d3s_capture = None
        if not training:
            return batch, None
        for key in prompts.hashes(self.accelerator, inputs):
            if key not in self.d3s_prompt_hashes:
                self.d3s_prompt_hashes.append(key)
        check_row_keys(batch)
        T = batch["completion_ids"].size(1)
        entropies = capture.entropies(batch["completion_mask"], T) if isinstance(capture, GenerationEntropy) else None
        return batch, entropies

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kwargs):
        # the rest: `num_generations` (TRL >= 1.14), `has_tool_images`
        if self.args.shared_prefill_generation and images is None and not multimodal_fields:
            # transformers path, each distinct prompt prefilled once
            completion_ids, logprobs, computed = shared_prefill_turn(self, prompt_ids)
        else:
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args,
                                                                     **kwargs)
            computed = turn_positions(self, prompt_ids, completion_ids)
        if self.model.training:
            self.d3s_positions.add_generation(**computed)
        return completion_ids, logprobs

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return self._d3s_generate_once(inputs)[0]  # evaluation: TRL's batch, no down-sampling
        generation_seconds = self._d3s_timer.times["generation"]
        self.d3s_prompt_hashes = []
        with self._d3s_timed("generation"):
            if self._d3s_prompts is not None:  # prompt_skip / dynamic_sampling (`prompts`)
                batch, entropies, counts = prompts.generate(self, inputs)
            else:
                batch, entropies = self._d3s_generate_once(inputs)
                counts = None
        step_metrics.log_generation(
            self._metrics["train"],
            flat_groups(weighted_rewards(self._d3s_rewards_per_func, self.reward_weights), self.num_generations),
            self._d3s_timer.times["generation"] - generation_seconds,
            counts,
        )
        with self._d3s_timed("selection"):
            return self._d3s_select(batch, entropies)

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        if not (self.is_deepspeed_enabled or self.is_fsdp_enabled):  # there the engine owns gradients and step
            optimizer_steps.install(optimizer, self._metrics["train"], self.args.skip_steps_without_signal)
        return optimizer

    def _d3s_select(self, batch: dict, generation_entropies: torch.Tensor | None) -> dict:
        """Rewards -> advantages -> rollouts kept -> every per-rollout pass for the kept ones -> token mask
        (`selection.select`). With nothing down-sampled, TRL's batch unchanged; only the metrics are logged.
        """
        return selection.select(self, batch, generation_entropies)

    def _d3s_kept_row_passes(self, batch: dict, mask: torch.Tensor, need_entropy: bool) -> dict:
        """The kept rows' old-policy, reference and sampler-correction terms (`passes.kept_row_passes`)."""
        return passes.kept_row_passes(self, batch, mask, need_entropy)

    def _d3s_no_grad_logps(self, model, batch, mask, entropy: bool = False):
        """`(per_token_logps, entropies or None)` of the valid completion tokens under `model`, no gradient."""
        return passes.no_grad_logps(self, model, batch, mask, entropy=entropy)

    # -- token level (paper eq. 8) ------------------------------------------------------------------

    def _d3s_token_mask(self, advantages, entropies, mask, fraction):
        """Top-K% |A| x H over the rows of ALL ranks: one threshold, identical on every rank (`token_mask`)."""
        return token_mask.gathered_token_mask(self.accelerator, self.args, advantages, entropies, mask, fraction)

    # -- the KL metric at beta = 0 ------------------------------------------------------------------

    def _d3s_monitor_kl(self, batch: dict) -> None:
        if not self._d3s_kl.due(self.beta, self.d3s_generation_index()):
            return
        with self._d3s_timed("kl_monitor"), self.d3s_positions.uncounted():
            kl = self._d3s_kl.measure(self, batch, lambda model, rows, mask: self._d3s_no_grad_logps(model, rows, mask)[0])
        self._metrics["train"]["kl"].append(kl)

    def train(self, *args, **kwargs):
        self._d3s_kl.keep_initial_weights(self)  # before a checkpoint is loaded: a resumed run keeps them too
        return super().train(*args, **kwargs)

    # -- the prompt history in checkpoints (as TRL keeps its adaptive entropy state) ----------------

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        prompts.save_history(self, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        prompts.load_history(self, checkpoint)

    # -- loss (paper eqs. 1, 3, 10) -----------------------------------------------------------------

    def _d3s_forward(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, grad_positions,
                     value_positions, entropy: bool = False, aux_rows=None):
        """The selective training forward, counting its positions (`positions.Positions.log_trained`)."""
        logps, entropies, aux_loss, computed = selective_forward(
            model, self.accelerator, prompt_ids, prompt_mask, completion_ids, completion_mask,
            grad_positions=grad_positions, value_positions=value_positions, entropy=entropy, aux_rows=aux_rows,
        )
        self.d3s_positions.log_trained(
            self.accelerator, self._metrics["train"], computed["body"], self.current_gradient_accumulation_steps,
            head=computed["head"], head_no_grad=computed["head_no_grad"],
        )
        return logps, entropies, aux_loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with self._d3s_timed("forward"):
            if not self.d3s_active or not self.model.training:  # TRL's own computation (plain GRPO/GSPO, evaluation)
                return self._d3s_trl_loss(model, inputs, return_outputs, num_items_in_batch)
            if return_outputs:
                raise ValueError("The GRPOTrainer does not support returning outputs")  # as TRL
            return self._d3s_compute_loss(model, inputs)

    def _d3s_trl_loss(self, model, inputs, return_outputs, num_items_in_batch):
        """TRL's loss, unchanged; in training, the positions its passes computed are counted."""
        metrics = self._metrics["train"]
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.model.training:  # TRL's forward: the body over every column, its fused head at the completion
            # tokens (`positions.labelled_positions`); its no-grad passes were counted as they ran (CountedPasses)
            body = inputs["prompt_ids"].numel() + inputs["completion_ids"].numel()
            self.d3s_positions.log_trained(
                self.accelerator, metrics, body, self.current_gradient_accumulation_steps,
                head=int(inputs["completion_mask"].sum()),
            )
            if metrics["entropy"]:
                metrics["entropy/trained"].append(metrics["entropy"][-1])
        return loss

    def _d3s_compute_loss(self, model, inputs):
        """The D3S loss of a training micro-batch: the selective forward and `d3s.policy_loss`."""
        settings = self.args.d3s_settings
        completion_mask = inputs["completion_mask"]
        mask = loss_mask(inputs)  # (S, T)
        token_mask = inputs.get("d3s_token_mask")  # (S, T) or None
        used = mask.bool() if token_mask is None else mask.bool() & token_mask  # (S, T)
        advantages = inputs["advantages"]  # (S,)
        old_per_token_logps = inputs.get("old_per_token_logps")  # (S, T) or None (on-policy)
        gspo = settings.importance_sampling_level == "sequence_token"

        real = inputs.get("d3s_real")  # (S,) False for the padding rows that deal kept rows out evenly
        real = torch.ones_like(advantages, dtype=torch.bool) if real is None else real
        # A micro-batch whose gradient is exactly zero runs a 1-token forward instead (same update). With a
        # mixture-of-experts model's router loss, every real row trains the router: only an all-padding
        # micro-batch has no gradient.
        if self.aux_loss_enabled:
            dead = not real.any()
        else:
            dead = not used.any() or (self.beta == 0.0 and bool((advantages[used.any(dim=1)] == 0).all()))
        if dead:
            return self._d3s_zero_loss(model, inputs)

        # Where the log-probs must exist: with gradient at the used tokens (all valid tokens when the
        # GSPO sequence ratio carries gradient into the KL), values at every valid token when a term
        # reads them (GSPO's sequence ratio off-policy, TRL's off-policy mask).
        kl_through_sequence = gspo and self.beta != 0.0 and self.args.use_bias_correction_kl
        grad_positions = mask.bool() if kl_through_sequence else used
        needs_values = (gspo and old_per_token_logps is not None) or self.off_policy_mask_threshold is not None
        value_positions = mask.bool() if needs_values else None
        logps, entropies, aux_loss = self._d3s_forward(
            model,
            inputs["prompt_ids"],
            inputs["prompt_mask"],
            inputs["completion_ids"],
            completion_mask,
            grad_positions=grad_positions,
            value_positions=value_positions,
            entropy=True,
            aux_rows=real if self.aux_loss_enabled else None,
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

        aggregation, denominator, accumulation = loss_denominator(
            self.loss_type,
            num_rows=int(inputs["d3s_num_rows"]),
            num_tokens=int(inputs["d3s_num_tokens"]),
            num_processes=self.accelerator.num_processes,
            gradient_accumulation_steps=self.current_gradient_accumulation_steps,
            steps_per_generation=self.args.steps_per_generation,
            rows_in_micro_batch=int(real.sum()),
            max_completion_length=self.max_completion_length,
        )
        loss, loss_metrics = policy_loss(
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
        self._d3s_log_loss_metrics(loss_metrics, per_token_logps, old_per_token_logps, advantages, used, entropies)
        loss = loss / accumulation
        if self.aux_loss_enabled:  # as TRL: the router loss of the micro-batch, averaged over the accumulation
            loss = loss + self.router_aux_loss_coef * aux_loss / self.current_gradient_accumulation_steps
            self._d3s_log_aux_loss(aux_loss)
        return loss

    def _d3s_zero_loss(self, model, inputs):
        """A loss of exactly 0 whose backward reaches every parameter (`passes.zero_loss`)."""
        return passes.zero_loss(self, model, inputs)

    def _d3s_log_aux_loss(self, aux_loss) -> None:
        step_metrics.log_aux_loss(self.accelerator, self._metrics["train"], aux_loss)

    def _d3s_log_loss_metrics(self, loss_metrics, per_token_logps, old_per_token_logps, advantages, used, entropies):
        step_metrics.log_loss_metrics(
            self.accelerator, self._metrics["train"], loss_metrics, per_token_logps=per_token_logps,
            old_per_token_logps=old_per_token_logps, advantages=advantages, used=used, entropies=entropies,
            epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high, with_kl=self.beta != 0.0,
        )
