"""DeepSpeed's batch calls on the engine (zero/engine_batch.py): set_train_batch_size and
set_train_micro_batch_size between steps, deepspeed_io, and save_16bit_model's
exclude_frozen_parameters with its old name save_fp16_model."""
import os
import sys

import pytest
import torch

import training
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(180)
STEPS = 4


def _train(rank, world, gas_at_start, ramp):
    """Stage 1 from a config of `gas_at_start` (gas 1: sharded gradients, as stage 2), then,
    when `ramp`, set_train_batch_size to the batch of two micro-batches per step."""
    import zero

    config = training.engine_config(1, gas=gas_at_start, scheduler=False)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    if ramp:
        engine.set_train_batch_size(2 * engine.train_batch_size())
    info = engine.get_batch_info()
    losses = training.train_engine(engine, rank, world, STEPS, engine.gradient_accumulation_steps())
    state = {k: v.float() for k, v in engine.module_state_dict().items()}
    return info, losses, state


def test_set_train_batch_size_trains_as_a_config_of_that_batch():
    """Ramped from one micro-batch per step to two, stage 1 (whose gradients were sharded for
    one micro-batch a step) trains exactly like an engine built for two."""
    built = run_distributed(_train, 2, args=(2, False))
    ramped = run_distributed(_train, 2, args=(1, True))
    for (info, losses, state), (ramped_info, ramped_losses, ramped_state) in zip(built, ramped):
        assert ramped_info == info == (2 * training.MICRO_BATCH * 2, training.MICRO_BATCH, 2)
        assert ramped_losses == pytest.approx(losses, rel=1e-6)
        # fp32 rounding of another summation order (up to 1.1e-5 on an AVX2 machine)
        for name, value in state.items():
            assert training.relative_error(ramped_state[name], value) < 1e-4, name


def _wrong_sizes(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(2, gas=1, scheduler=False))
    errors = []
    with pytest.raises(ValueError) as error:
        engine.set_train_batch_size(3 * engine.train_micro_batch_size_per_gpu())
    errors.append(str(error.value))
    engine.set_train_batch_size(4 * engine.train_batch_size())
    tokens, targets = training.batches(world, 1, 4)[rank]
    engine.backward(engine(tokens, targets))  # one micro-batch of the four
    engine.step()
    with pytest.raises(RuntimeError) as error:
        engine.set_train_micro_batch_size(1)
    errors.append(str(error.value))
    return errors


def test_a_batch_that_does_not_divide_or_a_change_mid_window_is_named():
    for not_a_multiple, mid_window in run_distributed(_wrong_sizes, 2):
        assert "must be a multiple of train_micro_batch_size_per_gpu x data-parallel ranks" \
            in not_a_multiple
        assert "in the middle of an accumulation window" in mid_window


def _config_views(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(2, gas=1, scheduler=False))
    before = engine._config  # DeepSpeed's private DeepSpeedConfig, which scripts read
    sizes = [(before.train_batch_size, before.gradient_accumulation_steps)]
    engine.set_train_batch_size(4 * engine.train_batch_size())
    sizes.append((engine._config.train_batch_size, engine._config.gradient_accumulation_steps))
    return sizes


def test_engine_config_view_follows_a_new_batch_size():
    """DeepSpeed's setters write into engine._config; zero's view is built again."""
    micro = training.engine_config(2)["train_micro_batch_size_per_gpu"]
    for sizes in run_distributed(_config_views, 2):
        assert sizes == [(2 * micro, 1), (8 * micro, 4)]


def _loaders(rank, world):
    import zero

    engine, _, _, _ = zero.initialize(model=training.make_model(),
                                      config=training.engine_config(2, gas=1, scheduler=False),
                                      collate_fn=lambda rows: torch.stack(rows))
    dataset = torch.arange(20).float()
    evaluation = [batch.tolist() for batch in engine.deepspeed_io(dataset, route="eval")]
    training_loader = engine.deepspeed_io(dataset, batch_size=5)
    return evaluation, [len(batch) for batch in training_loader]


def test_deepspeed_io_gives_each_rank_its_part():
    (first, first_sizes), (second, second_sizes) = run_distributed(_loaders, 2)
    micro = training.MICRO_BATCH
    rows = sorted(x for batch in first + second for x in batch)
    assert rows == list(range(20))  # in order for evaluation, each row once
    assert all(len(batch) <= micro for batch in first)  # the config's micro-batch
    assert first_sizes == second_sizes == [5, 5]  # batch_size given, 10 rows each


