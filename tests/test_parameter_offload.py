"""`engine.optimizer.parameter_offload` at stage 3 (zero/parameter_offload.py), driven by
TRL's own remove_hooks / add_hooks, as its unwrap_model_for_generation calls them around
generation: inside GatheredParameters the hooks come off and the module runs on its whole
weights; put back, training goes on as if nothing had happened. And what goes wrong is
named: the engine's forward with the hooks still off."""
import copy
import pickle

import pytest
import torch

import training
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(120)
trl_utils = pytest.importorskip("trl.models.utils")


def _generation_between_steps(rank, world, hooks_off):
    import zero

    config = training.engine_config(3, gas=1, scheduler=False)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    losses = training.train_engine(engine, rank, world, 1, 1)
    tokens, targets = training.batches(world, 1, 1)[0]
    with zero.GatheredParameters(engine.parameters()):
        if hooks_off:
            trl_utils.remove_hooks(engine)  # TRL's, unmodified
        handles = len(engine.optimizer.parameter_offload.forward_hooks)
        hooked = bool(engine.module._forward_pre_hooks)  # zero's, on the model itself
        with torch.no_grad():  # what generate() does: the module itself, many times
            outputs = [engine.module(tokens, targets).item() for _ in range(3)]
        whole = training.parameters_of(engine.module)
        if hooks_off:
            trl_utils.add_hooks(engine)
    losses += training.train_engine(engine, rank, world, 2, 1, first_step=1)
    return losses, outputs, whole, handles, hooked



@pytest.mark.parametrize("hooks_off", [True, False], ids=["trl-remove-hooks", "hooks-on"])
def test_generation_with_the_hooks_off_leaves_training_as_the_reference(hooks_off):
    """The module run between steps sees the whole weights after step 1, and the three steps
    are the single-process reference's, whether TRL took the hooks off or not."""
    config = training.engine_config(3, gas=1, scheduler=False)
    ref_losses, _ = training.train_reference(2, 3, 1, config)
    _, after_one = training.train_reference(2, 1, 1, config)
    for losses, outputs, whole, handles, hooked in run_distributed(
            _generation_between_steps, 2, args=(hooks_off,)):
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        assert (handles == 0) == hooks_off and hooked != hooks_off
        assert len(set(outputs)) == 1
        for name, value in whole.items():
            assert torch.allclose(value, after_one[name], atol=1e-6), name


def _forward_with_hooks_off(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(3, gas=1))
    trl_utils.remove_hooks(engine)
    tokens, targets = training.batches(world, 1, 1)[rank]
    with pytest.raises(RuntimeError, match=r"_register_deepspeed_module\(engine.module\)"):
        engine(tokens, targets)
    trl_utils.add_hooks(engine)
    loss = engine(tokens, targets).item()
    engine.destroy()
    with pytest.raises(RuntimeError, match="this engine was destroyed"):
        trl_utils.add_hooks(engine)
    return loss


def test_the_engines_forward_with_the_hooks_off_is_named_until_they_are_back():
    """And once the engine is destroyed, putting them back is named too."""
    for loss in run_distributed(_forward_with_hooks_off, 2):
        assert loss > 0


def _external_parameters(rank, world):
    import zero

    model = training.ExternalUseGPT(training.MODEL)
    engine, _, _, _ = zero.initialize(model=model, config=training.engine_config(3, gas=1))
    root = [p for _, p in engine.module.ds_external_parameters()]
    inner = list(engine.module.blocks[0].ds_external_parameters())
    params = trl_utils.iter_params(engine.module, recurse=True)  # TRL's walk
    for param in params:
        param.ds_active_sub_modules.clear()
    copied = copy.deepcopy(engine.module).ds_external_parameters()
    pickled = pickle.loads(pickle.dumps(engine.module.ds_external_parameters))()
    return (root == [engine.module.blocks[0].attn.proj.weight], inner,
            len(params), copied, pickled)


def test_modules_list_their_external_parameters_as_deepspeed():
    count = sum(1 for _ in training.ExternalUseGPT(training.MODEL).parameters())
    for root_is_registered, inner, params, copied, pickled in run_distributed(
            _external_parameters, 2):
        assert root_is_registered and inner == []
        assert params == count + 1  # every parameter, and the root's external one again
        assert copied == [] and pickled == []  # a copy is managed by nobody
