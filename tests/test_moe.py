"""DeepSpeed-MoE (`deepspeed.moe.layer.MoE`, zero/moe/): experts split over expert-parallel
ranks, tokens exchanged by all-to-all, trained with ZeRO stages 0-2.

Checked against the real DeepSpeed 0.19.8 (tests/deepspeed_moe/: its gating functions'
answers on fixed logits; every rank's losses and final weights for 2 ranks at ep_size 1 and
2, top-1 and top-2, stages 0-2, bf16, no token drops) and against a single process holding
every expert (4 ranks, ep_size 2: the experts' states sharded over their expert data-parallel
group of 2; with clipping, which zero takes over the whole model's norm)."""
import os

import pytest
import torch

import estimate_vs_report
from deepspeed_reference import TESTS, cases_of
from distributed_harness import run_distributed

cases = cases_of("moe")
EXPECTED = os.path.join(TESTS, "deepspeed_moe", "expected.pt")


def _expected():
    return torch.load(EXPECTED, weights_only=False)


# ---- the gates ---------------------------------------------------------------------------
def test_the_gates_route_as_deepspeeds():
    from zero.moe import gating
    entries = _expected()["gating"]
    assert len(entries) > 50
    for entry in entries:
        got = getattr(gating, entry["fn"])(entry["logits"].clone(), **entry["kwargs"])
        want = entry["out"]
        where = f"{entry['fn']}({entry['kwargs']})"
        torch.testing.assert_close(got[0], want[0], msg=f"l_aux of {where}")
        assert int(got[1]) == int(want[1]), f"capacity of {where}"
        assert got[2] == want[2]
        for index, what in ((3, "indices"), (4, "locations"), (6, "exp_counts")):
            assert torch.equal(got[index].long(), want[index].long()), f"{what} of {where}"
        torch.testing.assert_close(got[5], want[5], msg=f"gates of {where}")


def test_the_dense_form_holds_the_same_routes():
    from zero.moe import gating
    logits = torch.randn(12, 4, generator=torch.Generator().manual_seed(3))
    l_aux, combine, dispatch, counts = gating.top2gating(logits, 1.0, 0,
                                                         top2_2nd_expert_sampling=False)
    _, capacity, _, indices, locations, gates, _ = gating.top2gating(
        logits, 1.0, 0, top2_2nd_expert_sampling=False, sparse_routes=True)
    assert combine.shape == (12, 4, int(capacity)) and torch.equal(dispatch, combine.bool())
    for route in range(2):
        for token in range(12):
            if indices[route, token] >= 0:
                assert combine[token, indices[route, token], locations[route, token]] == \
                    gates[route, token]
    assert torch.isclose(combine.sum(), gates.sum())


# ---- against DeepSpeed ------------------------------------------------------------------
def _train_cases(rank, world, names):
    import zero.compat.deepspeed as deepspeed
    from zero.compat.deepspeed.moe.layer import MoE

    found = {}
    for name in names:
        found[name] = cases.train(deepspeed, MoE, rank, cases.case_named(name))
        engine = found[name].pop("engine")
        assert engine.has_moe_layers and engine.num_experts == [cases.NUM_EXPERTS]
        assert engine.moe_layers == [engine.module.moe]
        engine.destroy()
    return found


@pytest.mark.parametrize("names", [
    [c["name"] for c in cases.CASES if c["ep_size"] == 1],
    [c["name"] for c in cases.CASES if c["ep_size"] == 2],
], ids=["ep1", "ep2"])
def test_training_matches_deepspeed(names):
    expected = _expected()
    results = run_distributed(_train_cases, 2, args=(names,), timeout=240)
    for name in names:
        bf16 = name.endswith("bf16")
        for rank, found in enumerate(results):
            want = expected[name]
            torch.testing.assert_close(
                torch.tensor(found[name]["losses"]), torch.tensor(want["losses"][rank]),
                rtol=2e-2 if bf16 else 1e-5, atol=2e-2 if bf16 else 1e-6,
                msg=f"{name} losses on rank {rank}")
            for param, value in want["params"][rank].items():
                torch.testing.assert_close(
                    found[name]["params"][param], value, rtol=5e-2 if bf16 else 1e-4,
                    atol=5e-2 if bf16 else 1e-5, msg=f"{name} {param} on rank {rank}")


