"""The optimizer object `zero.initialize` returns. The update itself runs in C++ on each
rank's shard (EngineCore.step; for a torch optimizer zero does not build, a copy of it, called
from there: external_optimizer.py); this object carries what schedulers and scripts touch:
`param_groups` (lr, betas, weight decay ... per group) and state_dict()/load_state_dict()."""
from __future__ import annotations

from typing import Any

import collections
import logging

import torch

from zero.boundary import optimizer_hyper
from zero.external_optimizer import ExternalOptimizer
from zero.loss_scaler import StaticLossScaler

logger = logging.getLogger("zero")

ADAM_KEYS = ("lr", "betas", "eps", "weight_decay", "bias_correction")
SGD_KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
ADAGRAD_KEYS = ("lr", "eps", "weight_decay", "lr_decay", "initial_accumulator_value")
LION_KEYS = ("lr", "betas", "weight_decay")
LAMB_KEYS = ("lr", "betas", "eps", "weight_decay", "bias_correction", "max_coeff", "min_coeff",
             "eps_inside_sqrt")
# The hyperparameters of each update zero builds, and the config types that name them. Muon's
# groups are each Muon's or Adam's (zero/muon.py builds them with their settings).
KINDS = {"adam": ADAM_KEYS, "sgd": SGD_KEYS, "adagrad": ADAGRAD_KEYS, "lion": LION_KEYS,
         "lamb": LAMB_KEYS, "muon": ()}
CONFIG_KINDS = {"Adam": "adam", "AdamW": "adam", "SGD": "sgd", "Adagrad": "adagrad", "Lion": "lion",
                "Lamb": "lamb", "Muon": "muon"}


# Config types DeepSpeed builds from torch.optim (getattr(torch.optim, type)): zero builds them
# too and runs them on the shards as a client's (external_optimizer.py)
TORCH_CONFIG_TYPES = ("RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta")


# DeepSpeed's own optimizer names (deepspeed/runtime/config.py DEEPSPEED_OPTIMIZERS), which its
# config lower-cases; every other type keeps its spelling (get_mom tests "SGD", "RMSprop").
DEEPSPEED_OPTIMIZERS = ("adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion",
                        "muon")


def deepspeed_optimizer_name(written: str | None) -> str | None:
    """The name DeepSpeed's engine.optimizer_name() gives a config's optimizer type as written."""
    if written is not None and written.lower() in DEEPSPEED_OPTIMIZERS:
        return written.lower()
    return written


def torch_optimizer(optimizer_config, groups: list) -> torch.optim.Optimizer:
    """The config's torch.optim optimizer over the script's parameter groups, as DeepSpeed
    builds it."""
    return getattr(torch.optim, optimizer_config.type)(groups, **dict(optimizer_config.params))



def hyperparameters(saved_group: dict) -> dict:
    """A saved optimizer group's hyperparameters to restore: not what says which parameters
    the group holds ("params"; DeepSpeed-MoE's "name" ep_size_<n> and "moe", which follow the
    model's layout now)."""
    return {key: value for key, value in saved_group.items()
            if key not in ("params", "name", "moe")}

