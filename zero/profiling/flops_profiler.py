"""DeepSpeed's FLOPs profiler, counting with ``torch.utils.flop_counter``.

FLOPs are what :class:`torch.utils.flop_counter.FlopCounterMode` reports for each module:
only operators that have a FLOP formula there (matmul, addmm, bmm, convolution, attention,
...) are counted. Elementwise operators, norms, activations and softmax count nothing, where
DeepSpeed's profiler estimates them too; MACs are half the FLOPs (a multiply-add is 2).
"""
from __future__ import annotations

import functools
import numbers
import os
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from .flops_format import (AGGREGATED_HEADER, DETAILED_HEADER, DETAILED_NOTES, FOOTER, HEADER,
                           NOTATIONS, aggregated_lines, detailed_lines, duration_to_string,
                           macs_to_string, number_to_string, params_to_string, summary_lines)

__all__ = ["FlopsProfiler", "ModuleProfile", "get_model_profile"]


@dataclass
class ModuleProfile:
    """The forward profile of one module; FLOPs, MACs and latency include its submodules'.

    A module that was not measured itself (ignored, or never called, like a ModuleList)
    reports the sum of its submodules', as DeepSpeed does.
    """
    class_name: str
    depth: int
    params: int
    flops: int
    macs: int
    duration_s: float
    extra_repr: str = ""


