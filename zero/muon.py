"""DeepSpeed's "Muon" optimizer type (its MuonWithAuxAdam): which parameters Muon steps, the
optimizer groups it steps them in, and the dtype of its Newton-Schulz iteration. The update
itself runs in C++ on each rank's shard (csrc/adapter/muon.h; its hyperparameters and the
iteration's dtype: boundary.optimizer_hyper); the other parameters are stepped by Adam, in
groups of their own.

As DeepSpeed: a parameter is Muon's when it is a matrix (2 or more dimensions, as the layer
has it, also under zero.Init) and its name has neither "embed" nor "lm_head" in it (the
`use_muon` attribute, set on every parameter at initialize). Each incoming parameter group is
split into its Muon half and its Adam half; a half's settings are, most specific last,
MuonWithAuxAdam's defaults, the config's (lr for both, or muon_lr / adam_lr), then the
group's own."""
from __future__ import annotations

from torch import nn

from . import init as zero_init

# What each half takes from the config and from a group (DeepSpeed's _MUON_HALF_KEYS and
# _ADAM_HALF_KEYS), and MuonWithAuxAdam's defaults for them
MUON_KEYS = ("lr", "momentum", "weight_decay", "ns_method")
ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
MUON_DEFAULTS = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.0, "ns_method": "gram"}
# (bias_correction: FusedAdam's, which DeepSpeed builds for the Adam half)
ADAM_DEFAULTS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0.0,
                 "bias_correction": True}
_NOT_MUON = ("embed", "lm_head")


def is_muon(name: str, shape) -> bool:
    """Whether Muon steps the parameter of this name and (whole) shape."""
    return len(shape) >= 2 and not any(word in name.lower() for word in _NOT_MUON)


def tag_parameters(model: nn.Module) -> None:
    """Sets `use_muon` on every parameter of the model, as deepspeed.initialize does (over
    whatever a script set)."""
    for name, param in model.named_parameters():
        param.use_muon = is_muon(name, zero_init.full_shape(param))


def param_groups(groups: list[dict], params: dict) -> list[dict]:
    """Each of `groups` (the script's, or one of every parameter) split into its Muon and its
    Adam half, with their settings resolved (`params`: the config's optimizer.params)."""
    untagged = sum(1 for group in groups for p in group["params"] if not hasattr(p, "use_muon"))
    if untagged:
        raise ValueError(
            f"zero: optimizer Muon: {untagged} of the parameters to optimize are not the "
            "model's (initialize tags the model's parameters use_muon); pass them as part of "
            "the model, or set param.use_muon = True / False on them")
    halves = ((True, "muon", _half_defaults(MUON_DEFAULTS, MUON_KEYS, params, "muon_lr")),
              (False, "adam", _half_defaults(ADAM_DEFAULTS, ADAM_KEYS, params, "adam_lr")))
    split = []
    for index, group in enumerate(groups):
        own = {k: v for k, v in group.items() if k != "params"}
        prefix = own.get("name") or (f"group{index}" if len(groups) > 1 else None)
        for use_muon, label, defaults in halves:
            half = [p for p in group["params"] if bool(p.use_muon) is use_muon]
            if not half:
                continue
            keys = MUON_KEYS if use_muon else ADAM_KEYS
            settings = {**defaults, **{k: v for k, v in own.items() if k in keys}}
            name = f"{prefix}-{label}-params" if prefix else f"{label}-params"
            if use_muon:
                _check_muon_half(name, half, settings)
            split.append({"params": half, "use_muon": use_muon, "name": name, **settings})
    return split


def _check_muon_half(name: str, params: list, settings: dict) -> None:
    """What DeepSpeed asserts of a Muon group: matrices, a known iteration, a momentum in
    [0, 1] (here before the first step, on every rank alike)."""
    flat = [shape for shape in (tuple(zero_init.full_shape(p)) for p in params)
            if len(shape) < 2]
    if flat:
        raise ValueError(f"zero: optimizer Muon: group {name!r} has use_muon parameters of "
                         f"shapes {flat[:3]}; Muon orthogonalizes matrices: set use_muon = "
                         "False on them (Adam steps them)")
    if settings["ns_method"] not in ("gram", "standard"):
        raise ValueError(f"zero: optimizer Muon: group {name!r} has ns_method "
                         f"{settings['ns_method']!r}; use \"gram\" or \"standard\"")
    if not 0.0 <= float(settings["momentum"]) <= 1.0:
        raise ValueError(f"zero: optimizer Muon: group {name!r} has momentum "
                         f"{settings['momentum']}; it must lie in [0, 1]")


def _half_defaults(defaults: dict, keys, params: dict, lr_key: str) -> dict:
    settings = dict(defaults)
    settings.update({k: params[k] for k in keys if params.get(k) is not None})
    if params.get(lr_key) is not None:
        settings["lr"] = params[lr_key]
    return settings
