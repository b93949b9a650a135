"""The distributed harness itself: results come back in rank order, and every way a rank can
fail ends the run promptly with that rank named."""
import os
import time

import pytest
import torch.distributed as dist

from distributed_harness import RankFailed, run_distributed


def _rank_and_sum(rank, world_size):
    import torch
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return rank, world_size, t.item()


def _raise_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()  # rank 0 would wait forever for rank 1


def _die_on_rank_one(rank, world_size):
    if rank == 1:
        os._exit(7)
    dist.barrier()


def _die_on_rank_one_then_raise_on_rank_zero(rank, world_size):
    """Rank 0's error reaches the harness after it saw rank 1 dead (its queue poll is 0.2 s)."""
    if rank == 1:
        os._exit(7)
    time.sleep(0.6)
    raise RuntimeError("a peer's collective failed")


def _last_group_made_late_on_rank_one(rank, world_size):
    """Rank 0 returns at once; rank 1 then sets up a group through the store rank 0 serves."""
    if rank == 1:
        time.sleep(1)
        dist.new_group([1], use_local_synchronization=True)
    return rank


def _sleep_forever(rank, world_size):
    time.sleep(3600)


def test_results_come_back_in_rank_order():
    assert run_distributed(_rank_and_sum, 3, timeout=60) == [(0, 3, 3.0), (1, 3, 3.0), (2, 3, 3.0)]


def test_rank_0_keeps_the_store_until_every_rank_has_finished():
    assert run_distributed(_last_group_made_late_on_rank_one, 2, timeout=60) == [0, 1]


def test_a_raising_rank_fails_the_run_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"(?s)rank 1 of 2 raised:.*ValueError: boom on purpose"):
        run_distributed(_raise_on_rank_one, 2, timeout=60)
    assert time.monotonic() - start < 30


def test_a_rank_that_dies_silently_is_named_with_its_exit_code():
    with pytest.raises(RankFailed, match="rank 1 died with exit code 7"):
        run_distributed(_die_on_rank_one, 2, timeout=60)


def test_a_silent_death_is_named_before_the_error_it_caused_on_a_peer():
    with pytest.raises(RankFailed, match=r"(?s)rank 1 died with exit code 7.*rank 0 of 2 raised"):
        run_distributed(_die_on_rank_one_then_raise_on_rank_zero, 2, timeout=60)


def test_a_hanging_run_times_out_naming_the_ranks():
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"timed out after 3s; ranks \[0, 1\] of 2"):
        run_distributed(_sleep_forever, 2, timeout=3)
    assert time.monotonic() - start < 20
