"""TRL glue: `D3SGRPOConfig` (also `D3SConfig`) and `D3SGRPOTrainer`, drop-ins for TRL's `GRPOConfig` and `GRPOTrainer`.

Thin on purpose: the maths (selection, token mask, schedule, loss) is the core's and this package
moves TRL's tensors in and out of it. See docs/method.md for the method and docs/trl.md for use.
One file per concern, as TRL ships its own methods:

    compat.py          the supported TRL/transformers, the shims per TRL version, every private TRL name relied on
    config.py          D3SConfig: GRPOConfig plus the D3S fields, resolved and validated once
    trainer.py         D3SGRPOTrainer: the algorithm path (generation -> selection -> passes -> loss)
    rows.py            the per-rollout tensors of TRL's batch that follow a selection
    generation.py      hooks around TRL's generation: deferred passes, generation's own entropies
    selective_head.py  the training forward that scores only the kept positions
    step_metrics.py    the d3s/* metrics and where a step's time goes
    kl_monitor.py      the KL to the initial policy at beta = 0
"""

from d3s.integrations.trl.compat import (
    PRIVATE_TRL_API,
    TRANSFORMERS_VERSION_RANGE,
    TRL_VERSION_RANGE,
    trl_signature_mismatches,
)
from d3s.integrations.trl.config import D3SConfig, D3SGRPOConfig
from d3s.integrations.trl.step_metrics import STEP_TIME_PARTS
from d3s.integrations.trl.trainer import D3SGRPOTrainer

__all__ = [
    "D3SConfig",
    "D3SGRPOConfig",
    "D3SGRPOTrainer",
    "PRIVATE_TRL_API",
    "STEP_TIME_PARTS",
    "TRANSFORMERS_VERSION_RANGE",
    "TRL_VERSION_RANGE",
    "trl_signature_mismatches",
]
