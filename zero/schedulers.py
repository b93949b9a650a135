"""DeepSpeed-compatible learning-rate schedules.

Why this module exists: users bring DeepSpeed JSON configs (``"scheduler":
{"type": "WarmupLR", "params": {...}}``) and expect the learning rate at every
training step to be *identical* to what DeepSpeed would have produced. So the
parameter names, defaults and step arithmetic below follow
``deepspeed/runtime/lr_schedules.py`` of DeepSpeed 0.19.8, quirks included; the
quirks are called out where they occur so nobody "fixes" them by accident.
tests/test_schedulers_deepspeed.py checks every schedule against the real
0.19.8's values (tests/deepspeed_schedules/).

Protocol (same as DeepSpeed):

* Construction with ``last_batch_iteration=-1`` writes the *initial* lr into
  the optimizer's param groups (the lr used by the very first optimizer step).
* The engine calls ``step()`` once after every optimizer step that was actually
  applied (DeepSpeed skips ``scheduler.step()`` on fp16 overflow steps).
  ``step()`` advances ``last_batch_iteration`` by one and writes the lr for the
  *next* optimizer step.

The schedulers work on any object with ``param_groups`` (a list of dicts with
an ``'lr'`` key), e.g. ``torch.optim.Optimizer`` or this project's sharded
optimizers; nothing here touches a device.

Deliberate differences from DeepSpeed 0.19.8 (only where it silently misbehaves or hides a
config typo):

* An unknown ``warmup_type`` raises ``ValueError`` (DeepSpeed's ``WarmupLR`` warns and
  falls back to "log").
* ``load_state_dict`` re-applies the restored lr to the param groups
  (DeepSpeed relies on the optimizer checkpoint restoring ``'lr'``).
* ``get_last_lr`` returns Python floats; tensor lrs in param groups are kept
  as tensors of the same dtype/device/shape.
"""

import difflib
import inspect
import logging
import math

import torch

logger = logging.getLogger(__name__)

WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"
WARMUP_TYPES = (WARMUP_LOG_RATE, WARMUP_LINEAR_RATE)


# --------------------------------------------------------------------------- helpers


def _per_group(optimizer, value, name):
    """Broadcast a scalar to every param group, or check a per-group list."""
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name}: expected one value per param group ({n}), got {len(value)}: {list(value)}")
        return [float(v) for v in value]
    return [float(value)] * n


def _apply_lrs(param_groups, lrs):
    """Write lrs into the groups, keeping tensor lrs as tensors (capturable optimizers)."""
    for group, lr in zip(param_groups, lrs):
        old = group["lr"]
        group["lr"] = torch.full_like(old, lr) if isinstance(old, torch.Tensor) else lr
    return list(lrs)


def _check_warmup(warmup_num_steps, warmup_type):
    if isinstance(warmup_num_steps, bool) or not isinstance(warmup_num_steps, int) or warmup_num_steps <= 0:
        raise ValueError(f"warmup_num_steps must be a positive integer, got {warmup_num_steps!r}")
    if warmup_type not in WARMUP_TYPES:
        raise ValueError(f"warmup_type must be one of {list(WARMUP_TYPES)}, got {warmup_type!r}")


def _warmup_fraction(iteration, num_steps, warmup_type):
    """DeepSpeed's warmup curve in [0, 1) for 0 <= iteration < num_steps.

    Note the asymmetry DeepSpeed has: "log" reaches 1 at iteration num_steps-1
    (log(it+1)/log(N)), "linear" only at num_steps (it/N). Operation order
    mirrors DeepSpeed so results are bit-identical.
    """
    if warmup_type == WARMUP_LOG_RATE:
        return (1.0 / math.log(num_steps)) * math.log(iteration + 1)
    return iteration / num_steps


class _Scheduler:
    """Shared step/state plumbing. Subclasses implement ``get_lr()``."""

    def __init__(self, optimizer, last_batch_iteration):
        if not hasattr(optimizer, "param_groups"):
            raise TypeError(f"{type(optimizer).__name__} has no param_groups; pass an optimizer-like object")
        self.optimizer = optimizer
        self.last_batch_iteration = last_batch_iteration
        self._last_lr = None

    def get_lr(self):
        raise NotImplementedError

    def _apply(self):
        """Push the lr (and, for OneCycle, momentum) for the current iteration."""
        self._last_lr = _apply_lrs(self.optimizer.param_groups, self.get_lr())

    def step(self, last_batch_iteration=None):
        """Advance one training step (or jump to ``last_batch_iteration``) and apply its lr."""
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = last_batch_iteration
        self._apply()

    def get_last_lr(self):
        if self._last_lr is None:
            raise RuntimeError("no learning rate applied yet: call step() first")
        return list(self._last_lr)

    def state_dict(self):
        # Same single key as DeepSpeed so checkpoints are interchangeable.
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state_dict):
        self.last_batch_iteration = state_dict["last_batch_iteration"]
        self._apply()


