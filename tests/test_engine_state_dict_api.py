"""DeepSpeed's arguments to engine.module_state_dict (destination, prefix, keep_vars,
exclude_frozen_parameters), engine.load_module_state_dict (its checkpoint-dict form and
custom_load_fn) and engine.load_checkpoint (custom_load_fn), and engine.mp_world_size: scripts
calling them failed with a TypeError or an AttributeError (zero/engine_model_save.py)."""
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


def _loads(rank, world, stage, form, precision="fp32"):
    import zero

    config = training.engine_config(stage, gas=1, scheduler=False, precision=precision,
                                    stage3_param_persistence_threshold=0)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
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
    dtype = next(engine.module.parameters()).dtype
    loaded = engine.module_state_dict()
    if rank == 0:
        assert all(torch.equal(loaded[name], value.to(dtype)) for name, value in target.items())
    return training.train_engine(engine, rank, world, 2, 1)  # from the loaded weights


def _reference_losses(rank, world, stage, precision):
    """The engine built on the target weights themselves."""
    import zero

    torch.manual_seed(1234)
    model = training.make_model()
    for param in model.parameters():
        param.data.normal_()
    config = training.engine_config(stage, gas=1, scheduler=False, precision=precision,
                                    stage3_param_persistence_threshold=0)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    return training.train_engine(engine, rank, world, 2, 1)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("form", ["checkpoint", "custom_load_fn"])
@pytest.mark.parametrize("stage", [2, 3])
def test_load_module_state_dict_takes_deepspeeds_forms(stage, form, precision):
    """The engine then trains from the loaded weights as one built on them: under bf16 the
    fp32 master follows the load (a step used to write the old weights back)."""
    losses = run_distributed(_loads, 2, args=(stage, form, precision))
    expected = run_distributed(_reference_losses, 2, args=(stage, precision))
    assert losses == expected


def _custom_load_fails(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=_config(3))
    before = engine.module_state_dict()

    def load(src, dst):
        if rank == 1:
            raise KeyError("no such key on rank 1")
        for param in dst.parameters():
            param.data.zero_()

    with pytest.raises(RuntimeError) as raised:
        engine.load_module_state_dict(training.make_model().state_dict(), custom_load_fn=load)
    after = engine.module_state_dict()
    unchanged = rank == 1 or all(torch.equal(before[k], after[k]) for k in before)
    return str(raised.value), unchanged


def test_a_custom_load_fn_failing_on_one_rank_stops_every_rank_with_nothing_written():
    first, second = run_distributed(_custom_load_fails, 2, timeout=60)
    assert "custom_load_fn failed" in first[0] and "rank 1: zero: custom_load_fn raised " \
        "KeyError" in first[0] and first[1]
    assert "custom_load_fn raised KeyError: 'no such key on rank 1'" in second[0]


def _checkpoint_custom_load(rank, world, directory, stage):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=_config(stage))
    losses = training.train_engine(engine, rank, world, 2, 1)
    engine.save_checkpoint(directory, tag="saved")
    seen = []

    def load(src, dst):  # DeepSpeed's load_checkpoint(custom_load_fn=...)
        seen.append(sorted(src))
        dst.load_state_dict(src)

    fresh, _, _, _ = zero.initialize(model=training.make_model(), config=_config(stage))
    fresh.load_checkpoint(directory, tag="saved", custom_load_fn=load)
    resumed = training.train_engine(fresh, rank, world, 2, 1)
    again = training.train_engine(engine, rank, world, 2, 1)
    names = sorted(training.make_model().state_dict())
    return losses, resumed == again, seen == [names]


@pytest.mark.parametrize("stage", [2, 3])
def test_load_checkpoint_writes_the_module_through_custom_load_fn(stage, tmp_path):
    """The function gets the saved module state once and the resumed engine goes on as the one
    that saved (it was a TypeError)."""
    for _, resumed_equal, seen_once in run_distributed(_checkpoint_custom_load, 2,
                                                       args=(str(tmp_path), stage)):
        assert resumed_equal and seen_once