class OptimizerSpec:
    """What kind of update, and the default hyperparameters for every group."""

    def __init__(self, kind: str, defaults: dict[str, Any], decoupled_weight_decay: bool,
                 client_name: str | None = None, external: ExternalOptimizer | None = None):
        if kind not in KINDS and not (kind == "external" and external is not None):
            raise ValueError(f"optimizer kind {kind!r}: expected one of {sorted(KINDS)}")
        self.kind = kind
        self.defaults = dict(defaults)
        self.decoupled_weight_decay = decoupled_weight_decay
        self.client_name = client_name  # a client optimizer's class name (optimizer_name())
        self.external = external  # kind "external": the client, run on the shards
        # a client DeepSpeedCPUAdam's switch (boundary.sixteen_bit_states); None: the config's
        self.fp32_optimizer_states: bool | None = None

    @classmethod
    def from_config(cls, optimizer_config) -> "OptimizerSpec":
        kind = CONFIG_KINDS[optimizer_config.type]
        defaults = _pick(optimizer_config.params, KINDS[kind])
        if "betas" in KINDS[kind]:
            defaults["betas"] = tuple(defaults.get("betas", (0.9, 0.999)))
        return cls(kind, defaults, optimizer_config.decoupled_weight_decay)

    @classmethod
    def inference_only(cls) -> "OptimizerSpec":
        """No optimizer at all (DeepSpeed's inference engine: initialize without one): the
        engine shards and gathers as usual; step() is refused. A stateless SGD with lr 0
        stands in so the groups build the same way."""
        return cls("sgd", {"lr": 0.0}, decoupled_weight_decay=False)

    @classmethod
    def from_torch(cls, optimizer: torch.optim.Optimizer) -> "OptimizerSpec":
        """A client optimizer: its type and hyperparameters are taken over; its state is not
        (the engine keeps state only for its shard). One zero does not build (another class,
        or an option such as amsgrad) runs as it is on each shard (external_optimizer.py)."""
        spec = cls._of_client(optimizer)
        spec.fp32_optimizer_states = getattr(optimizer, "fp32_optimizer_states", None)
        return spec

    @classmethod
    def _of_client(cls, optimizer: torch.optim.Optimizer) -> "OptimizerSpec":
        name = type(optimizer).__name__
        if any(group.get(option) for group in [optimizer.defaults, *optimizer.param_groups]
               for option in ("amsgrad", "maximize", "capturable", "differentiable")):
            return cls.external_from(optimizer)
        if isinstance(optimizer, torch.optim.AdamW):
            return cls("adam", _pick(optimizer.defaults, ADAM_KEYS), True, name)
        if isinstance(optimizer, torch.optim.Adam):
            decoupled = bool(optimizer.defaults.get("decoupled_weight_decay", False))
            return cls("adam", _pick(optimizer.defaults, ADAM_KEYS), decoupled, name)
        if isinstance(optimizer, torch.optim.SGD):
            return cls("sgd", _pick(optimizer.defaults, SGD_KEYS), False, name)
        if isinstance(optimizer, torch.optim.Adagrad):
            return cls("adagrad", _pick(optimizer.defaults, ADAGRAD_KEYS), False, name)
        kind = getattr(optimizer, "zero_optimizer_kind", None)  # zero's DeepSpeed ops (Lion, ...)
        if kind in KINDS:
            return cls(kind, _pick(optimizer.defaults, KINDS[kind]), kind in ("lion", "lamb"), name)
        return cls.external_from(optimizer)

    @classmethod
    def external_from(cls, optimizer: torch.optim.Optimizer) -> "OptimizerSpec":
        return cls("external", dict(optimizer.defaults), False, type(optimizer).__name__,
                   ExternalOptimizer(optimizer))

    @property
    def label(self) -> str:
        """What a checkpoint records of the optimizer: the kind, or the external class."""
        return self.kind if self.external is None else f"external {self.external.name}"

    def needs_untested_flag(self) -> bool:
        """Whether DeepSpeed would ask "zero_allow_untested_optimizer" of this optimizer under
        ZeRO: one zero does not build itself, other than an Adam variant (amsgrad, ...)."""
        return self.external is not None and not isinstance(
            self.external.client, (torch.optim.Adam, torch.optim.AdamW))

    def kind_of(self, group: dict) -> str:
        """The update of one optimizer group: the spec's kind, but Adam for a Muon optimizer's
        groups that are not use_muon (MuonWithAuxAdam's auxiliary Adam)."""
        if self.kind == "muon" and not group.get("use_muon", False):
            return "adam"
        return self.kind

    def momentum_buffer_needed(self, groups) -> bool:
        return self.kind == "sgd" and any(g.get("momentum", 0.0) != 0.0 for g in groups)


