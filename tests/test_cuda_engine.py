"""The engine on a GPU: ZeRO stages 0-3 in fp32 and bf16 against the single-process PyTorch
reference, optimizer and parameter offload to pinned host memory through the copy engine and
to NVMe, the delayed parameter update, the reduced gradients read per parameter, bf16
gradients reduced in fp32, the memory report's device bytes against torch.cuda's allocator,
offload_states giving GPU memory back, Adagrad, Lion and a torch optimizer run on the
shards, DeepSpeed's stage-3 split rules with gathers by all-reduce, a bf16 master
(bf16_master_weights_and_grads), fp32 gradient accumulation (data_types.grad_accum_dtype),
LAMB and Muon, a rank-dependent branch at stage 3, Ulysses sequence parallelism, a
checkpoint the real DeepSpeed wrote on the CPU continued on the GPU, a GPU checkpoint
resumed at another world size, stage 3 under
torch.compile (eager and inductor), and tensor-parallel init_inference. Skipped where torch
sees no GPU
(scripts/gpu_check.sh runs them on one).

World 1 runs on NCCL; world 2 puts both ranks on the one GPU over gloo (NCCL refuses two
ranks on one device). The reference trains on the CPU in fp32, so fp32 tolerances allow for
the GPU's different summation order (no TF32: torch leaves it off for matmuls)."""
import pytest
import torch

import training
from deepspeed_reference import TESTS, cases_of
from distributed_harness import run_distributed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STEPS = 12
GAS = 2
ONE_GPU = {"LOCAL_RANK": "0"}
TOLERANCE = {"fp32": (1e-4, 1e-3), "bf16": (2e-2, 5e-2)}  # (losses rel, parameters rel L2)


def _train(rank, world, stage, precision, zero_extra, lora=False, bf16_extra=None,
           top_extra=None):
    import zero

    model = training.make_model(lora=lora)
    if stage == 3:  # partition every tensor but the biases and norms (default: all whole)
        zero_extra = {"stage3_param_persistence_threshold": 40, **zero_extra}
    config = training.engine_config(stage, gas=GAS, precision=precision, **zero_extra)
    config.get("bf16", {}).update(bf16_extra or {})
    config.update(top_extra or {})
    engine, _, _, _ = zero.initialize(model=model, config=config)
    assert engine.device.type == "cuda"
    losses = training.train_engine(engine, rank, world, STEPS, GAS)
    state = engine.module_state_dict()  # whole tensors at every stage (gathered at stage 3)
    params = {name: value.detach().float().cpu() for name, value in state.items()}
    report = engine.memory_report()
    engine.destroy()
    return losses, params, report


def _run(world, stage, precision, lora=False, bf16_extra=None, top_extra=None, **zero_extra):
    kwargs = dict(args=(stage, precision, zero_extra, lora, bf16_extra, top_extra), timeout=300)
    if world == 1:
        return run_distributed(_train, 1, backend="nccl", **kwargs)
    return run_distributed(_train, world, env=ONE_GPU, **kwargs)


def _assert_matches_reference(results, world, stage, precision):
    config = training.engine_config(stage, gas=GAS)
    ref_losses, ref_params = training.train_reference(world, STEPS, GAS, config)
    loss_tol, param_tol = TOLERANCE[precision]
    assert results[0][1], "rank 0 holds the whole model"
    for losses, params, _ in results:
        assert losses == pytest.approx(ref_losses, rel=loss_tol)
        for name, expected in ref_params.items() if params else ():  # stage 3: rank 0 only
            assert training.relative_error(params[name], expected) < param_tol, name
    assert ref_losses[-1] < ref_losses[0] - 0.2


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("world", [1, 2])
def test_stages_match_the_reference_on_the_gpu(world, stage, precision):
    _assert_matches_reference(_run(world, stage, precision), world, stage, precision)


