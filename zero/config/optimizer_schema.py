"""The config schema's "optimizer" and "scheduler" blocks (zero/config/schema.py holds the
rest): each optimizer type's and each scheduler type's parameters, with DeepSpeed's defaults
(``ops/adam/fused_adam.py``, ``runtime/lr_schedules.py``) and torch's for the torch optimizers
a config may name."""

from .keys import (BETAS, BOOL, FLOAT, MAX_STEPS, PARAMS, REQUIRED, Block, Key, boolean, choice,
                   integer, number, unsupported)

# --------------------------------------------------------------------------- optimizer

_ADAM_PARAMS = (
    number("lr", 1e-3, "Learning rate.", minimum=0),
    Key("betas", BETAS, (0.9, 0.999), "Coefficients of the running averages of the gradient and its square.",
        minimum=0, maximum=1, maximum_exclusive=True),
    number("eps", 1e-8, "Term added to the denominator for numerical stability.", minimum=0),
    number("weight_decay", None, "Weight decay coefficient: decoupled (AdamW) when decoupled_weight_decay resolves "
           "true, else L2 added to the gradient. Default 0.0 as in DeepSpeed's FusedAdam/CPUAdam; 0.01 when "
           "torch_adam is true and the decay is decoupled (DeepSpeed then builds torch.optim.AdamW, whose default "
           "is 0.01).", minimum=0, default_doc="0.0 (0.01 with torch_adam + decoupled)"),
    boolean("adam_w_mode", True, "DeepSpeed switch for type \"Adam\": true (DeepSpeed's default) = decoupled weight "
            "decay, i.e. \"Adam\" IS AdamW unless this is false. For type \"AdamW\" it must stay true."),
    boolean("torch_adam", False, "DeepSpeed: use torch.optim.Adam/AdamW instead of its fused kernel. The update is the "
            "same; in zero it only changes the weight_decay default (see weight_decay)."),
    Key("fp32_optimizer_states", BOOL, None, "DeepSpeedCPUAdam's switch (DeepSpeed reads it here for the CPU "
        "optimizer of offload_optimizer): false keeps the moments in the master's dtype, so with "
        "bf16_master_weights_and_grads (fp16_...) and offload_optimizer they are 16-bit, as bf16_optimizer_states "
        "makes them; otherwise no effect. bf16_optimizer_states true overrides true, as in DeepSpeed.",
        nullable=True),
    boolean("bias_correction", True, "Adam's bias correction of the moments (DeepSpeed's FusedAdam and "
            "DeepSpeedCPUAdam option, per parameter group); false uses them as they are, as BERT recipes do."),
    unsupported(BOOL, "amsgrad", False, "AMSGrad variant (DeepSpeed's FusedAdam rejects it too)."),
    unsupported(BOOL, "set_grad_none", True, "FusedAdam zero_grad() behaviour."),
    unsupported(BOOL, "maximize", False, "torch.optim option: maximise the objective."),
    unsupported(BOOL, "foreach", None, "torch.optim implementation switch.", nullable=True),
    unsupported(BOOL, "fused", None, "torch.optim implementation switch.", nullable=True),
)

_SGD_PARAMS = (
    number("lr", 1e-3, "Learning rate (torch.optim.SGD's default; DeepSpeed passes params straight to torch).",
           minimum=0),
    number("momentum", 0.0, "Momentum factor (above 1 the momentum buffer grows without bound).", minimum=0,
           maximum=1),
    number("dampening", 0.0, "Dampening for momentum (above 1 the gradient's sign flips).", minimum=0, maximum=1),
    number("weight_decay", 0.0, "L2 penalty added to the gradient (coupled, as in torch.optim.SGD).", minimum=0),
    boolean("nesterov", False, "Nesterov momentum (needs momentum > 0 and dampening = 0)."),
    unsupported(BOOL, "maximize", False, "torch.optim option: maximise the objective."),
    unsupported(BOOL, "foreach", None, "torch.optim implementation switch.", nullable=True),
    unsupported(BOOL, "fused", None, "torch.optim implementation switch.", nullable=True),
)