# --------------------------------------------------------------------------- warmup family


class WarmupLR(_Scheduler):
    """Warm lr from ``warmup_min_lr`` to ``warmup_max_lr`` over ``warmup_num_steps``, then hold.

    ``warmup_max_lr=None`` takes each param group's own current lr (as
    DeepSpeed 0.19.8 does). The initial lr (applied at construction) is
    ``warmup_min_lr``; because log warmup gives log(1)=0 at iteration 0, the
    first *two* optimizer steps both run at ``warmup_min_lr`` - a DeepSpeed
    quirk we keep.
    """

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=None, warmup_num_steps=1000,
                 warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        _check_warmup(warmup_num_steps, warmup_type)
        if warmup_max_lr is None:
            warmup_max_lr = [float(group["lr"]) for group in optimizer.param_groups]
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(optimizer, warmup_max_lr, "warmup_max_lr")
        self.warmup_num_steps = max(2, warmup_num_steps)  # log(1) = 0 would divide by zero
        self.warmup_type = warmup_type
        if last_batch_iteration == -1:
            self._apply()

    def _gamma(self):
        """Fraction of the way from min to max lr."""
        if self.last_batch_iteration < self.warmup_num_steps:
            return _warmup_fraction(self.last_batch_iteration, self.warmup_num_steps, self.warmup_type)
        return 1.0

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma()
        return [lo + (hi - lo) * gamma for lo, hi in zip(self.min_lrs, self.max_lrs)]


