"""DeepSpeed's stage-3 split rules (zero/stage3_policy.py): stage3_model_persistence_threshold
caps what stays whole, stage3_module_granularity_threshold gathers fine modules as one unit;
the engine follows them, with stage3_use_all_reduce_for_fetch_params too, and still trains
like single-process PyTorch. (The estimate's exact
bytes under both: tests/test_estimate_stage3.py.)"""
import logging

import pytest
import torch

import training
from distributed_harness import run_distributed
from zero import stage3, stage3_policy
from zero.models.tiny_gpt import GPTConfig, TinyGPT


def test_small_parameters_stay_whole_until_the_model_cap_then_later_ones_may_fit():
    # DeepSpeed's mark_persistent_parameters, walked in model order
    numels = [10, 500, 30, 40, 5, 20]
    assert stage3_policy.kept_whole(numels, 100, 2**63 - 1) == [True, False, True, True, True, True]
    # 10 + 30 = 40 kept; 40 more would pass 75; 5 fits (45); 20 fits (65)
    assert stage3_policy.kept_whole(numels, 100, 75) == [True, False, True, False, True, True]
    assert stage3_policy.kept_whole(numels, 100, 0) == [False] * 6
    assert stage3_policy.kept_whole(numels, 0, 2**63 - 1) == [False] * 6


def _gpt():
    torch.manual_seed(0)
    return TinyGPT(GPTConfig())  # 64 wide, two blocks, tied head


def test_granularity_is_elements_per_layer_as_deepspeed_counts_them():
    model = _gpt()
    block, attn = model.blocks[0], model.blocks[0].attn
    numel = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # a block: ln1, qkv, proj, attn itself, ln2, two linears of its Sequential, itself = 8
    # layers; the attention: qkv, proj, itself = 3 (containers and GELU add none)
    assert numel(block) // 8 == 6_224 and numel(attn) // 3 == 5_482
    assert stage3_policy.granularity_units(model, 6_224) == [model.blocks[0], model.blocks[1]]
    assert stage3_policy.granularity_units(model, 5_482) == [model.blocks[0].attn,
                                                             model.blocks[1].attn]
    plan = stage3.plan_units(model, stage3_policy.granularity_units(model, 5_482))
    # the attention modules are units inside their blocks' units (nested)
    assert [name for name, _ in plan.modules] == ["", "blocks.0", "blocks.0.attn", "blocks.1",
                                                  "blocks.1.attn"]
    assert plan.parents == [0, 0, 1, 0, 3]
    assert plan.unit_of_param[id(block.mlp[0].weight)] == 1
    assert plan.unit_of_param[id(attn.qkv.weight)] == 2


def test_a_root_within_the_threshold_makes_the_whole_model_one_unit():
    model = _gpt()
    units = stage3_policy.granularity_units(model, 10**6)
    assert units == [model]
    plan = stage3.plan_units(model, units)
    assert [name for name, _ in plan.modules] == [""]
    assert len(stage3.plan_units(model).modules) == 3  # nothing was marked on the model


def test_leaf_modules_are_chosen_by_class_path_name_or_suffix_as_deepspeed_does(caplog):
    model = _gpt()
    attentions = [model.blocks[0].attn, model.blocks[1].attn]
    for classes in (["CausalSelfAttention"], ["zero.models.tiny_gpt.CausalSelfAttention"]):
        assert stage3_policy.leaf_units(model, classes) == attentions
    assert stage3_policy.leaf_units(model, (), names=["blocks.1.mlp"]) == [model.blocks[1].mlp]
    assert stage3_policy.leaf_units(model, (), suffixes=[".mlp"]) == [model.blocks[0].mlp,
                                                                       model.blocks[1].mlp]
    assert stage3_policy.leaf_units(model) == []  # DeepSpeed's default: MoE blocks only
    with caplog.at_level(logging.WARNING, logger="zero"):
        assert stage3_policy.leaf_units(model, (), names=["blocks.7"]) == []
    assert "no module named ['blocks.7']" in caplog.text


def test_a_marked_root_is_one_unit_whichever_way_it_was_marked():
    model = _gpt()
    stage3.set_z3_leaf_modules(model, [TinyGPT])
    assert [name for name, _ in stage3.plan_units(model).modules] == [""]


def test_a_subclass_of_sequential_can_be_a_unit_as_deepspeed_names_containers():
    class Feed(torch.nn.Sequential):
        pass

    model = torch.nn.Sequential(Feed(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)),
                                torch.nn.Linear(4, 4))
    assert stage3_policy.granularity_units(model, 13) == [model[0]]  # 40 elements // 3 layers


def _tied_split(rank, world):
    import zero

    config = training.engine_config(3, gas=GAS, stage3_param_persistence_threshold=0,
                                    leaf_module={"names": ["token_embedding"]})
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    return training.train_engine(engine, rank, world, 3, GAS)


