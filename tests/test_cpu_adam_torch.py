"""zero._C.cpu_adam_step against torch.optim.Adam/AdamW(fused=True) on CPU.

The fp32 path must agree with torch's fused kernel to 1e-6 relative on every ISA the CPU has
(in practice it is bit-identical except in torch's own scalar tail, see docs/CPU_ADAM.md);
bf16/fp16 gradients are checked against torch run on the same values widened to fp32, and the
16-bit copy of the weights must equal torch's own round-to-nearest-even cast.
"""
import pytest
import torch

_C = pytest.importorskip(
    "zero._C", reason="zero._C is not built (python setup.py build_ext --inplace)")
if not hasattr(_C, "cpu_adam_step"):
    pytest.skip("zero._C has no cpu_adam_step binding yet", allow_module_level=True)

ISAS = ["scalar", "avx2", "avx512"]
ODD_LENGTHS = [1, 7, 15, 17, 33, 1000003]
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
# 1e-6 relative, plus 1e-6 of the tensor's largest magnitude for elements near zero (where a
# one-ulp difference in a cancelling sum is a large relative error). With torch's AVX2/AVX-512
# kernels the results are in fact bit-identical except in torch's scalar tail.
RTOL = 1e-6


def _step(state, grads, step, *, isa, adamw=True, wd=WD, bias_correction=True, grad_scale=1.0,
          out16=None, num_threads=1, betas=BETAS):
    params, exp_avg, exp_avg_sq = state
    _C.cpu_adam_step(params, grads, exp_avg, exp_avg_sq, LR, betas[0], betas[1], EPS, wd, adamw,
                     bias_correction, step, grad_scale, out16, isa, num_threads)


def _new_state(params):
    return params.clone(), torch.zeros_like(params), torch.zeros_like(params)


@pytest.fixture(params=ISAS)
def isa(request):
    """Each ISA in turn; skipped (not failed) where this CPU lacks it."""
    probe = _new_state(torch.zeros(1))
    try:
        _step(probe, torch.zeros(1), 1, isa=request.param)
    except ValueError as error:
        if "not supported by this CPU" in str(error):
            pytest.skip(f"CPU lacks {request.param}")
        raise
    return request.param


