"""d3s — Dynamic Dual-Level Down-Sampling (arXiv 2509.22115) for GRPO-family RL fine-tuning.

The core: pure PyTorch functions, tensors and plain numbers in, tensors out. Importing it needs
torch only; trainer integrations live in `d3s.integrations` and import their frameworks there; the
`d3s` command (recipes, tasks, train, compare, eval) lives in `d3s.app`.

    advantages          group_advantages                       paper eq. 2
    rollout_selection   max_variance_subset, select_rollouts   paper sec. 3.1, eqs. 6-7
    token_selection     token_scores, token_mask, ...          paper sec. 3.2, eq. 8
    schedule            linear_schedule                        paper sec. 3.3, eq. 9
    entropy             token_entropy
    loss                policy_loss                            paper eqs. 1, 3, 10
    metrics             pass_at_k, avg_at_n, ...               paper sec. 4.1
    variants            VARIANTS, Variant                      paper sec. 4.1, appendix D
    batch               deal_rows, loss_denominator, ...       a trainer's per-batch arithmetic
"""

from d3s.advantages import group_advantages
from d3s.entropy import token_entropy
from d3s.loss import policy_loss
from d3s.metrics import avg_at_n, pass_at_k, population_variance, sample_usefulness_rate
from d3s.rollout_selection import RolloutSelection, max_variance_mask, max_variance_subset, select_rollouts
from d3s.schedule import linear_schedule
from d3s.token_selection import nonfinite_scores, num_tokens_to_keep, token_mask, token_scores, top_tokens_mask
from d3s.variants import VARIANTS, Variant, get_variant

__version__ = "0.1.0"

__all__ = [
    "VARIANTS",
    "RolloutSelection",
    "Variant",
    "avg_at_n",
    "get_variant",
    "group_advantages",
    "linear_schedule",
    "max_variance_mask",
    "max_variance_subset",
    "num_tokens_to_keep",
    "pass_at_k",
    "policy_loss",
    "population_variance",
    "sample_usefulness_rate",
    "select_rollouts",
    "token_entropy",
    "token_mask",
    "token_scores",
    "nonfinite_scores",
    "top_tokens_mask",
]
