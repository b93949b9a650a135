"""DeepSpeed's stage-3 parameter attributes on zero (zero/ds_param.py): `ds_numel`,
`ds_shape`, `ds_id`, `ds_persist`, and `ds_status` following the parameter's own storage,
on a model built under zero.Init and on one a stage-3 engine partitions. What the libraries
do with them works: PEFT's parameter count (numel, else ds_numel) gives the whole model's,
and an RLHF trainer's fetch (the NOT_AVAILABLE ones, gathered) reads the whole weights."""
import math

import pytest
import torch

import training
from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(120)
THRESHOLD = 40  # parameters of at most this many elements stay whole (ds_persist)


def _peft_count(model) -> int:
    """PEFT's print_trainable_parameters: numel(), or ds_numel where that is 0."""
    return sum(p.numel() or getattr(p, "ds_numel", 0) for p in model.parameters())


def _fetch(model, ZeroParamStatus):
    """OpenRLHF's _z3_params_to_fetch."""
    return [p for p in model.parameters()
            if hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.NOT_AVAILABLE]


def _attributes(rank, world, under_init):
    import zero
    import zero.compat.deepspeed as deepspeed
    from zero.compat.deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    assert deepspeed.zero.ZeroParamStatus is ZeroParamStatus  # (both of DeepSpeed's paths)
    config = training.engine_config(3, gas=1, stage3_param_persistence_threshold=THRESHOLD)
    if under_init:
        with zero.Init(config_dict_or_path=config):
            model = training.make_model()
        before_engine = _peft_count(model)
    else:
        model = training.make_model()
        before_engine = None
    engine, _, _, _ = zero.initialize(model=model, config=config)
    seen = {}
    for name, p in engine.module.named_parameters():
        seen[name] = (tuple(p.ds_shape), p.ds_numel, p.ds_persist, p.ds_status.name, p.ds_id)
    fetched = _fetch(engine.module, ZeroParamStatus)
    with zero.GatheredParameters(fetched):
        inside = {name: (p.ds_status.name, p.detach().clone())
                  for name, p in engine.module.named_parameters()}
    training.train_engine(engine, rank, world, 1, 1)
    after_step = {p.ds_status.name for p in fetched}
    return before_engine, _peft_count(engine.module), seen, len(fetched), inside, after_step


@pytest.mark.parametrize("under_init", [False, True])
def test_stage3_parameters_carry_deepspeeds_attributes(under_init):
    results = run_distributed(_attributes, 2, args=(under_init,))
    plain = dict(training.make_model().named_parameters())
    total = sum(p.numel() for p in plain.values())
    for before_engine, count, seen, fetched, inside, after_step in results:
        assert count == total and before_engine in (None, total)
        for name, (shape, numel, persist, status, _) in seen.items():
            expected = plain[name]
            assert shape == tuple(expected.shape) and numel == expected.numel(), name
            small = expected.numel() <= THRESHOLD
            assert persist == small, name
            assert status == ("AVAILABLE" if small else "NOT_AVAILABLE"), name
        assert fetched == sum(1 for p in plain.values() if p.numel() > THRESHOLD)
        for name, (status, value) in inside.items():  # gathered: whole, rank 0's weights
            assert status == "AVAILABLE" and torch.equal(value, plain[name].detach()), name
        assert after_step == {"NOT_AVAILABLE"}
    ids = [ds_id for _, _, seen, *_ in results[:1] for *_, ds_id in seen.values()]
    assert len(set(ids)) == len(ids)  # one id per parameter


def test_a_partitioned_parameter_stays_a_parameter_and_its_copies_are_plain():
    """The class swap keeps what torch and the libraries rely on; a copy or a pickle is
    nobody's partitioned parameter, so it has no ds_* (DeepSpeed's copies lose them too)."""
    import copy
    import io

    from zero.ds_param import ZeroParameter, ZeroParamStatus, mark

    layer = torch.nn.Linear(4, 3)
    weight = layer.weight
    mark(weight, (3, 4), persist=False)
    assert layer.weight is weight and isinstance(weight, torch.nn.Parameter)
    assert type(weight) is ZeroParameter and weight.ds_status == ZeroParamStatus.AVAILABLE
    weight.data = torch.empty(0)
    assert weight.ds_status == ZeroParamStatus.NOT_AVAILABLE and weight.ds_numel == 12
    assert math.prod(weight.ds_shape) == 12
    saved = io.BytesIO()
    torch.save(layer, saved)
    saved.seek(0)
    for other in (copy.deepcopy(layer), torch.load(saved, weights_only=False)):
        assert type(other.weight) is torch.nn.Parameter
        assert not any(name.startswith("ds_") for name in vars(other.weight))


def test_another_librarys_parameter_class_is_left_alone():
    from zero.ds_param import mark

    class Quantized(torch.nn.Parameter):
        pass

    param = Quantized(torch.zeros(3))
    mark(param, (3,), persist=True)
    assert type(param) is Quantized and not hasattr(param, "ds_id")
