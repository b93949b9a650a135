"""DeepSpeed's ds_to_universal in zero (zero/checkpoint_to_universal.py): a DeepSpeed checkpoint
converts to what DeepSpeed's own converter writes; a zero checkpoint converts to a universal
checkpoint that the real DeepSpeed 0.19.8 resumed at another world size and stage exactly as
zero resumes it (tests/deepspeed_checkpoints/zero-*-universal, recorded under DeepSpeed by
make.py: Adam, and Lion's one array through DeepSpeed's CPU Lion), and that zero loads too; the command takes DeepSpeed's flags."""
import os
import subprocess
import sys

import pytest
import torch

import ds_checkpoint_run as run
from distributed_harness import run_distributed, subprocess_env
from training import relative_error, universal_values

pytestmark = pytest.mark.timeout(120)
TAG = f"global_step{run.SAVED_AT}"


@pytest.mark.parametrize("name", ["stage2-fp32", "stage3-fp32", "stage1-bf16-frozen"])
def test_a_deepspeed_checkpoint_converts_to_what_its_own_ds_to_universal_writes(tmp_path, name):
    from zero.checkpoint_to_universal import convert

    out = convert(os.path.join(run.FIXTURES, name, TAG), str(tmp_path / f"{TAG}_universal"))
    theirs = universal_values(os.path.join(run.FIXTURES, f"{name}-universal",
                                           f"{TAG}_universal"))
    ours = universal_values(out)
    assert set(theirs) <= set(ours)
    for file, want in theirs.items():
        if torch.is_tensor(want):  # (DeepSpeed's stage 3 writes flat tensors)
            assert torch.equal(ours[file].reshape(-1), want.reshape(-1)), file
        elif file != "optimizer_state.pt":
            assert ours[file] == want, file
    assert ours["optimizer_state.pt"]["param_groups"] == \
        theirs["optimizer_state.pt"]["param_groups"]
    # every trained parameter's files in the form DeepSpeed's stages 1-2 load, a step
    # included, and both model files: the conversion loads at every stage
    for file in ours:
        if file.endswith("fp32.pt") and file.replace("fp32.pt", "exp_avg.pt") in ours:
            assert isinstance(ours[file.replace("fp32.pt", "step.pt")], int), file
    assert {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"} <= \
        set(os.listdir(out))
    with open(tmp_path / "latest_universal") as file:
        assert file.read() == f"{TAG}_universal"


@pytest.fixture(scope="module")
def zero_checkpoints(tmp_path_factory):
    """name -> the directory holding zero's checkpoint of each ZERO_TO_DEEPSPEED run, and
    zero's conversion of it beside it (under `converted`)."""
    from zero.checkpoint_to_universal import convert

    made = {}
    for name, zero_run in run.ZERO_TO_DEEPSPEED.items():
        root = str(tmp_path_factory.mktemp(name))
        run_distributed(run.zero_save, run.WORLD, args=(zero_run, root), timeout=120)
        convert(os.path.join(root, TAG), os.path.join(root, "converted", f"{TAG}_universal"))
        made[name] = root
    return made


@pytest.mark.parametrize("name", sorted(run.ZERO_TO_DEEPSPEED))
def test_zeros_conversion_is_the_one_deepspeed_resumed(zero_checkpoints, name):
    """What zero writes today is what the real DeepSpeed was seen to load (make.py)."""
    committed = os.path.join(run.FIXTURES, name, f"{TAG}_universal")
    ours = os.path.join(zero_checkpoints[name], "converted", f"{TAG}_universal")
    want, got = universal_values(committed), universal_values(ours)
    assert set(got) == set(want)
    trained = {f.split(os.sep)[0] for f in want if f.endswith("exp_avg.pt")}
    # bf16 training rounds as the CPU's bf16 kernels do (AVX-512 and AVX2 machines differ,
    # about 1% after three steps): the values within that, the layout exactly
    bf16 = run.RUNS[run.ZERO_TO_DEEPSPEED[name].run].precision == "bf16"
    for file, value in want.items():
        if torch.is_tensor(value) and bf16:
            assert got[file].dtype == value.dtype and got[file].shape == value.shape, file
            assert relative_error(got[file].float(), value.float()) < 3e-2, file
        elif torch.is_tensor(value):  # the 16-bit module's values (frozen, tied, buffers): 1 ulp
            rtol = 1e-5 if file.split(os.sep)[0] in trained else 1e-2
            torch.testing.assert_close(got[file], value, rtol=rtol, atol=1e-7, msg=file)
        elif file != "optimizer_state.pt":
            assert got[file] == value, file
    assert got["optimizer_state.pt"] == want["optimizer_state.pt"]  # steps, groups, version
    assert sorted(os.listdir(ours)) == sorted(os.listdir(committed))
    # the model files: counters, scheduler, world sizes, client state, shapes, the module
    from zero.checkpoint_deepspeed import load_file

    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        a, b = (load_file(os.path.join(root, name)) for root in (committed, ours))
        assert a.keys() == b.keys() and a["module"].keys() == b["module"].keys(), name
        for key, value in a["module"].items():
            if bf16:
                assert relative_error(b["module"][key].float(), value.float()) < 3e-2, key
            else:
                torch.testing.assert_close(b["module"][key], value, rtol=1e-2, atol=1e-7,
                                           msg=key)
        assert {k: v for k, v in a.items() if k != "module"} == \
            {k: v for k, v in b.items() if k != "module"}, name
    assert {"global_steps", "skipped_steps", "dp_world_size", "mp_world_size",
            "lr_scheduler"} <= set(a)  # what DeepSpeed's load reads


def _zero_resumes(rank, world, name, load_dir, universal):
    """zero at DeepSpeed's world size and stage of run `name` loads `load_dir` and trains on."""
    import zero
    from zero.compat.deepspeed import utils

    zero_run = run.ZERO_TO_DEEPSPEED[name]
    spec = run.RUNS[zero_run.run]
    config = run.config(spec, world, zero_run.deepspeed_stage)
    if universal:
        config["checkpoint"] = {"load_universal": True}
    engine, _, _, _ = zero.initialize(model=run.make_model(spec), config=config)
    _, client_state = engine.load_checkpoint(load_dir)
    counters = (engine.global_steps, engine.global_samples)
    lr = engine.optimizer.param_groups[0]["lr"]
    seen = engine.module.seen_steps.clone()
    losses = run.train(engine, rank, world, run.SAVED_AT, run.MORE)
    engine.save_checkpoint(load_dir + "-after")
    if rank != 0:
        return None
    return {"losses": losses, "counters": counters, "lr": lr, "seen_steps": seen,
            "client_state": {k: client_state.get(k) for k in run.CLIENT_STATE},
            "fp32": utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(
                load_dir + "-after")}


@pytest.mark.parametrize("name", sorted(run.ZERO_TO_DEEPSPEED))
def test_deepspeed_resumed_zeros_run_as_zero_resumes_it(zero_checkpoints, tmp_path, name):
    """The real DeepSpeed's continuation from zero's conversion (recorded) is zero's own
    continuation from its checkpoint, and from the conversion."""
    import shutil

    zero_run = run.ZERO_TO_DEEPSPEED[name]
    deepspeed = torch.load(os.path.join(run.FIXTURES, name, "expected.pt"), weights_only=True)
    shutil.copytree(os.path.join(run.FIXTURES, name), tmp_path / "universal")
    results = [run_distributed(_zero_resumes, zero_run.deepspeed_world,
                               args=(name, load_dir, universal), timeout=120)[0]
               for load_dir, universal in ((zero_checkpoints[name], False),
                                           (str(tmp_path / "universal"), True))]
    own, from_universal = results
    bf16 = run.RUNS[zero_run.run].precision == "bf16"
    at_save = {f.split(os.sep)[0]: v for f, v in universal_values(
        os.path.join(run.FIXTURES, name, f"{TAG}_universal")).items() if f.endswith("fp32.pt")}
    # the weights (DeepSpeed's universal load leaves the buffer, a step count, at its start)
    weights = {k: v for k, v in deepspeed["fp32_after"].items() if k != "seen_steps"}
    moved = max((v - at_save[k].view_as(v)).abs().max().item() for k, v in weights.items())
    for result in results:
        assert result["losses"] == pytest.approx(deepspeed["losses"], rel=1e-4 if bf16 else 1e-5)
        assert result["counters"] == deepspeed["counters"]
        assert result["lr"] == pytest.approx(deepspeed["lr"])
        assert result["client_state"] == deepspeed["client_state"]
        difference = max((result["fp32"][k] - v).abs().max().item() for k, v in weights.items())
        assert difference < (0.1 * moved if bf16 else 1e-5), (difference, moved)
    if bf16:  # the committed conversion was saved on another machine's bf16 kernels
        assert own["losses"] == pytest.approx(from_universal["losses"], rel=1e-4)
    else:
        assert own["losses"] == from_universal["losses"]
    # zero's load restores the module's buffers too (DeepSpeed's universal load does not)
    assert own["seen_steps"].item() == from_universal["seen_steps"].item() == run.SAVED_AT


def test_optimizer_groups_carry_over(tmp_path):
    """Two optimizer groups (decay and no decay) become two param_shapes groups, and zero
    resumes the conversion as it resumes the checkpoint."""
    results = run_distributed(_two_groups, 1, args=(str(tmp_path),), timeout=120)[0]
    assert results["shapes"] == results["groups"]
    assert results["from_universal"] == results["own"]


def _two_groups(rank, world, root):
    import zero
    from zero.checkpoint_deepspeed import load_file
    from zero.checkpoint_to_universal import convert

    spec = run.RUNS["stage2-fp32"]

    def engine(stage, universal=False):
        model = run.make_model(spec)
        decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
        rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
        config = run.config(spec, world, stage)
        if universal:
            config["checkpoint"] = {"load_universal": True}
        names = {id(p): n for n, p in model.named_parameters()}
        groups = [sorted(names[id(p)] for p in g) for g in (decay, rest)]
        return zero.initialize(model=model, config=config, model_parameters=[
            {"params": decay}, {"params": rest, "weight_decay": 0.0}])[0], groups

    first, groups = engine(2)
    run.train(first, rank, world, 0, run.SAVED_AT)
    first.save_checkpoint(root, tag="saved")
    convert(os.path.join(root, "saved"), os.path.join(root, "converted", "u"))
    shapes = load_file(os.path.join(root, "converted", "u", "mp_rank_00_model_states.pt"))
    losses = {}
    for key, path, universal in (("own", root, False),
                                 ("from_universal", os.path.join(root, "converted"), True)):
        resumed, _ = engine(3, universal)
        resumed.load_checkpoint(path)
        losses[key] = run.train(resumed, rank, world, run.SAVED_AT, run.MORE)
    return {**losses, "groups": groups,
            "shapes": [sorted(group) for group in shapes["param_shapes"]]}


def _command(*args: str) -> subprocess.CompletedProcess:
    """DeepSpeed's command, `python -m deepspeed.checkpoint.ds_to_universal`, on zero's alias."""
    from zero.compat.deepspeed_alias import ALIAS_PATH

    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([ALIAS_PATH, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def test_deepspeeds_command_converts_and_names_what_is_wrong(tmp_path):
    source = os.path.join(run.FIXTURES, "stage2-fp32")
    done = _command("--input_folder", os.path.join(source, TAG), "--output_folder",
                    str(tmp_path / "u"), "--num_extract_workers", "4", "--inject_missing_state")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "latest_universal").read_text() == "u"
    wrong = _command("--input_folder", source, "--output_folder", str(tmp_path / "v"))
    assert wrong.returncode == 1
    assert f"its 'latest' names {os.path.join(source, TAG)}: pass that" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    missing = _command("--input_folder", str(tmp_path / "nowhere"), "--output_folder",
                       str(tmp_path / "v"))
    assert missing.returncode == 1 and "is not a directory" in missing.stderr
    assert not (tmp_path / "v").exists()


def test_a_conversion_that_fails_leaves_the_previous_one(tmp_path, monkeypatch):
    from zero import checkpoint_to_universal

    source = os.path.join(run.FIXTURES, "stage2-fp32", TAG)
    out = str(tmp_path / "u")
    checkpoint_to_universal.convert(source, out)
    before = universal_values(out)
    save, calls = checkpoint_to_universal.files.save_torch, []

    def failing(obj, path):  # the disk fills up at the fifth file
        calls.append(path)
        if len(calls) == 5:
            raise OSError("No space left on device")
        return save(obj, path)

    monkeypatch.setattr(checkpoint_to_universal.files, "save_torch", failing)
    with pytest.raises(OSError, match="No space left"):
        checkpoint_to_universal.convert(source, out)
    assert sorted(os.listdir(tmp_path)) == ["latest_universal", "u"]  # no staging left
    after = universal_values(out)
    assert after.keys() == before.keys()
    assert all(torch.equal(after[f], v) if torch.is_tensor(v) else after[f] == v
               for f, v in before.items() if f != "optimizer_state.pt")


def test_the_output_replaces_nothing_but_an_older_conversion(tmp_path):
    import shutil

    from zero.checkpoint_to_universal import convert

    save_dir = tmp_path / "checkpoints"
    shutil.copytree(os.path.join(run.FIXTURES, "stage2-fp32"), save_dir)
    source = str(save_dir / TAG)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "keep.txt").write_text("mine")
    for output, says in ((source, "is the input checkpoint"),
                         (str(save_dir), "holds it or lies inside it"),
                         (os.path.join(source, "u"), "lies inside it"),
                         (str(notes), "exists and is not a universal checkpoint")):
        with pytest.raises(ValueError, match=says):
            convert(source, output)
    assert sorted(os.listdir(save_dir)) == sorted(os.listdir(os.path.join(run.FIXTURES,
                                                                          "stage2-fp32")))
    assert (notes / "keep.txt").read_text() == "mine"
    target = str(save_dir / f"{TAG}_universal")
    convert(source, target)
    convert(source, target)  # an older conversion is replaced
    with pytest.raises(ValueError, match="is a universal checkpoint already"):
        convert(target, str(tmp_path / "again"))


def _sgd_groups(rank, world, root):
    """SGD with momentum in the weights' group only (the biases' group keeps none)."""
    import zero

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    engine, *_ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
        "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}},
        model_parameters=[{"params": weights}, {"params": biases, "momentum": 0.0}])
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 8)).pow(2).mean())
        engine.step()
    engine.save_checkpoint(root, tag="saved")


def test_each_optimizer_group_keeps_its_own_state_arrays(tmp_path):
    from zero.checkpoint_to_universal import convert

    run_distributed(_sgd_groups, 1, args=(str(tmp_path),), timeout=60)
    out = universal_values(convert(str(tmp_path / "saved"), str(tmp_path / "u")))
    files = {name: sorted(f.split(os.sep)[1] for f in out if f.startswith(name + os.sep))
             for name in ("0.weight", "2.weight", "0.bias", "2.bias")}
    assert files["0.weight"] == files["2.weight"] == ["fp32.pt", "momentum_buffer.pt", "step.pt"]
    assert files["0.bias"] == files["2.bias"] == ["fp32.pt", "step.pt"]
    assert out["0.weight/momentum_buffer.pt"].abs().sum() > 0