def test_a_unit_taking_a_tied_weight_is_gathered_with_the_other_user():
    """The embedding named as a unit takes the weight the head (in the root) shares: the
    root then gathers that unit with it (an implicit external link), as DeepSpeed fetches
    each module's own parameters."""
    config = training.engine_config(3, gas=GAS, stage3_param_persistence_threshold=0)
    ref_losses, _ = training.train_reference(2, 3, GAS, config)
    for losses in run_distributed(_tied_split, 2, timeout=120):
        assert losses == pytest.approx(ref_losses, rel=1e-5)


def test_a_threshold_finer_than_every_module_marks_none_and_names_the_finest(caplog):
    with caplog.at_level(logging.WARNING, logger="zero"):
        assert stage3_policy.granularity_units(_gpt(), 100) == []
    assert "CausalSelfAttention at 5,482" in caplog.text


STEPS, GAS = 10, 2
ZERO_EXTRA = {"stage3_param_persistence_threshold": 5_000,
              "stage3_model_persistence_threshold": 3_000,
              "stage3_use_all_reduce_for_fetch_params": True}


def _attention_granularity() -> int:
    attn = training.make_model().blocks[0].attn
    return sum(p.numel() for p in attn.parameters()) // 3  # qkv, proj, itself


def _config():
    # the attentions by granularity, the MLPs by name: units inside their blocks' units
    return training.engine_config(3, gas=GAS, stage3_module_granularity_threshold=
                                  _attention_granularity(),
                                  leaf_module={"name_suffixes": ".mlp"}, **ZERO_EXTRA)


def _train(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=_config())
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    persist = [bool(p.ds_persist) for p in engine.module.parameters()]
    assert [name for name, _ in engine.stage3_hooks.plan.modules] == [
        "", "blocks.0", "blocks.0.attn", "blocks.0.mlp", "blocks.1", "blocks.1.attn",
        "blocks.1.mlp"]
    state = engine.module_state_dict()
    engine.core.reset_comm_stats()
    training.train_engine(engine, rank, world, 1, GAS, first_step=STEPS)
    comm = engine.core.comm_stats()
    # all-gathers left: the persistent (stage-1) group's new parameters, fp32
    gathers = (comm.all_gather_bytes - 4 * engine.memory_report()["persistent_numel"],
               comm.all_reduce_bytes)
    return losses, persist, gathers, ({k: v.float() for k, v in state.items()}
                                      if rank == 0 else None)


def test_the_engine_keeps_what_the_rules_say_and_trains_like_torch():
    model = training.make_model()
    expected = stage3_policy.kept_whole([p.numel() for p in model.parameters()],
                                        ZERO_EXTRA["stage3_param_persistence_threshold"],
                                        ZERO_EXTRA["stage3_model_persistence_threshold"])
    small = [p.numel() <= 5_000 for p in model.parameters()]
    assert expected != small and any(expected)  # the cap partitions some small ones
    ref_losses, ref_params = training.train_reference(2, STEPS, GAS, _config())
    results = run_distributed(_train, 2, timeout=180)
    for losses, persist, (all_gather_bytes, all_reduce_bytes), _ in results:
        assert persist == expected
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        assert all_gather_bytes == 0 < all_reduce_bytes  # every unit's gather an all-reduce
    state = results[0][3]
    for name, value in ref_params.items():
        assert training.relative_error(state[name], value) < 1e-5, name


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    return MixtralForCausalLM(MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=1, max_position_embeddings=64, tie_word_embeddings=False))


MIXTRAL_STEPS, MIXTRAL_ROWS = 4, 2  # rows per rank and step
MIXTRAL_CONFIG = {"train_micro_batch_size_per_gpu": MIXTRAL_ROWS, "gradient_clipping": 0.0,
                  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
                  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}


def _mixtral_tokens(world):
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (MIXTRAL_STEPS, world * MIXTRAL_ROWS, 12), generator=generator)


def _train_mixtral(rank, world):
    import torch.distributed as dist

    import zero

    engine, _, _, _ = zero.initialize(model=_mixtral(), config=MIXTRAL_CONFIG)
    losses = []
    for tokens in _mixtral_tokens(world):
        mine = tokens[rank * MIXTRAL_ROWS:(rank + 1) * MIXTRAL_ROWS]
        loss = engine(input_ids=mine, labels=mine).loss
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses, [name for name, _ in engine.stage3_hooks.plan.modules]


def test_deepspeeds_default_leaf_modules_make_a_mixtral_moe_block_a_unit_inside_its_layer():
    """DeepSpeed's default leaf_module classes name Mixtral's sparse MoE block: at stage 3 it
    is a unit of its own inside its decoder layer's unit, and the model trains like
    single-process PyTorch on the global batch."""
    pytest.importorskip("transformers")
    reference = _mixtral()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=3e-3, weight_decay=0.0)
    expected = []
    for tokens in _mixtral_tokens(2):
        loss = reference(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        expected.append(loss.item())
    for losses, units in run_distributed(_train_mixtral, 2, timeout=180):
        assert units == ["", "model.layers.0", "model.layers.0.mlp", "model.layers.1",
                         "model.layers.1.mlp"]
        assert losses == pytest.approx(expected, rel=1e-5)
