"""LR schedulers: values are checked against closed forms written here from
DeepSpeed's documented arithmetic (and a few literal hand-computed numbers),
never against the implementation's own helpers.

Convention: ``lrs[0]`` is the lr applied at construction (used by the first
optimizer step); ``lrs[i]`` for i >= 1 is the lr after the i-th ``step()``,
i.e. at ``last_batch_iteration = i - 1``.
"""

import math

import pytest
import torch

from zero.schedulers import (OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR, build_scheduler)


class FakeOptimizer:
    """Anything with param_groups must work, not just torch optimizers."""

    def __init__(self, *groups):
        self.param_groups = [dict(g) for g in groups] or [{"lr": 0.5}]


def run(scheduler, optimizer, steps, key="lr", group=0):
    values = [optimizer.param_groups[group][key]]
    for _ in range(steps):
        scheduler.step()
        values.append(optimizer.param_groups[group][key])
    return values


def approx_list(values, rel=1e-12, abs_=1e-15):
    return pytest.approx(values, rel=rel, abs=abs_)


# ----------------------------------------------------------------------------- WarmupLR


def expected_warmup(it, lo, hi, n, kind):
    if it < 0:
        return lo
    if it >= n:
        return hi
    frac = math.log(it + 1) / math.log(n) if kind == "log" else it / n
    return lo + (hi - lo) * frac


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_lr_matches_closed_form(kind):
    opt = FakeOptimizer({"lr": 123.0})
    sched = WarmupLR(opt, warmup_min_lr=0.01, warmup_max_lr=0.1, warmup_num_steps=10, warmup_type=kind)
    got = run(sched, opt, 15)
    want = [expected_warmup(i - 1, 0.01, 0.1, 10, kind) for i in range(16)]
    assert got == approx_list(want)


def test_warmup_lr_hand_values():
    opt = FakeOptimizer()
    log = run(WarmupLR(opt, 0.01, 0.1, 10, "log"), opt, 12)
    # construction and it=0 both give min (log 1 = 0): DeepSpeed's double-min quirk
    assert log[0] == pytest.approx(0.01) and log[1] == pytest.approx(0.01)
    assert log[2] == pytest.approx(0.01 + 0.09 * 0.30102999566398120)  # ln2/ln10
    assert log[10] == pytest.approx(0.1)  # it=9: log reaches max one step early
    assert log[12] == pytest.approx(0.1)
    opt = FakeOptimizer()
    lin = run(WarmupLR(opt, 0.01, 0.1, 10, "linear"), opt, 12)
    assert lin[6] == pytest.approx(0.055)  # it=5
    assert lin[10] == pytest.approx(0.091)  # it=9: linear is still below max
    assert lin[11] == pytest.approx(0.1)  # it=10


def test_warmup_lr_default_max_is_each_groups_lr_and_defaults():
    opt = FakeOptimizer({"lr": 0.3}, {"lr": 0.7})
    sched = WarmupLR(opt)  # min 0, max=each group's own lr, 1000 steps, log
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0]
    sched.step(999)
    assert [g["lr"] for g in opt.param_groups] == approx_list([0.3, 0.7])
    sched.step(499)
    assert opt.param_groups[1]["lr"] == pytest.approx(0.7 * math.log(500) / math.log(1000))


def test_warmup_lr_per_group_lists_and_length_check():
    opt = FakeOptimizer({"lr": 1.0}, {"lr": 1.0})
    sched = WarmupLR(opt, warmup_min_lr=[0.0, 0.1], warmup_max_lr=[1.0, 0.2], warmup_num_steps=4,
                     warmup_type="linear")
    sched.step(2)
    assert [g["lr"] for g in opt.param_groups] == approx_list([0.5, 0.15])
    with pytest.raises(ValueError, match="warmup_max_lr.*2"):
        WarmupLR(opt, warmup_max_lr=[1.0, 2.0, 3.0])


def test_warmup_num_steps_one_is_raised_to_two():
    opt = FakeOptimizer()
    assert run(WarmupLR(opt, 0.0, 1.0, 1, "log"), opt, 3) == approx_list([0.0, 0.0, 1.0, 1.0])


@pytest.mark.parametrize("bad", [0, -5, 10.0, True])
def test_warmup_num_steps_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="warmup_num_steps"):
        WarmupLR(FakeOptimizer(), warmup_num_steps=bad)


@pytest.mark.parametrize("cls_args", [(WarmupLR, ()), (WarmupDecayLR, (100,)), (WarmupCosineLR, (100,))])
def test_unknown_warmup_type_is_rejected(cls_args):
    cls, args = cls_args
    with pytest.raises(ValueError, match=r"warmup_type.*'log'.*'linear'.*'cosine'"):
        cls(FakeOptimizer(), *args, warmup_type="cosine")