class FlopsProfiler:
    """Measures the parameters, FLOPs, MACs and forward latency of each module of a model.

    Between :meth:`start_profile` and :meth:`stop_profile` every forward of ``model`` is
    counted with a ``FlopCounterMode`` (active only while the model's forward runs) and timed
    module by module with forward hooks; several forwards add up. Example::

        prof = FlopsProfiler(model)
        prof.start_profile()
        loss = model(batch)
        prof.stop_profile()
        print(prof.get_total_flops(as_string=True))
        prof.print_model_profile(profile_step=step)
        prof.end_profile()

    Args:
        model: the module to profile.
        ds_engine: the engine that owns ``model``; kept for DeepSpeed's signature. Pass sizes
            and latencies to :meth:`print_model_profile` instead.
        recompute_fwd_factor: fraction of the forward recomputed in backward (activation
            checkpointing); the backward is counted as ``2 + recompute_fwd_factor`` forwards.
        param_counts: ``{qualified module name ("" for the root): parameter count}`` used
            instead of ``p.numel()``, e.g. at ZeRO stage 3 where each rank holds only shards.
    """

    def __init__(self, model: nn.Module, ds_engine=None, recompute_fwd_factor: float = 0.0,
                 param_counts: dict[str, int] | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"FlopsProfiler: model must be a torch.nn.Module, got {type(model).__name__}")
        if (not isinstance(recompute_fwd_factor, numbers.Real) or isinstance(recompute_fwd_factor, bool)
                or not recompute_fwd_factor >= 0):
            raise ValueError("FlopsProfiler: recompute_fwd_factor must be a number >= 0, "
                             f"got {recompute_fwd_factor!r}")
        self.model = model
        self.ds_engine = ds_engine
        self.recompute_fwd_factor = float(recompute_fwd_factor)
        self.param_counts = _check_param_counts(model, param_counts)
        self.started = False
        self._handles = []
        self._sync_cuda = False
        self._counter = None
        self._root_calls = 0
        self._flops = {}      # module -> FLOPs summed over the profiled forwards
        self._durations = {}  # module -> forward seconds summed over the profiled forwards
        self._starts = {}     # module -> perf_counter() of each forward still running

    def start_profile(self, ignore_list=None):
        """Starts profiling (clearing earlier results).

        Args:
            ignore_list: module classes not to time nor count themselves; such a module
                reports the sum of its submodules', as in DeepSpeed.
        """
        ignored = _check_ignore_list(ignore_list)
        self.stop_profile()
        self.reset_profile()
        self._sync_cuda = any(t.is_cuda for t in (*self.model.parameters(), *self.model.buffers()))
        _warm_up_counter()
        self._handles.append(self.model.register_forward_pre_hook(self._enter_counter))
        for module in self.model.modules():
            if type(module) not in ignored:
                self._handles.append(module.register_forward_pre_hook(self._start_timer))
                self._handles.append(module.register_forward_hook(self._stop_timer, always_call=True))
        self._handles.append(self.model.register_forward_hook(self._exit_counter, always_call=True))
        self.started = True

    def stop_profile(self):
        """Stops counting and timing; the results stay until :meth:`end_profile`."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def reset_profile(self):
        """Drops the FLOPs and latencies measured so far."""
        self._flops.clear()
        self._durations.clear()
        self._starts.clear()

    def end_profile(self):
        """Removes every hook and drops the results."""
        self.stop_profile()
        self.reset_profile()
        self.started = False

    def get_total_flops(self, as_string=False):
        """FLOPs of the profiled forward passes of the model."""
        flops = self._root_profile().flops
        return number_to_string(flops) if as_string else flops

    def get_total_macs(self, as_string=False):
        """Multiply-accumulate operations of the profiled forward passes (FLOPs / 2)."""
        macs = self._root_profile().macs
        return macs_to_string(macs) if as_string else macs

    def get_total_params(self, as_string=False):
        """Parameters of the model (``param_counts[""]`` when given)."""
        params = self._root_profile().params
        return params_to_string(params) if as_string else params

    def get_total_duration(self, as_string=False):
        """Seconds spent in the model's profiled forward passes."""
        duration = self._root_profile().duration_s
        return duration_to_string(duration) if as_string else duration

    def get_module_profile(self) -> dict[str, ModuleProfile]:
        """``{qualified name: ModuleProfile}`` for every module, parents before children."""
        profiles = {}
        self._collect(self.model, "", 0, profiles, set())
        return profiles

    def print_model_profile(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True,
                            output_file=None, *, fwd_latency=None, bwd_latency=None,
                            step_latency=None, world_size=1, batch_size=None):
        """Prints the profile in DeepSpeed's layout: summary, aggregated and detailed profile.

        Args:
            profile_step: the training step shown in the header.
            module_depth: deepest module depth listed (root = 0); -1 lists all.
            top_modules: how many module classes to list per depth in the aggregated profile.
            detailed: whether to print the module tree with each module's profile.
            output_file: path to write the profile to (parent folders are created) instead of
                printing it.
            fwd_latency: forward seconds measured by the caller; default: the root module's.
            bwd_latency, step_latency: backward and optimizer-step seconds, when measured.
            world_size: number of ranks (all data parallel here).
            batch_size: micro-batch size per rank, for samples/second.
        """
        if not self.started:
            raise RuntimeError("print_model_profile: nothing was profiled; call start_profile() "
                               "and run a forward pass first")
        _check_print_arguments(profile_step=profile_step, module_depth=module_depth,
                               top_modules=top_modules, detailed=detailed, world_size=world_size,
                               batch_size=batch_size, fwd_latency=fwd_latency,
                               bwd_latency=bwd_latency, step_latency=step_latency)
        profiles = self.get_module_profile()
        total = profiles[""]
        lines = ["", HEADER, f"Profile Summary at step {profile_step}:", NOTATIONS]
        lines += summary_lines(params=total.params, flops=total.flops, macs=total.macs,
                               fwd_latency=total.duration_s if fwd_latency is None else fwd_latency,
                               bwd_latency=bwd_latency, step_latency=step_latency,
                               world_size=world_size, batch_size=batch_size,
                               recompute_fwd_factor=self.recompute_fwd_factor)
        lines += ["", AGGREGATED_HEADER, *aggregated_lines(profiles, module_depth, top_modules)]
        if detailed:
            lines += ["", DETAILED_HEADER, DETAILED_NOTES, *detailed_lines(profiles, module_depth)]
        lines.append(FOOTER)
        _write("\n".join(lines) + "\n", output_file)

    # Forward hooks.

    def _enter_counter(self, module, args):
        self._root_calls += 1
        if self._root_calls > 1:  # the root called from inside its own forward
            return
        counter = FlopCounterMode(display=False, depth=None, custom_mapping=_MISSING_FORMULAS)
        counter.__enter__()
        _introduce_root(counter, module, args)
        self._counter = counter

    def _exit_counter(self, module, args, output):
        if self._root_calls == 0:  # a pre-hook before ours raised
            return
        self._root_calls -= 1
        if self._root_calls > 0 or self._counter is None:
            return
        counter, self._counter = self._counter, None
        counter.__exit__(None, None, None)
        for counted, flops in _flops_by_module(counter).items():
            self._flops[counted] = self._flops.get(counted, 0) + flops

    def _start_timer(self, module, args):
        self._synchronize()
        self._starts.setdefault(module, []).append(time.perf_counter())

    def _stop_timer(self, module, args, output):
        starts = self._starts.get(module)
        if not starts:
            return
        self._synchronize()
        elapsed = time.perf_counter() - starts.pop()
        self._durations[module] = self._durations.get(module, 0.0) + elapsed

    def _synchronize(self):
        if self._sync_cuda:
            torch.cuda.synchronize()

    # Results.

    def _root_profile(self):
        return self.get_module_profile()[""]

    def _collect(self, module, name, depth, profiles, seen):
        """Profiles ``module`` after its submodules, each module once as in named_modules()."""
        seen.add(module)
        profiles[name] = None  # keeps parents before their children in the dict's order
        children = []
        for child_name, child in module.named_children():
            if child not in seen:
                qualified = f"{name}.{child_name}" if name else child_name
                children.append(self._collect(child, qualified, depth + 1, profiles, seen))
        if module in self._durations:
            flops, duration = self._flops.get(module, 0), self._durations[module]
        else:  # ignored, or never called itself (a ModuleList): its submodules' sum
            flops = sum(child.flops for child in children)
            duration = sum(child.duration_s for child in children)
        params = self.param_counts.get(name)
        if params is None:
            params = sum(p.numel() for p in module.parameters())
        profile = ModuleProfile(class_name=type(module).__name__, depth=depth, params=params,
                                flops=flops, macs=flops // 2, duration_s=duration,
                                extra_repr=module.extra_repr())
        profiles[name] = profile
        return profile


