"""The clipped policy objective restricted to the kept tokens (paper eqs. 1, 3, 10; docs/method.md section 5).

Per token, with advantage A_i and importance ratio r_i,t:

    loss_i,t = -min(r_i,t * A_i, clip(r_i,t, 1 - epsilon_low, 1 + epsilon_high) * A_i)
               + beta * KL_i,t,      KL_i,t = exp(ref - logp) - (ref - logp) - 1   (k3 estimator)

Two ratios:
- `"token"` (GRPO): r_i,t = pi_theta(y_i,t) / pi_old(y_i,t).
- `"sequence_token"` (GSPO-token): r_i,t = sg[s_i] * pi_theta(y_i,t) / sg[pi_theta(y_i,t)], with
  s_i = (pi_theta(y_i|x) / pi_old(y_i|x))^(1/|y_i|) the length-normalised sequence ratio over all
  valid tokens. Its VALUE is s_i on every token but its GRADIENT flows through each token on its
  own, so a token mask removes exactly the masked tokens' gradient (plain sequence-level GSPO would
  only reweight whole sequences). Unmasked, it has the gradient of TRL's sequence-level GSPO.

Only the tokens in `completion_mask & token_mask` (the "used" tokens) enter the loss and the KL.
The normaliser is explicit (docs/method.md section 3): `"selected"` divides by the used tokens (eq. 10's
1/|T|), `"all"` by every valid token (TRL's `top_entropy_quantile` convention, a K-times smaller
step at fraction K).
"""

from __future__ import annotations

from typing import Literal

import torch

from d3s import _checks

ImportanceSamplingLevel = Literal["token", "sequence_token"]
Normalizer = Literal["selected", "all"]
Aggregation = Literal["token", "sequence"]


