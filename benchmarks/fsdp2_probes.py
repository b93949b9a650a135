"""bench_fsdp2.py's instruments: what neither framework reports about itself, measured the same
way on both sides where possible.

* SavedParamProbe: parameter memory autograd still holds after forward although the framework
  released it.
* FsdpTracker: FSDP2's collective bytes (paper convention) and its unsharded working set.
* profiled_step: one step under torch.profiler, for the peak of the step's own allocations
  and what is alive at that peak, by the op that allocated it."""
from __future__ import annotations

import weakref

import torch

from benchmarks.memory import local


class SavedParamProbe:
    """Parameter memory the autograd graph still holds after forward although the framework
    has released it. A saved-tensors hook notes every tensor autograd saves whose storage is,
    at that moment, the storage of one of the module's parameters (a gathered/unsharded
    weight); after forward, the storages no module parameter uses any more are summed at
    their current size. FSDP2 frees an unsharded parameter by resizing its storage to 0 (so
    saved views cost nothing until it re-gathers into the same storage); an engine that only
    drops its own reference leaves the storage alive until backward frees the graph node."""

    def __init__(self, model):
        self.model = model
        self.storages = {}
        self.held_bytes = 0
        self.held_count = 0

    def _param_storages(self):
        ptrs = set()
        for module in self.model.modules():
            for param in module._parameters.values():
                if param is not None:
                    storage = local(param).untyped_storage()
                    if storage.nbytes():
                        ptrs.add(storage.data_ptr())
        return ptrs

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if storage.nbytes() and ptr not in self.storages and ptr in self._param_storages():
            self.storages[ptr] = storage
        return tensor

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor)

    def after_forward(self):
        live = self._param_storages()
        held = [st for ptr, st in self.storages.items() if ptr not in live and st.nbytes()]
        self.held_bytes = sum(st.nbytes() for st in held)
        self.held_count = len(held)
        self.storages = {}  # keep nothing alive past this step


def profiled_step(runner, tokens, targets):
    """One more step under torch.profiler(profile_memory=True): the peak of the live bytes
    allocated during the step (the CPU allocator reports only allocations made while
    profiling, so the running total starts at 0), and the bytes sent in exactly this step."""
    from torch.profiler import ProfilerActivity, profile
    from torch._C._profiler import _EventType

    owned = runner["owned"]()
    comm0 = runner["comm"]()
    probe = SavedParamProbe(runner["model"])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss, _ = runner["step"](tokens, targets, probe)
    comm1 = runner["comm"]()
    events = []  # (time, address, +allocated / -freed bytes, running total, allocating op)

    def walk(nodes):
        for node in nodes:
            if node.typed[0] == _EventType.Allocation:
                fields = node.extra_fields
                events.append((node.start_time_ns, fields.ptr, fields.alloc_size,
                               fields.total_allocated, _op_path(node)))
            walk(node.children)
    walk(prof.profiler.kineto_results.experimental_event_tree())
    events.sort(key=lambda event: event[0])
    peak = max((event[3] for event in events), default=0)
    end = events[-1][3] if events else 0
    return {"owned_at_start_bytes": owned, "transient_peak_bytes": peak,
            "live_at_end_bytes": end, "step_peak_bytes": owned + peak,
            "live_at_peak_by_op": _live_at_peak(events),
            "allocation_events": len(events), "loss": loss,
            "autograd_held_param_bytes": probe.held_bytes,
            "autograd_held_param_storages": probe.held_count,
            "comm_delta": {k: comm1[k] - comm0[k] for k in comm1}}


def _op_path(node, depth: int = 3) -> str:
    """The ops an allocation happened under, innermost first (e.g. 'aten::empty < aten::zeros
    < AccumulateGrad')."""
    names, parent = [], node.parent
    while parent is not None and len(names) < depth:
        name = parent.name
        for noise in ("autograd::engine::evaluate_function: ", "torch::autograd::",
                      "zero::adapter::(anonymous namespace)::"):
            name = name.replace(noise, "")
        if not names or names[-1] != name:  # evaluate_function: X < X reads as X
            names.append(name)
        parent = parent.parent
    return " < ".join(names) or "(no op)"


def _live_at_peak(events, top: int = 8) -> list:
    """What was allocated during the step and still alive when its running total peaked,
    summed by allocating op: [[op path, bytes], ...], largest first."""
    if not events:
        return []
    peak_at = max(range(len(events)), key=lambda i: events[i][3])
    live = {}
    for _, ptr, size, _, op in events[:peak_at + 1]:
        if size > 0:
            live[ptr] = (size, op)
        else:
            live.pop(ptr, None)
    by_op = {}
    for size, op in live.values():
        by_op[op] = by_op.get(op, 0) + size
    return [[op, size] for op, size in sorted(by_op.items(), key=lambda kv: -kv[1])[:top]]


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _arg(a, k, name, index):
    return k[name] if name in k else a[index]


