"""Tiny, fully local TRL setup for the D3S integration tests: no downloads, CPU, seconds per run.

- `tiny_tokenizer()`: a word-level tokenizer over "t0".."t60" built in code.
- `tiny_model(seed)`: a 2-layer Llama with hidden size 32, initialised from `seed`.
- `make_rollout_func(...)`: a deterministic stand-in for generation (TRL's `rollout_func` hook): the
  completion of a row depends only on (prompt, its index in the group, the generation round), so a
  run on one process and a run on two see exactly the same data. Lengths vary; some completions end
  with EOS, some hit the length limit, optionally some are empty (EOS only).
- `length_reward`: a pure reward function.
"""

from __future__ import annotations

import os
import random
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from d3s.app.models import tiny_llama, word_level_tokenizer  # noqa: E402

DEVICE = os.environ.get("D3S_TEST_DEVICE", "cpu")  # "cuda": the trainer tests on a GPU, fp32

VOCAB = 64
PAD, EOS = 0, 1


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return word_level_tokenizer(["<pad>", "<eos>", "<unk>", *(f"t{i}" for i in range(VOCAB - 3))], padding_side="left")


def tiny_model(seed: int = 0, hidden_size: int = 32, num_hidden_layers: int = 2) -> LlamaForCausalLM:
    # initializer_range 0.3: a peaked policy, entropies that differ from token to token
    return tiny_llama(tiny_tokenizer(), hidden_size, num_hidden_layers, seed=seed, max_position_embeddings=256,
                      initializer_range=0.3)


