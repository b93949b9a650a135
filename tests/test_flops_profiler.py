"""zero.profiling: DeepSpeed's FLOPs profiler on torch.utils.flop_counter. FLOPs equal
FlopCounterMode's exactly (model and module by module), params, latency, the printed
DeepSpeed layout and its options, hooks removed, get_model_profile."""
import re

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.flop_counter import FlopCounterMode

from flop_reference import CPU_ATTENTION

from zero.models import GPTConfig, TinyGPT
from zero.profiling import FlopsProfiler, ModuleProfile, get_model_profile
from zero.profiling.flops_format import (duration_to_string, flops_to_string, macs_to_string,
                                         number_to_string, params_to_string)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 32), nn.GELU()),
                         nn.Linear(32, 8))


def _gpt():
    torch.manual_seed(0)
    return TinyGPT(GPTConfig(vocab_size=61, block_size=16, n_layer=2, n_head=2, n_embd=32))


def _tokens(batch=3, time=16):
    return torch.randint(0, 61, (batch, time), generator=torch.Generator().manual_seed(1))


def _reference(model, *inputs):
    """FlopCounterMode's {module name: FLOPs} for one forward of model, attention included."""
    with FlopCounterMode(display=False, depth=None, custom_mapping=CPU_ATTENTION) as counter:
        model(*inputs)
    return {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}


def _profiled(model, *inputs, forwards=1, ignore_list=None):
    prof = FlopsProfiler(model)
    prof.start_profile(ignore_list=ignore_list)
    for _ in range(forwards):
        model(*inputs)
    prof.stop_profile()
    return prof


def _report(prof, capsys, **options):
    prof.print_model_profile(**options)
    return capsys.readouterr().out


@pytest.mark.timeout(60)
def test_total_flops_of_mlp_equal_flop_counter():
    model, x = _mlp(), torch.randn(5, 16)
    assert _profiled(model, x).get_total_flops() == _reference(model, x)["Global"]


@pytest.mark.timeout(60)
def test_total_flops_of_tiny_gpt_equal_flop_counter():
    model, tokens = _gpt(), _tokens()
    total = _reference(model, tokens)["Global"]
    assert total > 0
    assert _profiled(model, tokens).get_total_flops() == total


@pytest.mark.timeout(60)
def test_module_flops_equal_flop_counter_per_module():
    model, tokens = _gpt(), _tokens()
    reference = _reference(model, tokens)  # keyed "TinyGPT", "TinyGPT.blocks.0", ...
    profiles = _profiled(model, tokens).get_module_profile()
    for name, module in model.named_modules():
        key = "TinyGPT" + (f".{name}" if name else "")
        if isinstance(module, nn.ModuleList):  # never called itself: see the next test
            continue
        assert profiles[name].flops == reference.get(key, 0), name
    assert profiles["blocks.0.attn.qkv"].flops > 0


@pytest.mark.timeout(60)
def test_module_list_reports_sum_of_its_modules():
    profiles = _profiled(_gpt(), _tokens()).get_module_profile()
    blocks = [profiles[f"blocks.{i}"] for i in range(2)]
    assert profiles["blocks"].flops == sum(b.flops for b in blocks) > 0
    assert profiles["blocks"].duration_s == pytest.approx(sum(b.duration_s for b in blocks))


@pytest.mark.timeout(60)
def test_submodule_profiled_inside_a_larger_forward():
    model, tokens = _gpt(), _tokens()
    reference = _reference(model, tokens)
    prof = FlopsProfiler(model.blocks[1])
    prof.start_profile()
    model(tokens)
    prof.stop_profile()
    profiles = prof.get_module_profile()
    assert profiles[""].flops == reference["TinyGPT.blocks.1"]
    assert profiles["mlp.2"].flops == reference["TinyGPT.blocks.1.mlp.2"]


@pytest.mark.timeout(60)
def test_linear_flops_and_macs_analytic():
    batch, fan_in, fan_out = 7, 12, 5
    prof = _profiled(nn.Linear(fan_in, fan_out), torch.randn(batch, fan_in))
    assert prof.get_total_flops() == 2 * batch * fan_in * fan_out
    assert prof.get_total_macs() == batch * fan_in * fan_out


@pytest.mark.timeout(60)
def test_macs_are_half_the_flops_for_every_module():
    for name, profile in _profiled(_gpt(), _tokens()).get_module_profile().items():
        assert isinstance(profile, ModuleProfile)
        assert 2 * profile.macs == profile.flops, name


@pytest.mark.timeout(60)
def test_params_per_module_are_sum_of_numel():
    model = _gpt()
    prof = _profiled(model, _tokens())
    profiles = prof.get_module_profile()
    for name, module in model.named_modules():
        assert profiles[name].params == sum(p.numel() for p in module.parameters()), name
    assert prof.get_total_params() == sum(p.numel() for p in model.parameters())  # tied once