@pytest.mark.parametrize("stage,offload", [(2, False), (3, False), (2, True)])
def test_a_bf16_master_on_the_gpu(stage, offload):
    """bf16_master_weights_and_grads with bf16_optimizer_states on the GPU, or offloaded with
    fp32 moments (DeepSpeed's CPU Adam): no fp32 master anywhere, within bf16 tolerance of the
    fp32 reference."""
    extra = {"offload_optimizer": {"device": "cpu"}} if offload else {}
    results = _run(1, stage, "bf16", bf16_extra={"bf16_master_weights_and_grads": True,
                                                 "bf16_optimizer_states": not offload}, **extra)
    _assert_matches_reference(results, 1, stage, "bf16")
    master = results[0][2]["categories"].get("fp32_master", {"by_location": {}})["by_location"]
    assert master.get("device", {"current": 0})["current"] == 0
    assert bool(offload) == any(where.startswith("host") for where in master)


@pytest.mark.parametrize("stage,offload", [(0, False), (1, False), (2, False), (3, False),
                                           (1, True), (2, True)])
def test_fp32_gradient_accumulation_on_the_gpu(stage, offload):
    """data_types.grad_accum_dtype fp32 under bf16: fp32 gradient buffers on the GPU (the
    offloaded step stages fp32 gradient chunks through pinned memory), within bf16 tolerance
    of the fp32 reference; the report's gradient bytes are 4 per element, as its formula says."""
    extra = {"offload_optimizer": {"device": "cpu", "pin_memory": True}} if offload else {}
    results = _run(1, stage, "bf16", top_extra={"data_types": {"grad_accum_dtype": "fp32"}},
                   **extra)
    _assert_matches_reference(results, 1, stage, "bf16")
    gradient = results[0][2]["categories"]["gradient"]
    assert gradient["peak"] == gradient["expected"] > 0
    assert gradient["formula"].startswith("4Ψ")


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_lamb_on_the_gpu(stage):
    """DeepSpeed's "Lamb" type on the GPU: the per-parameter trust ratios' squares summed on the
    device (NCCL), within fp32 tolerance of test_lamb.py's FusedLamb-kernel reference."""
    from test_lamb import LAMB, ReferenceLamb

    results = _run(1, stage, "fp32", top_extra={"optimizer": LAMB})
    config = dict(training.engine_config(stage, gas=GAS), optimizer=LAMB)  # its scheduler too
    ref_losses, ref_params, _ = training.train_reference(
        1, STEPS, GAS, config, make_optimizer=lambda params: ReferenceLamb(params, **LAMB["params"]))
    losses, params, _ = results[0]
    assert losses == pytest.approx(ref_losses, rel=TOLERANCE["fp32"][0])
    for name, expected in ref_params.items():
        assert training.relative_error(params[name], expected) < TOLERANCE["fp32"][1], name


@pytest.mark.parametrize("stage,offload", [(0, False), (1, False), (3, False), (2, True)])
def test_muon_on_the_gpu(stage, offload):
    """DeepSpeed's "Muon" type on the GPU, 2 ranks sharing it: each unit's blends all-gathered
    on the device, Newton-Schulz ("gram") in fp16 as DeepSpeed runs it on a GPU, within fp16's
    rounding of test_muon.py's single-process reference (iterating in fp16 too, on the CPU);
    with ZeRO-Offload the gradient shard and the momentum in host memory, the transform on
    the GPU."""
    import test_muon

    config = test_muon._config(stage)
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    losses, params, _, _ = run_distributed(test_muon._train, 2, args=(config,), env=ONE_GPU,
                                           timeout=300)[0]
    ref_losses, ref_params = test_muon._reference(config, ns_dtypes={"gram": "float16"})
    assert losses == pytest.approx(ref_losses, rel=1e-3)
    for name, expected in ref_params.items():
        assert training.relative_error(params[name], expected) < 2e-2, name


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_optimizer_offload_to_pinned_memory(stage):
    offload = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
    results = _run(1, stage, "bf16", **offload)
    _assert_matches_reference(results, 1, stage, "bf16")
    for _, _, report in results:
        master = report["categories"]["fp32_master"]["by_location"]
        assert set(master) == {"host_pinned"}, master  # pinned, not a pageable fallback


@pytest.mark.parametrize("stage", [2, 3])
def test_optimizer_offload_in_many_chunks_with_the_gradients_on_the_host(stage):
    """The gradient shard in pinned memory is read in place, chunk by chunk (no copy-in):
    chunk c's update must not write the 16-bit staging slot while chunk c-2's new parameters
    are still being copied out of it to the GPU (a race a short update over many chunks of
    1,000 elements would show as wrong parameters)."""
    offload = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
    results = _run(1, stage, "bf16", sub_group_size=1000, **offload)
    _assert_matches_reference(results, 1, stage, "bf16")
    for _, _, report in results:
        assert set(report["categories"]["gradient"]["by_location"]) == {"host_pinned"}


