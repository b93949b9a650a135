"""`deepspeed.utils`' safe_get_full_* / safe_set_full_*: a parameter's whole fp32 master,
optimizer state or reduced gradient, from the ranks' shards (zero/param_values.py).
Collective, as in DeepSpeed: every rank calls them for the same parameter."""
from __future__ import annotations

from zero import param_values


def safe_get_full_fp32_param(param):
    """The parameter's whole fp32 master weights; None for one no engine trains."""
    return param_values.get_full(param, "master")


def safe_set_full_fp32_param(param, value) -> None:
    """Sets the parameter's fp32 master weights (the model's weights follow at the next step)."""
    param_values.set_full(param, value, "master")


def safe_get_full_optimizer_state(param, optim_state_key):
    """The parameter's whole optimizer state `optim_state_key` ("exp_avg", "exp_avg_sq", ...)."""
    return param_values.get_full(param, optim_state_key)


def safe_set_full_optimizer_state(param, value, optim_state_key) -> None:
    param_values.set_full(param, value, optim_state_key)


def safe_get_local_fp32_param(param):
    """This rank's fragment of the parameter's fp32 master (flat), as DeepSpeed's stage 3."""
    return param_values.get_local(param, "master")


def safe_set_local_fp32_param(param, value) -> None:
    param_values.set_local(param, value, "master")


def safe_get_local_optimizer_state(param, optim_state_key):
    """This rank's fragment of the parameter's optimizer state `optim_state_key` (flat)."""
    return param_values.get_local(param, optim_state_key)


def safe_set_local_optimizer_state(param, value, optim_state_key) -> None:
    param_values.set_local(param, value, optim_state_key)


def safe_get_full_grad(param):
    """The parameter's whole gradient, averaged over the data-parallel ranks, in fp32 (with
    fp16's loss scale still in it, as DeepSpeed's): between engine.backward(loss) at an
    accumulation boundary and engine.step(). None for a parameter no engine trains."""
    return param_values.get_full(param, "grad")


def safe_set_full_grad(param, value) -> None:
    """Replaces the parameter's gradient before the step (each rank writes its own part);
    the step, its clipping and the gradient norm use the new value. With fp16 the value must
    carry the loss scale, as what safe_get_full_grad returns does."""
    param_values.set_full(param, value, "grad")


def safe_update_full_grad_vectorized(param_list, update_func) -> None:
    """DeepSpeed's: each parameter's whole gradient replaced by `update_func(grad, param)`,
    between a boundary's backward and the step: in place where the parameter shows one in
    param.grad (stage 0), through safe_get_full_grad / safe_set_full_grad where the engine
    holds it sharded. Collective, as those: every rank passes the same parameters."""
    for param in param_list:
        if param.grad is not None:
            param.grad.copy_(update_func(param.grad, param))
        elif param.requires_grad:
            grad = safe_get_full_grad(param)
            if grad is not None:  # trained by an engine
                safe_set_full_grad(param, update_func(grad, param))


def safe_get_local_grad(param):
    """This rank's fragment of the parameter's reduced gradient (flat, fp32)."""
    return param_values.get_local(param, "grad")


def safe_set_local_grad(param, value) -> None:
    param_values.set_local(param, value, "grad")