# ----------------------------------------------------------------------------- WarmupDecayLR


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_decay_matches_closed_form(kind):
    total, n, lo, hi = 20, 5, 0.02, 1.0

    def expected(it):
        if it < n:
            return expected_warmup(it, lo, hi, n, kind)
        return lo + (hi - lo) * max(0.0, (total - it) / (total - n))

    opt = FakeOptimizer()
    got = run(WarmupDecayLR(opt, total, lo, hi, n, kind), opt, 26)
    assert got == approx_list([expected(i - 1) for i in range(27)])


def test_warmup_decay_hand_values():
    opt = FakeOptimizer()
    lrs = run(WarmupDecayLR(opt, total_num_steps=20, warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=5,
                            warmup_type="linear"), opt, 25)
    assert lrs[5] == pytest.approx(0.8)  # it=4, end of warmup
    assert lrs[6] == pytest.approx(1.0)  # it=5: decay starts at the peak
    assert lrs[11] == pytest.approx(10 / 15)  # it=10
    assert lrs[21] == pytest.approx(0.0)  # it=20 = total_num_steps
    assert lrs[25] == 0.0  # clamped past the end


def test_warmup_decay_default_max_lr_is_0_001():
    opt = FakeOptimizer({"lr": 5.0})
    sched = WarmupDecayLR(opt, total_num_steps=3000)
    sched.step(1000)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.001)


# ----------------------------------------------------------------------------- WarmupCosineLR


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_cosine_matches_closed_form(kind):
    base, total, n, wmin, cmin = 0.5, 12, 4, 0.1, 0.01

    def expected(it):
        if it < 0:
            return 0.0
        if it < n:
            frac = math.log(it + 1) / math.log(n) if kind == "log" else it / n
            return base * (wmin + (1 - wmin) * frac)
        progress = min(1.0, (it - n + 1) / (total - n))
        return base * (cmin + (1 - cmin) * 0.5 * (1 + math.cos(math.pi * progress)))

    opt = FakeOptimizer({"lr": base})
    got = run(WarmupCosineLR(opt, total, wmin, n, cmin, kind), opt, 18)
    assert got == approx_list([expected(i - 1) for i in range(19)])


def test_warmup_cosine_endpoints_and_midpoint():
    opt = FakeOptimizer({"lr": 0.5})
    lrs = run(WarmupCosineLR(opt, total_num_steps=12, warmup_min_ratio=0.1, warmup_num_steps=4,
                             cos_min_ratio=0.01, warmup_type="linear"), opt, 16)
    assert lrs[0] == 0.0  # DeepSpeed applies 0, not warmup_min_ratio, at construction
    assert lrs[1] == pytest.approx(0.05)  # it=0: warmup_min_ratio * lr
    assert lrs[3] == pytest.approx(0.275)  # it=2: ratio 0.1 + 0.9 * 2/4
    assert lrs[8] == pytest.approx(0.2525)  # it=7: cosine midpoint, ratio (1 + 0.01) / 2
    assert lrs[12] == pytest.approx(0.005)  # it=11 = total-1: cos_min_ratio reached
    assert lrs[16] == pytest.approx(0.005)  # stays there past the end (no oscillation)


def test_warmup_cosine_uses_each_groups_own_lr():
    opt = FakeOptimizer({"lr": 1.0}, {"lr": 0.1})
    sched = WarmupCosineLR(opt, total_num_steps=10, warmup_num_steps=2, warmup_type="linear")
    sched.step(1)  # ratio 0.5
    assert [g["lr"] for g in opt.param_groups] == approx_list([0.5, 0.05])


def test_warmup_cosine_total_not_above_warmup_does_not_divide_by_zero():
    opt = FakeOptimizer({"lr": 1.0})
    sched = WarmupCosineLR(opt, total_num_steps=4, warmup_num_steps=4, cos_min_ratio=0.25)
    sched.step(4)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25)


# ----------------------------------------------------------------------------- OneCycle


def onecycle_expected(it, min_lr=0.1, max_lr=1.0, first=4, second=6, min_mom=0.8, max_mom=0.9,
                      decay_step=2, lr_rate=0.5, mom_rate=0.1):
    """(lr, momentum) after step() left last_batch_iteration at ``it``."""
    total = first + second
    p = it + 1  # DeepSpeed evaluates the triangle one position ahead
    if it < total:
        s = p / first if p <= first else (total - p) / second
        return min_lr + (max_lr - min_lr) * s, max_mom - (max_mom - min_mom) * s
    k = it - total + 1
    return min_lr / (1 + lr_rate * k / decay_step), max_mom * (1 + mom_rate * k / decay_step)


