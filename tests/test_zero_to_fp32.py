"""DeepSpeed's zero_to_fp32 on zero's checkpoints: the full fp32 weights read from the rank
files alone, without a process group, equal the engine's own master weights."""
import pytest
import torch

import training
from distributed_harness import run_distributed


def _train_save_and_gather(rank, world, stage, precision, save_dir):
    import zero

    config = training.engine_config(stage, gas=1, precision=precision, scheduler=False,
                                     **({"stage3_param_persistence_threshold": 10}
                                        if stage == 3 else {}))
    model = training.make_model(freeze_position_embedding=True)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    training.train_engine(engine, rank, world, 2, 1)
    engine.save_checkpoint(save_dir)
    state = engine.module_state_dict()  # the model dtype, gathered on rank 0
    return {k: v.clone() for k, v in state.items()} if rank == 0 else None


@pytest.mark.parametrize("stage,precision", [(1, "fp32"), (2, "bf16"), (3, "bf16"), (3, "fp32")])
def test_fp32_weights_from_the_files_alone_match_the_engine(tmp_path, stage, precision):
    from zero.compat.deepspeed import utils

    module = run_distributed(_train_save_and_gather, 2,
                             args=(stage, precision, str(tmp_path)))[0]
    fp32 = utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(tmp_path))
    assert set(fp32) == set(module)
    frozen = "position_embedding.weight"
    for name, value in module.items():
        if name == frozen:
            assert torch.equal(fp32[name], value)  # frozen: as saved
            continue
        assert fp32[name].dtype == torch.float32, name
        # the model's weights are the fp32 master rounded to the training dtype
        assert torch.equal(fp32[name].to(value.dtype), value), name
    without = utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(
        str(tmp_path), exclude_frozen_parameters=True)
    assert frozen not in without and set(without) == set(module) - {frozen}
    if precision == "bf16":  # the fp32 master, not the bf16 weights widened
        assert any(not torch.equal(fp32[k], v.float()) for k, v in module.items() if k != frozen)
    model = utils.zero_to_fp32.load_state_dict_from_zero_checkpoint(
        training.make_model(), str(tmp_path))
    for name, value in model.state_dict().items():
        assert torch.equal(value, fp32[name].to(value.dtype)), name


def _bf16_master_by_name(rank, world, save_dir):
    """Trains at stage 2 in bf16, saves, and returns the engine's own fp32 master per
    parameter, from memory: every rank's shard all-gathered, each unit's pieces in rank order."""
    import torch.distributed as dist

    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=training.engine_config(
        2, gas=1, precision="bf16", scheduler=False))
    training.train_engine(engine, rank, world, 2, 1)
    engine.save_checkpoint(save_dir)
    masters = {}
    names = {id(p): n for n, p in engine.module.named_parameters()}
    for g, group in enumerate(engine.groups):
        layout = engine.core.group_layout(g)
        shard = engine.core.group_master_shard(g)
        shards = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(shards, shard)
        full = torch.cat([torch.cat([s[layout.shard_offset(u):layout.shard_offset(u) +
                                       layout.unit(u).shard_numel] for s in shards])
                          for u in range(layout.unit_count)])
        for i, param in enumerate(group.params):
            offset = layout.param_offset(i)
            masters[names[id(param)]] = full[offset:offset + param.numel()].view(param.shape).clone()
    return masters if rank == 0 else None


def test_the_bf16_export_is_the_engines_fp32_master_bit_for_bit(tmp_path):
    from zero.compat.deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    masters = run_distributed(_bf16_master_by_name, 2, args=(str(tmp_path),))[0]
    fp32 = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path))
    assert masters
    for name, master in masters.items():
        assert master.dtype == torch.float32
        assert torch.equal(fp32[name], master), name