class FsdpTracker:
    """Counts FSDP2's collective bytes (paper convention) and samples its unsharded working
    set. FSDP2's hooks are patched at class level, so one tracker per process is active."""
    active = None
    installed = False

    def __init__(self, model, sample: bool):
        self.model = model
        self.sample_enabled = sample
        self.groups = None
        self.comm = {"all_gather_bytes": 0, "reduce_scatter_bytes": 0, "calls": 0}
        # flat all-gather outputs and reduce-scatter inputs, alive until FSDP2 drops them
        self.buffers = weakref.WeakSet()
        self.reset_peaks()

    def reset_peaks(self):
        self.unsharded_peak = 0
        self.unsharded_plus_comm_peak = 0
        self.ag_buffer_peak = 0
        self.rs_buffer_peak = 0
        self.samples = 0

    def param_groups(self):
        if self.groups is None:
            from torch.distributed.fsdp import FSDPModule
            groups = []
            for module in self.model.modules():
                if isinstance(module, FSDPModule):
                    groups += list(module._get_fsdp_state()._fsdp_param_groups)
            self.groups = groups
        return self.groups

    def unsharded_bytes(self) -> int:
        total = 0
        for group in self.param_groups():
            for fsdp_param in group.fsdp_params:
                for t in list(getattr(fsdp_param, "all_gather_outputs", [])) + \
                        list(getattr(fsdp_param, "_unsharded_inner_tensors", [])):
                    total += t.untyped_storage().nbytes()
        return total

    def buffer_bytes(self) -> int:
        seen, total = set(), 0
        for t in list(self.buffers):
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    def sample(self):
        if not self.sample_enabled:
            return
        live = self.unsharded_bytes()
        self.samples += 1
        self.unsharded_peak = max(self.unsharded_peak, live)
        self.unsharded_plus_comm_peak = max(self.unsharded_plus_comm_peak,
                                            live + self.buffer_bytes())

    def on_all_gather(self, output_tensor):
        nbytes = _nbytes(output_tensor)
        self.ag_buffer_peak = max(self.ag_buffer_peak, nbytes)
        self._count("all_gather_bytes", nbytes, output_tensor)

    def on_reduce_scatter(self, input_tensor, output_tensor):
        nbytes = _nbytes(input_tensor)
        self.rs_buffer_peak = max(self.rs_buffer_peak, nbytes + _nbytes(output_tensor))
        self._count("reduce_scatter_bytes", nbytes, input_tensor)

    def _count(self, counter, nbytes, buffer):
        self.comm[counter] += nbytes
        self.comm["calls"] += 1
        if self.sample_enabled:
            self.buffers.add(buffer)
            self.sample()

    @classmethod
    def install(cls):
        if cls.installed:
            return
        cls.installed = True
        cls._wrap_collectives()
        cls._wrap_param_group()

    @classmethod
    def _wrap_collectives(cls):
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll

        ag_call, rs_call = coll.DefaultAllGather.__call__, coll.DefaultReduceScatter.__call__

        def all_gather(self, *a, **k):
            if cls.active is not None:
                cls.active.on_all_gather(_arg(a, k, "output_tensor", 0))
            return ag_call(self, *a, **k)

        def reduce_scatter(self, *a, **k):
            if cls.active is not None:
                cls.active.on_reduce_scatter(_arg(a, k, "input_tensor", 1),
                                             _arg(a, k, "output_tensor", 0))
            return rs_call(self, *a, **k)

        coll.DefaultAllGather.__call__ = all_gather
        coll.DefaultReduceScatter.__call__ = reduce_scatter

    @classmethod
    def _wrap_param_group(cls):
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        wait_for_unshard, post_backward = (FSDPParamGroup.wait_for_unshard,
                                           FSDPParamGroup.post_backward)

        def wait_for_unshard_sampled(self, *a, **k):
            result = wait_for_unshard(self, *a, **k)
            if cls.active is not None:
                cls.active.sample()
            return result

        def post_backward_sampled(self, *a, **k):
            if cls.active is not None:
                cls.active.sample()
            try:
                return post_backward(self, *a, **k)
            finally:
                if cls.active is not None:
                    cls.active.sample()

        FSDPParamGroup.wait_for_unshard = wait_for_unshard_sampled
        FSDPParamGroup.post_backward = post_backward_sampled
