"""DeepSpeed's arguments to engine.module_state_dict (destination, prefix, keep_vars,
exclude_frozen_parameters) and engine.load_module_state_dict (its checkpoint-dict form and
custom_load_fn), and engine.mp_world_size: scripts calling them failed with a TypeError or an
AttributeError (zero/engine_model_save.py)."""
import pytest
import torch

import training
from distributed_harness import run_distributed


def _config(stage):
    return training.engine_config(stage, gas=1, scheduler=False,
                                  stage3_param_persistence_threshold=0)


def _module_state_dict(rank, world, stage):
    import zero

    model = training.make_model(freeze_position_embedding=True)
    engine, _, _, _ = zero.initialize(model=model, config=_config(stage))
    destination = {"kept": 1}
    state = engine.module_state_dict(destination=destination, prefix="model.",
                                     exclude_frozen_parameters=True)
    whole = engine.module_state_dict()
    if rank:  # (stage 3: gathered on rank 0)
        return None
    assert state is destination and state.pop("kept") == 1
    frozen = "position_embedding.weight"
    assert set(state) == {"model." + name for name in whole if name != frozen}
    assert all(torch.equal(state["model." + name], value)
               for name, value in whole.items() if name != frozen)
    if stage < 3:
        kept = engine.module_state_dict(keep_vars=True)
        assert kept["token_embedding.weight"] is engine.module.token_embedding.weight
    else:
        with pytest.raises(ValueError, match="keep_vars=True. at stage 3"):
            engine.module_state_dict(keep_vars=True)
    return engine.mp_world_size


@pytest.mark.parametrize("stage", [2, 3])
def test_module_state_dict_takes_deepspeeds_arguments(stage):
    assert run_distributed(_module_state_dict, 2, args=(stage,))[0] == 1


def _loads(rank, world, stage, form):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=_config(stage))
    torch.manual_seed(1234)
    other = training.make_model()
    for param in other.parameters():
        param.data.normal_()
    target = other.state_dict()
    if form == "checkpoint":  # DeepSpeed's load_module_state_dict(checkpoint={"module": ...})
        engine.load_module_state_dict({"module": target})
    else:
        def load(src, dst):
            dst.load_state_dict(src)

        engine.load_module_state_dict(target, custom_load_fn=load)
    loaded = engine.module_state_dict()
    if rank == 0:
        assert all(torch.equal(loaded[name], value) for name, value in target.items())
    return training.train_engine(engine, rank, world, 2, 1)  # from the loaded weights


@pytest.mark.parametrize("form", ["checkpoint", "custom_load_fn"])
@pytest.mark.parametrize("stage", [2, 3])
def test_load_module_state_dict_takes_deepspeeds_forms(stage, form):
    losses = run_distributed(_loads, 2, args=(stage, form))
    expected = run_distributed(_loads, 2, args=(stage, "checkpoint"))
    assert losses == expected
