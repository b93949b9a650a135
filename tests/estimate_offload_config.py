"""What the offload estimate tests (test_estimate_offload*.py, test_cuda_estimate.py) share:
the models they measure, the engine config of one grid entry, and a tuned config's run."""
import dataclasses
import os

import training

HERE = os.path.dirname(os.path.abspath(__file__))
FACTORY = os.path.join(HERE, "training.py") + ":make_model"
DEEP_FACTORY = os.path.join(HERE, "test_estimate_stage3.py") + ":deep_model"
GAS = 2
PERSISTENCE = 40  # stage 3: LayerNorm weights and 32-element biases stay whole

# offload_param keys of the grid -> their names in the config
PARAM_KEYS = {"param_buffer_count": "buffer_count", "param_buffer_size": "buffer_size",
              "param_max_in_cpu": "max_in_cpu"}


def _config(stage, precision, overrides, nvme_path, gas=GAS):
    zero_extra = dict(overrides)
    optimizer = zero_extra.pop("optimizer", None)
    delayed = zero_extra.pop("delayed_update", False)
    ratio = zero_extra.pop("ratio", None)
    grads_on_device = zero_extra.pop("grads_on_device", False)
    sixteen_bit = zero_extra.pop("bf16", None)  # bf16 block keys (a 16-bit master, states)
    data_types = zero_extra.pop("data_types", None)
    param_keys = {PARAM_KEYS[key]: zero_extra.pop(key) for key in list(zero_extra)
                  if key in PARAM_KEYS}
    for name in ("offload_optimizer", "offload_param"):
        device = zero_extra.pop(name, None)
        if device == "cpu":
            zero_extra[name] = {"device": "cpu", "pin_memory": False}
            if delayed and name == "offload_optimizer":
                zero_extra[name]["delayed_update"] = True
        elif device == "nvme":
            zero_extra[name] = {"device": "nvme", "nvme_path": nvme_path}
            if name == "offload_param":
                zero_extra[name].update(param_keys)
        if device and ratio is not None and name == "offload_optimizer":
            zero_extra[name]["ratio"] = ratio
        if device and grads_on_device and name == "offload_optimizer":
            zero_extra[name]["grads_on_device"] = True
    if stage == 3:
        zero_extra.setdefault("stage3_param_persistence_threshold", PERSISTENCE)
    config = training.engine_config(stage, gas=gas, precision=precision, **zero_extra)
    if optimizer is not None:
        config["optimizer"] = optimizer
    if sixteen_bit:
        config["bf16"].update(sixteen_bit)
    if data_types:
        config["data_types"] = data_types
    return config


def _close(estimated, measured, tolerance=0.05):
    return abs(estimated - measured) <= tolerance * max(measured, 1)


def train_tuned(rank, world, config_path):
    """Two steps of DEEP_FACTORY's model under a tuned config: its memory report, and the
    device it trained on ("device_type")."""
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(
        dataclasses.replace(training.MODEL, n_layer=8)), config=config_path)
    training.train_engine(engine, rank, world, 2, engine.gradient_accumulation_steps())
    report = engine.memory_report()
    report["device_type"] = engine.device.type
    engine.destroy()
    return report