def policy_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    token_mask: torch.Tensor | None = None,
    importance_sampling_level: ImportanceSamplingLevel = "token",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    ref_per_token_logps: torch.Tensor | None = None,
    normalizer: Normalizer = "selected",
    aggregation: Aggregation = "token",
    denominator: torch.Tensor | float | None = None,
    importance_sampling_ratio: torch.Tensor | None = None,
    kl_importance_weighted: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped GRPO / GSPO-token surrogate plus k3 KL over the used tokens.

    Args:
        per_token_logps: `(S, T)` log pi_theta of the completion tokens (with grad).
        old_per_token_logps: `(S, T)` log pi_old, or None when on-policy (then pi_old = sg[pi_theta]).
        advantages: `(S,)` or `(S, T)` advantages.
        completion_mask: `(S, T)` valid completion tokens.
        token_mask: optional bool `(S, T)`, the tokens kept by `token_mask` (paper eq. 8).
        importance_sampling_level: `"token"` (GRPO) or `"sequence_token"` (GSPO-token).
        epsilon_low, epsilon_high: clip range [1 - epsilon_low, 1 + epsilon_high].
        beta: KL coefficient; needs `ref_per_token_logps` `(S, T)` when non-zero.
        normalizer: `"selected"` (used tokens) or `"all"` (valid tokens), see module docstring.
        aggregation: `"token"` — sum over used tokens / the token count (TRL's `dapo`/`bnpo`);
            `"sequence"` — mean over tokens within each sequence, then over sequences (TRL's `grpo`).
            With `"selected"` a sequence with no used token is left out of the mean over sequences;
            with `"all"` every row counts, as in TRL.
        denominator: overrides the final divisor (the token count for `"token"`, the sequence count
            for `"sequence"`), e.g. a count over all micro-batches and processes of an update.
        importance_sampling_ratio: optional `(S, T)` or `(S, 1)` truncated ratio correcting for a
            sampler that differs from the trainer (vLLM), multiplied into the surrogate, not the KL.
        kl_importance_weighted: multiply the KL by the (differentiable) importance ratio — TRL's
            `use_bias_correction_kl`, the unbiased reverse-KL gradient of DeepSeek-V3.2. The ratio is
            the token ratio for `"token"` and the sequence ratio s_i (gradient through all its tokens,
            as TRL's sequence level) for `"sequence_token"`.

    Value checks: shapes, dtypes and the plain numbers are checked (a ValueError names the
    argument). The VALUES of the tensors are not (that would synchronise the device every step):
    a NaN or inf log-probability or advantage gives a non-finite loss, which TRL reports; a
    `completion_mask` holding other values than 0/1 weights the tokens by them.

    Returns:
        `(loss, metrics)`: a scalar loss and a dict of detached scalar tensors — `clip_ratio/low_mean`,
        `clip_ratio/high_mean`, `clip_ratio/region_mean` (over used tokens), `kl` (mean over used
        tokens, when beta != 0), `tokens_used`, `tokens_valid`.
    """
    _checks.tensor("per_token_logps", per_token_logps, kind="float")
    _checks.tensor("completion_mask", completion_mask)
    if per_token_logps.dim() != 2 or per_token_logps.shape != completion_mask.shape:
        raise ValueError(
            f"per_token_logps {tuple(per_token_logps.shape)} and completion_mask "
            f"{tuple(completion_mask.shape)} must both be (S, T)"
        )
    S, T = per_token_logps.shape
    for name, value in (("old_per_token_logps", old_per_token_logps), ("ref_per_token_logps", ref_per_token_logps)):
        if value is not None:
            _checks.tensor(name, value, kind="float")
            if value.shape != per_token_logps.shape:
                raise ValueError(f"{name} {tuple(value.shape)} must match per_token_logps {(S, T)}")
    _checks.tensor("advantages", advantages)
    if advantages.shape not in ((S,), (S, 1), (S, T)):
        raise ValueError(f"advantages {tuple(advantages.shape)} must be (S,), (S, 1) or (S, T) with S={S}, T={T}")
    if token_mask is not None:
        _checks.tensor("token_mask", token_mask)
        if token_mask.shape != completion_mask.shape:
            raise ValueError(f"token_mask {tuple(token_mask.shape)} must match completion_mask {(S, T)}")
    if importance_sampling_ratio is not None:
        _checks.tensor("importance_sampling_ratio", importance_sampling_ratio)
        if importance_sampling_ratio.shape not in ((S, T), (S, 1)):
            raise ValueError(
                f"importance_sampling_ratio {tuple(importance_sampling_ratio.shape)} must be (S, T) or (S, 1) "
                f"with S={S}, T={T}"
            )
    if normalizer not in ("selected", "all"):
        raise ValueError(f"normalizer={normalizer!r}; valid: 'selected', 'all'")
    if aggregation not in ("token", "sequence"):
        raise ValueError(f"aggregation={aggregation!r}; valid: 'token', 'sequence'")
    epsilon_low = _checks.as_float("epsilon_low", epsilon_low, low=0.0)
    epsilon_high = _checks.as_float("epsilon_high", epsilon_high, low=0.0)
    beta = _checks.as_float("beta", beta, low=0.0)
    if beta != 0.0 and ref_per_token_logps is None:
        raise ValueError(f"beta={beta} needs ref_per_token_logps")
    if denominator is not None and not isinstance(denominator, torch.Tensor):
        denominator = _checks.as_float("denominator", denominator, low=0.0, low_open=True)
    elif denominator is not None and denominator.numel() != 1:
        raise ValueError(f"denominator must be a scalar, got a tensor of shape {tuple(denominator.shape)}")
    elif denominator is not None and (denominator.dtype == torch.bool or denominator.is_complex()):
        raise ValueError(f"denominator must be a real number, got a {denominator.dtype} tensor")

    valid = completion_mask.to(per_token_logps.dtype)  # (S, T)
    used = valid if token_mask is None else valid * token_mask.to(valid.dtype)  # (S, T)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (S, 1)
    if old_per_token_logps is None:
        old_per_token_logps = per_token_logps.detach()

    log_ratio = per_token_logps - old_per_token_logps  # (S, T)
    if importance_sampling_level == "token":
        log_weights = log_ratio  # (S, T)
    elif importance_sampling_level == "sequence_token":
        seq_log_ratio = (log_ratio * valid).sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1.0)  # (S, 1)
        log_weights = per_token_logps - per_token_logps.detach() + seq_log_ratio.detach()  # (S, T)
    else:
        raise ValueError(
            f"importance_sampling_level={importance_sampling_level!r}; valid: 'token', 'sequence_token'"
        )

    coef_1 = torch.exp(log_weights)  # (S, T)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)  # (S, T)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)  # (S, T)
    if importance_sampling_ratio is not None:
        per_token_loss = per_token_loss * importance_sampling_ratio
    if beta != 0.0:
        per_token_kl = k3_kl(per_token_logps, ref_per_token_logps)  # (S, T)
        if kl_importance_weighted:
            if importance_sampling_level == "token":
                per_token_kl = per_token_kl * coef_1  # (S, T)
            else:
                per_token_kl = per_token_kl * torch.exp(seq_log_ratio)  # (S, 1), with its gradient
        per_token_loss = per_token_loss + beta * per_token_kl

    weights = used if normalizer == "selected" else valid  # (S, T): the per-sequence divisor's tokens
    if aggregation == "token":
        total = (per_token_loss * used).sum()
        count = used.sum() if normalizer == "selected" else valid.sum()
        loss = total / (count.clamp(min=1.0) if denominator is None else denominator)
    else:
        seq_loss = (per_token_loss * used).sum(-1) / weights.sum(-1).clamp(min=1.0)  # (S,)
        if denominator is not None:
            loss = seq_loss.sum() / denominator
        elif normalizer == "selected":
            loss = seq_loss.sum() / (used.sum(-1) > 0).sum().clamp(min=1)
        else:
            loss = seq_loss.mean() if seq_loss.numel() > 0 else seq_loss.sum()

    with torch.no_grad():
        n_used = used.sum()
        adv = advantages.expand_as(coef_1)
        low = ((coef_1 < 1 - epsilon_low) & (adv < 0)).to(used.dtype)
        high = ((coef_1 > 1 + epsilon_high) & (adv > 0)).to(used.dtype)
        den = n_used.clamp(min=1.0)
        metrics = {
            "clip_ratio/low_mean": (low * used).sum() / den,
            "clip_ratio/high_mean": (high * used).sum() / den,
            "clip_ratio/region_mean": (torch.maximum(low, high) * used).sum() / den,
            "tokens_used": n_used,
            "tokens_valid": valid.sum(),
        }
        if beta != 0.0:
            metrics["kl"] = (per_token_kl * used).sum() / den
    return loss, metrics


def k3_kl(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(pi_theta || pi_ref) at each token: exp(ref - logp) - (ref - logp) - 1.

    Non-negative, 0 where the two log-probs agree; differentiable in both arguments. Shapes broadcast.
    """
    delta = ref_per_token_logps - per_token_logps
    return torch.exp(delta) - delta - 1


def clip_shares(
    coef: torch.Tensor,
    advantages: torch.Tensor,
    used: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row shares of the used tokens whose ratio is clipped from below and from above.

    Low: ratio < 1 - epsilon_low with a negative advantage; high: ratio > 1 + epsilon_high with a
    positive one (where the clip removes the gradient). TRL logs the lowest low share and the highest
    high share of a batch (`clip_ratio/low_min`, `clip_ratio/high_max`).

    Args:
        coef: `(S, T)` importance ratios pi_theta / pi_old.
        advantages: `(S,)`.
        used: `(S, T)` tokens in the loss (any dtype; nonzero = used).

    Returns:
        `(low, high)`, each `(S,)` float32; NaN for a row with no used token.
    """
    u = used.bool().float()  # (S, T); the shares are counted in float32 whatever the ratios' dtype
    adv = advantages.unsqueeze(1)  # (S, 1)
    count = u.sum(1).clamp(min=1.0)  # (S,)
    low = (((coef < 1 - epsilon_low) & (adv < 0)).float() * u).sum(1) / count  # (S,)
    high = (((coef > 1 + epsilon_high) & (adv > 0)).float() * u).sum(1) / count  # (S,)
    rows = used.bool().any(dim=1)  # (S,)
    low = torch.where(rows, low, torch.full_like(low, float("nan")))
    high = torch.where(rows, high, torch.full_like(high, float("nan")))
    return low, high
