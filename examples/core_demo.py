"""One D3S step on a synthetic batch: advantages -> rollouts -> tokens -> loss.

    python examples/core_demo.py
"""

import torch

import d3s

torch.manual_seed(0)
B, G, T, V = 8, 32, 64, 1000  # prompts, rollouts per prompt, completion length, vocabulary
rewards = torch.randint(0, 2, (B * G,)).float()  # a verifier's 0/1 rewards, (B*G,)
logits = torch.randn(B * G, T, V)  # the policy's logits on the completions, (B*G, T, V)
completion_ids = torch.randint(0, V, (B * G, T))
completion_mask = torch.arange(T)[None] < torch.randint(8, T + 1, (B * G, 1))  # (B*G, T)

n_keep, fraction = d3s.VARIANTS["d3s"].schedule_at(progress=0.0)  # N = 8 of 32, K = 5%
advantages = d3s.group_advantages(rewards, num_generations=G)  # (B*G,)
sel = d3s.select_rollouts(advantages, rewards, G, n_keep, mode="cross")  # keeps N*B = 64 rollouts
logps = torch.log_softmax(logits[sel.indices], -1).gather(-1, completion_ids[sel.indices, :, None])[..., 0]
entropies = d3s.token_entropy(logits[sel.indices])  # (S, T)
mask = d3s.token_mask(sel.advantages, entropies, completion_mask[sel.indices], fraction)  # (S, T)
loss, metrics = d3s.policy_loss(logps, None, sel.advantages, completion_mask[sel.indices], token_mask=mask)

print(f"schedule at p=0: keep N={n_keep} of G={G} rollouts per group, K={fraction:.0%} of tokens")
print(f"rollouts kept: {len(sel.indices)} of {B * G}; per group: {sel.kept_per_group.tolist()}")
print(f"advantage variance: all {advantages.var(correction=0):.3f} -> kept {sel.advantages.var(correction=0):.3f}")
print(f"tokens in the loss: {int(metrics['tokens_used'])} of {int(completion_mask.sum())} generated "
      f"({metrics['tokens_used'] / completion_mask.sum():.2%} token consumption)")
print(f"loss {loss.item():.4f}")
