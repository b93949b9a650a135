"""Checkpoints survive crashes and corruption: a kill at any instant of save_checkpoint
(re-saving the same tag, as real scripts do with tag="latest_model") leaves `latest` loadable;
a flipped byte or a missing rank file is named on load, on every rank, before anything loads."""
import os
import shutil

import pytest

import training
from distributed_harness import RankFailed, run_distributed

TAG = "latest_model"
TIMEOUT = 30
# Filesystem operations a save makes; the crash test dies at the n-th of them on one rank.
OPERATIONS = [("os", "makedirs"), ("os", "replace"), ("os", "fsync"), ("shutil", "rmtree"),
              ("os", "open")]


def _engine():
    import zero

    config = training.engine_config(2, gas=1, scheduler=False)
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    return engine


def _first_save(rank, world, save_dir):
    engine = _engine()
    training.train_engine(engine, rank, world, 2, 1)
    engine.save_checkpoint(save_dir, tag=TAG)
    return engine.global_steps


def _die_at(operation: int) -> None:
    """Makes this process exit (as if killed) at its operation-th filesystem call."""
    import importlib

    calls = [0]
    for module_name, name in OPERATIONS:
        module = importlib.import_module(module_name)
        original = getattr(module, name)

        def counted(*args, _original=original, **kwargs):
            calls[0] += 1
            if calls[0] == operation:
                os._exit(137)
            return _original(*args, **kwargs)
        setattr(module, name, counted)


def _resave_and_die(rank, world, save_dir, crash_rank, operation):
    engine = _engine()
    engine.load_checkpoint(save_dir)
    training.train_engine(engine, rank, world, 1, 1, first_step=engine.global_steps)
    if rank == crash_rank:
        _die_at(operation)
    engine.save_checkpoint(save_dir, tag=TAG)
    return "finished"


def _load_and_step(rank, world, save_dir):
    """Loads `latest`, trains a step, saves the same tag again and loads that back."""
    engine = _engine()
    path, _ = engine.load_checkpoint(save_dir)
    loaded = engine.global_steps
    training.train_engine(engine, rank, world, 1, 1, first_step=loaded)
    engine.save_checkpoint(save_dir, tag=TAG)
    engine.load_checkpoint(save_dir)
    return loaded, path is not None and engine.global_steps == loaded + 1


def test_a_kill_at_any_instant_of_a_save_leaves_latest_loadable(tmp_path):
    template = tmp_path / "template"
    assert run_distributed(_first_save, 2, args=(str(template),), timeout=TIMEOUT) == [2, 2]
    killed_at = {0: [], 1: []}
    for crash_rank in (0, 1):
        for operation in range(1, 40):
            save_dir = tmp_path / f"rank{crash_rank}_op{operation}"
            shutil.copytree(template, save_dir)
            try:
                outcome = run_distributed(_resave_and_die, 2, timeout=TIMEOUT,
                                          args=(str(save_dir), crash_rank, operation))
            except RankFailed:
                outcome = None  # killed mid-save, as intended
                killed_at[crash_rank].append(operation)
            for loaded, found in run_distributed(_load_and_step, 2, args=(str(save_dir),),
                                                 timeout=TIMEOUT):
                assert found and loaded in (2, 3), (crash_rank, operation, loaded)
            if outcome == ["finished", "finished"]:
                break  # past the save's last operation on this rank
        else:
            pytest.fail(f"the save on rank {crash_rank} made more than 40 operations")
    # rank 0 writes, publishes and updates latest; rank 1 writes its shard
    assert len(killed_at[0]) >= 10 and len(killed_at[1]) >= 2, killed_at


def _load_expecting_error(rank, world, save_dir):
    from zero.checkpoint import CheckpointError

    engine = _engine()
    try:
        engine.load_checkpoint(save_dir)
    except CheckpointError as error:
        return str(error)
    return None


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "manifest"])
def test_a_damaged_rank_file_is_named_on_every_rank_and_nothing_loads(tmp_path, damage):
    assert run_distributed(_first_save, 2, args=(str(tmp_path),), timeout=TIMEOUT) == [2, 2]
    victim = tmp_path / TAG / "zero_rank1_optim_states.pt"
    if damage == "manifest":  # the file that verifies the others (a JSONDecodeError, unnamed)
        victim = tmp_path / TAG / "manifest.json"
    data = victim.read_bytes()
    if damage == "flip":
        middle = len(data) // 2
        victim.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    elif damage in ("truncate", "manifest"):
        victim.write_bytes(data[:-100])
    else:
        victim.unlink()
    for message in run_distributed(_load_expecting_error, 2, args=(str(tmp_path),),
                                   timeout=TIMEOUT):
        assert message is not None and "rank 1" in message
        assert victim.name in message and "nothing was loaded" in message


