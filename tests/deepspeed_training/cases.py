"""Short training runs tests/test_training_deepspeed.py compares: each a DeepSpeed JSON config
with the parameter groups a script would pass, trained 4 steps on 2 ranks. Shared by make.py
(the real DeepSpeed 0.19.8 writes expected.pt: the losses and the final fp32 weights) and the
test (zero on the same). What the other fixtures leave out: accumulation, the default
clipping, per-group lrs and weight decay, Adam's L2 form and no bias correction, SGD with
momentum, the decaying schedules, the optimizer (and at stage 3 the parameters) offloaded to
CPU memory, a bf16 master (and bf16 moments), fp32 gradient accumulation under bf16,
DeepSpeed's other ZeRO optimizers, Adagrad and Lion, and torch.optim types it runs as
"untested" optimizers."""
import torch

from zero.models.tiny_gpt import GPTConfig, TinyGPT, synthetic_batches

MODEL = GPTConfig(vocab_size=61, block_size=8, n_layer=2, n_head=2, n_embd=12)
WORLD, STEPS, MICRO = 2, 4, 2

CASES = {
    "stage2-adam-l2-groups-gas2": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 2e-3, "weight_decay": 0.01,
                                                 "adam_w_mode": False}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
        "zero_optimization": {"stage": 2}},
    "stage3-adamw-decay-clip": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.8, 0.9],
                                                  "weight_decay": 0.05}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 6,
                                                          "warmup_num_steps": 2}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
    "stage2-offload-adamw": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    "stage3-offload-all": {
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 8,
                                                           "warmup_num_steps": 2}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                              "offload_optimizer": {"device": "cpu"},
                              "offload_param": {"device": "cpu"}}},
    "stage1-sgd-momentum": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9,
                                                "weight_decay": 1e-3}},
        "zero_allow_untested_optimizer": True,  # DeepSpeed asks it of SGD under ZeRO
        "zero_optimization": {"stage": 1}},
    # DeepSpeed builds torch.optim.Adagrad on the device, DeepSpeedCPUAdagrad when offloaded.
    # At stages 1-2 it rebuilds the device one over its fp32 partitions as one group, so the
    # script's three groups fail (IndexError): zero is held to single-process torch there.
    "stage2-adagrad-gas2": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Adagrad", "params": {"lr": 0.05, "weight_decay": 1e-3}},
        "zero_optimization": {"stage": 2}},
    "stage3-offload-adagrad": {
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "Adagrad", "params": {"lr": 0.05}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                              "offload_optimizer": {"device": "cpu"}}},
    # DeepSpeedCPULion (its FusedLion needs CUDA)
    "stage2-offload-lion-decay": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Lion", "params": {"lr": 2e-3, "betas": [0.9, 0.99],
                                                 "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    # torch.optim types DeepSpeed runs on its fp32 partitions once allowed (zero: on its shards)
    "stage2-rmsprop-untested": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "RMSprop", "params": {"lr": 1e-3, "momentum": 0.5,
                                                    "centered": True}},
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 2}},
    # Adam without bias correction (BERT recipes' "bias_correction": false), per group and offloaded
    "stage2-adam-no-bias-correction-gas2": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 2e-3, "weight_decay": 0.01,
                                                 "bias_correction": False}},
        "zero_optimization": {"stage": 2}},
    "stage3-offload-adamw-no-bias-correction": {
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.1,
                                                  "bias_correction": False}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                              "offload_optimizer": {"device": "cpu"}}},
    # DeepSpeed's low-precision master: bf16 weights that are the master, bf16 moments
    # (bf16_optimizer_states); the master alone needs the CPU optimizer in DeepSpeed
    "stage2-bf16-master-states-gas2": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "bf16": {"enabled": True, "bf16_master_weights_and_grads": True,
                 "bf16_optimizer_states": True},
        "zero_optimization": {"stage": 2}},
    "stage3-bf16-master-states": {
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "bf16": {"enabled": True, "bf16_master_weights_and_grads": True,
                 "bf16_optimizer_states": True},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
    "stage2-offload-bf16-master": {
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "bf16": {"enabled": True, "bf16_master_weights_and_grads": True},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    # data_types.grad_accum_dtype fp32 under bf16: at stage 1 DeepSpeed's BF16_Optimizer (fp32
    # gradients of the whole model, reduced at the boundary), at stages 2-3 fp32 partitions
    "stage1-bf16-fp32-grad-accum-gas2": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": {"stage": 1}},
    "stage2-bf16-fp32-grad-accum-gas2": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": {"stage": 2}},
    "stage3-bf16-fp32-grad-accum-gas2": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
    # Muon (MuonWithAuxAdam): each script group split into its matrices (Muon) and the rest
    # (Adam, inline on DeepSpeed's CPU accelerator); DeepSpeed's ZeRO clips the updates
    "stage0-muon": {
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3,
                                                 "weight_decay": 0.1}},
        "zero_optimization": {"stage": 0}},
    "stage1-muon-gas2": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3,
                                                 "weight_decay": 0.1}},
        "zero_optimization": {"stage": 1}},
    "stage2-muon-clip": {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 0.5,
        "optimizer": {"type": "Muon", "params": {"muon_lr": 0.03, "lr": 2e-3,
                                                 "momentum": 0.9, "betas": [0.9, 0.99]}},
        "zero_optimization": {"stage": 2}},
    "stage2-offload-muon-gas2": {  # the momentum and Adam's moments in host memory
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3,
                                                 "weight_decay": 0.1}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    "stage3-muon-gas2": {  # (DeepSpeed's stage 3 refuses Muon with reduce_scatter; zero not)
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3,
                                                 "weight_decay": 0.1}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                              "reduce_scatter": False}},
    "stage3-nadam-untested": {
        "train_micro_batch_size_per_gpu": MICRO,
        "optimizer": {"type": "NAdam", "params": {"lr": 2e-3, "weight_decay": 0.01}},
        "zero_allow_untested_optimizer": True,
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
}