@pytest.mark.parametrize("stage", [2, 3])
def test_optimizer_offload_with_the_gradients_on_the_gpu(stage):
    """offload_optimizer.grads_on_device: backward reduces into a gradient shard on the GPU,
    and the step's copy engine stages it to pinned memory chunk by chunk."""
    offload = {"offload_optimizer": {"device": "cpu", "pin_memory": True,
                                     "grads_on_device": True}}
    results = _run(1, stage, "bf16", sub_group_size=1000, **offload)
    _assert_matches_reference(results, 1, stage, "bf16")
    for _, _, report in results:
        assert set(report["categories"]["gradient"]["by_location"]) == {"device"}
        assert "host_pinned" in report["categories"]["staging"]["by_location"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_partial_optimizer_offload_on_the_gpu(stage):
    """offload_optimizer.ratio < 1, the tuner's partial-offload tier: each shard's tail steps
    on the host through pinned staging, its head on the GPU, and the gradients stay there."""
    offload = {"offload_optimizer": {"device": "cpu", "pin_memory": True, "ratio": 0.4}}
    results = _run(1, stage, "bf16", sub_group_size=1000, **offload)
    _assert_matches_reference(results, 1, stage, "bf16")
    for _, _, report in results:
        master = report["categories"]["fp32_master"]["by_location"]
        assert set(master) == {"device", "host_pinned"}, master
        assert master["host_pinned"]["peak"] < master["device"]["peak"]  # 0.4 of each shard
        assert set(report["categories"]["gradient"]["by_location"]) == {"device"}


@pytest.mark.parametrize("world", [1, 2])
def test_parameter_and_optimizer_offload(world):
    offload = {"offload_optimizer": {"device": "cpu", "pin_memory": True},
               "offload_param": {"device": "cpu", "pin_memory": True}}
    results = _run(world, 3, "bf16", **offload)
    _assert_matches_reference(results, world, 3, "bf16")
    for _, _, report in results:
        assert report["offload"] == {"optimizer": "cpu", "param": "cpu"}
        assert report["model_state_by_location"]["measured"]["device"] < \
            report["model_state_by_location"]["measured"]["host"]


def test_optimizer_and_parameters_on_nvme_on_the_gpu(tmp_path):
    """ZeRO-Infinity on the GPU: the fp32 master, Adam's moments and the parameter shard in
    swap files (tmp_path), read and written around every gather and step."""
    (tmp_path / "optimizer").mkdir()
    (tmp_path / "params").mkdir()
    offload = {"offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "optimizer")},
               "offload_param": {"device": "nvme", "nvme_path": str(tmp_path / "params")}}
    results = _run(1, 3, "bf16", **offload)
    _assert_matches_reference(results, 1, 3, "bf16")
    for _, _, report in results:
        assert report["offload"] == {"optimizer": "nvme", "param": "nvme"}
        assert report["by_location"]["nvme"]["peak"] > 0


@pytest.mark.parametrize("grads_on_device", [False, True], ids=["host-grads", "device-grads"])
def test_delayed_update_on_the_gpu(grads_on_device):
    """The delayed parameter update (offload_optimizer.delayed_update): the CPU step of one
    optimizer step overlaps the next forward and backward, so the model trains one update
    behind; exactly test_offload.py's one-behind reference, to the GPU's rounding. With
    grads_on_device the update's gradients are copied from the GPU's shard."""
    from test_offload import _dpu_config, _dpu_reference, _train_dpu

    config = _dpu_config(2)
    config["zero_optimization"]["offload_optimizer"].update(pin_memory=True,
                                                            grads_on_device=grads_on_device)
    ref_losses, ref_params = _dpu_reference(1, STEPS, config)
    [(losses, params, pending)] = run_distributed(_train_dpu, 1, args=(config,), timeout=300,
                                                  backend="nccl")
    loss_tol, param_tol = TOLERANCE["fp32"]
    assert losses == pytest.approx(ref_losses, rel=loss_tol)
    assert pending[GAS:] == [True] * (len(pending) - GAS)  # an update in flight after step 1
    for name, expected in ref_params.items():
        assert training.relative_error(params[name], expected) < param_tol, name


def test_a_rank_dependent_branch_at_stage_3_on_the_gpu():
    """Stage 3's comparison of what each rank's backward reaches (backward_reach.h) with its
    counts on the GPU: a block's submodule and an output only rank 0 uses, partitioned."""
    import test_stage3_branches as branches

    model = branches._ExpertNet(experts=False)
    expected = branches._reference(branches._ExpertNet(experts=False))
    for weights in run_distributed(branches._train, 2, env=ONE_GPU, timeout=300,
                                   args=(model, branches.PARTITIONED, False)):
        for name, value in expected.items():
            assert training.relative_error(weights[name], value) < 1e-3, name


@pytest.mark.parametrize("stage,offload", [(1, False), (2, True), (3, False)])
def test_reduced_gradients_read_on_the_gpu(stage, offload):
    """deepspeed.utils.safe_get_full_grad on NCCL: each parameter's averaged gradient after
    the boundary's backward (a host shard with optimizer offload), the global batch's."""
    from test_param_values import _grads_after_backward

    [(full, _, after_step, _)] = run_distributed(_grads_after_backward, 1, timeout=300,
                                              backend="nccl",
                                              args=(stage, GAS, offload, "fp32"))
    for name, expected in training.reference_grads(1, GAS).items():
        assert training.relative_error(full[name], expected) < TOLERANCE["fp32"][0], name
    assert "only there between engine.backward(loss)" in after_step


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_bf16_gradients_reduced_in_fp32_through_nccl(stage):
    """communication_data_type "fp32" in bf16 on NCCL: the first step's reduced gradients
    are the fp32 reference's to bf16 rounding, and the step sends more bytes than in bf16."""
    from test_communication_dtype import _train

    extra = {"stage3_param_persistence_threshold": 40} if stage == 3 else {}
    runs = {comm: run_distributed(_train, 1, timeout=300, backend="nccl",
                                  args=(stage, 1, extra, comm))[0] for comm in ("fp32", None)}
    grads, sent = runs["fp32"][1], runs["fp32"][2]
    for name, expected in training.reference_grads(1, 1).items():
        assert training.relative_error(grads[name], expected) < 3e-2, name
    assert sent > runs[None][2]


@pytest.mark.parametrize("stage", [2, 3])
def test_memory_report_device_bytes_against_the_allocator(stage):
    """What the registry counts on the device is memory torch's allocator handed out: its
    device peak never exceeds torch.cuda.max_memory_allocated, its model states on the device
    are the formula's, and the report names what the allocator holds outside zero (on an
    H100 about 64 MiB of cuBLAS workspaces, which torch allocates through the same allocator)."""
    [(_, _, report)] = _run(1, stage, "bf16")
    device = report["by_location"]["device"]
    process = report["process"]
    assert 0 < device["peak"] <= process["cuda_max_allocated_bytes"]
    assert 0 < device["current"] <= process["cuda_allocated_bytes"]
    by_location = report["model_state_by_location"]
    assert by_location["measured"]["device"] == by_location["expected"]["device"]
    assert process["cuda_outside_zero_bytes"] == process["cuda_allocated_bytes"] - device["current"]


def test_the_int8_code_is_the_same_bytes_on_the_gpu():
    """ZeRO++'s CUDA kernels (csrc/cuda/quantize_kernels.cu) encode byte for byte as the CPU
    code does, an inf block included, and decode to the same values."""
    from zero import _C

    values = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3
    values[300] = float("inf")  # block 1 decodes to NaN
    on_cpu, on_gpu = _C.quantize_int8(values), _C.quantize_int8(values.cuda())
    assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), on_cpu)
    decoded_cpu, decoded_gpu = _C.dequantize_int8(on_cpu, 1000), _C.dequantize_int8(on_gpu, 1000)
    assert torch.allclose(decoded_gpu.cpu(), decoded_cpu, rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(decoded_cpu[256:512]).all() and torch.isfinite(decoded_cpu[512:]).all()


def test_stage3_split_rules_and_all_reduce_fetch_on_nccl():
    """stage3_model_persistence_threshold, stage3_module_granularity_threshold and the
    gathers by all-reduce (stage3_use_all_reduce_for_fetch_params) on NCCL, bf16."""
    results = _run(1, 3, "bf16", stage3_param_persistence_threshold=5_000,
                   stage3_model_persistence_threshold=3_000,
                   stage3_module_granularity_threshold=1_500,
                   stage3_use_all_reduce_for_fetch_params=True)
    _assert_matches_reference(results, 1, 3, "bf16")


def test_quantized_weights_and_gradients_train_on_the_gpu():
    """qwZ and qgZ on NCCL (world 1: the collectives still send their int8 code): the losses
    follow the reference within the quantization's 1%."""
    results = _run(1, 3, "bf16", zero_quantized_weights=True, zero_quantized_gradients=True)
    ref_losses, _ = training.train_reference(1, STEPS, GAS, training.engine_config(3, gas=GAS))
    assert results[0][0] == pytest.approx(ref_losses, rel=2e-2)


@pytest.mark.parametrize("offload", [False, True], ids=["on-device", "offload-param"])
def test_a_lora_models_frozen_base_partitioned_and_quantized_on_the_gpu(offload):
    """Stage 3's frozen group on NCCL, bf16: the LoRA model's base partitioned and kept as int8
    (zero_quantized_nontrainable_weights; with offload_param in pinned host memory, each
    gather staging its packed piece), the adapters trained; the losses follow the unquantized
    reference within the quantization's 1%."""
    extra = {"offload_param": {"device": "cpu"}} if offload else {}
    results = _run(1, 3, "bf16", lora=True, zero_quantized_nontrainable_weights=True, **extra)
    ref_losses, _ = training.train_reference(1, STEPS, GAS, training.engine_config(3, gas=GAS),
                                             lora=True)
    assert results[0][0] == pytest.approx(ref_losses, rel=2e-2)
    report = results[0][2]
    assert report["frozen_numel"] > 0
    assert report["categories"]["param"]["peak"] == report["categories"]["param"]["expected"]


def _sleep_on_the_gpu(rank, world, stage):
    """Two steps, offload_states, the allocator's view, reload_states, two more steps."""
    import zero
    from test_offload_states import _config

    engine, _, _, _ = zero.initialize(model=training.make_model(), config=_config(stage, "bf16"))
    losses = training.train_engine(engine, rank, world, 2, 1)
    awake = torch.cuda.memory_allocated()
    engine.offload_states()
    asleep = torch.cuda.memory_allocated()
    moved = engine.core.offloaded_bytes
    pinned = engine.core.registry().location_usage("host_pinned").current
    engine.reload_states()
    back = torch.cuda.memory_allocated()
    losses += training.train_engine(engine, rank, world, 2, 1, first_step=2)
    return losses, awake, asleep, back, moved, pinned


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_offload_states_gives_the_gpu_memory_back(stage):
    """offload_states (RLHF's sleep) frees on the GPU what it moved to pinned host memory,
    reload_states takes it again, and the run goes on as the one without the round trip."""
    from test_offload_states import _config, _plain_run

    [(losses, awake, asleep, back, moved, pinned)] = run_distributed(
        _sleep_on_the_gpu, 1, timeout=300, backend="nccl", args=(stage,))
    assert moved > 0 and pinned >= moved
    assert awake - asleep >= moved  # the allocator rounds blocks up: at least the bytes moved
    assert back - asleep >= moved
    [plain] = run_distributed(_plain_run, 1, timeout=300, backend="nccl",
                              args=(_config(stage, "bf16"),))
    assert losses == pytest.approx(plain, rel=1e-5)  # CUDA's embedding backward uses atomics


@pytest.mark.parametrize("stage,precision,offload", [(2, "bf16", "cpu"), (3, "bf16", None),
                                                     (1, "fp32", None)])
def test_ranges_of_the_master_and_moments_on_the_gpu(tmp_path, stage, precision, offload):
    """safe_get/set_local_* by range on the GPU (the device head of a partially offloaded
    shard and its pinned host tail): the elements of the whole shards, and a write changes
    those alone (test_param_values' check)."""
    from test_param_values import _ranges_against_whole_shards

    [checked] = run_distributed(_ranges_against_whole_shards, 1, timeout=300, backend="nccl",
                                args=(stage, precision, offload, str(tmp_path)))
    assert checked > 20


# Adagrad and Lion (zero's own updates in ATen ops), RMSprop (torch's, run on the shard)
OTHER_OPTIMIZERS = {"Adagrad": {"lr": 0.05, "weight_decay": 1e-3, "lr_decay": 0.01,
                                "initial_accumulator_value": 0.1},
                    "Lion": {"lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.1},
                    "RMSprop": {"lr": 1e-3, "momentum": 0.5, "centered": True}}


def _train_config(rank, world, config):
    return training.resume_and_train(config, rank, world, 0, STEPS)


@pytest.mark.parametrize("name", sorted(OTHER_OPTIMIZERS))
@pytest.mark.parametrize("stage", [2, 3])
def test_other_optimizers_match_the_reference_on_the_gpu(name, stage):
    extra = {"stage3_param_persistence_threshold": 40} if stage == 3 else {}
    config = training.engine_config(stage, gas=GAS, **extra)
    config["optimizer"] = {"type": name, "params": dict(OTHER_OPTIMIZERS[name])}
    config["zero_allow_untested_optimizer"] = True
    ref_losses, _ = training.train_reference(1, STEPS, GAS, config)
    [losses] = run_distributed(_train_config, 1, timeout=300, backend="nccl", args=(config,))
    assert losses == pytest.approx(ref_losses, rel=TOLERANCE["fp32"][0])
    assert ref_losses[-1] < ref_losses[0]


def _ulysses(rank, world, name):
    import zero.compat.deepspeed as deepspeed

    engine, losses, _ = cases_of("ulysses").train(deepspeed, name)
    return engine.device.type, losses


@pytest.mark.parametrize("name", ["stage1", "stage3"])
def test_ulysses_on_the_gpu(name):
    """DistributedAttention's all-to-alls on CUDA tensors (2 ranks on the GPU over gloo):
    rank 0's losses are the real DeepSpeed's ZeRO-3 run on the CPU (tests/deepspeed_ulysses;
    clipping makes its stages' trajectories one)."""
    expected = torch.load(f"{TESTS}/deepspeed_ulysses/expected.pt")["stage3"]["losses"]
    (device, losses), _ = run_distributed(_ulysses, 2, args=(name,), env=ONE_GPU, timeout=300)
    assert device == "cuda"
    assert losses == pytest.approx(expected, rel=1e-4)


def _moe(rank, world, name):
    import zero.compat.deepspeed as deepspeed
    from zero.compat.deepspeed.moe.layer import MoE

    cases = cases_of("moe")
    trained = cases.train(deepspeed, MoE, rank, cases.case_named(name), device="cuda")
    return trained["engine"].device.type, trained["losses"]


@pytest.mark.parametrize("name", ["ep2-k1-stage2-nodrop", "ep2-k2-stage1"])
def test_moe_on_the_gpu(name):
    """MoE's token all-to-alls and the expert groups' reductions on CUDA tensors (2 ranks on
    the GPU over gloo): every rank's losses are the real DeepSpeed's on the CPU
    (tests/deepspeed_moe). Cases whose routing is the same on any device: top-1 with a
    capacity drop keeps, as DeepSpeed's gate, the tokens torch.topk ranks first among equal
    priorities, and CUDA's topk orders equals otherwise than the CPU's (ep2-k1-stage2 lost 2%
    on an H200, 2026-11-30); the top-1 case here takes every token (drop_tokens=False, its
    capacity an all-reduce MAX over the expert group), top-2 places tokens by cumulative sums."""
    expected = torch.load(f"{TESTS}/deepspeed_moe/expected.pt", weights_only=False)[name]
    results = run_distributed(_moe, 2, args=(name,), env=ONE_GPU, timeout=300)
    for rank, (device, losses) in enumerate(results):
        assert device == "cuda"
        assert losses == pytest.approx(expected["losses"][rank], rel=1e-4)


def _auto_ep(rank, world, autoep_size):
    import test_auto_ep as case

    engine = case._engine(rank, "mixtral", 2, autoep_size)
    losses = []
    for step in range(3):
        ids = case._batch(rank, step).to(engine.device)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return engine.device.type, losses


def test_auto_ep_on_the_gpu():
    """AutoEP's variable all-to-alls and expert-order sums on CUDA tensors (2 ranks on the GPU
    over gloo, a small Hugging Face Mixtral): the losses of the same run without AutoEP."""
    split = run_distributed(_auto_ep, 2, args=(2,), env=ONE_GPU, timeout=300)
    whole = run_distributed(_auto_ep, 2, args=(0,), env=ONE_GPU, timeout=300)
    for (device, losses), (_, want) in zip(split, whole):
        assert device == "cuda"
        assert losses == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("name,stage", [("stage2-fp32", 2), ("stage3-fp32", 3),
                                        ("stage2-bf16", 3)])
def test_a_deepspeed_cpu_run_continues_on_the_gpu(tmp_path, name, stage):
    """A checkpoint the real DeepSpeed wrote on the CPU (tests/deepspeed_checkpoints/) loads
    into zero on the GPU at world 1 (NCCL), and the next steps land where DeepSpeed's did, to
    the GPU's rounding."""
    from test_deepspeed_checkpoint import _assert_continues, _resume

    [result] = run_distributed(_resume, 1, args=(name, stage, str(tmp_path)), backend="nccl",
                               timeout=300)
    # bf16: a quarter of DeepSpeed's last move (its own CPU run took 4% of it from stage 3;
    # the GPU's bf16 matmuls round differently again); fp32: a hundredth
    _assert_continues(result, name, losses_rel=(1e-3, 1e-4),
                      within=lambda bf16, moved: (0.25 if bf16 else 0.01) * moved)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_stage3_under_torch_compile_on_the_gpu(backend):
    """engine.compile at stage 3 (as Accelerate calls it for the HF Trainer's --torch_compile):
    the module hooks gather the units, nothing is compiled again and again (test_engine_batch's
    recompile limit), and the losses are the engine's without it."""
    from test_engine_batch import _compiled

    [plain] = run_distributed(_compiled, 1, args=(3, None), backend="nccl", timeout=300)
    [compiled] = run_distributed(_compiled, 1, args=(3, "engine.compile", backend),
                                 backend="nccl", timeout=300)
    # (two processes: CUDA's embedding backward adds with atomics, as in the offload_states
    # test, so even the eager losses are only near-equal)
    assert compiled == pytest.approx(plain, rel=1e-4 if backend == "inductor" else 1e-5)


@pytest.mark.parametrize("stage,offload", [(2, False), (3, False), (2, True)])
def test_a_gpu_checkpoint_resumes_at_another_world_size(tmp_path, stage, offload):
    """Saved by one rank on NCCL after 3 of 4 steps, resumed by two ranks sharing the GPU
    (gloo): the last step is the uninterrupted run's (the same global batch: 1 x 2 micro-steps
    against 2 x 1), to bf16 rounding."""
    from test_checkpoint_reshard import STEPS, _train

    saved = 3
    whole = run_distributed(_train, 1, args=(stage, 2, offload, 0, STEPS, None, None),
                            backend="nccl", timeout=300)[0]
    run_distributed(_train, 1, args=(stage, 2, offload, 0, saved, None, str(tmp_path)),
                    backend="nccl", timeout=300)
    resumed = run_distributed(_train, 2, args=(stage, 1, offload, saved, STEPS - saved,
                                               str(tmp_path), None), env=ONE_GPU, timeout=300)
    for losses in resumed:
        assert losses == pytest.approx(whole[saved:], rel=2e-3, abs=1e-4)


def test_tensor_parallel_inference_on_the_gpu():
    """deepspeed.init_inference with tensor_parallel.tp_size 2 on two ranks sharing the GPU
    (gloo on CUDA tensors): GPT-2's logits and greedy generation are the whole model's, and
    both slices sample the same tokens."""
    pytest.importorskip("transformers")
    from test_inference import _tensor_parallel

    ranks = run_distributed(_tensor_parallel, 2, env=ONE_GPU, timeout=300)
    for split, error, same_greedy, _ in ranks:
        assert split and error < 1e-4 and same_greedy
    assert torch.equal(ranks[0][3], ranks[1][3])