def tiny_moe(seed: int = 0, router_aux_loss_coef: float = 0.05):
    """A 2-layer Qwen3-MoE (4 experts, 2 per token) whose router load-balancing loss trains, as TRL enables it."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
        output_router_logits=True, router_aux_loss_coef=router_aux_loss_coef, max_position_embeddings=256,
        pad_token_id=PAD, eos_token_id=EOS, initializer_range=0.3,
    )
    return Qwen3MoeForCausalLM(config)


def prompt_dataset(n: int = 32, prompt_len: int = 3) -> Dataset:
    """Prompts of `prompt_len` words each (equal token length: no left padding differences)."""
    return Dataset.from_dict({"prompt": [" ".join(f"t{(i + j) % 50}" for j in range(prompt_len)) for i in range(n)]})


def length_reward(completions, **kwargs) -> list[float]:
    """Pure: 1 point per 't5'..'t9' word plus 0.1 per word."""
    return [sum(w in {"t5", "t6", "t7", "t8", "t9"} for w in c.split()) + 0.1 * len(c.split()) for c in completions]


def make_rollout_func(max_len: int, num_generations: int, *, empty_every: int = 0, full_every: int = 5):
    """A deterministic `rollout_func(prompts, trainer)` for TRL (see module docstring).

    Row g of a group in generation round r gets a completion drawn from a RNG seeded by
    (prompt, g, r): length in [1, max_len - 1] ending with EOS, or exactly `max_len` words without EOS
    for every `full_every`-th row (truncated), or EOS alone (empty text) for every `empty_every`-th row.
    """

    def rollout_func(prompts, trainer):
        tok = trainer.processing_class
        rank = trainer.accelerator.process_index
        args = trainer.args  # the generation round, from the (checkpointed) optimizer step count
        rnd = trainer.state.global_step * args.gradient_accumulation_steps // (
            args.steps_per_generation * trainer.num_iterations)
        prompt_ids, completion_ids = [], []
        for i, prompt in enumerate(prompts):
            row = rank * len(prompts) + i
            g = row % num_generations
            rng = random.Random(zlib.crc32(f"{prompt}|{g}|{rnd}".encode()))
            prompt_ids.append(tok(prompt, add_special_tokens=False)["input_ids"])
            if empty_every and row % empty_every == 0:
                ids = [EOS]  # an empty answer: the decoded text is ""
            elif full_every and row % full_every == 0:
                ids = [rng.randrange(3, VOCAB) for _ in range(max_len)]
            else:
                ids = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, max_len))] + [EOS]
            completion_ids.append(ids)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout_func


def run_training(trainer_cls, config_cls, tmp_path, *, model_seed: int = 0, model_fn=None, reward_funcs=length_reward,
                 rollout_func=None, max_len: int = 8, num_generations: int = 4, train_dataset=None,
                 callbacks=(), resume_from_checkpoint=None, eval_dataset=None, setup=None, peft_config=None, **config):
    """Build a tiny trainer, train it, return it with a `GradRecorder` of every optimizer step.

    Defaults: 16 rollouts per generation (4 prompts x G=4), SGD (no Adam amplification of float
    noise), fp32, CPU (`D3S_TEST_DEVICE=cuda` runs the same tests on a GPU), no checkpoints, one log
    per step.
    """
    defaults = dict(
        output_dir=str(tmp_path),
        use_cpu=DEVICE == "cpu",
        per_device_train_batch_size=16,
        gradient_accumulation_steps=1,
        num_generations=num_generations,
        max_completion_length=max_len,
        max_steps=2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,  # no clipping: the captured gradients are the raw ones
        loss_type="grpo",
        disable_tqdm=True,
        bf16=False,  # GRPOConfig defaults to bf16 autocast, slow and imprecise on CPU
    )
    defaults.update(config)
    args = config_cls(**defaults)
    recorder = GradRecorder()
    model = (model_fn or tiny_model)(model_seed)
    if args.beta != 0.0:  # TRL loads the reference model by name: save the tiny model locally
        path = os.path.join(str(tmp_path), "tiny-model")
        model.save_pretrained(path)
        model = path
    if setup is not None:
        trainer_cls = _with_setup(trainer_cls, setup)
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=train_dataset if train_dataset is not None else prompt_dataset(),
        eval_dataset=eval_dataset,
        processing_class=tiny_tokenizer(),
        # rollout_func="generate": transformers generation (sampled from the tiny model itself)
        rollout_func=None if rollout_func == "generate" else rollout_func or make_rollout_func(max_len, num_generations),
        callbacks=[recorder, *callbacks],
        **({} if peft_config is None else {"peft_config": peft_config}),
    )
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    trainer.grad_recorder = recorder
    return trainer


def _with_setup(trainer_cls, setup):
    """`trainer_cls` whose instances are passed to `setup(trainer)` right after construction."""

    class WithSetup(trainer_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            setup(self)

    return WithSetup


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def step_logs(trainer) -> list[dict]:
    """The per-step log entries (without the final summary)."""
    return [h for h in trainer.state.log_history if "loss" in h]


from transformers import TrainerCallback  # noqa: E402


class GradRecorder(TrainerCallback):
    """Keeps a flat copy of the gradients just before every optimizer step."""

    def __init__(self):
        self.grads: list[torch.Tensor] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append(
            torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).clone()
                       for p in model.parameters()])
        )


class RowCounter(TrainerCallback):
    """Counts the rows the policy's forward sees with grad enabled (the training forward), per step."""

    def __init__(self):
        self.rows_per_step: list[int] = []
        self._rows = 0
        self._handle = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        def hook(module, args_, kwargs_):
            if torch.is_grad_enabled():
                ids = kwargs_.get("input_ids", args_[0] if args_ else None)
                self._rows += ids.size(0)

        self._handle = model.model.register_forward_pre_hook(hook, with_kwargs=True)

    def on_step_end(self, args, state, control, **kwargs):
        self.rows_per_step.append(self._rows)
        self._rows = 0

    def on_train_end(self, args, state, control, **kwargs):
        self._handle.remove()


class RecordingRollout:
    """Wraps a rollout function and keeps the completion ids of its last call."""

    def __init__(self, rollout_func):
        self.rollout_func = rollout_func
        self.last_completion_ids: list[list[int]] = []

    def __call__(self, prompts, trainer):
        out = self.rollout_func(prompts, trainer)
        self.last_completion_ids = out["completion_ids"]
        return out


class StopAt(TrainerCallback):
    """Stops training after global step `step` (a checkpoint saved at that step stays behind)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