def make_model():
    torch.manual_seed(0)
    return TinyGPT(MODEL)


def parameter_groups(model):
    """What training scripts pass as model_parameters: no decay for biases and norms, and the
    embeddings at half the lr."""
    named = list(model.named_parameters())
    embeddings = [p for n, p in named if "embedding" in n]
    plain = [p for n, p in named if n.endswith("bias") or "ln" in n]
    taken = {id(p) for p in embeddings + plain}
    rest = [p for n, p in named if id(p) not in taken]
    return [{"params": rest}, {"params": plain, "weight_decay": 0.0},
            {"params": embeddings, "lr": 1e-3, "weight_decay": 0.0}]


def train(engine, rank, config):
    """STEPS optimizer steps; the mean loss of each (over the micro-steps and ranks)."""
    import training

    gas = config.get("gradient_accumulation_steps", 1)
    data = synthetic_batches(MODEL, MICRO, STEPS * gas * WORLD, seed=3)
    return training.train_engine(engine, rank, WORLD, STEPS, gas, data=data)


def train_case(initialize, rank: int, name: str):
    """(engine, losses): case `name` built by `initialize` (DeepSpeed's or zero's) with the
    script's parameter groups, and trained."""
    config = CASES[name]
    model = make_model()
    engine, _, _, _ = initialize(model=model, config=config,
                                 model_parameters=parameter_groups(model))
    return engine, train(engine, rank, config)


def reference(name: str) -> list[float]:
    """Case `name` in one process on the global batch: torch's own optimizer of the config's
    type over the same parameter groups, clipping at DeepSpeed's default 1.0; the losses (for
    where DeepSpeed fails). Only what the cases that need it use."""
    import training

    config = CASES[name]
    gas = config.get("gradient_accumulation_steps", 1)
    assert "scheduler" not in config and "gradient_clipping" not in config, name
    model = make_model()
    optimizer = training.reference_adamw(parameter_groups(model), config)
    data = synthetic_batches(MODEL, MICRO, STEPS * gas * WORLD, seed=3)
    return training.reference_steps(model, optimizer, data, WORLD, STEPS, gas, clip=1.0)
