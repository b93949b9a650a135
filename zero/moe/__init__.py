"""DeepSpeed-MoE (`deepspeed.moe`): mixture-of-experts layers whose experts are split over
expert-parallel ranks, trained with ZeRO stages 0-3 (docs/PARALLELISM.md).

- `layer.py`: `MoE`, its gate, experts and the all-to-all exchange;
- `gating.py`: the top-1 / top-2 / top-k routing and its load-balancing loss;
- `groups.py`: the expert-parallel and expert data-parallel process groups;
- `params.py`: which parameters are experts', the optimizer groups split;
- `engine_layout.py`: what the engine does differently for them;
- `checkpoint.py`: the experts' files in a checkpoint;
- `auto_ep.py`, `ep_experts.py`, `ep_checkpoint.py`: AutoEP, a Hugging Face MoE model's
  experts split over expert-parallel ranks (the `expert_parallel` block).
"""
from .layer import MoE
from .params import is_moe_param, split_params_into_different_moe_groups_for_optimizer

__all__ = ["MoE", "is_moe_param", "split_params_into_different_moe_groups_for_optimizer"]
