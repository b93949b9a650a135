"""The hybrid engine's generate (zero/hybrid_engine.py, `"hybrid_engine": {"enabled": true}`):
at stage 3 the model's generate runs with every unit gathered once, and generates what the
single-process model generates; training goes on after it. A whole-model gather is never
refused by stage3_max_live_parameters (DeepSpeed-Chat sets 3e7, far below its models)."""
import copy

import pytest
import torch

from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(180)
NEW_TOKENS = 12


def _model():
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(vocab_size=64, hidden_size=32, num_hidden_layers=3, ffn_dim=64,
                       num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32,
                       pad_token_id=1, bos_token_id=0, eos_token_id=2, dropout=0.0)
    return OPTForCausalLM(config)


def _prompt(rank):
    return torch.randint(3, 64, (2, 5), generator=torch.Generator().manual_seed(rank))


def _generate(model, rank, **kwargs):
    with torch.no_grad():
        return model.generate(_prompt(rank), attention_mask=torch.ones(2, 5, dtype=torch.long),
                              max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                              do_sample=False, pad_token_id=1, **kwargs)


def _config(enabled):
    return {"train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_max_live_parameters": 20000},  # a forward fits, the whole model does not
              "hybrid_engine": {"enabled": enabled, "max_out_tokens": 512, "inference_tp_size": 1,
                                "release_inference_cache": False, "pin_parameters": True,
                                "tp_gather_partition_size": 8}}


def _run(rank, world, enabled):
    import zero

    engine, _, _, _ = zero.initialize(model=_model(), config=_config(enabled))
    before = engine.core.schedule_stats().gathers
    tokens = _generate(engine.module, rank, synced_gpus=True)  # DeepSpeed-Chat's call
    gathers = engine.core.schedule_stats().gathers - before
    peak = engine.memory_report()["categories"]["gathered_param"]["peak"]
    released = all(p.numel() == 0 for p in engine.module.parameters())
    clone = copy.deepcopy(engine.module)  # (TRL's reference model is one): its own generate
    released = released and clone.generate.__self__ is clone
    # the handles TRL's remove_hooks would take off are still the model's hooks
    handles = engine.optimizer.parameter_offload.forward_hooks
    released = released and bool(handles) and all(h.id in h.hooks_dict_ref() for h in handles)
    ids = _prompt(rank)
    loss = engine(input_ids=ids, labels=ids).loss  # training goes on, hooks back on
    engine.backward(loss)
    engine.step()
    return tokens, gathers, released, engine.core.schedule_stats().notice, peak


def test_generate_gathers_each_unit_once_and_matches_the_single_process_model():
    reference = _model()
    results = run_distributed(_run, 2, args=(True,))
    units = None
    for rank, (tokens, gathers, released, notice, _) in enumerate(results):
        assert torch.equal(tokens, _generate(reference, rank))
        assert released and notice == ""
        units = gathers
    assert 0 < units <= 6  # one gather per unit (root + 3 layers), not one per token
    plain = run_distributed(_run, 2, args=(False,), timeout=120)
    for rank, (tokens, gathers, _, _, _) in enumerate(plain):
        assert torch.equal(tokens, _generate(reference, rank))
        assert gathers >= NEW_TOKENS * units  # ZeRO-3's usual way: every layer for every token


def test_the_estimate_counts_the_whole_model_gathered_for_generate():
    """zero-mem: with the hybrid engine the gathered parameters peak at every unit at once,
    the bytes the engine measured while generating."""
    from zero.reports import estimate as est

    measured = [result[4] for result in run_distributed(_run, 2, args=(True,))]
    for enabled in (True, False):
        setup, stage = est.setup_from_config(_config(enabled), 2)
        row = est.estimate(est.shapes_from_module(_model()), setup, stage).categories["gathered_param"]
        if enabled:
            assert row["bytes"] == measured[0] == measured[1]
            assert "hybrid engine" in row["formula"]
        else:
            assert row["bytes"] < measured[0]