def _introduce_root(counter, root, args):
    """Lets the counter's module tracker see ``root`` enter forward, naming all its modules.

    FlopCounterMode keys FLOPs by the names its ModuleTracker gives modules entering forward.
    The counter is entered in the root's own pre-hook, after the global pre-hooks (the
    tracker's) ran for the root; left alone, the tracker would name the root's children after
    their class only (two Linear children would share one count). With this the names and
    counts are exactly those of ``with FlopCounterMode(): model(x)``.
    """
    counter.mod_tracker._fw_pre_hook(root, args)


def _cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query, key, value)


def _cpu_attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


# Operators torch's counter has no formula for, by shapes: scaled_dot_product_attention on the
# CPU (torch counts its CUDA kernels only; without these, attention counted nothing here).
_MISSING_FORMULAS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward,
}


@functools.cache
def _warm_up_counter():
    """Counts one op, so that the imports FlopCounterMode's first op triggers (torch._dynamo,
    about a second) are not timed as the first profiled module's latency."""
    with FlopCounterMode(display=False):
        torch.mm(torch.ones(1, 1), torch.ones(1, 1))


def _flops_by_module(counter):
    """``{module: FLOPs}`` from a finished counter, whatever naming scheme its tracker uses."""
    counts = counter.get_flop_counts()
    names = counter.mod_tracker._known_modules  # module -> the name its counts are keyed by
    return {module: sum(counts[name].values()) for module, name in names.items() if name in counts}


def _check_print_arguments(*, profile_step, module_depth, top_modules, detailed, world_size,
                           batch_size, **latencies):
    _check_int("profile_step", profile_step, minimum=0)
    _check_int("module_depth", module_depth, minimum=-1)
    _check_int("top_modules", top_modules, minimum=1)
    _check_int("world_size", world_size, minimum=1)
    if batch_size is not None:
        _check_int("batch_size", batch_size, minimum=1)
    if not isinstance(detailed, bool):
        raise TypeError(f"detailed must be a bool, got {detailed!r}")
    for name, seconds in latencies.items():
        if seconds is not None:
            _check_seconds(name, seconds)