@pytest.mark.timeout(60)
def test_param_counts_override_numel():
    model = _mlp()
    prof = FlopsProfiler(model, param_counts={"": 1000, "0": 600})
    prof.start_profile()
    model(torch.randn(2, 16))
    profiles = prof.get_module_profile()
    assert prof.get_total_params() == profiles[""].params == 1000
    assert profiles["0"].params == 600
    assert profiles["3"].params == 32 * 8 + 8  # not overridden: numel
    with pytest.raises(ValueError, match="param_counts"):
        FlopsProfiler(model, param_counts={"missing.module": 3})


@pytest.mark.timeout(60)
def test_latency_positive_and_root_at_least_each_child():
    prof = _profiled(_gpt(), _tokens())
    profiles = prof.get_module_profile()
    root = prof.get_total_duration()
    assert root == profiles[""].duration_s > 0
    for name, profile in profiles.items():
        assert profile.duration_s > 0, name
        assert root >= profile.duration_s, name


@pytest.mark.timeout(60)
def test_forwards_add_up_and_backward_is_not_counted():
    model, tokens = _gpt(), _tokens()
    one_forward = _reference(model, tokens)["Global"]
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(tokens).sum().backward()
    assert prof.get_total_flops() == one_forward
    model(tokens)
    assert prof.get_total_flops() == 2 * one_forward


@pytest.mark.timeout(60)
def test_profiling_does_not_change_outputs():
    model, tokens = _gpt(), _tokens()
    expected = model(tokens)
    prof = FlopsProfiler(model)
    prof.start_profile()
    assert torch.equal(model(tokens), expected)
    prof.end_profile()
    assert torch.equal(model(tokens), expected)


@pytest.mark.timeout(60)
def test_stop_and_end_profile_remove_all_hooks():
    model = _gpt()
    prof = FlopsProfiler(model)
    prof.start_profile()
    assert all(m._forward_pre_hooks and m._forward_hooks for m in model.modules())
    model(_tokens())
    prof.stop_profile()
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    assert prof.get_total_flops() > 0  # stop keeps the results
    prof.end_profile()
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    assert prof.get_total_flops() == 0
    assert _get_current_dispatch_mode() is None


@pytest.mark.timeout(60)
def test_counter_exits_when_forward_raises():
    class Failing(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x):
            raise RuntimeError("boom")

    prof = FlopsProfiler(Failing())
    prof.start_profile()
    with pytest.raises(RuntimeError, match="boom"):
        prof.model(torch.randn(2, 4))
    assert _get_current_dispatch_mode() is None
    prof.end_profile()


@pytest.mark.timeout(60)
def test_ignored_modules_report_sum_of_their_modules():
    model, x = _mlp(), torch.randn(5, 16)
    profiles = _profiled(model, x, ignore_list=[nn.Sequential]).get_module_profile()
    assert not model[0]._forward_hooks  # hooks gone after stop_profile
    inner = profiles["2"]  # an ignored Sequential(Linear, GELU)
    assert inner.flops == profiles["2.0"].flops == 2 * 5 * 32 * 32
    assert profiles[""].flops == sum(profiles[name].flops for name in ("0", "2", "3"))


@pytest.mark.timeout(60)
def test_print_model_profile_has_deepspeed_layout(capsys):
    prof = _profiled(_gpt(), _tokens())
    out = _report(prof, capsys, profile_step=5)
    for line in ("-------------------------- DeepSpeed Flops Profiler --------------------------",
                 "Profile Summary at step 5:", "Notations:", "world size:", "data parallel size:",
                 "model parallel size:", "params per GPU:", "params of model = params per GPU * mp_size:",
                 "fwd MACs per GPU:", "fwd flops per GPU:",
                 "fwd flops of model = fwd flops per GPU * mp_size:",
                 "fwd latency:", "fwd FLOPS per GPU = fwd flops per GPU / fwd latency:",
                 "Aggregated Profile per GPU", "depth 0:", "    params      - {'TinyGPT':",
                 "Detailed Profile per GPU", "TinyGPT(", "(qkv): Linear(", "elementwise"):
        assert line in out, line
    assert f"fwd MACs per GPU: {'':<52}  {prof.get_total_macs(as_string=True)}" in out
    assert "bwd latency:" not in out and "samples/second:" not in out


@pytest.mark.timeout(60)
def test_print_model_profile_backward_step_and_throughput_lines(capsys):
    prof = _profiled(nn.Linear(1000, 1000), torch.randn(500, 1000))  # 1 GFLOP forward
    out = _report(prof, capsys, fwd_latency=0.5, bwd_latency=1.0, step_latency=0.5,
                  world_size=4, batch_size=8)
    assert re.search(r"world size: +4", out) and re.search(r"data parallel size: +4", out)
    assert re.search(r"batch size per GPU: +8", out)
    assert re.search(r"fwd FLOPS per GPU = fwd flops per GPU / fwd latency: +2 GFLOPS", out)
    assert re.search(r"bwd FLOPS per GPU = 2 \* fwd flops per GPU / bwd latency: +2 GFLOPS", out)
    assert re.search(r"fwd\+bwd FLOPS per GPU = 3 \* fwd flops per GPU / \(fwd\+bwd latency\): +2 GFLOPS",
                     out)
    assert re.search(r"iter latency: +2 s", out)
    assert re.search(r"samples/second: +16", out)


