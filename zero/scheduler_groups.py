"""A saved LR scheduler state laid out as the optimizer's groups are now.

torch's schedulers keep lists with one entry per optimizer group (LambdaLR's base_lrs,
_last_lr and lr_lambdas; ReduceLROnPlateau's min_lrs; CyclicLR's max_lrs and momenta;
SequentialLR and ChainedScheduler hold such states in `_schedulers`). A checkpoint loaded with
another MoE layout gives the optimizer other groups (AutoEP on or off: its experts are a group
of their own), each group's hyperparameters taken from the saved group that held its first
parameter (checkpoint_layout.saved_group_sources). Loaded as saved, the scheduler's lists would
no longer match the groups, and its next step would fail in torch (zip(..., strict=True)).
zero's own schedulers (schedulers.py) keep no per-group state. (The Hugging Face Trainer's
scheduler is the engine's here: Accelerate wraps it in DeepSpeedSchedulerWrapper, and the
Trainer then leaves its own scheduler.pt unread.)
"""
from __future__ import annotations

PER_GROUP = ("base_lrs", "_last_lr", "lr_lambdas", "min_lrs", "max_lrs", "base_momentums",
             "max_momentums")
NESTED = "_schedulers"


def regrouped(state: dict, sources: list[int], saved_groups: int) -> dict:
    """`state` with each per-group list of the saved groups' length (`saved_groups`) laid out
    as the groups now are: entry i from the saved group sources[i]."""
    out = dict(state)
    for key in PER_GROUP:
        value = state.get(key)
        if isinstance(value, list) and len(value) == saved_groups:
            out[key] = [value[source] for source in sources]
    if isinstance(state.get(NESTED), list):
        out[NESTED] = [regrouped(inner, sources, saved_groups) if isinstance(inner, dict)
                       else inner for inner in state[NESTED]]
    return out