_ADAGRAD_PARAMS = (
    number("lr", 1e-2, "Learning rate (torch.optim.Adagrad's and DeepSpeedCPUAdagrad's default).", minimum=0),
    number("eps", 1e-10, "Term added to the denominator for numerical stability.", minimum=0),
    number("weight_decay", 0.0, "L2 penalty added to the gradient (coupled, as in torch.optim.Adagrad).",
           minimum=0),
    number("lr_decay", 0.0, "Learning-rate decay: step t uses lr / (1 + (t - 1) * lr_decay) (torch.optim.Adagrad).",
           minimum=0),
    number("initial_accumulator_value", 0.0, "Starting value of the sum of squared gradients "
           "(torch.optim.Adagrad).", minimum=0),
    unsupported(BOOL, "amsgrad", False, "DeepSpeedCPUAdagrad option (it rejects true too)."),
    unsupported(BOOL, "maximize", False, "torch.optim option: maximise the objective."),
    unsupported(BOOL, "foreach", None, "torch.optim implementation switch.", nullable=True),
    unsupported(BOOL, "fused", None, "torch.optim implementation switch.", nullable=True),
)

_LION_PARAMS = (
    number("lr", 1e-3, "Learning rate (DeepSpeed's FusedLion / DeepSpeedCPULion default). Lion's update has "
           "unit size per element, so it is usually 3-10x smaller than AdamW's.", minimum=0),
    Key("betas", BETAS, (0.9, 0.999), "beta1 interpolates the momentum and the gradient for the update's sign; "
        "beta2 is the momentum's decay (DeepSpeed's default (0.9, 0.999); the paper uses (0.9, 0.99)).",
        minimum=0, maximum=1, maximum_exclusive=True),
    number("weight_decay", 0.0, "Decoupled weight decay: each step multiplies the parameters by 1 - lr * "
           "weight_decay.", minimum=0),
    unsupported(BOOL, "set_grad_none", True, "FusedLion zero_grad() behaviour."),
)

_LAMB_PARAMS = (
    number("lr", 1e-3, "Learning rate (DeepSpeed's FusedLamb default).", minimum=0),
    boolean("bias_correction", True, "Scale the step by sqrt(1 - beta2^t) / (1 - beta1^t) (the moments "
            "themselves stay uncorrected in the update, as in FusedLamb)."),
    Key("betas", BETAS, (0.9, 0.999), "Coefficients of the running averages of the gradient and its square.",
        minimum=0, maximum=1, maximum_exclusive=True),
    number("eps", 1e-8, "Added to sqrt(v) (or to v under the root with eps_inside_sqrt).", minimum=0),
    boolean("eps_inside_sqrt", False, "Add eps to v before the square root instead of after it."),
    number("weight_decay", 0.0, "Added to the update as weight_decay * w before the trust ratio.",
           minimum=0),
    number("max_coeff", 10.0, "Upper bound of each parameter's trust ratio ||w|| / ||update||.", minimum=0),
    number("min_coeff", 0.01, "Lower bound of the trust ratio.", minimum=0),
    unsupported(FLOAT, "max_grad_norm", 0.0, "FusedLamb's own clipping by the global norm (use "
                 "gradient_clipping, which the engine applies)."),
    unsupported(BOOL, "amsgrad", False, "AMSGrad variant (FusedLamb rejects it too)."),
)

# DeepSpeed's MuonWithAuxAdam: Muon for the matrices, Adam for the rest (zero/muon.py)
_MUON_PARAMS = (
    number("lr", None, "Learning rate of both halves, unless muon_lr / adam_lr set one.", minimum=0,
           default_doc="0.02 for Muon, 3e-4 for Adam (MuonWithAuxAdam's)"),
    number("muon_lr", None, "Learning rate of the Muon half (over lr).", minimum=0, default_doc="lr"),
    number("adam_lr", None, "Learning rate of the Adam half (over lr).", minimum=0, default_doc="lr"),
    number("momentum", 0.95, "Muon's momentum; its update is the Nesterov blend (1 - momentum) g + momentum m, "
           "orthogonalized.", minimum=0, maximum=1),
    choice("ns_method", "gram", ("gram", "standard"), "Muon's Newton-Schulz iteration: \"gram\" iterates on the "
            "Gram matrix in fp16, \"standard\" on the matrix in bf16 (each in fp32 where the device lacks it, "
            "as DeepSpeed)."),
    number("weight_decay", 0.0, "Decoupled weight decay of both halves: each step multiplies the parameters by "
           "1 - lr * weight_decay (the Adam half's is L2 with adam_w_mode false).", minimum=0),
    Key("betas", BETAS, (0.9, 0.95), "The Adam half's betas (MuonWithAuxAdam's default).", minimum=0, maximum=1,
        maximum_exclusive=True),
    number("eps", 1e-10, "The Adam half's eps (MuonWithAuxAdam's default).", minimum=0),
    boolean("adam_w_mode", True, "The Adam half's decoupled weight decay (true) or L2 added to the gradient."),
    unsupported(BOOL, "per_head_muon", False, "Orthogonalize each attention head's rows apart."),
)