# ---- against one process holding every expert ---------------------------------------------
OPTIMIZERS = {  # SGD: the gradients' scale shows; Adam with clipping: the norm's
    "sgd": ({"type": "SGD", "params": {"lr": 0.2}}, 0.0),
    "adam-clipped": ({"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.0}}, 0.05),
}


def _build(rank: int, ep_size: int, k: int):
    from zero.moe import MoE
    sampled = {"top2_2nd_expert_sampling": False} if k == 2 else {}  # (else random)
    return cases.build(MoE, rank, ep_size, k, **sampled)


# stage 3: every parameter of the small model partitioned (none kept whole)
STAGE3 = {"stage3_param_persistence_threshold": 0, "stage3_model_persistence_threshold": 0}


def _config(stage: int, optimizer: str) -> dict:
    block, clip = OPTIMIZERS[optimizer]
    return {**cases.config(stage), "optimizer": block, "gradient_clipping": clip,
            "zero_optimization": {"stage": stage, **(STAGE3 if stage == 3 else {})}}


def _reference(world: int, k: int, optimizer: str) -> dict:
    """Every expert in one process (ep_size 1: experts 0-3 as cases.build draws them); each
    rank's batch routed on its own (the capacity is per rank's tokens), the losses averaged."""
    net = _build(0, 1, k)
    block, clip = OPTIMIZERS[optimizer]
    params = block["params"]
    optim = torch.optim.SGD(net.parameters(), lr=params["lr"]) if block["type"] == "SGD" else \
        torch.optim.Adam(net.parameters(), lr=params["lr"])
    for step in range(cases.STEPS):
        for rank in range(world):
            (net(*cases.batch(rank, step)) / world).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        optim.step()
        optim.zero_grad()
    return {n: p.detach().clone() for n, p in net.named_parameters()}


def _train_zero(rank, world, ep_size, k, stage, optimizer):
    import zero

    net = _build(rank, ep_size, k)
    engine, *_ = zero.initialize(model=net, model_parameters=net.parameters(),
                                 config=_config(stage, optimizer))
    for step in range(cases.STEPS):
        loss = engine(*cases.batch(rank, step))
        engine.backward(loss)
        engine.step()
    with zero.GatheredParameters(list(engine.module.parameters())):  # (stage 3)
        found = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    comm = engine.core.data_group_comm_stats()
    engine.destroy()
    return found, comm.all_reduce_bytes + comm.reduce_scatter_bytes


@pytest.mark.parametrize("world,ep_size,k,stage,optimizer", [
    (4, 2, 1, 2, "sgd"), (4, 2, 2, 1, "adam-clipped"), (2, 2, 1, 0, "adam-clipped"),
    (2, 2, 2, 0, "sgd"), (4, 4, 1, 2, "adam-clipped"),
    # stage 3 (DeepSpeed refuses MoE there): the experts partitioned within their group
    (4, 2, 1, 3, "adam-clipped"), (2, 2, 2, 3, "sgd"), (2, 1, 1, 3, "adam-clipped"),
])
def test_training_matches_one_process_with_every_expert(world, ep_size, k, stage, optimizer):
    want = _reference(world, k, optimizer)
    results = run_distributed(_train_zero, world, args=(ep_size, k, stage, optimizer),
                              timeout=240)
    for rank, (found, expert_bytes) in enumerate(results):
        for name, value in found.items():
            torch.testing.assert_close(value, want[cases.global_name(name, rank, ep_size)],
                                       rtol=1e-4, atol=1e-5, msg=f"{name} on rank {rank}")
        # the experts' gradients go over their expert data-parallel group (ep_size 1: the
        # world, the engine's own)
        assert (expert_bytes > 0) == (ep_size > 1)


def _train_data_before_expert(rank, world):
    import zero
    from zero.compat.deepspeed.utils import groups

    # D + E: ranks [0, 1] and [2, 3] hold the same experts, [0, 2] and [1, 3] split them
    net = _build(rank // 2, 2, 1)  # (cases.build draws experts of expert-parallel rank r % 2)
    engine, *_ = zero.initialize(model=net, model_parameters=net.parameters(), config={
        **_config(1, "adam-clipped"), "use_data_before_expert_parallelism": True})
    layout = (list(groups._get_expert_parallel_group_ranks("ep_size_2")),
              list(groups._get_expert_data_parallel_group_ranks("ep_size_2")),
              groups._get_expert_parallel_rank("ep_size_2"),
              groups._get_expert_broadcast_src_rank("ep_size_2"), groups._get_max_expert_size())
    for step in range(cases.STEPS):
        loss = engine(*cases.batch(rank, step))
        engine.backward(loss)
        engine.step()
    return layout, {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def test_data_before_expert_layout_trains_the_same():
    """use_data_before_expert_parallelism: rank r is expert-parallel rank r // 2 on 4 ranks."""
    want = _reference(4, 1, "adam-clipped")
    results = run_distributed(_train_data_before_expert, 4, timeout=240)
    for rank, (layout, found) in enumerate(results):
        ep_rank = rank // 2
        assert layout == ([rank % 2, rank % 2 + 2], [2 * ep_rank, 2 * ep_rank + 1], ep_rank,
                          2 * ep_rank, 2)
        for name, value in found.items():
            marker = "deepspeed_experts."
            if marker in name:
                head, tail = name.split(marker)
                local, rest = tail.split(".", 1)
                name_in_reference = f"{head}{marker}{ep_rank * 2 + int(local)}.{rest}"
            else:
                name_in_reference = name
            torch.testing.assert_close(value, want[name_in_reference], rtol=1e-4, atol=1e-5,
                                       msg=f"{name} on rank {rank}")


# ---- what is refused --------------------------------------------------------------------
def _initialize(rank, world, ep_size, num_experts, stage, extra):
    import zero
    from zero.moe import MoE

    net = torch.nn.Sequential(torch.nn.Linear(8, 8))
    net.append(MoE(8, torch.nn.Linear(8, 8), num_experts=num_experts, ep_size=ep_size))
    try:
        zero.initialize(model=net, model_parameters=net.parameters(),
                        config={**cases.config(stage), **extra})
    except (ValueError, NotImplementedError) as error:
        return str(error)
    return None


@pytest.mark.parametrize("ep_size,num_experts,stage,extra,message", [
    (2, 4, 3, {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}},
     "stage 3 with zero_optimization.offload_param are not built"),
    (3, 3, 1, {}, "ep_size=3 does not divide the world of 2 ranks"),
    (2, 2, 1, {"sequence_parallel_size": 2}, "with sequence parallelism are not built"),
])
def test_what_is_not_built_is_refused_on_every_rank(ep_size, num_experts, stage, extra, message):
    errors = run_distributed(_initialize, 2, args=(ep_size, num_experts, stage, extra),
                             timeout=60)
    assert all(error is not None and message in error for error in errors), errors


def test_a_layer_that_cannot_split_its_experts_is_refused():
    from zero.moe import MoE
    with pytest.raises(ValueError, match="num_experts=3 must be a multiple of ep_size=2"):
        MoE(8, torch.nn.Linear(8, 8), num_experts=3, ep_size=2)
    with pytest.raises(ValueError, match="noisy_gate_policy='Gumbel'"):
        MoE(8, torch.nn.Linear(8, 8), num_experts=2, noisy_gate_policy="Gumbel")
    with pytest.raises(NotImplementedError, match="enable_expert_tensor_parallelism"):
        MoE(8, torch.nn.Linear(8, 8), num_experts=2, enable_expert_tensor_parallelism=True)


def test_deepspeeds_moe_names_are_zeros():
    import zero.compat.deepspeed as deepspeed
    from zero.compat.deepspeed.moe import layer, sharded_moe, utils
    from zero.moe import MoE
    assert layer.MoE is MoE and deepspeed.moe.layer.MoE is MoE
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), MoE(4, torch.nn.Linear(4, 4), num_experts=2))
    assert utils.has_moe_layers(net) == (True, 2)
    groups = utils.split_params_into_different_moe_groups_for_optimizer(
        {"params": list(net.parameters()), "name": "all", "lr": 0.1})
    assert [(g["name"], g.get("moe", False), len(g["params"])) for g in groups] == \
        [("all", False, 3), ("ep_size_1", True, 4)]  # linear + gate; 2 experts x (w, b)
    assert all(utils.is_moe_param(p) for p in groups[1]["params"])
    assert sharded_moe.TopKGate(4, 2).wg.bias is None


# ---- memory: the estimate is what the engine holds ---------------------------------------
def _frozen_build(rank: int, ep_size: int):
    """The net with local expert 1's second layer frozen (global experts 1 and 3 at ep 2)."""
    net = _build(rank, ep_size, 1)
    net.moe.deepspeed_moe.experts.deepspeed_experts[1].fc2.requires_grad_(False)
    return net


def _held(rank, world, ep_size, stage, config):
    import zero

    net = _frozen_build(rank, ep_size)
    engine, *_ = zero.initialize(model=net, model_parameters=net.parameters(), config=config)
    for step in range(2):
        loss = engine(*cases.batch(rank, step))
        engine.backward(loss)
        engine.step()
        # The first backward launches units in a default order (groups in turn) until it has
        # learned the model's: the shared group's first layer, last in backward, holds the
        # experts' buckets back once. The estimate is the learned order's peak.
        if step == 0:
            engine.core.registry().reset_peaks()
    found = estimate_vs_report.held(engine)
    engine.destroy()
    return found


@pytest.mark.parametrize("world,ep_size,stage", [(4, 2, 1), (4, 2, 2), (2, 2, 0), (2, 1, 2),
                                                  (4, 2, 3)])
def test_the_estimate_is_what_each_rank_holds(world, ep_size, stage):
    """Each rank holds only its experts, their states sharded over world / ep_size ranks (at
    stage 3 the frozen experts' too)."""
    from zero.reports import estimate as est
    config = {**cases.config(stage), "zero_optimization": {
        "stage": stage, "reduce_bucket_size": 1000, **(STAGE3 if stage == 3 else {})}}
    setup, _ = est.setup_from_config(config, world_size=world)
    shapes = est.shapes_from_module(_frozen_build(0, ep_size))
    assert shapes.group_ep == (1, ep_size)
    estimate = est.estimate(shapes, setup, stage)
    results = run_distributed(_held, world, args=(ep_size, stage, config), timeout=120)
    estimate_vs_report.assert_held_as_estimated(estimate, results, stage)
    offloaded = est.estimate(shapes, setup, est.option_for(3, "none", "cpu"), strict=False)
    assert not offloaded.runs and "offload_param with MoE" in offloaded.refused


def test_the_capacity_is_rounded_in_fp32_as_deepspeeds():
    """DeepSpeed's _capacity: ceil(tokens / experts * capacity_factor) in fp32 (200 tokens, 8
    experts, factor 1.2: 31 where exact arithmetic gives 30), at least min_capacity."""
    from zero.moe.gating import capacity
    assert capacity(200, 8, 1.2, 0) == 31 and capacity(25, 2, 1.2, 0) == 16
    for tokens in range(1, 300, 7):
        for experts in (2, 4, 8, 16):
            for factor in (0.5, 1.0, 1.2, 1.25, 2.0):
                deepspeed = torch.ceil(torch.tensor(tokens / experts) * torch.tensor(factor))
                assert capacity(tokens, experts, factor, 4) == max(int(deepspeed), 4)


# ---- expert buffers, parameter values, whole-model saves -----------------------------------
def _details(rank, world, directory, precision, stage):
    import zero
    from zero.compat.deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

    net = _build(rank, 2, 1)
    for expert in net.moe.deepspeed_moe.experts.deepspeed_experts:
        expert.register_buffer("count", torch.full((3,), float(rank)))
    net.register_buffer("shared", torch.full((3,), float(rank)))
    frozen = net.moe.deepspeed_moe.experts.deepspeed_experts[1].fc2.bias
    frozen.requires_grad_(False)
    config = _config(stage, "adam-clipped")
    if precision == "bf16":  # (.to(bf16) gives the buffers new tensors)
        config["bf16"] = {"enabled": True}
    engine, *_ = zero.initialize(model=net, model_parameters=net.parameters(), config=config)
    loss = engine(*cases.batch(rank, 0))
    engine.backward(loss)
    engine.step()
    found = {"buffers": [float(e.count[0]) for e in net.moe.deepspeed_moe.experts.deepspeed_experts],
             "shared": float(net.shared[0])}
    # each parameter's whole fp32 master is its value; a write reads back (experts' shards
    # lie in their expert data-parallel group)
    found["full_equal"] = all(torch.equal(safe_get_full_fp32_param(p).to(p.dtype), p.detach())
                              for p in net.parameters() if p.requires_grad)
    expert = net.moe.deepspeed_moe.experts.deepspeed_experts[0].fc1.weight
    safe_set_full_fp32_param(expert, torch.full_like(expert, float(rank % 2)))
    found["written"] = torch.equal(safe_get_full_fp32_param(expert),
                                   torch.full_like(expert, float(rank % 2)))
    engine.save_16bit_model(directory, "whole.bin", exclude_frozen_parameters=True)
    engine.destroy()
    return found


@pytest.mark.parametrize("precision, stage", [("fp32", 2), ("bf16", 2), ("fp32", 0)],
                         ids=["fp32", "bf16", "stage0"])
def test_expert_buffers_parameter_values_and_whole_saves(tmp_path, precision, stage):
    """(stage 0: each rank holds its experts whole, no shards to add up)"""
    results = run_distributed(_details, 4, args=(str(tmp_path), precision, stage), timeout=120)
    for rank, found in enumerate(results):
        # experts' buffers from their expert data-parallel group's first rank (0 or 1); the
        # shared ones from rank 0
        assert found["buffers"] == [float(rank % 2)] * 2 and found["shared"] == 0.0
        assert found["full_equal"] and found["written"], rank
    whole = torch.load(tmp_path / "whole.bin", weights_only=True)
    experts = {int(k.split("deepspeed_experts.")[1].split(".")[0]) for k in whole
               if "deepspeed_experts" in k}
    assert experts == {0, 1, 2, 3}
    # the frozen local expert 1's bias is global expert 1's and 3's: left out of both
    assert {k for k in whole if k.endswith("fc2.bias") and "deepspeed_experts" in k} == \
        {f"moe.deepspeed_moe.experts.deepspeed_experts.{e}.fc2.bias" for e in (0, 2)}


def _train_stage3(rank, world, name):
    import zero.compat.deepspeed as deepspeed
    from zero.compat.deepspeed.moe.layer import MoE

    case = {**cases.case_named(name), "stage": 3}
    trained = cases.train(deepspeed, MoE, rank, case, zero_extra=STAGE3)
    trained.pop("engine").destroy()
    return trained


@pytest.mark.parametrize("name", ["ep2-k1-stage2", "ep2-k2-stage2", "ep1-k1-stage2"])
def test_stage_3_trains_as_deepspeeds_stages_0_to_2(name):
    """DeepSpeed refuses MoE at stage 3; zero's stage 3 (every parameter partitioned, the
    experts within their expert data-parallel group) follows DeepSpeed's stage-2 run."""
    want = _expected()[name]
    for rank, found in enumerate(run_distributed(_train_stage3, 2, args=(name,), timeout=240)):
        torch.testing.assert_close(torch.tensor(found["losses"]),
                                   torch.tensor(want["losses"][rank]), rtol=1e-5, atol=1e-6)
        for param, value in want["params"][rank].items():
            torch.testing.assert_close(found["params"][param], value, rtol=1e-4, atol=1e-5,
                                       msg=f"{param} on rank {rank}")


def _modify(rank, world):
    import zero

    net = _build(rank, 2, 1)
    engine, *_ = zero.initialize(model=net, model_parameters=net.parameters(),
                                 config=_config(3, "sgd"))
    expert = net.moe.deepspeed_moe.experts.deepspeed_experts[0].fc1.weight
    with zero.GatheredParameters([expert, net.inp.weight], modifier_rank=0):
        if rank == 0:
            expert.data.fill_(7.0)
            net.inp.weight.data.fill_(3.0)
    with zero.GatheredParameters([expert, net.inp.weight]):
        found = expert.detach().clone(), net.inp.weight.detach().clone()
    engine.destroy()
    return found


def test_a_stage_3_edit_reaches_the_ranks_holding_the_same_experts_only():
    """GatheredParameters(modifier_rank=0) at stage 3: rank 0's edit of a shared weight
    reaches every rank; of its expert, the ranks holding that expert (0 and 2 on 4 ranks at
    ep 2), while ranks 1 and 3 keep their own, other expert."""
    results = run_distributed(_modify, 4, timeout=120)
    for rank, (expert, shared) in enumerate(results):
        assert torch.equal(shared, torch.full_like(shared, 3.0))
        assert torch.equal(expert, torch.full_like(expert, 7.0)) == (rank % 2 == 0), rank
    assert torch.equal(results[1][0], results[3][0])


# ---- PR-MoE: layers of different ep_size, a residual MoE ---------------------------------
def _train_pyramid(rank, world, eps):
    import zero

    from zero.moe import MoE

    net = cases.pyramid(MoE, rank, eps)
    engine, *_ = zero.initialize(model=net, model_parameters=net.parameters(),
                                 config=_config(2, "adam-clipped"))
    for step in range(cases.STEPS):
        loss = engine(*cases.batch(rank, step))
        engine.backward(loss)
        engine.step()
    found = {n: p.detach().clone() for n, p in net.named_parameters()}
    engine.destroy()
    return found


def test_layers_of_different_ep_size_and_a_residual_moe_train_as_one_process():
    world, eps = 4, (2, 4)
    from zero.moe import MoE

    reference = cases.pyramid(MoE, 0, (1, 1))
    optim = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for step in range(cases.STEPS):
        for rank in range(world):
            (reference(*cases.batch(rank, step)) / world).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), OPTIMIZERS["adam-clipped"][1])
        optim.step()
        optim.zero_grad()
    want = dict(reference.named_parameters())
    for rank, found in enumerate(run_distributed(_train_pyramid, world, args=(eps,),
                                                 timeout=240)):
        for name, value in found.items():
            ep = eps[0] if name.startswith("first.") else eps[1]
            marker = "deepspeed_experts."
            if marker in name:
                head, tail = name.split(marker)
                local, rest = tail.split(".", 1)
                name = f"{head}{marker}{(rank % ep) * (4 // ep) + int(local)}.{rest}"
            torch.testing.assert_close(value, want[name].detach(), rtol=1e-4, atol=1e-5,
                                       msg=f"{name} on rank {rank}")
