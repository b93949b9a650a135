"""fp16 loss scaling with DeepSpeed's update rules.

Why: fp16 gradients underflow unless the loss is multiplied by a large factor
before backward. A *dynamic* scaler starts high, halves on overflow (the step
is skipped by the caller) and grows again after a run of clean steps. Users
tune this through DeepSpeed's ``fp16`` config block, so the arithmetic here
follows ``deepspeed/runtime/fp16/loss_scaler.py`` (0.19.0) exactly, including
its off-by-one growth window and its hysteresis bookkeeping (see
``DynamicLossScaler.update_scale``).

The module is device-agnostic: the scaler only holds Python numbers, and
``has_inf_or_nan`` reduces on whatever device the tensor lives on.
"""

import logging

import torch

logger = logging.getLogger(__name__)


class LossScaleUnderflowError(RuntimeError):
    """Gradients overflowed while the loss scale was already at ``min_loss_scale``."""


def has_inf_or_nan(tensor):
    """True if ``tensor`` holds any inf or NaN.

    DeepSpeed tests ``float(x.float().sum())`` for inf/NaN, which also fires
    when finite fp32 values merely sum past fp32's range. We use the same cheap
    single reduction as a fast path (a finite sum proves every element is
    finite) but confirm a non-finite sum element-wise, so the answer is exact.
    """
    if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.numel() == 0:
        return False
    acc_dtype = torch.float64 if tensor.dtype == torch.float64 else torch.float32
    if tensor.is_floating_point() and bool(torch.isfinite(tensor.sum(dtype=acc_dtype))):
        return False
    return not bool(torch.isfinite(tensor).all())


class StaticLossScaler:
    """A fixed loss scale (DeepSpeed's ``LossScaler``): ``update_scale`` never changes it.

    The scale is configuration, not training state, so ``load_state_dict``
    leaves it alone: a resumed run uses the scale from its current config.
    """

    dynamic = False

    def __init__(self, scale=1.0):
        if not scale > 0:
            raise ValueError(f"static loss scale must be > 0, got {scale}")
        self.cur_scale = scale

    @property
    def loss_scale(self):
        return self.cur_scale

    def scale_loss(self, loss):
        return loss * self.cur_scale

    def update_scale(self, overflow):
        pass

    def state_dict(self):
        return {"dynamic": False, "cur_scale": self.cur_scale}

    def load_state_dict(self, state_dict):
        pass


