"""zero/scheduler_groups.py: a torch scheduler's saved per-group lists laid out as other
optimizer groups (an MoE layout change), nested schedulers' too; other lists left alone."""
import torch

from zero.scheduler_groups import regrouped


def _optimizer(groups: int) -> torch.optim.Optimizer:
    return torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.1 * (g + 1)}
                            for g in range(groups)], lr=0.1, momentum=0.9)


def test_a_sequential_schedulers_inner_states_are_regrouped_and_its_milestones_kept():
    optimizer = _optimizer(2)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=2)
    decay = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    state = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, decay], milestones=[2]) \
        .state_dict()
    moved = regrouped(state, sources=[1, 1, 0], saved_groups=2)
    assert moved["_milestones"] == [2]  # (not per group)
    for inner, before in zip(moved["_schedulers"], state["_schedulers"]):
        assert inner["base_lrs"] == [before["base_lrs"][s] for s in (1, 1, 0)]
        assert inner["_last_lr"] == [before["_last_lr"][s] for s in (1, 1, 0)]
    assert state["_schedulers"][0]["base_lrs"] == [0.1, 0.2]  # the saved state is left as it was


def test_a_cyclic_schedulers_rates_and_momenta_follow_their_groups():
    optimizer = _optimizer(2)
    state = torch.optim.lr_scheduler.CyclicLR(optimizer, base_lr=[0.01, 0.02], max_lr=[1.0, 2.0],
                                              base_momentum=[0.8, 0.7], max_momentum=[0.9, 0.95]
                                              ).state_dict()
    moved = regrouped(state, sources=[1], saved_groups=2)
    for key in ("base_lrs", "max_lrs", "base_momentums", "max_momentums", "_last_lr"):
        assert moved[key] == [state[key][1]], key
    restored = torch.optim.lr_scheduler.CyclicLR(_optimizer(1), base_lr=0.5, max_lr=5.0)
    restored.load_state_dict(moved)
    restored.optimizer.step()
    restored.step()  # (torch zips the lists with the groups, strict)
