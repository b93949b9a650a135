"""An automatic tensor-parallel pass in the manner of DeepSpeed's AutoTP: the linears of
attention and MLP blocks, recognised by their attribute names, become column- and
row-parallel layers over the tensor-parallel group.

A module is converted when its direct children include at least one input-side linear
(column: q/k/v, up/gate, fc1, c_fc, or a fused q/k/v / gate_up projection) and at least one
output-side linear (row: o_proj, out_proj, c_proj, down_proj, fc2, ...): then the pair
computes the block's output with one all-reduce, and the ops between them (attention per
head, the activation) run on the split features unchanged. A module with only one side is
left alone (its output would be split where the model expects it whole).

Head counts and widths the block stores (num_heads, num_key_value_heads, embed_dim,
split_size, ...) are divided by the tensor size, as DeepSpeed's update_mp_params does, so a
forward that reshapes with them sees this rank's heads. Every dimension is checked before
anything changes: a size that does not divide raises TensorParallelSplitError naming the
module, the size and the tensor size, and the model is left as it was. Embeddings and the
output head are not touched (zero.tp.VocabParallelEmbedding splits them by hand).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from . import comm
from .linear import ColumnParallelLinear, RowParallelLinear
from .split import TensorParallelSplitError, check_divisible

COLUMN = frozenset({"q_proj", "k_proj", "v_proj", "query", "key", "value", "up_proj",
                    "gate_proj", "fc1", "c_fc", "w1", "w3", "fc_in", "wi_0", "wi_1"})
FUSED = {"qkv": 3, "c_attn": 3, "qkv_proj": 3, "Wqkv": 3, "gate_up_proj": 2}  # equal blocks
ROW = frozenset({"o_proj", "out_proj", "c_proj", "down_proj", "fc2", "w2", "fc_out", "wo"})
HEADS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "num_key_value_heads",
         "num_kv_heads", "n_kv_heads")
WIDTHS = ("embed_dim", "hidden_size", "all_head_size", "inner_dim", "split_size")


@dataclass(frozen=True)
class _Split:
    """One linear to convert: its parent, attribute name, qualified name and side."""
    parent: nn.Module
    attr: str
    name: str
    column: bool
    fused: int


def _as_linear(module: nn.Module) -> nn.Linear | None:
    """nn.Linear as it is; HF's Conv1D (weight [in, out]) as an equal nn.Linear; else None."""
    if isinstance(module, nn.Linear):
        return module
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        in_features, out_features = module.weight.shape
        linear = nn.Linear(in_features, out_features, bias=module.bias is not None,
                           device="meta")
        linear.weight = nn.Parameter(module.weight.detach().t().contiguous(),
                                     requires_grad=module.weight.requires_grad)
        if module.bias is not None:
            linear.bias = module.bias
        return linear
    return None


def plan(model: nn.Module) -> list[_Split]:
    """The linears auto_tp would convert, block by block (no change to the model)."""
    splits = []
    for parent_name, parent in model.named_modules():
        found = []
        for attr, child in parent.named_children():
            if _as_linear(child) is None or not (attr in COLUMN or attr in FUSED or attr in ROW):
                continue
            name = f"{parent_name}.{attr}" if parent_name else attr
            found.append(_Split(parent, attr, name, attr not in ROW, FUSED.get(attr, 1)))
        if any(s.column for s in found) and any(not s.column for s in found):
            splits.extend(found)
    return splits


