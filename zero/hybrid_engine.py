"""DeepSpeed's hybrid engine (`"hybrid_engine": {"enabled": true}`, DeepSpeed-Chat's
--enable_hybrid_engine): what zero builds of it.

An RLHF actor trains under ZeRO and generates the experience it trains on. At stage 3 plain
ZeRO gathers every layer for every generated token, one layer at a time. DeepSpeed's hybrid
engine takes over the model's `generate` and, with `pin_parameters` (its default), gathers
every parameter once for the whole call; so does zero's: the units are held for the call and
the module hooks idle while the model's own generate runs, so the tokens cost no gathers and
no per-layer bookkeeping. DeepSpeed also swaps in its inference kernels, fuses LoRA weights and
can generate tensor-parallel (inference_tp_size); zero runs the model's own generate, LoRA
unfused, on every rank alone. At stages 0-2 nothing is partitioned and generate runs as it is.
"""
from __future__ import annotations

import functools
import types
import weakref

from . import stage3


def take_over_generate(model, config, hooks) -> None:
    """With `config.enabled` (a HybridEngineConfig) and at stage 3 (`hooks`: the engine's
    Stage3Hooks, None below stage 3), replaces `model.generate` by one that runs with the whole
    model gathered (DeepSpeed's DeepSpeedHybridEngine.generate also replaces it)."""
    original = getattr(type(model), "generate", None)
    if not config.enabled or not config.pin_parameters or hooks is None or original is None:
        return
    owner, managed = weakref.ref(hooks), weakref.ref(model)  # the model must not keep the engine

    @functools.wraps(original)
    def generate(self, *args, **kwargs):
        hooks = owner()
        # (a copy of the model, copy.deepcopy's, runs as its class says: nothing gathers for it)
        if self is not managed() or hooks is None or hooks.removed:
            return original(self, *args, **kwargs)
        with stage3.whole_model(hooks):
            return original(self, *args, **kwargs)

    model.generate = types.MethodType(generate, model)
