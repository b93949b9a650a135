"""Bytes one stage-3 optimizer step sends per rank, across nodes and within one, for each
layout: plain, ZeRO++ (qwZ, qgZ, hpZ) and MiCS. zero-mem estimate prints it for stage 3, and
the tuner's communication model (tuner.communication) takes its sum. Counted as the engine's
Communicators count them (the paper's convention: an all-gather or reduce-scatter of B bytes
moves B, an all-reduce 2B); scalar all-reduces (norm, overflow) left out.

Per micro-step the replayed gather schedule all-gathers G elements and every partitioned unit
is reduce-scattered (Ψ elements); at the boundary the persistent group reduce-scatters and
all-gathers its Ψp elements over the world. The layouts move these:
  qwZ / qgZ  the all-gathers / reduce-scatters carry the int8 code (1 byte per value plus a
             4-byte scale per 256; each unit's rounding to 4 bytes left out: within 0.1%);
  hpZ        each unit's first gather of the step crosses nodes, the rest stay within the
             secondary group (plain, unquantized);
  MiCS       gathers and reduce-scatters stay within the shard group of S ranks; each reduced
             piece is all-reduced over the replicas: 2·Ψ/S·b per micro-step across nodes.
stage3_use_all_reduce_for_fetch_params makes the plain (not qwZ, not hpZ's secondary) gathers
all-reduces of the whole unit: twice their bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from .result import Estimate
from .training_setup import Setup

QUANT_BLOCK = 256  # values per fp32 scale (csrc/core/block_quantizer.h)


@dataclass(frozen=True)
class Traffic:
    cross_node: int  # bytes per step over the world group or MiCS's replicate groups
    in_node: int     # bytes per step within hpZ's secondary or MiCS's shard groups


def _wire(numel: int, param_bytes: int, quantized: bool) -> int:
    """The bytes `numel` values take on the wire."""
    if not quantized:
        return numel * param_bytes
    return numel + 4 * -(-numel // QUANT_BLOCK)


def stage3_traffic(est: Estimate, setup: Setup, gas: int) -> Traffic:
    """Per optimizer step of `gas` micro-steps, once the gather order is recorded."""
    b, bc, psi = setup.param_bytes, setup.comm_bytes, est.numel  # bc: the gradients' dtype
    gathered = gas * est.stage3["working_set"]["gathered_numel_per_micro_step"]
    reduced = _wire(gas * psi, bc, setup.quantized_gradients)
    persistent = est.persistent_numel * (bc + b)  # reduce-scatter, all-gather
    fetch = 2 if setup.all_reduce_fetch and not setup.quantized_weights else 1
    if setup.hpz_world:
        first = fetch * _wire(psi, b, setup.quantized_weights)  # each unit's first of the step
        return Traffic(cross_node=first + reduced + persistent,
                       in_node=(gathered - psi) * b)
    gathers = fetch * _wire(gathered, b, setup.quantized_weights)
    if setup.partition_world < setup.world_size:  # MiCS
        replicas = gas * 2 * (psi // setup.partition_world) * bc
        return Traffic(cross_node=replicas + persistent, in_node=gathers + reduced)
    return Traffic(cross_node=gathers + reduced + persistent, in_node=0)