def _torch_keys(lr, *keys):
    """A torch.optim optimizer's arguments (DeepSpeed passes an unknown type's params to
    torch.optim.<type> as they are): its lr default, then `keys`, maximize and foreach;
    capturable and differentiable at torch's defaults only."""
    return (number("lr", lr, "Learning rate (torch's default).", minimum=0), *keys,
            boolean("maximize", False, "Maximise the objective (torch.optim's)."),
            boolean("foreach", None, "torch.optim's implementation switch (None: torch's choice).",
                    nullable=True),
            unsupported(BOOL, "capturable", False, "torch.optim CUDA-graph switch."),
            unsupported(BOOL, "differentiable", False, "torch.optim autograd-through-step switch."))


def _torch_betas():
    return Key("betas", BETAS, (0.9, 0.999), "Coefficients of the running averages.", minimum=0, maximum=1,
               maximum_exclusive=True)


_TORCH_EPS = number("eps", 1e-8, "Term added to the denominator for numerical stability.", minimum=0)
_TORCH_L2 = number("weight_decay", 0.0, "Weight decay (L2 added to the gradient unless decoupled).", minimum=0)
_TORCH_DECOUPLED = boolean("decoupled_weight_decay", False, "Decoupled weight decay (AdamW-style).")
# torch.optim optimizers zero runs as they are on each rank's shard (zero/external_optimizer.py), as
# DeepSpeed runs them with zero_allow_untested_optimizer: the same update element by element
TORCH_OPTIMIZERS = {
    "RMSprop": _torch_keys(
        1e-2, number("alpha", 0.99, "Smoothing constant of the squared-gradient average.", minimum=0, maximum=1),
        _TORCH_EPS, _TORCH_L2,
        number("momentum", 0.0, "Momentum factor (a momentum buffer per element when > 0).", minimum=0,
               maximum=1),
        boolean("centered", False, "Normalise by the gradient's estimated variance (a gradient average per "
                "element).")),
    "Adamax": _torch_keys(2e-3, _torch_betas(), _TORCH_EPS, _TORCH_L2),
    "NAdam": _torch_keys(2e-3, _torch_betas(), _TORCH_EPS, _TORCH_L2,
                         number("momentum_decay", 4e-3, "Momentum decay (psi).", minimum=0),
                         _TORCH_DECOUPLED),
    "RAdam": _torch_keys(1e-3, _torch_betas(), _TORCH_EPS, _TORCH_L2, _TORCH_DECOUPLED),
    "Adadelta": _torch_keys(1.0, number("rho", 0.9, "Decay of the squared-gradient and update averages.",
                                        minimum=0, maximum=1),
                            number("eps", 1e-6, "Term added for numerical stability.", minimum=0), _TORCH_L2),
}

_ADAM = Block("optimizer.params", "Parameters of types \"Adam\" and \"AdamW\" (DeepSpeed FusedAdam / CPUAdam "
              "semantics; see \"What Adam means\" above).", _ADAM_PARAMS)

