"""`deepspeed.comm`: DeepSpeed's drop-in for torch.distributed, as scripts call it
(`from deepspeed import comm as dist`), backed by torch.distributed's default group or the
group given (init_distributed creates it).

Every public function of DeepSpeed 0.19.8's deepspeed/comm/comm.py is here with its signature,
but for the ones about DeepSpeed's own backends and clusters (set_backend,
init_deepspeed_backend, timed_op, mpi_discovery, in_aml / in_aws_sm / in_dlts and their
environment patches, enable_symm_mem_for_group). Where they differ from DeepSpeed's:
  * the comms logger does not time the script's own calls (`prof`, `log_name` and `debug` are
    accepted): it records the engine's collectives (zero/monitor/comms_logger.py), which
    log_summary, has_comm_data, get_comm_operation_count and get_logged_comm_ops read;
  * ProcessGroup is torch's (DeepSpeed's is a placeholder class that scripts name in their
    annotations: `group: dist.ProcessGroup`);
  * has_coalescing_manager is False: the "coalesced" calls run one collective per tensor,
    one handle for all of them where async_op is set.
"""
from __future__ import annotations

import os

import torch.distributed as _dist
from torch.distributed import ProcessGroup, ReduceOp, get_rank, get_world_size, is_initialized

from zero.distributed import init_distributed
from zero.engine import live_engines


# ---- the process group ------------------------------------------------------------------
def is_available() -> bool:
    return True


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def destroy_process_group(group=None) -> None:
    _dist.destroy_process_group(group)


def new_group(ranks):
    return _dist.new_group(ranks)


def get_world_group():
    return _dist.group.WORLD


def get_global_rank(group=None, group_rank: int = 0) -> int:
    return _dist.get_global_rank(_dist.group.WORLD if group is None else group, group_rank)


def get_all_ranks_from_group(group=None) -> list[int]:
    return _dist.get_process_group_ranks(_dist.group.WORLD if group is None else group)


def initialize_mesh_device(mesh_shape, mesh_dim_names):
    from torch.distributed.device_mesh import init_device_mesh

    from .accelerator import get_accelerator
    return init_device_mesh(get_accelerator().device_name(), mesh_shape,
                            mesh_dim_names=mesh_dim_names)


def has_all_gather_into_tensor() -> bool:
    return True


def has_reduce_scatter_tensor() -> bool:
    return True


def has_all_reduce_coalesced() -> bool:
    return True


def has_coalescing_manager() -> bool:
    return False


# ---- collectives (DeepSpeed's prof / log_name / debug are accepted) ----------------------
def broadcast(tensor, src, group=None, async_op=False, prof=False, log_name="broadcast",
              debug=None):
    return _dist.broadcast(tensor, src, group=group, async_op=async_op)


def broadcast_object_list(object_list, src, group=None, device=None, prof=False,
                          log_name="broadcast_object_list", debug=None):
    return _dist.broadcast_object_list(object_list, src, group=group, device=device)


def all_gather(tensor_list, tensor, group=None, async_op=False, prof=False,
               log_name="all_gather", debug=None):
    return _dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_gather_object(object_list, obj, group=None, prof=False, log_name="all_gather_object",
                      debug=None):
    return _dist.all_gather_object(object_list, obj, group=group)


def all_gather_into_tensor(output_tensor, tensor, group=None, async_op=False, prof=False,
                           log_name="all_gather_into_tensor", debug=None):
    return _dist.all_gather_into_tensor(output_tensor, tensor, group=group, async_op=async_op)


def allgather_fn(output_tensor, input_tensor, group=None, async_op=False, debug=None):
    return all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def reduce_scatter_tensor(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False,
                          prof=False, log_name="reduce_scatter_tensor", debug=None):
    return _dist.reduce_scatter_tensor(output_tensor, tensor, op=op, group=group,
                                       async_op=async_op)


def reduce_scatter_fn(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False,
                      prof=False, debug=None):
    return reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
                   log_name="reduce_scatter", debug=None):
    return _dist.reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
               log_name="all_reduce", debug=None):
    return _dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def inference_all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
                         log_name="all_reduce", debug=None):
    """DeepSpeed's: synchronous whatever async_op says; the tensor itself on one rank."""
    if _dist.get_world_size(group) <= 1:
        return tensor
    return _dist.all_reduce(tensor, op=op, group=group)


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
                         log_name="all_reduce", debug=None):
    return _each(async_op, [_dist.all_reduce(t, op=op, group=group, async_op=async_op)
                            for t in tensors])


def all_gather_coalesced(output_tensors, input_tensors, group=None, async_op=False):
    return _each(async_op, [_dist.all_gather_into_tensor(out, t, group=group, async_op=async_op)
                            for out, t in zip(output_tensors, input_tensors, strict=True)])


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False, prof=False, log_name="all_to_all_single",
                      debug=None):
    return _dist.all_to_all_single(output, tensor, output_split_sizes, input_split_sizes,
                                   group=group, async_op=async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, prof=False,
               log_name="all_to_all", debug=None):
    return _dist.all_to_all(output_tensor_list, input_tensor_list, group=group,
                            async_op=async_op)


