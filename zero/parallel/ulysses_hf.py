"""Ulysses for Hugging Face models (DeepSpeed's ALST: `UlyssesSPAttentionHF`,
`UlyssesSPDataLoaderAdapter`), which the Trainer and Accelerate use with
`ParallelismConfig(sp_backend="deepspeed", sp_size=s)`.

`UlyssesAttention` stands in for a transformers attention function (`sdpa`, ...): it receives
this rank's piece of the sequence for every head in HF's layout [batch, heads, seq, dim],
trades it for the whole sequence and 1/s of the heads (ulysses.py's exchange), calls the real
function, and trades back. The position ids are gathered over the group so the real function
sees whole sequences; the attention mask HF built for the piece is dropped (causality comes
from the whole sequence, as in DeepSpeed). With fewer key/value heads than ranks, each is
repeated so every rank holds one.

`install` puts it in transformers' attention table under the model's own implementation name,
so every branch transformers takes on that name still runs (DeepSpeed does the same);
`check` refuses what cannot work before any group is made.

`SequenceShardingLoader` wraps a script's DataLoader: the ranks of a group gather their
batches, and each batch in turn is cut along the sequence, every rank taking its piece, with
`shift_labels` (the labels shifted before the cut) in place of `labels`.
"""
from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist
from torch import nn

from .ulysses import exchange

IGNORE_INDEX = -100  # the labels' "no loss here"
REFUSED_ATTENTION = {
    "eager": "it needs the whole 4-d attention mask (O(n^2) memory)",
    "paged|eager": "it needs the whole 4-d attention mask (O(n^2) memory)",
    "flex_attention": "its BlockMask would have to be rebuilt for the whole sequence (not built)",
}