OPTIMIZER_PARAMS = {
    "Adam": _ADAM,
    "AdamW": _ADAM,
    "SGD": Block("optimizer.params", "Parameters of type \"SGD\" (torch.optim.SGD).", _SGD_PARAMS),
    "Adagrad": Block("optimizer.params", "Parameters of type \"Adagrad\" (torch.optim.Adagrad; "
                     "DeepSpeedCPUAdagrad with offload).", _ADAGRAD_PARAMS),
    "Lion": Block("optimizer.params", "Parameters of type \"Lion\" (DeepSpeed's FusedLion; DeepSpeedCPULion "
                  "with offload).", _LION_PARAMS),
    "Lamb": Block("optimizer.params", "Parameters of type \"Lamb\" (DeepSpeed's FusedLamb: Adam's moments, "
                  "each parameter's step scaled by its trust ratio, over the whole parameter at every ZeRO "
                  "stage; on the device only, as FusedLamb has no CPU version).", _LAMB_PARAMS),
    "Muon": Block("optimizer.params", "Parameters of type \"Muon\" (DeepSpeed's MuonWithAuxAdam: Muon for every "
                  "parameter of 2 or more dimensions whose name has neither \"embed\" nor \"lm_head\", Adam for the "
                  "others; each parameter group is split in two, its own keys applying to the half that takes them). "
                  "Muon's matrices are orthogonalized whole at every ZeRO stage; its state on the device or in host "
                  "memory (offload_optimizer \"cpu\").", _MUON_PARAMS),
    **{name: Block("optimizer.params", f"Parameters of type \"{name}\" (torch.optim.{name}, run on each "
                   "rank's shard; needs zero_allow_untested_optimizer under ZeRO, as in DeepSpeed).", keys)
       for name, keys in TORCH_OPTIMIZERS.items()},
}

# DeepSpeed's own optimizers (config.py DEEPSPEED_OPTIMIZERS) and common torch.optim
# names that DeepSpeed would import: known, but not implemented by zero.
_UNSUPPORTED_OPTIMIZERS = ("OneBitAdam", "ZeroOneAdam", "OneBitLamb", "MuAdam", "MuAdamW",
                           "MuSGD", "SparseAdam", "ASGD", "LBFGS", "Rprop")

OPTIMIZER = Block("optimizer", "Optimizer built by the engine. Absent or null: the client passes its own optimizer.", (
    choice("type", REQUIRED, tuple(OPTIMIZER_PARAMS), "Optimizer name, matched case-insensitively (as DeepSpeed "
            "does for its own optimizers) and canonicalised. \"Adam\" with adam_w_mode true (the default) is "
            "decoupled AdamW; see decoupled_weight_decay in the resolved config.",
            ignore_case=True, unsupported_choices=_UNSUPPORTED_OPTIMIZERS),
    Key("params", PARAMS, {}, "Optimizer arguments; the keys depend on type (tables below).",
        nullable=True, variants=OPTIMIZER_PARAMS),
    unsupported(BOOL, "legacy_fusion", False, "DeepSpeed legacy fused-optimizer switch."),
))

# --------------------------------------------------------------------------- scheduler

_WARMUP_TYPES = ("log", "linear")


def _warmup_keys(max_lr_default, max_lr_doc):
    return (
        number("warmup_min_lr", 0.0, "Learning rate at the start of warmup.", minimum=0),
        number("warmup_max_lr", max_lr_default, max_lr_doc, minimum=0, nullable=max_lr_default is None,
               default_doc="each group's lr" if max_lr_default is None else None),
        integer("warmup_num_steps", 1000, "Warmup length in steps (DeepSpeed uses max(2, value) internally).",
                minimum=1, maximum=MAX_STEPS),
        choice("warmup_type", "log", _WARMUP_TYPES, "Warmup curve (DeepSpeed warns and falls back to log on "
                "an unknown value; zero rejects it)."),
        integer("last_batch_iteration", -1, "Index of the last step already taken (-1: start of the schedule).",
                minimum=-1, maximum=MAX_STEPS),
    )


_TOTAL_NUM_STEPS = integer("total_num_steps", REQUIRED, "Total number of training steps.", minimum=1,
                           maximum=MAX_STEPS)