def make_onecycle(opt, **overrides):
    kwargs = dict(cycle_min_lr=0.1, cycle_max_lr=1.0, decay_lr_rate=0.5, cycle_first_step_size=4,
                  cycle_second_step_size=6, decay_step_size=2, cycle_min_mom=0.8, cycle_max_mom=0.9,
                  decay_mom_rate=0.1)
    kwargs.update(overrides)
    return OneCycle(opt, **kwargs)


def test_onecycle_lr_and_momentum_match_closed_form():
    opt = FakeOptimizer({"lr": 9.0, "betas": (0.5, 0.999)})
    sched = make_onecycle(opt)
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["betas"] == (0.8, 0.99)
    for it in range(20):
        sched.step()
        lr, mom = onecycle_expected(it)
        assert opt.param_groups[0]["lr"] == pytest.approx(lr), it
        beta1, beta2 = opt.param_groups[0]["betas"]
        assert beta1 == pytest.approx(mom), it
        assert beta2 == 0.99  # DeepSpeed overwrites beta2


def test_onecycle_phase_hand_values():
    opt = FakeOptimizer({"lr": 0.0, "betas": (0.9, 0.999)})
    sched = make_onecycle(opt)
    lrs = run(sched, opt, 14)
    assert lrs[1] == pytest.approx(0.325)  # it=0: a quarter up the first half
    assert lrs[4] == pytest.approx(1.0)  # it=3: peak
    assert lrs[7] == pytest.approx(0.55)  # it=6: half way down the second half
    assert lrs[10] == pytest.approx(0.1)  # it=9: back at min, end of cycle
    assert lrs[11] == pytest.approx(0.08)  # it=10: decay k=1 -> 0.1 / 1.25
    assert lrs[14] == pytest.approx(0.05)  # it=13: decay k=4 -> 0.1 / 2
    assert sched.get_mom()[0] == pytest.approx(1.08)  # momentum decay grows: 0.9 * 1.2


def test_onecycle_leaves_sgd_momentum_alone_as_deepspeed():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    sched = make_onecycle(opt)
    assert not sched.cycle_momentum
    sched.step()
    sched.step()
    assert opt.param_groups[0]["momentum"] == 0.5
    assert "betas" not in opt.param_groups[0]


def test_onecycle_torch_adam_and_no_decay_holds_endpoints():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1.0)
    sched = make_onecycle(opt, decay_step_size=0)
    lrs = run(sched, opt, 15)
    assert lrs[11:] == approx_list([0.1] * 5)
    assert opt.param_groups[0]["betas"] == (pytest.approx(0.9), 0.99)


def test_onecycle_zero_rates_disable_decay_separately():
    opt = FakeOptimizer({"lr": 1.0, "betas": (0.9, 0.99)})
    sched = make_onecycle(opt, decay_lr_rate=0.0, decay_mom_rate=0.2)
    sched.step(11)  # k = 2
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    assert opt.param_groups[0]["betas"][0] == pytest.approx(0.9 * 1.2)


def test_onecycle_second_step_defaults_to_first_and_stairs_hold_the_lr():
    opt_a = FakeOptimizer({"lr": 0.0, "betas": (0.9, 0.999)})
    opt_b = FakeOptimizer({"lr": 0.0, "betas": (0.9, 0.999)})
    plain = OneCycle(opt_a, 0.0, 1.0, cycle_first_step_size=5)
    stairs = OneCycle(opt_b, 0.0, 1.0, cycle_first_step_size=5, cycle_first_stair_count=2,
                      cycle_second_stair_count=3)
    lrs = run(plain, opt_a, 11)
    assert lrs == approx_list([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 0.8, 0.6, 0.4, 0.2, 0.0, 0.0])
    # floor(position x stairs) / stairs: 2 stairs up, 3 down (DeepSpeed 0.19.8)
    assert run(stairs, opt_b, 11) == approx_list(
        [0.0, 0.0, 0.0, 0.5, 0.5, 1.0, 2 / 3, 1 / 3, 1 / 3, 0.0, 0.0, 0.0])


def test_onecycle_without_momentum_keys_disables_momentum():
    opt = FakeOptimizer({"lr": 1.0})
    sched = make_onecycle(opt)
    sched.step()
    assert sched.get_mom() is None and set(opt.param_groups[0]) == {"lr"}


