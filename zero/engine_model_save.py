"""The whole model out of (and into) an engine: its state dict with whole parameters
(gathered unit by unit at stage 3), DeepSpeed's consolidated 16-bit state dicts that the HF
Trainer and Accelerate save through, and save_16bit_model."""
from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from . import agreement, checkpoint_layout, checkpoint_mesh, sharding, stage3
from .moe import checkpoint as moe_checkpoint
from .moe import ep_checkpoint
from .parallel import data_group

logger = logging.getLogger("zero")


class EngineModelSave:
    """Mixed into ZeroEngine, which sets `config`, `module`, `stage`, `moe`, `grid`,
    `tensor_parallel_group`, `_stage3` and `_whole_world`."""

    def module_state_dict(self, destination=None, prefix="", keep_vars=False,
                          exclude_frozen_parameters=False) -> dict:
        """The module's state dict with whole parameters (gathered unit by unit at stage 3),
        its names after `prefix`, put into `destination` when given, without the frozen
        parameters if asked (DeepSpeed's arguments). Every rank must call it; at stage 3 only
        rank 0 gets the full copy (with MoE layers every other rank its own experts). With
        pipeline or tensor parallelism: this rank's stage / slice of the model. `keep_vars`
        (the parameters themselves, not detached tensors) only below stage 3, where they are
        whole."""
        if keep_vars:
            if self._stage3 is not None:
                raise ValueError("zero: module_state_dict(keep_vars=True) at stage 3: its "
                                 "parameters are partitioned; the state dict holds gathered "
                                 "copies (keep_vars=False)")
            state = self.module.state_dict(keep_vars=True)
        else:
            # (below stage 3 no rank is asked: it works after the process group is gone too)
            state = self.gathered_module_state(keep=self._stage3 is None or dist.get_rank() == 0)
        if exclude_frozen_parameters:
            frozen = sharding.frozen_names(self.module)
            state = {name: value for name, value in state.items() if name not in frozen}
        destination = {} if destination is None else destination
        destination.update((prefix + name, value) for name, value in state.items())
        return destination

    def gathered_module_state(self, keep: bool) -> dict:
        """module_state_dict with the rank that keeps the whole state chosen (a checkpoint's
        model writer): at stage 3 a collective, whose whole parameters stay where `keep` (with
        MoE layers every other rank its own experts)."""
        if self._stage3 is None:
            return self.module.state_dict()
        self._alive("module_state_dict")
        return stage3.full_state_dict(
            self._stage3, self.module,
            keep=moe_checkpoint.kept_names(keep, self.module) if self.moe is not None else keep)

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False):
        """DeepSpeed's name, used by the HF Trainer and Accelerate to save a stage-3 model: the
        whole state dict in the training dtype on rank 0, None on the other ranks. Every rank
        must call it."""
        data_group.check_whole_model_save(self._whole_world, "_zero3_consolidated_16bit_state_dict")
        state = self.module_state_dict(exclude_frozen_parameters=exclude_frozen_parameters)
        if self.moe is not None:  # every expert, under its global id
            state = moe_checkpoint.whole_state(self.module, state)
        return state if dist.get_rank() == 0 else None

    def _consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False):
        """DeepSpeed's, which Accelerate's get_state_dict calls under ZeRO-3 or AutoTP: the
        whole model's state dict on rank 0 (None elsewhere); under tensor parallelism its
        parameters, each split one's slices gathered and joined. Every rank must call it."""
        if self.stage == 3:
            return self._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters)
        group = self.tensor_parallel_group
        if group is None or dist.get_world_size(group) == 1:
            raise ValueError("zero: consolidated_16bit_state_dict is only for weights that are "
                             "partitioned: ZeRO stage 3 or tensor parallelism; use "
                             "engine.module_state_dict()")
        data_group.check_whole_model_save(self.grid is None or
                                          self.grid.get_pipe_parallel_world_size() == 1,
                                          "_consolidated_16bit_state_dict with pipeline stages")
        return checkpoint_mesh.whole_parameters(self.module, group, exclude_frozen_parameters)

    def load_module_state_dict(self, state: dict, strict: bool = True, custom_load_fn=None,
                               fetch_z3_params: bool = False) -> None:
        """A whole model's state dict into the model and the optimizer's fp32 master (which a
        step would otherwise write back over it): load_module_weights, then the masters."""
        self.load_module_weights(state, strict, custom_load_fn, fetch_z3_params)
        if self.core is not None:  # (below stage 3 a destroyed engine's model is a plain one)
            checkpoint_layout.refresh_masters(self.core)

    def load_module_weights(self, state: dict, strict: bool = True, custom_load_fn=None,
                            fetch_z3_params: bool = False) -> None:
        """A whole model's state dict (AutoEP's stacked experts whole, or this rank's rows), or
        DeepSpeed's form, a checkpoint dict holding it under "module", into the model's
        weights; the masters are left to the caller (a checkpoint load writes them from its
        files). With DeepSpeed's `custom_load_fn(src=state, dst=module)` instead of
        load_state_dict: at stage 3 every partitioned parameter is whole during the call (the
        whole model on every rank at once) and rank 0's values are kept, as DeepSpeed's
        fetch_z3_params (always here: its partitions are not the model's tensors); an error in
        it on any rank stops every rank before anything is written back."""
        del fetch_z3_params  # (what custom_load_fn needs is always fetched)
        if isinstance(state.get("module"), dict):
            state = state["module"]
        if self.moe is not None:
            state = ep_checkpoint.localized(self.module, state)
        if custom_load_fn is not None:
            def load():
                try:
                    custom_load_fn(src=state, dst=self.module)
                except Exception as error:  # noqa: BLE001 - whatever the script's function raises
                    raise RuntimeError(f"zero: custom_load_fn raised {type(error).__name__}: "
                                       f"{error}") from error

            with self.gathered_parameters(list(self.module.parameters()), modifier_rank=0):
                agreement.on_every_rank(load, RuntimeError, "custom_load_fn failed: nothing "
                                        "was written back into the partitioned weights")
        elif self._stage3 is None:
            self.module.load_state_dict(state, strict=strict)
        else:
            stage3.load_full_state_dict(self._stage3, self.module, state, strict)

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """Rank 0 writes the whole model in its training dtype (gathered unit by unit), without
        the frozen parameters if asked. At stage 3 this needs
        stage3_gather_16bit_weights_on_model_save, as in DeepSpeed."""
        data_group.check_whole_model_save(self._whole_world, "save_16bit_model")
        if self._stage3 is not None and \
                not self.config.zero_optimization.stage3_gather_16bit_weights_on_model_save:
            if dist.get_rank() == 0:
                logger.warning("zero: save_16bit_model did nothing: set zero_optimization."
                               "stage3_gather_16bit_weights_on_model_save to true to gather the "
                               "weights at stage 3")
            return False
        state = self._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters)
        if dist.get_rank() == 0:
            os.makedirs(save_dir, exist_ok=True)
            path = os.path.join(save_dir, save_filename)
            torch.save(state, path + ".partial")
            os.replace(path + ".partial", path)
        dist.barrier()
        return True

    def save_fp16_model(self, save_dir, save_filename="pytorch_model.bin") -> bool:
        """DeepSpeed's old name of save_16bit_model."""
        return self.save_16bit_model(save_dir, save_filename)