def _check_int(name, value, minimum):
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_seconds(name, value):
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value}")


def _check_ignore_list(ignore_list):
    if ignore_list is None:
        return ()
    if isinstance(ignore_list, type) or not isinstance(ignore_list, (list, tuple, set, frozenset)):
        raise TypeError(f"ignore_list must be a list of nn.Module classes, got {ignore_list!r}")
    for entry in ignore_list:
        if not (isinstance(entry, type) and issubclass(entry, nn.Module)):
            raise TypeError(f"ignore_list must hold nn.Module classes, got {entry!r}")
    return tuple(ignore_list)


def _check_param_counts(model, param_counts):
    if param_counts is None:
        return {}
    if not isinstance(param_counts, dict):
        raise TypeError("param_counts must be a dict of module name -> count, "
                        f"got {type(param_counts).__name__}")
    names = {name for name, _ in model.named_modules()}
    for name, count in param_counts.items():
        if name not in names:
            raise ValueError(f"param_counts: the model has no module named {name!r}")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"param_counts[{name!r}] must be an int >= 0, got {count!r}")
    return dict(param_counts)


def _write(text, output_file):
    if not output_file:
        print(text, end="")
        return
    folder = os.path.dirname(os.path.abspath(output_file))
    os.makedirs(folder, exist_ok=True)
    with open(output_file, "w") as f:
        f.write(text)


def get_model_profile(model, input_shape=None, args=[], kwargs={}, print_profile=True,
                      detailed=True, module_depth=-1, top_modules=1, warm_up=1, as_string=True,
                      output_file=None, ignore_modules=None, mode="forward"):
    """``(flops, macs, params)`` of one forward of ``model`` after ``warm_up`` unprofiled ones.

    Args:
        model: the module to profile (put in eval mode, as DeepSpeed does).
        input_shape: shape of a single input tensor (uninitialized, with the model's dtype and
            device) to call the model with; otherwise ``args`` / ``kwargs`` are used.
        args, kwargs: positional and keyword arguments of the forward.
        print_profile, detailed, module_depth, top_modules, output_file: as in
            :meth:`FlopsProfiler.print_model_profile`.
        warm_up: forward passes run before the profiled one.
        as_string: return strings ("1.2 G", "600 MMACs", "1.5 M") instead of numbers.
        ignore_modules: module classes not to profile themselves.
        mode: "forward" (DeepSpeed's "generate" is not supported).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"get_model_profile: model must be a torch.nn.Module, got {type(model).__name__}")
    if mode != "forward":
        raise ValueError("get_model_profile: mode must be 'forward' (the only supported value), "
                         f"got {mode!r}")
    _check_int("warm_up", warm_up, minimum=0)
    args, kwargs = _model_inputs(model, input_shape, args, kwargs)
    prof = FlopsProfiler(model)
    model.eval()
    for _ in range(warm_up):
        model(*args, **kwargs)
    prof.start_profile(ignore_list=ignore_modules)
    try:
        model(*args, **kwargs)
        prof.stop_profile()
        flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
        if print_profile:
            prof.print_model_profile(profile_step=warm_up, module_depth=module_depth,
                                     top_modules=top_modules, detailed=detailed,
                                     output_file=output_file)
    finally:
        prof.end_profile()
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params


def _model_inputs(model, input_shape, args, kwargs):
    if not isinstance(args, (list, tuple)):
        raise TypeError(f"get_model_profile: args must be a list or tuple, got {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise TypeError(f"get_model_profile: kwargs must be a dict, got {type(kwargs).__name__}")
    if input_shape is not None:
        if not isinstance(input_shape, tuple) or len(input_shape) == 0:
            raise ValueError(f"get_model_profile: input_shape must be a non-empty tuple, got {input_shape!r}")
        param = next(model.parameters(), None)
        options = {} if param is None else {"dtype": param.dtype, "device": param.device}
        args = [torch.empty(input_shape, **options)]
    if not args and not kwargs:
        raise ValueError("get_model_profile: give input_shape, or args and/or kwargs for the forward")
    return list(args), dict(kwargs)