def send(tensor, dst, group=None, tag=0, prof=False, log_name="send", debug=None):
    return _dist.send(tensor, dst, group=group, tag=tag)


def recv(tensor, src=None, group=None, tag=0, prof=False, log_name="recv", debug=None):
    return _dist.recv(tensor, src, group=group, tag=tag)


def isend(tensor, dst, group=None, tag=0, prof=False, log_name="isend", debug=None):
    return _dist.isend(tensor, dst, group=group, tag=tag)


def irecv(tensor, src=None, group=None, tag=0, prof=False, log_name="irecv", debug=None):
    return _dist.irecv(tensor, src, group=group, tag=tag)


class P2POp:
    """One send or receive of a batch_isend_irecv: `op` is this module's isend or irecv."""

    def __init__(self, op, tensor, peer, group=None, tag=0):
        if op not in (isend, irecv):
            raise ValueError("zero: P2POp's op must be deepspeed.comm.isend or "
                             f"deepspeed.comm.irecv, got {op!r}")
        self.op = "isend" if op is isend else "irecv"
        self.tensor, self.peer, self.group, self.tag = tensor, peer, group, tag


def batch_isend_irecv(p2p_op_list, prof=False, log_name="batch_isend_irecv", debug=None):
    """Launches the P2POps as one batch; their handles."""
    return _dist.batch_isend_irecv([_dist.P2POp(getattr(_dist, op.op), op.tensor, op.peer,
                                                op.group, op.tag) for op in p2p_op_list])


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False, prof=False,
           log_name="gather", debug=None):
    return _dist.gather(tensor, gather_list, dst, group=group, async_op=async_op)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False, prof=False,
            log_name="scatter", debug=None):
    return _dist.scatter(tensor, scatter_list, src, group=group, async_op=async_op)


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
           log_name="reduce", debug=None):
    return _dist.reduce(tensor, dst, op=op, group=group, async_op=async_op)


def barrier(group=None, async_op=False, device_ids=None, prof=False, log_name="barrier",
            debug=None):
    return _dist.barrier(group=group, async_op=async_op)  # (device_ids: NCCL's; DeepSpeed drops it)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False, prof=False,
                      log_name="monitored_barrier", debug=None):
    return _dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)


class _Handles:
    """The handles of one call's collectives, waited on together."""

    def __init__(self, works: list):
        self._works = works

    def wait(self) -> bool:
        for work in self._works:
            work.wait()
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)


def _each(async_op: bool, works: list):
    return _Handles(works) if async_op else None


# ---- the comms logger (the engines' records) --------------------------------------------
def configure(deepspeed_config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None,
              debug=None) -> None:
    """DeepSpeed's switch for the comms logger, applied to the live engines (a new engine takes
    its config's comms_logger block). deepspeed_config is accepted and not read: zero's engines
    read that block when they are built."""
    for engine in live_engines():
        engine.watch.configure_comms(enabled=enabled, prof_all=prof_all, prof_ops=prof_ops,
                                     verbose=verbose, debug=debug)


def _loggers(enabled_only: bool = True) -> list:
    """The live engines' comms loggers, each holding every record made so far."""
    return [engine.watch.drained_comms() for engine in live_engines()
            if engine.watch.comms.enabled or not enabled_only]


def log_summary(show_straggler: bool = False, return_dict: bool = False):
    """DeepSpeed's summary of the collectives logged so far (comms_logger), printed on rank 0;
    every rank calls it. With several live engines logging, each one's table in turn."""
    _dist.barrier()
    results = [logger.log_all(True, show_straggler, return_dict) for logger in _loggers()]
    if return_dict:
        return results[-1] if results else None
    return None


def reset_log() -> None:
    for logger in _loggers(enabled_only=False):
        logger.reset_data()


def has_comm_data() -> bool:
    return any(logger.has_data() for logger in _loggers())


def get_comm_operation_count() -> int:
    return sum(logger.operation_count() for logger in _loggers())


def get_logged_comm_ops() -> list[str]:
    return sorted({name for logger in _loggers() for name in logger.operation_names()})


__all__ = [
    "P2POp", "ProcessGroup", "ReduceOp", "all_gather", "all_gather_coalesced",
    "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_reduce_coalesced", "all_to_all",
    "all_to_all_single", "allgather_fn", "barrier", "batch_isend_irecv", "broadcast",
    "broadcast_object_list", "configure", "destroy_process_group", "gather",
    "get_all_ranks_from_group", "get_comm_operation_count", "get_global_rank",
    "get_local_rank", "get_logged_comm_ops", "get_rank", "get_world_group", "get_world_size",
    "has_all_gather_into_tensor", "has_all_reduce_coalesced", "has_coalescing_manager",
    "has_comm_data", "has_reduce_scatter_tensor", "inference_all_reduce", "init_distributed",
    "initialize_mesh_device", "irecv", "is_available", "is_initialized", "isend",
    "log_summary", "monitored_barrier", "new_group", "recv", "reduce", "reduce_scatter",
    "reduce_scatter_fn", "reduce_scatter_tensor", "reset_log", "scatter", "send"]