def _run_both(n, isa, *, steps=3, adamw=True, wd=WD, grad_dtype=torch.float32, seed=0,
              betas=BETAS, grad_scale=1.0):
    """Runs torch's fused optimizer and ours side by side; returns (torch_state, our_state)."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.rand(n, generator=gen) * 2 - 1
    param = torch.nn.Parameter(start.clone())
    optim_cls = torch.optim.AdamW if adamw else torch.optim.Adam
    opt = optim_cls([param], lr=LR, betas=betas, eps=EPS, weight_decay=wd, fused=True)
    ours = _new_state(start)
    for step in range(1, steps + 1):
        grads = torch.randn(n, generator=gen).to(grad_dtype)
        # torch gets the scaled fp32 gradient; the kernel does the same single fp32 multiply.
        param.grad = grads.float() * grad_scale
        opt.step()
        _step(ours, grads, step, isa=isa, adamw=adamw, wd=wd, grad_scale=grad_scale, betas=betas)
    state = opt.state[param]
    return (param.detach(), state["exp_avg"], state["exp_avg_sq"]), ours


def _assert_states_close(expected, actual):
    for name, want, got in zip(("params", "exp_avg", "exp_avg_sq"), expected, actual):
        atol = RTOL * want.abs().max().item() if want.numel() else 0.0
        torch.testing.assert_close(got, want, rtol=RTOL, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("n", ODD_LENGTHS)
def test_fp32_adamw_matches_torch_fused(isa, n):
    expected, actual = _run_both(n, isa)
    _assert_states_close(expected, actual)


def test_fp32_adam_l2_matches_torch_fused(isa):
    expected, actual = _run_both(1003, isa, adamw=False, wd=0.1)
    _assert_states_close(expected, actual)


def test_no_weight_decay_and_small_beta1_match_torch_fused(isa):
    # 1 - beta1 >= 0.5 takes the other branch of torch's lerp.
    expected, actual = _run_both(1003, isa, wd=0.0, betas=(0.3, 0.99))
    _assert_states_close(expected, actual)


def test_grad_scale_matches_prescaled_torch_grads(isa):
    expected, actual = _run_both(1003, isa, grad_scale=0.7 / 1024)
    _assert_states_close(expected, actual)


def test_bias_correction_off_matches_float64_reference(isa):
    gen = torch.Generator().manual_seed(3)
    params = torch.rand(1003, generator=gen)
    grads = torch.randn(1003, generator=gen)
    ours = _new_state(params)
    _step(ours, grads, 1, isa=isa, bias_correction=False)
    p, g = params.double(), grads.double()
    p = p * (1 - LR * WD)
    m = (1 - BETAS[0]) * g
    v = (1 - BETAS[1]) * g * g
    p = p - LR * m / (v.sqrt() + EPS)
    torch.testing.assert_close(ours[0].double(), p, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(ours[1].double(), m, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(ours[2].double(), v, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [17, 1000003])
def test_16bit_grads_match_torch_on_widened_grads(isa, grad_dtype, n):
    expected, actual = _run_both(n, isa, grad_dtype=grad_dtype)
    _assert_states_close(expected, actual)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [33, 100003])
def test_16bit_output_equals_torch_cast(isa, out_dtype, n):
    gen = torch.Generator().manual_seed(5)
    # Magnitudes from 2^-30 to 2^20 cover fp16 subnormals, normals and overflow to inf.
    exponents = torch.randint(-30, 20, (n,), generator=gen).float()
    params = (torch.rand(n, generator=gen) * 2 - 1) * torch.exp2(exponents)
    state = _new_state(params)
    out = torch.empty(n, dtype=out_dtype)
    _step(state, torch.randn(n, generator=gen), 1, isa=isa, out16=out)
    assert torch.equal(out.view(torch.int16), state[0].to(out_dtype).view(torch.int16))


def test_threads_are_bit_identical_to_one_thread(isa):
    gen = torch.Generator().manual_seed(9)
    params = torch.rand(1000003, generator=gen)
    grads = torch.randn(1000003, generator=gen).bfloat16()
    one, many = _new_state(params), _new_state(params)
    out_one = torch.empty_like(params, dtype=torch.bfloat16)
    out_many = torch.empty_like(params, dtype=torch.bfloat16)
    _step(one, grads, 1, isa=isa, out16=out_one, num_threads=1)
    _step(many, grads, 1, isa=isa, out16=out_many, num_threads=3)
    for a, b in zip(one + (out_one,), many + (out_many,)):
        assert torch.equal(a, b)


def test_isas_are_bit_identical_to_each_other():
    gen = torch.Generator().manual_seed(4)
    params = torch.rand(10007, generator=gen)
    grads = torch.randn(10007, generator=gen)
    results = {}
    for name in ISAS:
        state = _new_state(params)
        try:
            _step(state, grads, 1, isa=name, grad_scale=1 / 3)
        except ValueError:
            continue  # not on this CPU
        results[name] = state
    reference = results.pop("scalar")
    for name, state in results.items():
        for a, b in zip(reference, state):
            assert torch.equal(a, b), name


def test_zero_length_is_a_no_op():
    state = _new_state(torch.empty(0))
    _step(state, torch.empty(0), 1, isa="auto", out16=torch.empty(0, dtype=torch.bfloat16))


def test_version_counters_are_bumped():
    state = _new_state(torch.rand(8))
    before = [t._version for t in state]
    _step(state, torch.randn(8), 1, isa="auto")
    assert all(t._version > v for t, v in zip(state, before))


# ---- argument checking: messages say what to change ----

def _ok_args(n=8):
    return dict(params=torch.rand(n), grads=torch.randn(n), exp_avg=torch.zeros(n),
                exp_avg_sq=torch.zeros(n), out16=None, isa="auto")


def _call(**kw):
    _C.cpu_adam_step(kw["params"], kw["grads"], kw["exp_avg"], kw["exp_avg_sq"], LR, *BETAS, EPS,
                     WD, True, True, kw.get("step", 1), 1.0, kw["out16"], kw["isa"],
                     kw.get("num_threads", 1))


@pytest.mark.parametrize("field,bad,match", [
    ("params", torch.rand(8, dtype=torch.float64), "params must be float32"),
    ("exp_avg", torch.zeros(8, dtype=torch.bfloat16), "exp_avg must be float32"),
    ("grads", torch.randn(8, dtype=torch.float64), "grads must be float32, bfloat16 or float16"),
    ("out16", torch.empty(8), "out16 must be bfloat16 or float16"),
    ("exp_avg_sq", torch.zeros(9), "exp_avg_sq has 9 elements but params has 8"),
    ("grads", torch.randn(16)[::2], "grads must be contiguous"),
    ("isa", "sse9", "unknown CPU ISA 'sse9'"),
    ("step", 0, "step is 1-based"),
    ("num_threads", 0, "num_threads must be in"),
])
def test_bad_arguments_raise_value_error(field, bad, match):
    args = _ok_args()
    args[field] = bad
    with pytest.raises(ValueError, match=match):
        _call(**args)


def test_aliased_buffers_are_rejected():
    args = _ok_args()
    args["exp_avg_sq"] = args["exp_avg"]
    with pytest.raises(ValueError, match="exp_avg and exp_avg_sq share memory"):
        _call(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_rejected():
    args = _ok_args()
    args["grads"] = args["grads"].cuda()
    with pytest.raises(ValueError, match="grads must be on the CPU"):
        _call(**args)
