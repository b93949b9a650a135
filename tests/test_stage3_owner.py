"""A stage-3 parameter knows the engine that partitions it through param._zero_owner (weakly):
GatheredParameters and register_external_parameter find the engine that way; a copy or a
pickle of the parameter is owned by nobody, and a destroyed engine owns nothing."""
import copy
import io

import torch

import training
from distributed_harness import run_distributed


def _owners(rank, world):
    import zero
    from zero import stage3

    config = training.engine_config(3, gas=1, stage3_param_persistence_threshold=40)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    weight = engine.module.blocks[0].mlp[0].weight
    owned = stage3.owner_of(weight) is engine.stage3_hooks
    copied = stage3.owner_of(copy.deepcopy(weight)) is None
    buffer = io.BytesIO()
    torch.save(weight, buffer)
    buffer.seek(0)
    pickled = stage3.owner_of(torch.load(buffer, weights_only=False)) is None
    with zero.GatheredParameters([weight]):
        whole = tuple(weight.shape)
    engine.destroy()
    return owned, copied, pickled, whole, stage3.owner_of(weight) is None


def test_a_partitioned_parameter_knows_its_engine_and_only_while_it_lives():
    for owned, copied, pickled, whole, released in run_distributed(_owners, 2):
        assert owned and copied and pickled and released
        assert whole == (4 * training.MODEL.n_embd, training.MODEL.n_embd)