class UlyssesAttention(nn.Module):
    """DeepSpeed's UlyssesSPAttentionHF (its constructor arguments): `attn` is the real
    transformers attention function; `process_group` the sequence group."""

    def __init__(self, attn, batch_size: int, attn_head_count: int, attn_head_size: int,
                 kv_head_count: int, num_hidden_layers: int, process_group,
                 seq_length_is_variable: bool = False, local_seq_length: int | None = None,
                 global_seq_length: int | None = None, disable_in_eval: bool = False):
        super().__init__()
        self.attn, self.process_group = attn, process_group
        self.world_size = dist.get_world_size(process_group)
        self.sp_rank = dist.get_rank(process_group)
        self.batch_size, self.disable_in_eval = batch_size, disable_in_eval
        self.seq_length_is_variable = seq_length_is_variable
        self.local_seq_length, self.global_seq_length = local_seq_length, global_seq_length
        self.attn_head_count, self.attn_head_size = attn_head_count, attn_head_size
        self.global_kv_head_count, self.num_hidden_layers = kv_head_count, num_hidden_layers
        self.core_attn_implementation = None  # set by install()
        check_heads(attn_head_count, kv_head_count, self.world_size)
        self.kv_replication_factor = max(1, self.world_size // kv_head_count)

    def forward(self, module: nn.Module, query, key, value, attention_mask, *args, **kwargs):
        if not module.training and self.disable_in_eval:
            return self.attn(module, query, key, value, attention_mask, *args, **kwargs)
        if "position_ids" not in kwargs or kwargs["position_ids"] is None:
            raise ValueError(
                "zero: Ulysses needs position_ids in every forward() so that each token keeps "
                "its place in the whole sequence (torch.arange(seq_len) per sample, or "
                "restarting at document boundaries for packed ones); UlyssesSPDataLoaderAdapter "
                "passes the batch's own")
        if not self.seq_length_is_variable and query.shape[2] != self.local_seq_length:
            raise ValueError(f"zero: this rank's piece has {query.shape[2]} tokens but Ulysses "
                             f"was registered for a fixed {self.local_seq_length} "
                             "(seq_length_is_variable=False)")
        kwargs["position_ids"] = self._whole(kwargs["position_ids"])
        if self.kv_replication_factor > 1:  # every rank needs a key/value head of its own
            key, value = (t.repeat_interleave(self.kv_replication_factor, dim=1)
                          for t in (key, value))
        q, k, v = (self._heads_for_sequence(t) for t in (query, key, value))
        groups = getattr(module, "num_key_value_groups", None)
        if groups is not None:  # the local heads' ratio, for this call only
            module.num_key_value_groups = q.shape[1] // k.shape[1]
        try:
            context, weights = self.attn(module, q, k, v, None, *args, **kwargs)
        finally:
            if groups is not None:
                module.num_key_value_groups = groups
        # [batch, whole seq, local heads, dim] -> [batch, piece, heads * dim]
        mine = exchange(context, self.process_group, heads_out=False)
        return mine.reshape(*mine.shape[:2], -1), weights

    def _heads_for_sequence(self, tensor):
        """[batch, heads, piece, dim] -> [batch, heads / s, whole seq, dim]."""
        whole = exchange(tensor.transpose(1, 2), self.process_group, heads_out=True)
        return whole.transpose(1, 2).contiguous()

    def _whole(self, position_ids):
        pieces = [torch.empty_like(position_ids) for _ in range(self.world_size)]
        dist.all_gather(pieces, position_ids.contiguous(), group=self.process_group)
        return torch.cat(pieces, dim=1)


def check(model_or_name, core_attn_implementation: str, size: int, seq_length: int | None,
          seq_length_is_variable: bool):
    """Everything `install` needs, checked before any group exists (DeepSpeed's checks, and
    the heads against `size`): the model's text config."""
    from transformers import AutoConfig
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if not seq_length_is_variable and seq_length is None:
        raise ValueError("Either `seq_length_is_variable` needs to be `True` or `seq_length` "
                         "needs to be set to an integer value of the fixed batch size length.")
    loaded = hasattr(model_or_name, "config")
    config = model_or_name.config if loaded else AutoConfig.from_pretrained(model_or_name)
    active = getattr(config, "_attn_implementation", None) if loaded else None
    if active is not None and active != core_attn_implementation:
        raise ValueError(f"core_attn_implementation='{core_attn_implementation}' does not match "
                         f"model config attn_implementation='{active}'. Set both to the same "
                         "value so sequence-parallel wrapper can intercept the active attention "
                         "path.")
    if core_attn_implementation in REFUSED_ATTENTION:
        raise ValueError(f"zero: Ulysses with attn_implementation '{core_attn_implementation}' "
                         f"is not built: {REFUSED_ATTENTION[core_attn_implementation]}; use "
                         "'sdpa' or a flash attention")
    if core_attn_implementation not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(f"{core_attn_implementation} is not a valid attn_implementation. The "
                         f"choices are {ALL_ATTENTION_FUNCTIONS.valid_keys()}")
    text = config.get_text_config()
    check_heads(*head_counts(text), size)
    return text


def head_counts(text_config) -> tuple[int, int]:
    """(query heads, key/value heads) of a transformers text config (no key/value count:
    one per query head)."""
    heads = text_config.num_attention_heads
    return heads, getattr(text_config, "num_key_value_heads", None) or heads


def check_heads(heads: int, kv_heads: int, size: int) -> None:
    """Each rank takes heads / size query heads, and kv_heads / size key/value heads or a copy
    of one (DeepSpeed's rule)."""
    if heads % size:
        raise ValueError(f"Attention head count {heads} is not divisible by SP size {size}: "
                         f"use a sequence_parallel_size that divides {heads}")
    if kv_heads % size and size % kv_heads:
        raise ValueError(f"KV attention head count {kv_heads} is not divisible by SP size "
                         f"{size} or vice versa")


def install(text_config, core_attn_implementation: str, group, micro_batch_size: int,
            seq_length: int | None, seq_length_is_variable: bool, disable_in_eval: bool,
            cls=UlyssesAttention) -> UlyssesAttention:
    """Puts a `cls` over `group` in transformers' attention table under
    `core_attn_implementation`, sized from `text_config` (what `check` returned)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    size = dist.get_world_size(group)
    heads, kv_heads = head_counts(text_config)
    attention = cls(
        attn=ALL_ATTENTION_FUNCTIONS[core_attn_implementation], batch_size=micro_batch_size,
        attn_head_count=heads,
        attn_head_size=getattr(text_config, "head_dim", None) or text_config.hidden_size // heads,
        kv_head_count=kv_heads,
        num_hidden_layers=text_config.num_hidden_layers, process_group=group,
        seq_length_is_variable=seq_length_is_variable,
        local_seq_length=None if seq_length_is_variable else seq_length // size,
        global_seq_length=None if seq_length_is_variable else seq_length,
        disable_in_eval=disable_in_eval)
    attention.core_attn_implementation = core_attn_implementation

    def ulysses(module, query, key, value, attention_mask, *args, **kwargs):
        return attention(module, query, key, value, attention_mask, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS[core_attn_implementation] = ulysses
    return attention


class SequenceShardingLoader:
    """DeepSpeed's UlyssesSPDataLoaderAdapter (its arguments): each of the s ranks of the
    group reads its own batch from `dl`; the group gathers them, and the next s iterations
    give every rank its piece of batch 0, 1, ... s - 1 in turn (s times as many iterations as
    `dl`). Tensors are cut along dim 1; other values are copied. Batches need `input_ids`,
    `position_ids` and `labels`; `labels` becomes `shift_labels` (shifted before the cut, the
    last token ignored). The pieces stay in host memory, as DeepSpeed keeps them."""

    def __init__(self, dl, sp_rank: int, sp_group, sp_world_size: int, device):
        self.dl, self.sp_rank, self.sp_group = dl, sp_rank, sp_group
        self.sp_world_size, self.device = sp_world_size, device
        self.iter = iter(dl)
        self.micro_batches: deque = deque()

    def __len__(self):
        return len(self.dl) * self.sp_world_size

    def __iter__(self):
        return self

    def __next__(self):
        if not self.micro_batches:
            self.refill()
        return self.micro_batches.popleft()

    def refill(self) -> None:
        try:
            batch = next(self.iter)
        except StopIteration:
            self.iter = iter(self.dl)  # the next epoch starts over
            raise
        for name in ("input_ids", "position_ids", "labels"):
            if name not in batch:
                raise ValueError(f"zero: Ulysses needs `{name}` in every DataLoader batch (got "
                                 f"{sorted(batch)}); position_ids keep each token's place in "
                                 "the whole sequence: torch.arange(seq_len) per sample")
        for batch in self._gathered(batch):
            self.micro_batches.append(self._piece(batch))

    def _gathered(self, batch: dict) -> list[dict]:
        """Every rank's batch of the group, in rank order."""
        length = batch["input_ids"].shape[1]
        lengths = [torch.zeros(1, dtype=torch.int64, device=self.device)
                   for _ in range(self.sp_world_size)]
        dist.all_gather(lengths, torch.tensor([length], device=self.device), group=self.sp_group)
        lengths = [int(x.item()) for x in lengths]
        gathered = [{} for _ in range(self.sp_world_size)]
        for name, value in batch.items():
            if torch.is_tensor(value):
                value = value.to(self.device)
                if value.shape[1] != length:
                    raise ValueError(f"{name}'s shape {tuple(value.shape)} must match "
                                     f"input_ids's shape {tuple(batch['input_ids'].shape)}")
                pieces = [torch.zeros((value.shape[0], n, *value.shape[2:]), dtype=value.dtype,
                                      device=value.device) for n in lengths]
                dist.all_gather(pieces, value.contiguous(), group=self.sp_group)
            else:
                pieces = [None] * self.sp_world_size
                dist.all_gather_object(pieces, value, group=self.sp_group)
            for rank, piece in enumerate(pieces):
                gathered[rank][name] = piece
        return gathered

    def _piece(self, batch: dict) -> dict:
        length = batch["input_ids"].shape[1]
        if length % self.sp_world_size:
            raise ValueError(f"batch's seqlen={length} isn't divisible by "
                             f"sp-size={self.sp_world_size}: pad the sequences to a multiple of "
                             f"{self.sp_world_size}")
        labels = batch.pop("labels")
        batch["shift_labels"] = nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        chunk = length // self.sp_world_size
        mine = slice(chunk * self.sp_rank, chunk * (self.sp_rank + 1))
        return {name: value[:, mine].contiguous().cpu() if torch.is_tensor(value) else value
                for name, value in batch.items()}
