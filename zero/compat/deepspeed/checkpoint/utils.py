"""`deepspeed.checkpoint.utils.clone_tensors_for_torch_save`, which Accelerate applies to the
state dict of every stage-0/1/2 model it saves (on every rank: the Hugging Face Trainer's
save_model)."""
from __future__ import annotations

import torch

from zero.moe import ep_checkpoint


def clone_tensors_for_torch_save(item, device=torch.device("cpu")):
    """A copy of `item` (a tensor, or lists, tuples and dicts of them) whose tensors are
    detached, compact clones on `device`, so torch.save writes no views of larger storage.
    A module's state dict holding AutoEP experts (this rank's rows) comes back whole, which
    takes every rank's call (zero.moe.ep_checkpoint.whole_rows); DeepSpeed's writes each
    rank's rows."""
    if isinstance(item, dict):
        item = ep_checkpoint.whole_rows(item)
    if torch.is_tensor(item):
        return item.detach().clone().to(device)
    if isinstance(item, (list, tuple)):
        return type(item)(clone_tensors_for_torch_save(value, device) for value in item)
    if isinstance(item, dict):
        return type(item)((key, clone_tensors_for_torch_save(value, device))
                          for key, value in item.items())
    return item


__all__ = ["clone_tensors_for_torch_save"]
