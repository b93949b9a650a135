"""A saved LR scheduler state laid out as the optimizer's groups are now.

torch's schedulers keep lists with one entry per optimizer group (LambdaLR's base_lrs,
_last_lr and lr_lambdas; ReduceLROnPlateau's min_lrs; OneCycleLR's max_lrs and momenta;
SequentialLR and ChainedScheduler hold such states in `_schedulers`). A checkpoint loaded with
another MoE layout gives the optimizer other groups (AutoEP on or off: its experts are a group
of their own), each group's hyperparameters taken from the saved group that held its first
parameter (checkpoint_layout.saved_group_sources). Loaded as saved, the scheduler's lists would
no longer match the groups, and its next step would fail in torch (zip(..., strict=True)).
zero's own schedulers (schedulers.py) keep no per-group state.
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


def load_regrouped(scheduler, state: dict, sources: list[int], saved_groups: int) -> None:
    """Loads `state` (of `saved_groups` groups) into `scheduler`; where the group count
    changed, a state of the saved layout loaded into it later is regrouped too: the Hugging
    Face Trainer loads its own copy (scheduler.pt) after the engine's checkpoint."""
    scheduler.load_state_dict(regrouped(state, sources, saved_groups))
    if saved_groups != len(sources):  # (then a list's length tells the layouts apart)
        load = type(scheduler).load_state_dict
        scheduler.load_state_dict = \
            lambda later: load(scheduler, regrouped(later, sources, saved_groups))
