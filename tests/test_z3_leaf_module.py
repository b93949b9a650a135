"""`deepspeed.utils`' stage-3 leaf flags (zero/compat/deepspeed/utils/z3_leaf_module.py) as
DeepSpeed 0.19.8's deepspeed/utils/z3_leaf_module.py has them: set, unset, by name, by suffix,
read back; a flagged module is one gather unit, and a stage-3 engine leaves each parameter
inside one naming it, as DeepSpeed's hooks do."""
import inspect

import pytest
import torch

import training
from distributed_harness import run_distributed
from zero import stage3
from zero.models.tiny_gpt import CausalSelfAttention, GPTConfig, TinyGPT

pytestmark = pytest.mark.timeout(120)

# DeepSpeed 0.19.8's signatures (its pip sdist), parameter by parameter with defaults.
DEEPSPEED = {
    "z3_leaf_module": "model",
    "z3_leaf_parameter": "model",
    "get_z3_leaf_modules": "model",
    "set_z3_leaf_module": "model flag",
    "set_z3_leaf_modules": "model leaf_module_classes raise_if_not_found=True",
    "unset_z3_leaf_modules": "model leaf_module_classes raise_if_not_found=True",
    "set_z3_leaf_modules_by_name": "model module_names flag=True raise_if_not_found=True",
    "set_z3_leaf_modules_by_suffix": "model module_name_suffixes flag=True "
                                     "raise_if_not_found=True",
}


def _written(function) -> str:
    return " ".join(name if p.default is inspect.Parameter.empty else f"{name}={p.default!r}"
                    for name, p in inspect.signature(function).parameters.items())


def test_every_function_takes_deepspeeds_arguments():
    import zero.compat.deepspeed.utils as utils

    for name, expected in DEEPSPEED.items():
        written = _written(getattr(utils, name))
        # zero's set_z3_leaf_modules also takes flag (unset's own way in): DeepSpeed's first
        assert written == expected or written.startswith(expected + " flag="), name


def _gpt():
    torch.manual_seed(0)
    return TinyGPT(GPTConfig())  # two blocks


def test_set_and_unset_by_class_change_the_units():
    from zero.compat.deepspeed import utils

    model = _gpt()
    attentions = [block.attn for block in model.blocks]
    assert utils.set_z3_leaf_modules(model, [CausalSelfAttention]) == attentions
    assert utils.get_z3_leaf_modules(model) == attentions
    assert all(m._z3_leaf for m in attentions)  # DeepSpeed's attribute, read directly
    assert len(stage3.plan_units(model).modules) == 5  # root, two blocks, two attentions
    assert utils.unset_z3_leaf_modules(model, ["CausalSelfAttention"]) == attentions
    assert utils.get_z3_leaf_modules(model) == []
    assert len(stage3.plan_units(model).modules) == 3
    with pytest.raises(ValueError, match="no module of"):
        utils.unset_z3_leaf_modules(model, [torch.nn.Conv2d])
    assert utils.unset_z3_leaf_modules(model, [torch.nn.Conv2d], raise_if_not_found=False) == []
    with pytest.raises(TypeError, match="classes or class names"):
        utils.set_z3_leaf_modules(model, [3])


def test_by_name_and_by_suffix_return_what_they_missed():
    from zero.compat.deepspeed import utils

    model = _gpt()
    found, missing = utils.set_z3_leaf_modules_by_name(model, ["blocks.1.mlp", "blocks.7"],
                                                       raise_if_not_found=False)
    assert (found, missing) == ([model.blocks[1].mlp], ["blocks.7"])
    assert utils.z3_leaf_module(model.blocks[1].mlp) and not utils.z3_leaf_module(model)
    with pytest.raises(ValueError, match=r"no modules named \['blocks.7'\]"):
        utils.set_z3_leaf_modules_by_name(model, ["blocks.7"])
    found, missing = utils.set_z3_leaf_modules_by_suffix(model, [".mlp", "mlp", ".nothing"],
                                                         raise_if_not_found=False)
    assert found == [model.blocks[0].mlp, model.blocks[1].mlp]  # once each
    assert missing == [".nothing"]
    found, _ = utils.set_z3_leaf_modules_by_suffix(model, [".mlp"], flag=False)
    assert utils.get_z3_leaf_modules(model) == []
    utils.set_z3_leaf_module(model, True)
    assert [name for name, _ in stage3.plan_units(model).modules] == [""]


def test_a_class_flagged_leaf_makes_each_instance_one_unit():
    """DeepSpeed reads the flag as an attribute, so a class may carry it."""
    from zero.compat.deepspeed import utils

    class LeafMLP(torch.nn.Sequential):
        _z3_leaf = True

    model = torch.nn.Sequential(LeafMLP(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)),
                                torch.nn.Linear(4, 4))
    assert utils.get_z3_leaf_modules(model) == [model[0]]
    assert utils.z3_leaf_module(model[0]) and not utils.z3_leaf_module(model[1])
    assert [name for name, _ in stage3.plan_units(model).modules] == ["", "0"]
    utils.set_z3_leaf_module(model[0], False)  # an instance's own flag wins over its class's
    assert utils.get_z3_leaf_modules(model) == []
    assert [name for name, _ in stage3.plan_units(model).modules] == [""]


def _flags(rank, world):
    import zero
    from zero.compat.deepspeed import utils

    model = training.make_model()
    utils.set_z3_leaf_modules(model, ["CausalSelfAttention"])
    config = training.engine_config(3, stage3_param_persistence_threshold=0,
                                    leaf_module={"names": ["blocks.1.mlp"]})
    engine, _, _, _ = zero.initialize(model=model, config=config)
    training.train_engine(engine, rank, world, 1, 2)
    named = dict(engine.module.named_modules())
    leaf_of = {name: named_module_of(named, p) for name, p in engine.module.named_parameters()}
    flagged = sorted(name for name, m in named.items() if utils.z3_leaf_module(m))
    engine.destroy()
    return flagged, leaf_of


def named_module_of(named, param):
    from zero.compat.deepspeed import utils

    if not utils.z3_leaf_parameter(param):
        return None
    return next(name for name, m in named.items() if m is param.ds_z3_leaf_module)


def test_a_stage3_engine_names_each_leaf_parameters_module():
    """The config's leaf modules are flagged too (DeepSpeed's apply_zero_leaf_module_config
    flags them); a parameter inside a leaf names it, the others are not leaf parameters."""
    for flagged, leaf_of in run_distributed(_flags, 2):
        assert flagged == ["blocks.0.attn", "blocks.1.attn", "blocks.1.mlp"]
        assert leaf_of["blocks.0.attn.qkv.weight"] == "blocks.0.attn"
        assert leaf_of["blocks.1.mlp.0.weight"] == "blocks.1.mlp"
        assert leaf_of["blocks.0.mlp.0.weight"] is None
        assert leaf_of["token_embedding.weight"] is None