def check_client_states(spec: OptimizerSpec, config) -> None:
    """DeepSpeed's check of a client DeepSpeedCPUAdam: with bf16_optimizer_states and the
    optimizer offloaded, one built with fp32_optimizer_states=True is refused (its moments
    would be fp32 where the config asks for bf16)."""
    if (spec.fp32_optimizer_states and config.bf16.bf16_optimizer_states
            and config.zero_optimization.offload_optimizer.device != "none"):
        raise ValueError(
            f"zero: bf16.bf16_optimizer_states keeps the moments in bf16 with the optimizer "
            f"offloaded, but the client {spec.client_name} was built with "
            "fp32_optimizer_states=True (DeepSpeed refuses this too); build it with "
            "fp32_optimizer_states=False, or set bf16_optimizer_states to false")


# The updates zero steps with an fp32 master, on the device only or (Muon) with all of its
# state in host memory: the config type's name, what offload it takes, why not a 16-bit master
# (the engine's check below and the estimator's refusals)
ON_DEVICE = {
    "lamb": ("Lamb", "LAMB steps on the device (DeepSpeed's FusedLamb has no CPU version "
             "either)", "LAMB steps an fp32 master"),
    "muon": ("Muon", "zero offloads Muon's momentum to host memory only, all of it and stepped "
             "at once (device \"cpu\", ratio 1, no delayed_update)",
             "Muon keeps an fp32 master and fp32 momentum"),
}


def offload_allowed(kind: str, device: str, ratio: float, delayed_update: bool) -> bool:
    """Whether an update of `kind` (one of ON_DEVICE) takes this offload_optimizer: none, or
    for Muon all of its state in host memory, stepped at once."""
    host_whole = device == "cpu" and float(ratio) == 1.0 and not delayed_update
    return device == "none" or (kind == "muon" and host_whole)


def check_on_device(spec: OptimizerSpec, config) -> None:
    """LAMB steps an fp32 master on the device; Muon too, or with its state in host memory:
    no other offload, no 16-bit master."""
    if spec.kind not in ON_DEVICE:
        return
    name, offload_rule, not_16_bit = ON_DEVICE[spec.kind]
    offload = config.zero_optimization.offload_optimizer
    if not offload_allowed(spec.kind, offload.device, offload.ratio, offload.delayed_update):
        raise ValueError(
            f"zero: zero_optimization.offload_optimizer (device \"{offload.device}\", ratio "
            f"{offload.ratio}, delayed_update {str(offload.delayed_update).lower()}) with "
            f"optimizer {name}: {offload_rule}; remove offload_optimizer or use Adam")
    for block, key in ((config.bf16, "bf16_master_weights_and_grads"),
                       (config.fp16, "fp16_master_weights_and_grads")):
        if getattr(block, key):
            precision = key.split("_")[0]
            raise ValueError(f"zero: {precision}.{key} with optimizer {name}: {not_16_bit}; "
                             f"set {key} to false or use Adam")


def check_external(spec: OptimizerSpec, config) -> None:
    """What an optimizer zero runs as the script's own object (external_optimizer.py) needs:
    DeepSpeed's consent to an untested optimizer under ZeRO, and its state on the device."""
    if spec.external is None:
        return
    zero_cfg = config.zero_optimization
    if spec.needs_untested_flag() and zero_cfg.stage >= 1 \
            and not config.zero_allow_untested_optimizer:
        raise ValueError(
            f"zero: ZeRO stage {zero_cfg.stage} with optimizer {spec.external.name}, which "
            "DeepSpeed does not test under ZeRO: add \"zero_allow_untested_optimizer\": true "
            "to the config (as DeepSpeed asks; the HF Trainer adds it when it builds the "
            "optimizer), or use Adam, AdamW, Adagrad, Lion, Lamb or SGD")
    if zero_cfg.offload_optimizer.device != "none":
        raise ValueError(
            f"zero: zero_optimization.offload_optimizer.device "
            f"\"{zero_cfg.offload_optimizer.device}\" with optimizer {spec.external.name}: zero "
            "offloads the optimizers it builds itself (Adam, AdamW, Adagrad, Lion, SGD); remove "
            "offload_optimizer or use one of those")