def _damage(tag_dir, damage: str) -> None:
    """Damages rank 1's file: removed, a byte flipped, cut short, or rewritten (manifest
    updated to match) in a format version no zero reads yet."""
    import hashlib
    import json

    import torch

    victim = tag_dir / "zero_rank1_optim_states.pt"
    data = victim.read_bytes()
    if damage == "remove":
        victim.unlink()
    elif damage == "flip":
        middle = len(data) // 2
        victim.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    elif damage == "truncate":
        victim.write_bytes(data[:-100])
    else:
        shard = torch.load(victim, weights_only=False)
        shard["format_version"] = 99
        torch.save(shard, victim)
        manifest = json.loads((tag_dir / "manifest.json").read_text())
        data = victim.read_bytes()
        manifest[victim.name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (tag_dir / "manifest.json").write_text(json.dumps(manifest))


def _engine_state(engine) -> dict:
    """Everything a load writes into the engine: weights, this rank's fp32 master and
    optimizer state, counters."""
    core = engine.core
    state = {f"module.{k}": v.clone() for k, v in engine.module_state_dict().items()}
    for g in range(core.group_count):
        state[f"master.{g}"] = core.group_master_shard(g).clone()
        for name, value in core.group_optimizer_state(g).items():
            state[f"state.{g}.{name}"] = value.clone()
    state["global_steps"] = engine.global_steps
    return state


def _load_expecting_error_untouched(rank, world, save_dir):
    import torch

    from zero.checkpoint import CheckpointError

    engine = _engine()
    before = _engine_state(engine)
    try:
        engine.load_checkpoint(save_dir)
    except CheckpointError as error:
        after = _engine_state(engine)
        changed = [k for k in before if not (torch.equal(before[k], after[k])
                                             if isinstance(before[k], torch.Tensor)
                                             else before[k] == after[k])]
        return str(error), changed
    return None, None


@pytest.mark.parametrize("damage,loaded_world", [("remove", 1), ("flip", 1), ("version", 1),
                                                 ("truncate", 3), ("version", 2)])
def test_a_damaged_rank_file_at_another_world_size_is_named_before_anything_loads(
        tmp_path, damage, loaded_world):
    # At another world size every rank reads every saved rank's file: all of them are checked
    # (present, manifest, format version) before the weights go in, so nothing is half-loaded.
    assert run_distributed(_first_save, 2, args=(str(tmp_path),), timeout=TIMEOUT) == [2, 2]
    _damage(tmp_path / TAG, damage)
    for message, changed in run_distributed(_load_expecting_error_untouched, loaded_world,
                                            args=(str(tmp_path),), timeout=TIMEOUT):
        assert message is not None and "zero_rank1_optim_states.pt" in message
        assert "nothing was loaded" in message
        if damage == "version":
            assert "checkpoint format 99" in message
        assert changed == []


def _nested_tags(rank, world, save_dir):
    engine = _engine()
    training.train_engine(engine, rank, world, 1, 1)
    engine.save_checkpoint(save_dir, tag="run1/step1")
    training.train_engine(engine, rank, world, 1, 1, first_step=1)
    engine.save_checkpoint(save_dir, tag="run1/step1/")  # re-saved: the old copy retired beside
    path, _ = engine.load_checkpoint(save_dir)  # `latest` names "run1/step1"
    refused = []
    for bad in ("../elsewhere", "/abs/tag", "run1/../../elsewhere", "run1/../step1"):
        try:
            engine.save_checkpoint(save_dir, tag=bad)
        except ValueError as error:
            refused.append(str(error))
    return path, engine.global_steps, refused


def test_a_nested_tag_saves_resaves_and_loads_and_a_tag_outside_the_directory_is_named(tmp_path):
    """DeepSpeed scripts may save under "run/step" tags; its staging and retired copies stay
    beside it (run1/.step1.tmp), so publishing finds its parent directory."""
    for path, steps, refused in run_distributed(_nested_tags, 2, args=(str(tmp_path),),
                                                timeout=TIMEOUT):
        assert path == os.path.join(str(tmp_path), "run1", "step1") and steps == 2
        assert len(refused) == 4 and "../elsewhere" in refused[0] and "relative" in refused[0]
    assert sorted(os.listdir(tmp_path / "run1")) == ["step1"]  # nothing left beside it
    assert not (tmp_path / "elsewhere").exists() and not os.path.exists("/abs/tag")


def _load_disagreeing(rank, world, save_dir, empty_dir):
    """Rank 1 asks for another tag, then finds no `latest` (its own, empty directory), then
    every rank finds none."""
    from zero.checkpoint import CheckpointError

    engine = _engine()
    messages = []
    for load_dir, tag in ((save_dir, "step1" if rank == 0 else "step2"),
                          (save_dir if rank == 0 else empty_dir, None)):
        try:
            engine.load_checkpoint(load_dir, tag=tag)
            messages.append("loaded")
        except CheckpointError as error:
            messages.append(str(error))
    return messages, engine.load_checkpoint(empty_dir), engine.global_steps


def _two_tags(rank, world, save_dir):
    engine = _engine()
    for step in (1, 2):
        training.train_engine(engine, rank, world, 1, 1, first_step=step - 1)
        engine.save_checkpoint(save_dir, tag=f"step{step}")


def test_ranks_asking_for_different_checkpoints_are_refused_on_every_rank(tmp_path):
    """Each rank read its own tag or `latest` and loaded it (different weights on each, exit
    0), or returned (None, None) without `latest` while the others waited in the load."""
    save_dir, empty = str(tmp_path / "run"), str(tmp_path / "empty")
    os.makedirs(empty)
    run_distributed(_two_tags, 2, args=(save_dir,), timeout=TIMEOUT)
    for messages, nothing, steps in run_distributed(_load_disagreeing, 2,
                                                    args=(save_dir, empty), timeout=TIMEOUT):
        assert "rank 0: 'step1'; rank 1: 'step2'" in messages[0], messages[0]
        assert "rank 0: 'step2'; rank 1: no latest file" in messages[1], messages[1]
        assert nothing == (None, None) and steps == 0


def _save_failing_on_rank_1(rank, world, save_dir):
    import torch

    from zero.checkpoint import CheckpointError

    engine = _engine()
    training.train_engine(engine, rank, world, 1, 1)
    if rank == 1:  # its shard cannot be written (a full disk, say)
        torch.save = lambda *args, **kwargs: (_ for _ in ()).throw(OSError(28, "No space left"))
    try:
        engine.save_checkpoint(save_dir, tag="step1")
    except CheckpointError as error:
        return str(error)
    return "saved"


def test_a_failed_save_leaves_no_unfinished_copy_behind(tmp_path):
    """The staging directory of a save that failed stayed, holding the space a full disk
    needed for the next save."""
    for message in run_distributed(_save_failing_on_rank_1, 2, args=(str(tmp_path),),
                                   timeout=TIMEOUT):
        assert "rank 1: OSError" in message and "untouched" in message, message
    assert os.listdir(tmp_path) == []


def _save_to_own_directory(rank, world, root):
    from zero.checkpoint import CheckpointError

    engine = _engine()
    training.train_engine(engine, rank, world, 1, 1)
    try:
        engine.save_checkpoint(os.path.join(root, f"run_{rank}"), tag="step1")
    except CheckpointError as error:
        return str(error)
    return "saved"


def test_ranks_saving_into_different_directories_are_refused_on_every_rank(tmp_path):
    """Each rank wrote its part into its own directory: a FileNotFoundError for a partial file
    in another rank's staging directory, or (DeepSpeed) a checkpoint that fails at load."""
    for message in run_distributed(_save_to_own_directory, 2, args=(str(tmp_path),),
                                   timeout=TIMEOUT):
        assert "different directories" in message and "run_0" in message and \
            "run_1" in message, message
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("tag", ["latest", "latest/", "latest_universal", "zero_to_fp32.py",
                                 "run1/step1.partial", ".gs.tmp", "run1/.gs.old/"])
def test_a_tag_naming_a_file_of_the_checkpoint_directory_is_refused(tag):
    """Saved under tag "latest" the checkpoint took the place of the `latest` file (publishing
    it then failed, IsADirectoryError) and the next load started from nothing; a tag
    "zero_to_fp32.py" retired the recovery script as if it were an older copy."""
    from zero.checkpoint import RECOVERY_SCRIPT
    from zero.checkpoint_files import LATEST, RESERVED_NAMES, checked_tag
    from zero.checkpoint_universal import LATEST_UNIVERSAL

    assert {LATEST, LATEST_UNIVERSAL, RECOVERY_SCRIPT} <= set(RESERVED_NAMES)
    with pytest.raises(ValueError, match="a name the checkpoint directory uses itself"):
        checked_tag(tag)
    assert checked_tag("run1/latest") == os.path.join("run1", "latest")  # nested: no clash