class WarmupDecayLR(WarmupLR):
    """``WarmupLR`` followed by a linear decay that reaches ``warmup_min_lr`` at ``total_num_steps``.

    After warmup, gamma = max(0, (total - it) / max(1, total - warmup)), so the
    decay starts at exactly ``warmup_max_lr`` at iteration ``warmup_num_steps``
    and stays at ``warmup_min_lr`` past the end. Unlike ``WarmupLR``, the
    default ``warmup_max_lr`` is 0.001 (DeepSpeed's signature).
    """

    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001,
                 warmup_num_steps=1000, warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)
        if total_num_steps < self.warmup_num_steps:
            logger.warning("total_num_steps %s is less than warmup_num_steps %s", total_num_steps, warmup_num_steps)

    def _gamma(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            return super()._gamma()
        remaining = float(self.total_num_steps - self.last_batch_iteration)
        return max(0.0, remaining / float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR(_Scheduler):
    """Warm a *ratio* of each group's own lr up to 1, then cosine-decay it to ``cos_min_ratio``.

    The peak lr is the optimizer's lr at construction (captured once). Quirks
    kept from DeepSpeed: the lr applied at construction is 0.0 (not
    ``warmup_min_ratio * lr``), and the cosine phase counts from
    ``it - warmup_num_steps + 1``, so it reaches ``cos_min_ratio`` at iteration
    ``total_num_steps - 1``. Past that it stays there (as DeepSpeed 0.19.8).
    """

    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000,
                 cos_min_ratio=0.0001, warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        _check_warmup(warmup_num_steps, warmup_type)
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio = warmup_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = warmup_type
        if total_num_steps < self.warmup_num_steps:
            logger.warning("total_num_steps %s is less than warmup_num_steps %s", total_num_steps, warmup_num_steps)
        self.org_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        if last_batch_iteration == -1:
            self._apply()

    def get_lr_ratio(self):
        it = self.last_batch_iteration
        if it < 0:
            return 0.0
        if it < self.warmup_num_steps:
            fraction = _warmup_fraction(it, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + fraction * (1.0 - self.warmup_min_ratio)
        decay_steps = max(1, self.total_num_steps - self.warmup_num_steps)
        steps_done = min(it - self.warmup_num_steps + 1, decay_steps)  # clamp: hold at the floor
        cosine = (1.0 + math.cos(math.pi * steps_done / decay_steps)) / 2.0
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def get_lr(self):
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]


# --------------------------------------------------------------------------- 1Cycle


def _has_betas(optimizer) -> bool:
    """DeepSpeed cycles momentum only for an optimizer whose defaults have 'betas' (Adam's
    kind); an object without defaults counts when its groups have them."""
    defaults = getattr(optimizer, "defaults", None)
    if isinstance(defaults, dict):
        return "betas" in defaults
    return all("betas" in group for group in optimizer.param_groups)


class OneCycle(_Scheduler):
    """1Cycle: lr rises min->max over ``cycle_first_step_size`` steps, falls back over
    ``cycle_second_step_size`` (default: the first), then optionally decays.

    Momentum (when ``cycle_momentum``) moves inversely: max->min->max, written to
    ``betas[0]``; an optimizer without ``'betas'`` (SGD) keeps its momentum, with a
    warning, as in DeepSpeed.

    DeepSpeed quirks kept on purpose (so runs match step for step):

    * The schedule is evaluated at ``last_batch_iteration + 1``: the lr written
      by ``step()`` is already the one for the next batch position.
    * At construction, lr = ``cycle_min_lr`` and momentum = ``cycle_min_mom``
      (not max, although the first ``step()`` jumps to ~``cycle_max_mom``).
    * ``betas`` become ``(momentum, 0.99)``: DeepSpeed overwrites beta2 with
      0.99 for every Adam-style group.
    * Post-cycle decay: lr = min_lr / (1 + decay_lr_rate * k / decay_step_size)
      and momentum = max_mom * (1 + decay_mom_rate * k / decay_step_size)
      (momentum *grows*), where k counts post-cycle iterations from 1. Decay
      is off when ``decay_step_size`` is 0 or the rate is 0; lr then stays at
      ``cycle_min_lr`` and momentum at ``cycle_max_mom``.
    * ``cycle_first_stair_count``/``cycle_second_stair_count`` (> 0) hold lr and
      momentum flat over stairs of each half: the scale is floor(position x stairs)
      / stairs, the position taken from the integer step within the cycle (DeepSpeed
      0.19.8's arithmetic; earlier releases ignored the counts).
    """

    BETA2 = 0.99  # DeepSpeed's hard-coded second beta while cycling momentum

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.0, cycle_first_step_size=2000,
                 cycle_second_step_size=None, cycle_first_stair_count=0, cycle_second_stair_count=None,
                 decay_step_size=0, cycle_momentum=True, cycle_min_mom=0.8, cycle_max_mom=0.9,
                 decay_mom_rate=0.0, last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        if cycle_second_step_size is None:
            cycle_second_step_size = cycle_first_step_size
        if cycle_first_step_size <= 0 or cycle_second_step_size < 0:
            raise ValueError("cycle_first_step_size must be > 0 and cycle_second_step_size >= 0, got "
                             f"{cycle_first_step_size} and {cycle_second_step_size}")
        if decay_step_size < 0:
            raise ValueError(f"decay_step_size must be >= 0 (0 disables decay), got {decay_step_size}")
        self.first_step_size = float(cycle_first_step_size)
        self.second_step_size = float(cycle_second_step_size)
        self.total_size = self.first_step_size + self.second_step_size
        self.step_ratio = self.first_step_size / self.total_size
        self.first_stair_count = cycle_first_stair_count
        self.second_stair_count = (cycle_first_stair_count
                                   if cycle_second_stair_count is None else cycle_second_stair_count)
        self.decay_step_size = decay_step_size

        self.min_lrs = _per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = decay_lr_rate
        self.skip_lr_decay = math.isclose(decay_step_size, 0) or math.isclose(decay_lr_rate, 0)

        self.min_moms = _per_group(optimizer, cycle_min_mom, "cycle_min_mom")
        self.max_moms = _per_group(optimizer, cycle_max_mom, "cycle_max_mom")
        self.decay_mom_rate = decay_mom_rate
        self.skip_mom_decay = math.isclose(decay_step_size, 0) or math.isclose(decay_mom_rate, 0)
        self.cycle_momentum = cycle_momentum
        if cycle_momentum and not _has_betas(optimizer):
            logger.warning("cycle_momentum disabled: optimizer %s has no 'betas' (as DeepSpeed, "
                           "SGD's momentum is not cycled)", type(optimizer).__name__)
            self.cycle_momentum = False

        if last_batch_iteration == -1:
            self._last_lr = _apply_lrs(optimizer.param_groups, self.min_lrs)
            if self.cycle_momentum:
                self._apply_moms(self.min_moms)

    def _scale_factor(self):
        """Position in the triangle, 0 at the ends and 1 at the peak (in stairs when the half
        has a stair count)."""
        batch = self.last_batch_iteration + 1
        cycle = math.floor(1 + batch / self.total_size)
        x = 1.0 + batch / self.total_size - cycle
        if x <= self.step_ratio:
            scale, stairs = x / self.step_ratio, self.first_stair_count
        else:
            scale, stairs = (x - 1) / (self.step_ratio - 1), self.second_stair_count
        if stairs > 0:  # from the integer step, not `scale` (a float just under a stair)
            step = batch % self.total_size
            if step <= self.first_step_size:
                position = step * stairs / self.first_step_size
            else:
                position = (self.total_size - step) * stairs / self.second_step_size
            scale = math.floor(position) / stairs
        return scale

    def _decay_iteration(self):
        return self.last_batch_iteration - self.total_size + 1

    def _in_cycle(self):
        return self.last_batch_iteration < self.total_size

    def get_lr(self):
        if self._in_cycle():
            scale = self._scale_factor()
            return [lo + (hi - lo) * scale for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        factor = 1 + self.decay_lr_rate * (self._decay_iteration() / self.decay_step_size)
        return [lo / factor for lo in self.min_lrs]

    def get_mom(self):
        """Momentum (beta1) per group for the current iteration, or None when not cycling."""
        if not self.cycle_momentum:
            return None
        if self._in_cycle():
            scale = self._scale_factor()
            return [hi - (hi - lo) * scale for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        factor = 1 + self.decay_mom_rate * (self._decay_iteration() / self.decay_step_size)
        return [hi * factor for hi in self.max_moms]

    def _apply_moms(self, moms):
        for group, mom in zip(self.optimizer.param_groups, moms):
            group["betas"] = (mom, self.BETA2)

    def _apply(self):
        super()._apply()
        if self.cycle_momentum:
            self._apply_moms(self.get_mom())


# --------------------------------------------------------------------------- range test


class LRRangeTest(_Scheduler):
    """The learning-rate range test: lr = min_lr x (1 + step_rate x interval), interval =
    (iteration + 1) / step_size, floored with ``lr_range_test_staircase``; it grows without
    bound, to find the largest lr that still trains (DeepSpeed's arithmetic)."""

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000,
                 lr_range_test_step_rate=1.0, lr_range_test_staircase=False,
                 last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        if isinstance(lr_range_test_step_size, bool) or not isinstance(lr_range_test_step_size, int) \
                or lr_range_test_step_size <= 0:
            raise ValueError("lr_range_test_step_size must be a positive integer, got "
                             f"{lr_range_test_step_size!r}")
        self.min_lrs = _per_group(optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        if last_batch_iteration == -1:
            self._last_lr = _apply_lrs(optimizer.param_groups, self.min_lrs)

    def get_lr(self):
        interval = float(self.last_batch_iteration + 1) / self.step_size
        increase = 1 + self.step_rate * (math.floor(interval) if self.staircase else interval)
        return [lr * increase for lr in self.min_lrs]


# --------------------------------------------------------------------------- factory

SCHEDULERS = {cls.__name__: cls
              for cls in (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)}


def _constructor_params(cls):
    """(all accepted config keys, required ones), read from the constructor signature."""
    params = list(inspect.signature(cls.__init__).parameters.values())[2:]  # drop self, optimizer
    names = [p.name for p in params]
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    return names, required


def build_scheduler(type_name, params, optimizer):
    """Build a scheduler from a DeepSpeed-style ``{"type": ..., "params": {...}}`` config.

    Raises ``ValueError`` (not DeepSpeed's ``TypeError``/fallback to
    ``torch.optim.lr_scheduler``) so config mistakes are reported with the valid
    choices instead of a bare signature error.
    """
    cls = SCHEDULERS.get(type_name)
    if cls is None:
        hint = difflib.get_close_matches(str(type_name), SCHEDULERS, n=1)
        did_you_mean = f" Did you mean {hint[0]!r}?" if hint else ""
        raise ValueError(f"unknown scheduler type {type_name!r}; valid choices: {sorted(SCHEDULERS)}.{did_you_mean}")
    params = dict(params or {})
    names, required = _constructor_params(cls)
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for scheduler {type_name}; valid parameters: {names}")
    missing = [name for name in required if name not in params]
    if missing:
        raise ValueError(f"scheduler {type_name} requires parameter(s) {missing}; valid parameters: {names}")
    return cls(optimizer, **params)
