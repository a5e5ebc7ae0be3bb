"""The selective LM head: a training forward that scores only the positions that matter (docs/method.md section 3).

`add_selective_lm_head(model, ...)` lets `model(..., d3s_positions=...)` return `(per_token_logps,
entropies)` at chosen positions: the backbone runs once, the LM head and its log-softmax (TRL's
chunked kernel, so the values are TRL's) run with gradient at the kept tokens, without gradient where
only values are needed, and nowhere else. `selective_forward` calls it for a batch of completions and
stops the backbone at the last column any row needs (a causal model's earlier outputs do not depend
on later positions).
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch

from d3s.batch import last_used_column
from d3s.integrations.trl.compat import log_prob_kernel, maybe_gather_lm_head_ctx


def head_scales(config) -> tuple[float | None, float]:
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


def add_selective_lm_head(model, temperature: float, cast_lm_head_to_fp32: bool) -> None:
    """Let `model(..., d3s_positions=...)` return `(per_token_logps, entropies, aux_loss)` scored at chosen positions.

    The backbone runs once over the given columns; the LM head and its log-softmax (TRL's chunked
    kernel, so the values are TRL's) run with gradient at `d3s_positions["grad"]` and without at
    `d3s_positions["values"]`, nowhere else. With `d3s_positions["aux_mask"]` (a mixture-of-experts
    model), the router's load-balancing loss over the positions of that mask, as TRL computes it;
    else `aux_loss` is None. Any other call goes to the previous forward unchanged. Installed through
    `forward`, so the call passes through DDP/DeepSpeed/FSDP wrappers as usual.
    """
    if getattr(model, "_d3s_selective_head", False):
        return
    previous = model.forward
    softcap, logit_scale = head_scales(model.config)

    @functools.wraps(type(model).forward)
    def forward(self, *args, d3s_positions=None, **kwargs):
        if d3s_positions is None:
            return previous(*args, **kwargs)
        kwargs["use_cache"] = False
        aux_mask = d3s_positions.get("aux_mask")  # (S, L) or None
        if aux_mask is not None:
            kwargs["output_router_logits"] = True
        backbone = self.base_model(*args, **kwargs)
        hidden = backbone.last_hidden_state  # (S, L, H)
        aux_loss = None if aux_mask is None else router_aux_loss(self.config, backbone.router_logits, aux_mask)
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
                return log_prob_kernel(h, weight, bias, labels[where], temperature, softcap, logit_scale, outputs)

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
        return logps, entropies, aux_loss

    model.forward = types.MethodType(forward, model)
    model._d3s_selective_head = True


def router_aux_loss(config, router_logits, mask: torch.Tensor) -> torch.Tensor:
    """A mixture-of-experts model's load-balancing loss over the positions of `mask` `(S, L)`, as TRL's fused
    head computes it (Mixtral's `load_balancing_loss_func`, which every MoE family in transformers uses)."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    text_config = config.get_text_config()
    return load_balancing_loss_func(router_logits, text_config.num_experts, text_config.num_experts_per_tok, mask)


def selective_forward(
    model,
    accelerator,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    grad_positions: torch.Tensor | None,
    value_positions: torch.Tensor | None,
    entropy: bool = False,
    aux_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, dict[str, int]]:
    """`(per_token_logps, entropies, aux_loss, computed)`: `(S, T)` scored only where asked, zeros elsewhere.

    The forward stops at the last column any row needs and the LM head runs only at `grad_positions`
    (with gradient) and `value_positions` (without). Entropies are returned at every scored position
    when `entropy`. With `aux_rows` `(S,)` (a mixture-of-experts model whose router loss trains), the
    forward runs over the whole width and `aux_loss` is the router's load-balancing loss over every
    token of those rows, prompt included, as TRL computes it for its rows; else None. `computed` counts the
    positions the call computed: `body` (the backbone's, rows x columns), `head` (the LM head's at
    `grad_positions`) and `head_no_grad` (at the other `value_positions`, without gradient).
    """
    S, T = completion_ids.shape
    wanted = grad_positions if value_positions is None else value_positions
    if grad_positions is not None and value_positions is not None:
        wanted = grad_positions | value_positions
    W = T if aux_rows is not None else max(last_used_column(wanted), 1)
    input_ids = torch.cat([prompt_ids, completion_ids[:, :W]], dim=1)  # (S, P+W)
    attention_mask = torch.cat([prompt_mask, completion_mask[:, :W]], dim=1)  # (S, P+W)
    positions = {
        "labels": completion_ids[:, :W],
        "grad": None if grad_positions is None else grad_positions[:, :W].bool(),
        "values": None if value_positions is None else value_positions[:, :W].bool(),
        "entropy": entropy,
    }
    if aux_rows is not None:
        positions["aux_mask"] = attention_mask * aux_rows.unsqueeze(1).to(attention_mask.dtype)  # (S, P+W)
    with accelerator.autocast():
        logps, entropies, aux_loss = model(input_ids=input_ids, attention_mask=attention_mask, d3s_positions=positions)
    if W < T:  # (S, W) -> (S, T)
        logps = torch.nn.functional.pad(logps, (0, T - W))
        entropies = None if entropies is None else torch.nn.functional.pad(entropies, (0, T - W))
    grad, values = positions["grad"], positions["values"]
    rest = values if grad is None else (values & ~grad if values is not None else None)  # as `forward` scores them
    computed = {"body": input_ids.numel(), "head": 0 if grad is None else int(grad.sum()),
                "head_no_grad": 0 if rest is None else int(rest.sum())}
    return logps, entropies, aux_loss, computed