def test_onecycle_rejects_zero_step_size():
    with pytest.raises(ValueError, match="cycle_first_step_size"):
        OneCycle(FakeOptimizer(), 0.1, 1.0, cycle_first_step_size=0)


# ----------------------------------------------------------------------------- common protocol


def test_step_with_explicit_iteration_and_get_last_lr():
    opt = FakeOptimizer()
    sched = WarmupLR(opt, 0.0, 1.0, 10, "linear")
    assert sched.get_last_lr() == [0.0]
    sched.step(7)
    assert sched.last_batch_iteration == 7
    assert sched.get_last_lr() == [pytest.approx(0.7)]
    sched.step()
    assert sched.get_last_lr() == [pytest.approx(0.8)]


def test_resume_constructor_leaves_groups_untouched():
    opt = FakeOptimizer({"lr": 0.123})
    sched = WarmupLR(opt, 0.0, 1.0, 10, "linear", last_batch_iteration=4)
    assert opt.param_groups[0]["lr"] == 0.123
    with pytest.raises(RuntimeError, match="step"):
        sched.get_last_lr()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)


def test_tensor_lr_stays_a_tensor():
    lr = torch.tensor(1.0, dtype=torch.float64)
    opt = FakeOptimizer({"lr": lr})
    sched = WarmupLR(opt, 0.0, 1.0, 4, "linear")
    sched.step(2)
    new = opt.param_groups[0]["lr"]
    assert isinstance(new, torch.Tensor) and new.dtype == torch.float64 and new.shape == lr.shape
    assert new.item() == pytest.approx(0.5)


FACTORIES = {
    "WarmupLR": lambda o: WarmupLR(o, 0.01, 0.1, 6, "log"),
    "WarmupDecayLR": lambda o: WarmupDecayLR(o, 15, 0.01, 0.1, 6, "linear"),
    "WarmupCosineLR": lambda o: WarmupCosineLR(o, 15, 0.05, 6, 0.01, "log"),
    "OneCycle": lambda o: make_onecycle(o),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_state_dict_round_trip_continues_identically(name):
    opt_a = FakeOptimizer({"lr": 0.5, "betas": (0.9, 0.999)})
    sched_a = FACTORIES[name](opt_a)
    for _ in range(7):
        sched_a.step()
    state = sched_a.state_dict()
    assert state == {"last_batch_iteration": 6}  # DeepSpeed's checkpoint format

    opt_b = FakeOptimizer({"lr": 0.5, "betas": (0.9, 0.999)})
    sched_b = FACTORIES[name](opt_b)
    sched_b.load_state_dict(state)
    assert opt_b.param_groups == approx_param_groups(opt_a.param_groups)
    for _ in range(12):
        sched_a.step()
        sched_b.step()
        assert opt_b.param_groups == approx_param_groups(opt_a.param_groups)
        assert sched_b.get_last_lr() == sched_a.get_last_lr()


def approx_param_groups(groups):
    return [{k: pytest.approx(v) for k, v in g.items()} for g in groups]


# ----------------------------------------------------------------------------- factory


def test_build_scheduler_builds_each_type():
    opt = FakeOptimizer({"lr": 0.5})
    sched = build_scheduler("WarmupDecayLR", {"total_num_steps": 10, "warmup_max_lr": 0.2,
                                              "warmup_num_steps": 2, "warmup_type": "linear"}, opt)
    assert isinstance(sched, WarmupDecayLR) and sched.total_num_steps == 10
    sched.step(2)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    assert isinstance(build_scheduler("WarmupLR", {}, opt), WarmupLR)
    assert isinstance(build_scheduler("WarmupCosineLR", {"total_num_steps": 5}, opt), WarmupCosineLR)
    assert isinstance(build_scheduler("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1}, opt), OneCycle)


def test_build_scheduler_unknown_type_lists_choices():
    with pytest.raises(ValueError) as err:
        build_scheduler("WarmupLr", {}, FakeOptimizer())
    msg = str(err.value)
    assert "'WarmupLr'" in msg
    for valid in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle"):
        assert valid in msg.replace("'WarmupLr'", "")


def test_build_scheduler_unknown_param_names_it_and_valid_ones():
    with pytest.raises(ValueError) as err:
        build_scheduler("WarmupCosineLR", {"total_num_steps": 5, "cos_min_lr": 0.1}, FakeOptimizer())
    msg = str(err.value)
    assert "cos_min_lr" in msg and "cos_min_ratio" in msg and "warmup_min_ratio" in msg


def test_build_scheduler_missing_required_param():
    with pytest.raises(ValueError, match="total_num_steps"):
        build_scheduler("WarmupDecayLR", {"warmup_max_lr": 0.1}, FakeOptimizer())
