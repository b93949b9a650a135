"""checkpoint_pieces.py: this rank's shard cut from a checkpoint's pieces reads only its own
elements, and equals the shard cut from the whole values, for any layout."""
import pytest
import torch

from zero import _C
from zero.checkpoint_pieces import Flat, Located, shard_from, split_over_ranks


class CountingFlat(Flat):
    """A Flat that counts the elements copied out of it."""
    read_numel = 0

    def read(self, start, stop):
        views = super().read(start, stop)
        CountingFlat.read_numel += sum(v.numel() for v in views)
        return views


def _reference_shard(layout, rank, values, wanted):
    """The shard from the whole values: the full buffer, then this rank's piece of each unit."""
    full = torch.zeros(layout.full_numel)
    for i, name in enumerate(wanted):
        offset = layout.param_offset(i)
        full[offset:offset + values[name].numel()] = values[name].reshape(-1)
    pieces = []
    for u in range(layout.unit_count):
        numel = layout.unit(u).shard_numel
        begin = layout.full_offset(u) + (rank % layout.world_size) * numel
        pieces.append(full[begin:begin + numel])
    return torch.cat(pieces)


SHAPES = [[7, 3], [5], [1], [11, 2], [0], [13], [4, 4], [3]]


@pytest.mark.parametrize("world,unit_numel", [(1, 10**6), (2, 17), (3, 8), (4, 40)])
def test_the_shard_from_pieces_is_the_shard_from_whole_values(world, unit_numel):
    torch.manual_seed(world)
    values = {f"p{i}": torch.randn(shape) for i, shape in enumerate(SHAPES)}
    wanted = list(values)
    layout = _C.ShardedLayout(SHAPES, "float32", world, 2, unit_numel)
    # saved as one flat buffer cut into 3 files' pieces of unequal length
    flat = torch.cat([v.reshape(-1) for v in values.values()])
    flats = CountingFlat([flat[:10], flat[10:11], flat[11:]])
    located, offset = {}, 0
    for name, value in values.items():
        located[name] = Located(value.shape, [(flats, offset, value.numel())])
        offset += value.numel()
    for rank in range(world):
        CountingFlat.read_numel = 0
        shard = shard_from(layout, rank, located, wanted)
        assert torch.equal(shard, _reference_shard(layout, rank, values, wanted))
        assert CountingFlat.read_numel <= shard.numel()  # only this rank's own elements


def test_a_parameter_deepspeeds_stage_3_split_reads_back_whole():
    value = torch.arange(10.0)
    padded = torch.cat([value, torch.zeros(2)])  # pieces of ceil(10 / 3) = 4, the last padded
    ranks = [Flat([padded[r * 4:r * 4 + 4]]) for r in range(3)]
    located = split_over_ranks([2, 5], ranks, 0)
    assert torch.equal(located.whole(), value.view(2, 5))
    assert [count for _, _, count in located.runs] == [4, 4, 2]


def test_runs_that_do_not_cover_the_shape_are_refused():
    with pytest.raises(ValueError, match="runs of 3 elements for a parameter of shape"):
        Located([2, 2], [(Flat([torch.zeros(3)]), 0, 3)])