def trust_ratios(engine) -> dict[int, float]:
    """LAMB's last step: each engine group's trust ratios, by id of the parameter (none once
    the engine is gone)."""
    core = getattr(engine, "core", None)
    if core is None:
        return {}
    return {id(param): ratio for g, group in enumerate(engine.groups)
            for param, ratio in zip(group.params, core.group_trust_ratios(g))}


def fill_initial_state(core, engine_groups, param_groups) -> None:
    """Adagrad's sum starts at its group's initial_accumulator_value, as torch fills it when
    the optimizer is built (the engine's arrays start at 0): this rank's shard of each engine
    group, wherever it lives (device, host, NVMe)."""
    for g, group in enumerate(engine_groups):
        value = float(param_groups[group.owner].get("initial_accumulator_value", 0.0))
        if value and "sum" in core.group_state_names(g):
            layout = core.group_layout(g)
            numel = sum(layout.unit(u).shard_numel for u in range(layout.unit_count))
            core.group_write_array(g, "sum", 0, torch.full((numel,), value))


def _pick(values: dict, keys) -> dict:
    return {k: values[k] for k in keys if k in values}


class ZeroOptimizer(torch.optim.Optimizer):
    """param_groups[i] describes optimizer group i (its 'params' are the model parameters),
    the owner of one or more engine groups.

    A torch Optimizer by type, so LR schedulers built on it (torch's LambdaLR from the HF
    Trainer, a client scheduler callable) accept it, as they accept DeepSpeed's; torch's
    __init__ is not run: the state is sharded inside the engine, not in `state`. At stage 3
    the engine adds `parameter_offload` (zero/parameter_offload.py), as DeepSpeed's stage-3
    optimizer has one; it is absent at the other stages, as there."""

    def __init__(self, spec: OptimizerSpec, param_groups: list[dict],  # noqa: super-init-not-called
                 loss_scaler=None, owners: list[int] | None = None, trust_ratios=None):
        self.spec = spec
        self.param_groups = param_groups
        self.owners = owners or []  # the optimizer group of each engine group
        self.defaults = spec.defaults
        self.state = collections.defaultdict(dict)
        self.overflow = False  # the last step was skipped (fp16 overflow, non-finite grads)
        self._loss_scaler = loss_scaler  # fp16's (zero/loss_scaler.py); None otherwise
        self._scale_of_one = StaticLossScaler(1.0)  # loss_scaler without fp16
        self._trust_ratios = trust_ratios  # LAMB's: () -> {id(parameter): last ratio}

    def _get_scale(self) -> float:
        return self._loss_scaler.loss_scale if self._loss_scaler is not None else 1.0

    def _set_scale(self, value: float) -> None:
        if self._loss_scaler is None:
            raise ValueError("zero: the loss scale is 1.0 without fp16; there is none to set")
        self._loss_scaler.cur_scale = value

    # The loss scale in use now (fp16's dynamic or static one; 1.0 otherwise), settable, under
    # DeepSpeed's ZeRO optimizers' names.
    cur_scale = property(_get_scale, _set_scale)
    loss_scale = property(_get_scale, _set_scale)

    @property
    def loss_scaler(self):
        """DeepSpeed's ZeRO optimizers' scaler object (cur_scale, cur_iter, cur_hysteresis,
        ...): fp16's; without fp16 a static scale of 1, as DeepSpeed's bf16 and fp32."""
        return self._loss_scaler if self._loss_scaler is not None else self._scale_of_one

    @property
    def dynamic_loss_scale(self) -> bool:
        return self._loss_scaler is not None and self._loss_scaler.dynamic

    def hypers(self) -> list:
        """Each engine group's hyperparameters for EngineCore.step (_C.OptimizerHyper), read
        fresh each step so schedulers and scripts that edit param_groups take effect."""
        hypers = []
        for g, owner in enumerate(self.owners):
            group = self.param_groups[owner]
            external = self.spec.external.update(g, group) if self.spec.external else None
            hypers.append(optimizer_hyper(self.spec.kind_of(group), group,
                                          self.spec.decoupled_weight_decay, external))
        return hypers

    @property
    def optimizer(self) -> "ZeroOptimizer":
        """DeepSpeed's ZeRO and fp16 optimizers wrap the basic one as `.optimizer` (its
        param_groups the same); here it is this object (bing_bert's
        `optimizer.optimizer.get_lamb_coeffs()`)."""
        return self

    def get_lamb_coeffs(self) -> list[float]:
        """DeepSpeed's FusedLamb.get_lamb_coeffs(): each parameter's trust ratio at the last
        step, in parameter-group order (empty before the first step)."""
        if self.spec.kind != "lamb" or self._trust_ratios is None:
            raise ValueError(f"zero: get_lamb_coeffs() is LAMB's; this engine's optimizer is "
                             f"{self.spec.label}")
        ratios = self._trust_ratios()
        return [ratios[id(p)] for group in self.param_groups for p in group["params"]
                if id(p) in ratios]

    def state_dict(self) -> dict:
        state = {"param_groups": [{k: v for k, v in g.items() if k != "params"}
                                  for g in self.param_groups]}
        if self.spec.external is not None:  # its state that is not per element
            state["external_scalars"] = self.spec.external.scalar_state(self.param_groups,
                                                                        self.owners)
        return state

    def load_state_dict(self, state: dict) -> None:
        saved = state["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError(f"zero: checkpoint has {len(saved)} optimizer groups, the engine "
                             f"has {len(self.param_groups)}; the model's parameter groups changed "
                             "(with MoE layers: their ep_sizes, which make one group each, or "
                             "the expert groups' split at max_group_size); load with "
                             "load_optimizer_states=False, or pass the groups it was saved with")
        for group, values in zip(self.param_groups, saved):
            group.update(hyperparameters(values))
        if self.spec.external is not None:
            self.spec.external.load_scalar_state(state.get("external_scalars", {}),
                                                 self.param_groups, self.owners)

    def quantize_nontrainable_params(self) -> None:
        """DeepSpeed's stage-3 call after a model was made LoRA (DeepSpeed-Chat, the Mixed
        Precision ZeRO++ tutorial) with zero_quantized_nontrainable_weights. zero decides what
        is frozen when the engine is built and keeps the frozen shard in int8 from then on, so
        there is nothing left to quantize; a parameter frozen or unfrozen since is an error
        (build the engine after freezing)."""
        offload = getattr(self, "parameter_offload", None)
        if offload is None:
            raise RuntimeError("zero: quantize_nontrainable_params is stage 3's "
                               "(zero_optimization.stage 3 with zero_quantized_nontrainable_weights)")
        if not offload.quantized_frozen:
            logger.warning("zero: quantize_nontrainable_params() with "
                           "zero_optimization.zero_quantized_nontrainable_weights false: nothing "
                           "to do")
            return
        changed = offload.changed_since_layout()
        if changed:
            raise ValueError(
                f"zero: requires_grad of {changed[:5]} changed after the engine was built; zero "
                "lays the frozen parameters out (and quantizes them) at initialize: freeze the "
                "model (e.g. make it LoRA) before zero.initialize / deepspeed.initialize")

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 - engine owns grads
        """Gradients live in engine buffers; engine.zero_grad() clears them."""

    def step(self, closure=None):  # noqa: ARG002
        raise RuntimeError("zero: call engine.step(); the sharded update runs inside the engine")