class DynamicLossScaler:
    """DeepSpeed's dynamic loss scaler.

    Args:
        init_scale: starting scale (DeepSpeed config: ``2**initial_scale_power``).
        scale_factor: divide on overflow / multiply on growth. DeepSpeed
            hard-codes 2.0 and does not expose it in config.
        scale_window: clean steps between growths (``loss_scale_window``).
        min_scale: floor for the scale (``min_loss_scale``).
        delayed_shift: hysteresis, i.e. how many overflows are tolerated
            before the scale actually drops (``hysteresis``).
        consecutive_hysteresis: refill hysteresis after *every* clean step
            instead of only when the scale grows.
        raise_error_at_min_scale: what to do when gradients overflow while the
            scale already sits at ``min_scale``. DeepSpeed (default True)
            raises; we raise ``LossScaleUnderflowError`` naming the fix. With
            False the scale stays clamped at ``min_scale`` and training goes on
            (every such step is still skipped by the caller).

    Note the floor is reached by clamping: an overflow that would take the
    scale below ``min_scale`` sets it to exactly ``min_scale``; only the *next*
    exhausted-hysteresis overflow raises.
    """

    dynamic = True

    def __init__(self, init_scale=2**16, scale_factor=2.0, scale_window=1000, min_scale=1, delayed_shift=1,
                 consecutive_hysteresis=False, raise_error_at_min_scale=True):
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        if not scale_factor > 1:
            raise ValueError(f"scale_factor must be > 1, got {scale_factor}")
        if not (isinstance(scale_window, int) and scale_window >= 1):
            raise ValueError(f"scale_window (loss_scale_window) must be an integer >= 1, got {scale_window!r}")
        if not 0 < min_scale <= init_scale:
            raise ValueError(f"min_scale (min_loss_scale) must be in (0, init_scale={init_scale}], got {min_scale}")
        if not (isinstance(delayed_shift, int) and delayed_shift >= 1):
            raise ValueError(f"delayed_shift (hysteresis) must be an integer >= 1, got {delayed_shift!r}")
        self.cur_scale = init_scale
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.cur_hysteresis = delayed_shift

    @property
    def loss_scale(self):
        return self.cur_scale

    def scale_loss(self, loss):
        return loss * self.cur_scale

    def update_scale(self, overflow):
        """Advance one iteration, given whether this iteration's gradients overflowed.

        Overflow: if hysteresis is exhausted (``delayed_shift == 1`` or
        ``cur_hysteresis == 1``) the scale is divided, else one unit of
        hysteresis is spent. Hysteresis is *not* refilled by the drop itself,
        so after the first drop every further overflow drops again until it
        is refilled (by a growth, or by any clean step with
        ``consecutive_hysteresis``).

        Clean step: the scale grows when ``cur_iter - last_overflow_iter - 1``
        is a positive multiple of ``scale_window``. That is DeepSpeed's
        off-by-one: the first growth needs ``scale_window + 1`` consecutive
        clean steps, later ones ``scale_window`` each.
        """
        if overflow:
            self._on_overflow()
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable_interval = self.cur_iter - self.last_overflow_iter - 1
            if stable_interval > 0 and stable_interval % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    def _on_overflow(self):
        if self.delayed_shift > 1 and self.cur_hysteresis > 1:
            logger.info("fp16 overflow at loss scale %s; hysteresis %d -> %d, scale kept",
                        self.cur_scale, self.cur_hysteresis, self.cur_hysteresis - 1)
            self.cur_hysteresis -= 1
            return
        if self.cur_scale == self.min_scale and self.raise_error_at_min_scale:
            raise LossScaleUnderflowError(
                f"fp16 gradients overflowed with the loss scale already at min_loss_scale={self.min_scale}; "
                "the scale cannot go lower. Fix: lower fp16.min_loss_scale, look for inf/NaN produced by the "
                "model or data, lower the learning rate, or train in bf16/fp32.")
        next_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
        logger.info("fp16 overflow: skipping step, loss scale %s -> %s", self.cur_scale, next_scale)
        self.cur_scale = next_scale

    # Only the running state is saved/restored. Hyper-parameters come from the
    # current config, so a resumed run can e.g. lower min_loss_scale after a
    # LossScaleUnderflowError (DeepSpeed pickles the whole object instead).
    _STATE_KEYS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")

    def state_dict(self):
        return {"dynamic": True, **{key: getattr(self, key) for key in self._STATE_KEYS}}

    def load_state_dict(self, state_dict):
        missing = [key for key in self._STATE_KEYS if key not in state_dict]
        if missing:
            raise ValueError(f"dynamic loss scaler state is missing {missing}; got keys {sorted(state_dict)}")
        for key in self._STATE_KEYS:
            setattr(self, key, state_dict[key])


def from_config(loss_scale=0, initial_scale_power=16, loss_scale_window=1000, hysteresis=2,
                consecutive_hysteresis=False, min_loss_scale=1, raise_error_at_min_scale=True):
    """Build a scaler from DeepSpeed ``fp16`` config values (defaults are DeepSpeed's).

    ``loss_scale == 0`` selects dynamic scaling starting at
    ``2**initial_scale_power``; any positive value is a static scale.
    """
    if isinstance(loss_scale, bool) or not loss_scale >= 0:
        raise ValueError(f"loss_scale must be >= 0 (0 enables dynamic loss scaling), got {loss_scale!r}")
    if loss_scale > 0:
        return StaticLossScaler(loss_scale)
    return DynamicLossScaler(init_scale=2**initial_scale_power, scale_window=loss_scale_window,
                             min_scale=min_loss_scale, delayed_shift=hysteresis,
                             consecutive_hysteresis=consecutive_hysteresis,
                             raise_error_at_min_scale=raise_error_at_min_scale)