def _check(splits: list[_Split], size: int) -> None:
    """Raises TensorParallelSplitError for the first dimension or head count that does not
    divide by `size`, before anything is converted."""
    for split in splits:
        linear = _as_linear(getattr(split.parent, split.attr))
        if split.column:
            if linear.out_features % split.fused:
                raise TensorParallelSplitError(
                    f"zero: {split.name}.out_features = {linear.out_features} is not "
                    f"{split.fused} equal blocks, as a fused {split.attr} must be; rename the "
                    "layer if it is not a fused projection")
            check_divisible(linear.out_features // split.fused, size, f"{split.name}.out_features / {split.fused}"
                            if split.fused > 1 else f"{split.name}.out_features")
        else:
            check_divisible(linear.in_features, size, f"{split.name}.in_features")
    for parent, name in _parents(splits):
        _check_heads(parent, [s for s in splits if s.parent is parent], size)
        for attr in HEADS + WIDTHS:
            value = getattr(parent, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                check_divisible(value, size, f"{name or 'model'}.{attr}")
        kv = [getattr(parent, a) for a in ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
              if isinstance(getattr(parent, a, None), int)]
        heads = [getattr(parent, a) for a in ("num_heads", "n_head", "num_attention_heads")
                 if isinstance(getattr(parent, a, None), int)]
        fused_qkv = [s.name for s in splits if s.parent is parent and s.fused == 3]
        if fused_qkv and kv and heads and kv[0] != heads[0]:
            raise TensorParallelSplitError(
                f"zero: cannot split the fused projection {fused_qkv[0]}: the block has "
                f"{heads[0]} query heads but {kv[0]} key/value heads, so q, k and v are not "
                "equal thirds; unfuse it into q_proj, k_proj and v_proj")


def _check_heads(parent: nn.Module, splits: list[_Split], size: int) -> None:
    """In a block that stores head_dim, each rank must get whole heads: a q/k/v projection's
    (or a fused block's) outputs, and the output projection's inputs, divide by
    size * head_dim. (HF attention often keeps the head counts only in its config.)"""
    head_dim = getattr(parent, "head_dim", None)
    if not isinstance(head_dim, int) or isinstance(head_dim, bool):
        return
    for split in splits:
        linear = _as_linear(getattr(split.parent, split.attr))
        width = linear.out_features // split.fused if split.column else linear.in_features
        if width % (size * head_dim):
            raise TensorParallelSplitError(
                f"zero: cannot split {split.name} over {size} tensor-parallel ranks: its "
                f"{width} {'outputs' if split.column else 'inputs'} are {width // head_dim} "
                f"heads of {head_dim}, and {width // head_dim} heads do not divide by {size}; "
                "choose a tensor_parallel.autotp_size that divides the number of heads (and "
                "of key/value heads)")


def _parents(splits: list[_Split]) -> list[tuple[nn.Module, str]]:
    seen, parents = set(), []
    for split in splits:
        if id(split.parent) not in seen:
            seen.add(id(split.parent))
            parents.append((split.parent, split.name.rpartition(".")[0]))
    return parents


def local_shapes(model: nn.Module, size: int) -> dict[int, tuple[int, ...]]:
    """{id(parameter): the shape of one rank's slice} for every parameter auto_tp(model) over
    `size` tensor ranks would split, without changing the model (the memory estimate's view);
    raises TensorParallelSplitError as auto_tp does."""
    splits = plan(model)
    _check(splits, size)
    shapes = {}
    for split in splits:
        original = getattr(split.parent, split.attr)
        linear = _as_linear(original)
        out_features, in_features = linear.out_features, linear.in_features
        if split.column:
            shapes[id(original.weight)] = (out_features // size, in_features)
            if original.bias is not None:
                shapes[id(original.bias)] = (out_features // size,)
        else:
            shapes[id(original.weight)] = (out_features, in_features // size)
    return shapes


_SPLIT_MARKS = ("tensor_model_parallel", "partition_dim", "partition_fused", "partition_transposed")


def _adopt_parameters(layer: nn.Module, original: nn.Module) -> None:
    """The split layer takes over the original layer's Parameter objects, each now holding
    this rank's slice, as DeepSpeed's AutoTP keeps them: an optimizer or a parameter list a
    script made before initialize() (DeepSpeed's AutoTP example builds its torch optimizer
    first) still holds the parameters that train."""
    for name in ("weight", "bias"):
        made, kept = getattr(layer, name, None), getattr(original, name, None)
        if made is None or kept is None:
            continue
        kept.data = made.data
        for mark in _SPLIT_MARKS:
            if hasattr(made, mark):
                setattr(kept, mark, getattr(made, mark))
        setattr(layer, name, kept)


def auto_tp(model: nn.Module, group) -> list[str]:
    """Converts `model` in place over the tensor-parallel process group `group`; returns the
    qualified names of the linears it split, in model order. Every rank of the group must
    hold the same whole model (same weights): each keeps its own slice. Raises
    TensorParallelSplitError (model unchanged) when a size does not divide."""
    size = comm.group_size(group)
    splits = plan(model)
    _check(splits, size)
    for split in splits:
        linear = _as_linear(getattr(split.parent, split.attr))
        layer = (ColumnParallelLinear.from_linear(linear, group, fused=split.fused,
                                                  name=split.name) if split.column
                 else RowParallelLinear.from_linear(linear, group, name=split.name))
        original = getattr(split.parent, split.attr)
        if linear is not original:  # an HF Conv1D, weight [in, out]
            layer.weight.partition_transposed = True  # checkpoints export it as it was
        layer = layer.to(linear.weight.device)
        _adopt_parameters(layer, original)
        setattr(split.parent, split.attr, layer)
    for parent, _ in _parents(splits):
        for attr in HEADS + WIDTHS:
            value = getattr(parent, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(parent, attr, value // size)
    return [split.name for split in splits]
