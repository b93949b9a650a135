"""Where each parameter's elements lie in a checkpoint's files, and this rank's new shard cut
from them reading only its own elements.

A saved array (the fp32 master, or an optimizer-state array laid out like it, in zero's rank
files or DeepSpeed's) is a set of flat tensors memory-mapped from the files: nothing is read
until a slice of them is copied. `Flat` strings pieces of them end to end; one parameter is
one or more runs of consecutive elements in Flats (`Located`). `shard_from` builds this rank's
shard of an engine group (csrc/core/sharded_layout.h: for each unit, this rank's piece of the
unit's slice of the full buffer) by copying, for each parameter overlapping that piece, only
the overlapping elements. So a rank holds about the checkpoint over the new world size,
whatever world size, stage or library the checkpoint was saved with (the files' checksums are
still read whole, checkpoint_files.verify).
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

import torch


class Flat:
    """Tensors end to end as one flat array; `read` returns views, copying nothing."""

    def __init__(self, pieces: Sequence[torch.Tensor]):
        self.pieces = [piece.reshape(-1) for piece in pieces]
        self.starts = list(itertools.accumulate((p.numel() for p in self.pieces), initial=0))

    @property
    def numel(self) -> int:
        return self.starts[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.pieces[0].dtype

    def located(self, shape, offset: int) -> "Located":
        """The parameter of `shape` whose elements are this array's from `offset` on; a
        ValueError when they would run past its end."""
        numel = math.prod(shape)
        if offset + numel > self.numel:
            raise ValueError(f"a parameter of shape {tuple(shape)} at element {offset} runs "
                             f"past the end of its flat array of {self.numel} elements")
        return Located(shape, [(self, offset, numel)], self.dtype)

    def read(self, start: int, stop: int) -> list[torch.Tensor]:
        """Views of the elements [start, stop), one per piece they cross."""
        if stop > self.numel:
            raise IndexError(f"elements up to {stop} of a flat array of {self.numel}")
        views = []
        i = bisect.bisect_right(self.starts, start) - 1
        while start < stop:
            local = start - self.starts[i]
            take = min(stop - start, self.pieces[i].numel() - local)
            views.append(self.pieces[i][local:local + take])
            start += take
            i += 1
        return views


class Located:
    """One parameter of shape `shape` and `dtype`: its elements, flattened, are the runs
    (flat, offset, count) end to end (none for a parameter of no elements)."""

    def __init__(self, shape, runs: list[tuple[Flat, int, int]], dtype: torch.dtype):
        self.shape, self.runs, self.dtype = torch.Size(shape), runs, dtype
        if sum(count for _, _, count in runs) != self.shape.numel():
            raise ValueError(f"runs of {sum(c for _, _, c in runs)} elements for a parameter "
                             f"of shape {tuple(self.shape)}")

    @classmethod
    def of(cls, value: torch.Tensor) -> "Located":
        """A whole value held in memory."""
        return cls(value.shape, [(Flat([value]), 0, value.numel())], value.dtype)

    def part(self, start: int, stop: int, shape) -> "Located":
        """The flattened elements [start, stop) as a value of `shape` (rows of a stacked
        parameter)."""
        runs, at = [], 0
        for flat, offset, count in self.runs:
            low, high = max(start, at), min(stop, at + count)
            if low < high:
                runs.append((flat, offset + low - at, high - low))
            at += count
        return Located(shape, runs, self.dtype)

    def followed_by(self, rows: "Located") -> "Located":
        """This value and `rows` after it along dim 0 (another rank's rows of a stacked
        parameter)."""
        return Located((self.shape[0] + rows.shape[0], *self.shape[1:]), self.runs + rows.runs,
                       self.dtype)

    def read(self, start: int, stop: int) -> list[torch.Tensor]:
        """Views of the flattened elements [start, stop)."""
        views, at = [], 0
        for flat, offset, count in self.runs:
            low, high = max(start, at), min(stop, at + count)
            if low < high:
                views += flat.read(offset + low - at, offset + high - at)
            at += count
        return views

    def whole(self) -> torch.Tensor:
        """The parameter's value, read (a copy)."""
        value = torch.empty(self.shape.numel(), dtype=self.dtype)
        at = 0
        for view in self.read(0, self.shape.numel()):
            value[at:at + view.numel()] = view
            at += view.numel()
        return value.view(self.shape)


class RankPieces:
    """Where the elements of an engine group's full buffer lie in one rank's shard of it
    (`layout`, csrc/core/sharded_layout.h: for each unit, this rank's slice of the unit's part
    of the full buffer, the slices end to end)."""

    def __init__(self, layout, rank: int):
        self.numels = [layout.unit(u).shard_numel for u in range(layout.unit_count)]
        slot = rank % layout.world_size
        # ascending: a unit's slices all begin before the next unit's
        self.begins = [layout.full_offset(u) + slot * numel for u, numel in enumerate(self.numels)]
        self.positions = list(itertools.accumulate(self.numels, initial=0))

    @property
    def shard_numel(self) -> int:
        return self.positions[-1]

    def of(self, offset: int, numel: int) -> list[tuple[int, int, int]]:
        """(start, stop, position) for each run of the elements [offset, offset + numel) of
        the full buffer (a parameter's) that this rank holds: its elements [start, stop)
        (counted from `offset`) lie at `position` of the shard."""
        runs = []
        u = max(bisect.bisect_right(self.begins, offset) - 1, 0)
        while u < len(self.begins) and self.begins[u] < offset + numel:
            low = max(self.begins[u], offset)
            high = min(self.begins[u] + self.numels[u], offset + numel)
            if low < high:
                runs.append((low - offset, high - offset, self.positions[u] + low - self.begins[u]))
            u += 1
        return runs


def shard_from(layout, rank: int, values: dict[str, Located], wanted: list[str]) -> torch.Tensor:
    """This rank's shard laid out by `layout` (an engine group's ShardedLayout, its
    parameters `wanted` in order): every parameter's elements this rank holds, read from
    where they lie, and zeros elsewhere (alignment padding)."""
    pieces = RankPieces(layout, rank)
    shard = torch.zeros(pieces.shard_numel, dtype=values[wanted[0]].dtype)
    for i, name in enumerate(wanted):
        value = values[name]
        for start, stop, position in pieces.of(layout.param_offset(i), value.shape.numel()):
            for view in value.read(start, stop):
                shard[position:position + view.numel()] = view
                position += view.numel()
    return shard