@pytest.mark.timeout(60)
def test_print_model_profile_module_depth(capsys):
    prof = _profiled(_gpt(), _tokens())
    out = _report(prof, capsys, module_depth=1)
    assert "depth 1:" in out and "depth 2:" not in out
    assert "(blocks): ModuleList(" in out and "(0): Block(" not in out
    deepest = _report(prof, capsys, module_depth=-1)
    assert "depth 4:" in deepest and "(qkv): Linear(" in deepest


@pytest.mark.timeout(60)
def test_print_model_profile_top_modules(capsys):
    prof = _profiled(_gpt(), _tokens())
    line = next(ln for ln in _report(prof, capsys, top_modules=1).splitlines() if ln.startswith("    params"))
    assert line.count(": '") == 1
    out = _report(prof, capsys, top_modules=3)
    assert "Top 3 modules" in out
    depth1 = out.split("depth 1:")[1].splitlines()[1]
    assert depth1.count(": '") == 3  # ModuleList, Embedding, Linear, LayerNorm: 3 shown


@pytest.mark.timeout(60)
def test_print_model_profile_without_detail(capsys):
    out = _report(_profiled(_gpt(), _tokens()), capsys, detailed=False)
    assert "Aggregated Profile per GPU" in out
    assert "Detailed Profile per GPU" not in out and "TinyGPT(" not in out


@pytest.mark.timeout(60)
def test_print_model_profile_to_output_file(tmp_path, capsys):
    path = tmp_path / "new" / "folder" / "flops.txt"
    _profiled(_mlp(), torch.randn(2, 16)).print_model_profile(output_file=str(path))
    assert capsys.readouterr().out == ""
    text = path.read_text()
    assert "DeepSpeed Flops Profiler" in text and "Sequential(" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("option, value", [("module_depth", -2), ("top_modules", 0),
                                           ("world_size", 0), ("batch_size", 1.5),
                                           ("bwd_latency", -1.0), ("detailed", "yes")])
def test_print_model_profile_rejects_bad_arguments(option, value):
    prof = _profiled(_mlp(), torch.randn(2, 16))
    with pytest.raises((TypeError, ValueError), match=option):
        prof.print_model_profile(**{option: value})


@pytest.mark.timeout(60)
def test_print_model_profile_before_start_is_an_error():
    with pytest.raises(RuntimeError, match="start_profile"):
        FlopsProfiler(_mlp()).print_model_profile()


@pytest.mark.timeout(60)
def test_constructor_rejects_bad_arguments():
    with pytest.raises(TypeError, match="model"):
        FlopsProfiler(object())
    with pytest.raises(ValueError, match="recompute_fwd_factor"):
        FlopsProfiler(_mlp(), recompute_fwd_factor=-1)
    with pytest.raises(TypeError, match="ignore_list"):
        FlopsProfiler(_mlp()).start_profile(ignore_list=nn.Linear)


@pytest.mark.timeout(60)
def test_get_model_profile_returns_strings_or_numbers(capsys):
    model, x = nn.Linear(8, 4), torch.randn(3, 8)
    flops, macs, params = get_model_profile(model, args=[x], print_profile=False, as_string=False)
    assert (flops, macs, params) == (2 * 3 * 8 * 4, 3 * 8 * 4, 8 * 4 + 4)
    strings = get_model_profile(model, input_shape=(3, 8), print_profile=False)
    assert strings == ("192 ", "96 MACs", "36")
    assert capsys.readouterr().out == ""
    assert not model._forward_hooks and not model._forward_pre_hooks


@pytest.mark.timeout(60)
def test_get_model_profile_prints_with_kwargs(capsys):
    model = _gpt()
    flops, _, _ = get_model_profile(model, kwargs={"tokens": _tokens()}, as_string=False, top_modules=2)
    assert flops == _reference(model, _tokens())["Global"]
    assert "Profile Summary at step 1:" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_get_model_profile_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode must be 'forward'"):
        get_model_profile(nn.Linear(2, 2), input_shape=(1, 2), mode="generate")
    with pytest.raises(ValueError, match="input_shape"):
        get_model_profile(nn.Linear(2, 2), input_shape=[1, 2])
    with pytest.raises(ValueError, match="args"):
        get_model_profile(nn.Linear(2, 2))


@pytest.mark.timeout(60)
def test_number_formats_match_deepspeed():
    assert params_to_string(336.23e6) == "336.23 M"
    assert params_to_string(1.5e9) == "1.5 B"
    assert macs_to_string(3139.93e9, units="G") == "3139.93 GMACs"
    assert macs_to_string(3139.93e9) == "3.14 TMACs"
    assert duration_to_string(0.07667) == "76.67 ms"
    assert duration_to_string(34.09e-6) == "34.09 us"
    assert flops_to_string(81.9e12) == "81.9 TFLOPS"
    assert number_to_string(6279.86e9, units="G") == "6279.86 G"
    assert number_to_string(0) == "0 "
