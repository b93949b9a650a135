"""checkpoint_pieces.py: this rank's shard cut from a checkpoint's pieces reads only its own
elements, and equals the shard cut from the whole values, for any layout."""
import pytest
import torch

from zero import _C
from zero.checkpoint_pieces import Flat, Located, shard_from


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


SHAPES = [[0], [7, 3], [5], [1], [11, 2], [0], [13], [4, 4], [3]]  # first: no elements


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
        located[name] = flats.located(value.shape, offset)
        offset += value.numel()
        assert torch.equal(located[name].whole(), value)
    for rank in range(world):
        CountingFlat.read_numel = 0
        shard = shard_from(layout, rank, located, wanted)
        assert torch.equal(shard, _reference_shard(layout, rank, values, wanted))
        assert CountingFlat.read_numel <= shard.numel()  # only this rank's own elements


def test_a_parameter_in_runs_over_several_arrays_reads_back_whole():
    value = torch.arange(10.0)
    padded = torch.cat([value, torch.zeros(2)])  # as DeepSpeed's stage 3: pieces of 4
    ranks = [Flat([padded[r * 4:r * 4 + 4]]) for r in range(3)]
    located = Located([2, 5], [(ranks[0], 0, 4), (ranks[1], 0, 4), (ranks[2], 0, 2)],
                      torch.float32)
    assert torch.equal(located.whole(), value.view(2, 5))
    assert [v.numel() for v in located.read(3, 9)] == [1, 4, 1]


def test_a_parameter_past_the_end_of_its_array_is_refused():
    with pytest.raises(ValueError, match=r"shape \(2, 3\) at element 5 runs past the end of "
                                         r"its flat array of 10 elements"):
        Flat([torch.zeros(4), torch.zeros(6)]).located([2, 3], 5)


def test_runs_that_do_not_cover_the_shape_are_refused():
    with pytest.raises(ValueError, match="runs of 3 elements for a parameter of shape"):
        Located([2, 2], [(Flat([torch.zeros(3)]), 0, 3)], torch.float32)
