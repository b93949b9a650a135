"""The pipeline schedules as instruction lists, checked without processes: activations in
flight, forward before backward, sends matching receives, and a simulated run in which sends
do not block and receives do (the engine's contract) completes on every stage."""
from __future__ import annotations

import pytest

from zero.pipe import schedule as S
from zero.pipe.partition import partition_balanced, partition_layers, partition_uniform

SHAPES = [(p, m) for p in (1, 2, 3, 4) for m in (1, 2, 3, 4, 8)]


def stages(kind, p, m):
    return [S.train_schedule(kind, m, p, s) for s in range(p)]


@pytest.mark.parametrize("p,m", SHAPES)
def test_1f1b_holds_at_most_stages_minus_stage_id(p, m):
    for s, steps in enumerate(stages("1f1b", p, m)):
        assert S.peak_in_flight(steps) == min(p - s, m)


@pytest.mark.parametrize("p,m", SHAPES)
def test_gpipe_holds_every_micro_batch(p, m):
    for steps in stages("gpipe", p, m):
        assert S.peak_in_flight(steps) == m


@pytest.mark.parametrize("kind", S.SCHEDULES)
@pytest.mark.parametrize("p,m", SHAPES)
def test_every_forward_before_its_backward_once_each(kind, p, m):
    for steps in stages(kind, p, m):
        forwards = [i.micro_batch for i in steps if isinstance(i, S.ForwardPass)]
        backwards = [i.micro_batch for i in steps if isinstance(i, S.BackwardPass)]
        assert sorted(forwards) == sorted(backwards) == list(range(m))
        position = {(type(i), i.micro_batch): n for n, i in enumerate(steps)}
        for mb in range(m):
            assert position[S.ForwardPass, mb] < position[S.BackwardPass, mb]
        assert [i.name for i in steps[-3:]] == ["ReduceTiedGrads", "ReduceGrads",
                                                "OptimizerStep"]


@pytest.mark.parametrize("kind", S.SCHEDULES)
@pytest.mark.parametrize("p,m", SHAPES)
def test_sends_match_receives_between_neighbours(kind, p, m):
    lists = stages(kind, p, m)
    for s in range(p - 1):
        sent = [i.micro_batch for i in lists[s] if isinstance(i, S.SendActivation)]
        received = [i.micro_batch for i in lists[s + 1] if isinstance(i, S.RecvActivation)]
        assert sent == received == list(range(m))
        grads_sent = [i.micro_batch for i in lists[s + 1] if isinstance(i, S.SendGrad)]
        grads_received = [i.micro_batch for i in lists[s] if isinstance(i, S.RecvGrad)]
        assert grads_sent == grads_received and sorted(grads_sent) == list(range(m))
    assert not any(isinstance(i, (S.RecvActivation, S.SendGrad)) for i in lists[0])
    assert not any(isinstance(i, (S.SendActivation, S.RecvGrad)) for i in lists[-1])


def simulate(lists):
    """Runs the stages' lists together: sends enqueue, receives wait for the message.
    Returns the number of rounds; raises on a deadlock or a mismatched message."""
    p = len(lists)
    cursor = [0] * p
    channels: dict[tuple[int, int, str], list[int]] = {}
    rounds = 0
    while any(cursor[s] < len(lists[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while cursor[s] < len(lists[s]):
                step = lists[s][cursor[s]]
                if isinstance(step, S.SendActivation):
                    channels.setdefault((s, s + 1, "act"), []).append(step.micro_batch)
                elif isinstance(step, S.SendGrad):
                    channels.setdefault((s, s - 1, "grad"), []).append(step.micro_batch)
                elif isinstance(step, (S.RecvActivation, S.RecvGrad)):
                    key = (s - 1, s, "act") if isinstance(step, S.RecvActivation) \
                        else (s + 1, s, "grad")
                    queue = channels.get(key, [])
                    if not queue:
                        break  # blocked
                    assert queue.pop(0) == step.micro_batch, (s, step)
                cursor[s] += 1
                progressed = True
        rounds += 1
        if not progressed:
            raise AssertionError(f"deadlock at {[lists[s][cursor[s]] for s in range(p) if cursor[s] < len(lists[s])]}")
    assert all(not queue for queue in channels.values())
    return rounds


@pytest.mark.parametrize("kind", S.SCHEDULES)
@pytest.mark.parametrize("p,m", SHAPES)
def test_schedules_complete_with_nonblocking_sends(kind, p, m):
    simulate(stages(kind, p, m))


def test_eval_schedule_is_forward_only():
    lists = [S.eval_schedule(3, 2, s) for s in range(2)]
    assert not any(isinstance(i, S.BackwardPass) for steps in lists for i in steps)
    simulate(lists)


def test_unknown_schedule_named():
    with pytest.raises(ValueError, match="'zb'.*1f1b"):
        S.train_schedule("zb", 2, 2, 0)


def test_partition_uniform_like_deepspeed():
    assert partition_uniform(7, 3) == [0, 3, 5, 7]
    assert partition_uniform(6, 2) == [0, 3, 6]
    assert partition_uniform(2, 4) == [0, 1, 2, 2, 2]


def test_partition_balanced_minimises_the_heaviest_stage():
    assert partition_balanced([1, 1, 1, 1, 4], 2) == [0, 4, 5]
    assert partition_balanced([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]
    assert partition_balanced([5, 0, 0, 0], 2) == [0, 3, 4]  # every stage keeps a layer


def test_partition_by_type_regex():
    names = ["Embedding", "Block", "Block", "Block", "Block", "Head"]
    assert partition_layers("type:block", [0] * 6, names, 2) == [0, 3, 6]
    assert partition_layers("type:^Head$", [0] * 6, names, 2) == [0, 5, 6]
    with pytest.raises(NotImplementedError, match="'best'"):
        partition_layers("best", [0] * 6, names, 2)