SCHEDULER_PARAMS = {
    "WarmupLR": Block("scheduler.params", "Parameters of type \"WarmupLR\": warm up, then hold warmup_max_lr.",
                      _warmup_keys(None, "Learning rate after warmup. Default (DeepSpeed code): each parameter "
                                   "group's own lr. DeepSpeed's docs say 0.001; its code uses the groups' lrs.")),
    "WarmupDecayLR": Block("scheduler.params", "Parameters of type \"WarmupDecayLR\": warm up, then decay "
                           "linearly to 0 at total_num_steps.",
                           (_TOTAL_NUM_STEPS,) + _warmup_keys(0.001, "Learning rate after warmup.")),
    "WarmupCosineLR": Block("scheduler.params", "Parameters of type \"WarmupCosineLR\": warm up a ratio of the "
                            "optimizer lr to 1, then cosine-decay it to cos_min_ratio.", (
        _TOTAL_NUM_STEPS,
        number("warmup_min_ratio", 0.0, "lr ratio at the start of warmup.", minimum=0, maximum=1),
        integer("warmup_num_steps", 1000, "Warmup length in steps.", minimum=1, maximum=MAX_STEPS),
        number("cos_min_ratio", 0.0001, "lr ratio at the end of the cosine decay.", minimum=0, maximum=1),
        choice("warmup_type", "log", _WARMUP_TYPES, "Warmup curve."),
        integer("last_batch_iteration", -1, "Index of the last step already taken.", minimum=-1,
                maximum=MAX_STEPS),
    )),
    "OneCycle": Block("scheduler.params", "Parameters of type \"OneCycle\" (1Cycle lr and momentum policy).", (
        number("cycle_min_lr", REQUIRED, "Lower lr bound of the cycle.", minimum=0),
        number("cycle_max_lr", REQUIRED, "Upper lr bound of the cycle.", minimum=0),
        number("decay_lr_rate", 0.0, "Post-cycle lr decay rate (0: no decay).", minimum=0),
        integer("cycle_first_step_size", 2000, "Steps in the increasing half of the cycle.", minimum=1,
                maximum=MAX_STEPS),
        integer("cycle_second_step_size", None, "Steps in the decreasing half (null: cycle_first_step_size; "
                "0: none, as DeepSpeed allows).", minimum=0, maximum=MAX_STEPS, nullable=True,
                default_doc="cycle_first_step_size"),
        integer("cycle_first_stair_count", 0, "Stairs in the first half (0: continuous).", minimum=0,
                maximum=MAX_STEPS),
        integer("cycle_second_stair_count", None, "Stairs in the second half (null: cycle_first_stair_count).",
                minimum=0, maximum=MAX_STEPS, nullable=True, default_doc="cycle_first_stair_count"),
        integer("decay_step_size", 0, "Steps between post-cycle decays (0: no decay).", minimum=0,
                maximum=MAX_STEPS),
        boolean("cycle_momentum", True, "Cycle momentum (Adam's beta1) inversely to the lr; an optimizer "
                "without betas (SGD) keeps its momentum, as in DeepSpeed."),
        number("cycle_min_mom", 0.8, "Lower momentum bound.", minimum=0, maximum=1),
        number("cycle_max_mom", 0.9, "Upper momentum bound.", minimum=0, maximum=1),
        number("decay_mom_rate", 0.0, "Post-cycle momentum decay rate.", minimum=0),
        integer("last_batch_iteration", -1, "Index of the last step already taken.", minimum=-1,
                maximum=MAX_STEPS),
    )),
    "LRRangeTest": Block("scheduler.params", "Parameters of type \"LRRangeTest\" (the learning-rate range "
                         "test: the lr grows from lr_range_test_min_lr without bound).", (
        number("lr_range_test_min_lr", 0.001, "Starting lr (of every parameter group).", minimum=0),
        integer("lr_range_test_step_size", 2000, "Steps per unit of increase.", minimum=1, maximum=MAX_STEPS),
        number("lr_range_test_step_rate", 1.0, "The lr grows by this times min_lr per step_size steps.",
               minimum=0),
        boolean("lr_range_test_staircase", False, "Grow in stairs of step_size steps instead of every step."),
        integer("last_batch_iteration", -1, "Index of the last step already taken.", minimum=-1,
                maximum=MAX_STEPS),
    )),
}

SCHEDULER = Block("scheduler", "Learning-rate schedule, stepped once per optimizer step.", (
    choice("type", REQUIRED, tuple(SCHEDULER_PARAMS), "Schedule name (case-sensitive, as in DeepSpeed)."),
    Key("params", PARAMS, {}, "Schedule arguments; the keys depend on type (tables below).",
        nullable=True, variants=SCHEDULER_PARAMS),
))