def _epochs(rank, world, drop_last):
    import zero

    config = training.engine_config(2, gas=1, scheduler=False)
    config["dataloader_drop_last"] = drop_last
    engine, _, loader, _ = zero.initialize(model=training.make_model(), config=config,
                                           training_data=torch.arange(22).float())
    epochs = []
    for epoch in range(2):
        loader.data_sampler.set_epoch(epoch)  # DeepSpeedExamples' cifar10_deepspeed.py
        epochs.append([row for batch in loader for row in batch.tolist()])
    return epochs, len(loader), engine.dataloader_drop_last()


@pytest.mark.parametrize("drop_last", [False, True])
def test_the_training_data_loader_reshuffles_by_epoch_and_drops_a_short_batch_when_told(
        drop_last):
    """initialize(training_data=...)'s loader has DeepSpeedDataLoader's data_sampler (the
    script's set_epoch reshuffles; it was an AttributeError) and takes dataloader_drop_last
    (it was rejected): 11 rows a rank in micro-batches of 2."""
    runs = run_distributed(_epochs, 2, args=(drop_last,))
    for epochs, length, told in runs:
        assert told is drop_last
        assert length == (5 if drop_last else 6)
        assert [len(rows) for rows in epochs] == [10 if drop_last else 11] * 2
        assert epochs[0] != epochs[1]
    if not drop_last:  # each row once per epoch over the ranks
        for epoch in range(2):
            assert sorted(runs[0][0][epoch] + runs[1][0][epoch]) == list(range(22))


def _save(rank, world, directory):
    import zero

    model = training.make_model(freeze_position_embedding=True)
    config = training.engine_config(3, gas=1, scheduler=False,
                                    stage3_gather_16bit_weights_on_model_save=True)
    engine, _, _, _ = zero.initialize(model=model, config=config)
    assert engine.save_16bit_model(directory, "trainable.bin", exclude_frozen_parameters=True)
    assert engine.save_fp16_model(directory, "all.bin")


def test_save_16bit_model_leaves_frozen_parameters_out_when_asked(tmp_path):
    run_distributed(_save, 2, args=(str(tmp_path),))
    trainable = torch.load(os.path.join(tmp_path, "trainable.bin"))
    everything = torch.load(os.path.join(tmp_path, "all.bin"))
    assert set(everything) - set(trainable) == {"position_embedding.weight"}


def _compiled(rank, world, stage, how, backend="eager"):
    import zero

    config = training.engine_config(stage, gas=2, scheduler=False,
                                    stage3_param_persistence_threshold=40)
    model = training.make_model()
    # As in a job that never loaded dynamo (these ranks have it from the forkserver): the
    # engine does not load it (seconds of CPU) and puts its hooks on plain; compile wraps them.
    dynamo = sys.modules.pop("torch._dynamo", None)
    try:
        engine, _, _, _ = zero.initialize(model=model, config=config)
        assert "torch._dynamo" not in sys.modules
    finally:
        if dynamo is not None:
            sys.modules["torch._dynamo"] = dynamo
    if how == "engine.compile":  # as Accelerate calls it for the HF Trainer's --torch_compile
        engine.compile(backend=backend, compile_kwargs={"dynamic": False})
        assert engine.is_compiled
    elif how == "module.compile":  # the script's own, after initialize
        engine.module.compile(backend=backend, dynamic=False)
    if how is not None:
        # no code compiled more than twice (nn.Embedding.forward: the tokens' and the
        # positions'): a traced hook would be compiled again for each of the 3 unit numbers
        torch._dynamo.config.recompile_limit = 2
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    return training.train_engine(engine, rank, world, 3, 2)


def test_engine_compile_trains_as_the_engine_without_it():
    """At stage 3, where the module hooks gather the units (the eager backend), compiled by
    engine.compile or by the script after initialize. Dynamo runs the hooks as they are
    (torch.compiler.disable, as DeepSpeed's): no code is compiled again and again."""
    plain = run_distributed(_compiled, 2, args=(3, None))
    for how in ("engine.compile", "module.compile"):
        compiled = run_distributed(_compiled, 2, args=(3, how))
        for losses, compiled_losses in zip(plain, compiled):
            assert compiled_losses == pytest.approx(losses, rel=1e-6), how
