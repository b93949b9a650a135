"""Where a PipelineModule cuts its layers into stages (DeepSpeed's partition_method).

Every function returns `parts`: num_stages + 1 layer indices, stage s holds layers
parts[s] .. parts[s+1]-1.

  - "uniform": the same number of layers per stage (the first stages take one more when the
    count does not divide), as DeepSpeed's partition_uniform;
  - "parameters": balanced by each layer's trainable parameter count;
  - "type:<regex>": balanced by the count of layers whose class name matches the regex
    (case-insensitive search, as DeepSpeed), e.g. "type:Block".

Balanced means: the heaviest stage is as light as possible; among such cuts, earlier stages
are filled first, and every stage keeps at least one layer when there are enough layers.
"""
from __future__ import annotations

import re


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    parts = [0]
    for p in range(num_parts):
        parts.append(parts[-1] + chunk + (1 if p < residual else 0))
    return parts


def partition_balanced(weights: list[int], num_parts: int) -> list[int]:
    """The cut whose heaviest part is lightest (weights are non-negative integers)."""
    if len(weights) <= num_parts:
        return partition_uniform(len(weights), num_parts)
    low, high = max(weights), sum(weights)
    while low < high:  # the smallest bottleneck a greedy fill achieves
        middle = (low + high) // 2
        if _greedy(weights, num_parts, middle) is not None:
            high = middle
        else:
            low = middle + 1
    return _greedy(weights, num_parts, low)


def _greedy(weights: list[int], num_parts: int, bottleneck: int) -> list[int] | None:
    """Fill each part up to `bottleneck`, leaving at least one item for every later part;
    None when the items do not fit in num_parts parts."""
    parts, start, count = [0], 0, len(weights)
    for p in range(num_parts):
        last_allowed = count - (num_parts - p - 1)  # later parts keep one item each
        end, total = start, 0
        while end < last_allowed and (end == start or total + weights[end] <= bottleneck):
            if total + weights[end] > bottleneck:
                return None
            total += weights[end]
            end += 1
        parts.append(end)
        start = end
    return parts if start == count else None


def layer_weights(method: str, counts: list[int], class_names: list[str]) -> list[int] | None:
    """The weights a method balances (None for "uniform")."""
    lowered = method.lower()
    if lowered == "uniform":
        return None
    if lowered == "parameters":
        return list(counts)
    if lowered.startswith("type:"):
        pattern = re.compile(method[len("type:"):], re.IGNORECASE)
        return [1 if pattern.search(name) else 0 for name in class_names]
    raise NotImplementedError(
        f"zero: partition_method = {method!r} is not built; use \"parameters\", \"uniform\" or "
        "\"type:<regex of layer class names>\"")


def partition_layers(method: str, counts: list[int], class_names: list[str],
                     num_stages: int) -> list[int]:
    """parts for `num_stages` stages of the layers described by their trainable parameter
    counts and class names."""
    weights = layer_weights(method, counts, class_names)
    if weights is None:
        return partition_uniform(len(counts), num_stages)
    return partition_balanced(weights, num_stages)
