"""DeepSpeed's `checkpoint` config block: tag_validation compares the ranks' tags at save
("Warn", DeepSpeed's default, logs and saves under rank 0's tag; "Fail" stops every rank;
"Ignore" saves quietly), load_universal loads zero's checkpoints as usual (they load at any
world size anyway), and use_node_local_storage has each node's local rank 0 write the shared
files into its own save_dir (two "nodes" here: two ranks that both have LOCAL_RANK 0)."""
import logging
import os

import pytest
import torch

import training
from distributed_harness import run_distributed

TIMEOUT = 60
BASE = {"train_micro_batch_size_per_gpu": 1}


# ---- the schema ----------------------------------------------------------------------------

@pytest.mark.parametrize("given,resolved", [(None, "Warn"), ("Warn", "Warn"), ("warn", "Warn"),
                                            ("IGNORE", "Ignore"), ("Fail", "Fail")])
def test_tag_validation_values_are_deepspeeds_case_insensitive(given, resolved):
    from zero.config import load_config

    block = {} if given is None else {"tag_validation": given}
    assert load_config({**BASE, "checkpoint": block}, 1).checkpoint.tag_validation == resolved


@pytest.mark.parametrize("block,named", [
    ({"tag_validation": "Strict"}, 'checkpoint.tag_validation = "Strict": must be one of'),
    ({"load_universal": "yes"}, "checkpoint.load_universal"),
    ({"use_node_local_storage": 1}, "checkpoint.use_node_local_storage"),
    ({"checkpoint_serialization": False}, "checkpoint.checkpoint_serialization"),
    ({"writer": {"type": "fast"}}, "checkpoint.writer"),
    ({"parallel_write": {"pipeline_stage": True}}, "checkpoint.parallel_write"),
])
def test_bad_checkpoint_values_are_named(block, named):
    from zero.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace("(", r"\(")):
        load_config({**BASE, "checkpoint": block}, 1)


def test_the_other_keys_are_accepted_at_deepspeeds_defaults():
    from zero.config import load_config

    config = load_config({**BASE, "checkpoint": {
        "load_universal": True, "use_node_local_storage": True, "checkpoint_serialization": True,
        "writer": None, "parallel_write": {"pipeline_stage": False}}}, 1)
    assert config.checkpoint.load_universal and config.checkpoint.use_node_local_storage


# ---- tag_validation ------------------------------------------------------------------------

def _engine(checkpoint=None, gas=1):
    import zero

    config = training.engine_config(2, gas=gas, scheduler=False)
    if checkpoint is not None:
        config["checkpoint"] = checkpoint
    engine, _, _, _ = zero.initialize(model=training.make_model(), config=config)
    return engine


def _save_with_rank_tags(rank, world, root):
    """Per mode: each rank passes its own tag; what happened on this rank."""
    from zero.checkpoint import CheckpointError

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("zero").addHandler(handler)
    outcome = {}
    for mode in ("Warn", "Ignore", "Fail", None):  # None: no checkpoint block (DeepSpeed's Warn)
        save_dir = f"{root}/{mode}"
        engine = _engine(None if mode is None else {"tag_validation": mode})
        training.train_engine(engine, rank, world, 1, 1)
        del records[:]
        try:
            engine.save_checkpoint(save_dir, tag=f"rank{rank}")
            error = None
        except CheckpointError as raised:
            error = str(raised)
        loaded = None
        if error is None:  # the checkpoint is whole: it loads back
            path, _ = engine.load_checkpoint(save_dir)
            loaded = os.path.basename(path), engine.global_steps
        warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING
                    and "different tags" in r.getMessage()]
        outcome[mode] = error, warnings, loaded
        engine.destroy()
    return outcome


@pytest.fixture(scope="module")
def rank_tags(tmp_path_factory):
    root = tmp_path_factory.mktemp("tags")
    return root, run_distributed(_save_with_rank_tags, 2, args=(str(root),), timeout=TIMEOUT)


@pytest.mark.parametrize("mode", ["Warn", None])
def test_warn_logs_the_ranks_tags_and_saves_under_rank_0s(rank_tags, mode):
    root, outcomes = rank_tags
    (error0, warnings0, loaded0), (error1, warnings1, loaded1) = (o[mode] for o in outcomes)
    assert error0 is None and error1 is None
    assert loaded0 == loaded1 == ("rank0", 1)
    assert len(warnings0) == 1 and warnings1 == []  # logged once, on rank 0
    assert "rank 0: 'rank0'; rank 1: 'rank1'" in warnings0[0]
    assert "saving under rank 0's tag 'rank0'" in warnings0[0]
    assert sorted(os.listdir(root / str(mode))) == ["latest", "rank0", "zero_to_fp32.py"]


def test_ignore_saves_under_rank_0s_tag_quietly(rank_tags):
    root, outcomes = rank_tags
    for error, warnings, loaded in (o["Ignore"] for o in outcomes):
        assert error is None and warnings == [] and loaded == ("rank0", 1)


def test_fail_stops_every_rank_naming_the_tags_and_saves_nothing(rank_tags):
    root, outcomes = rank_tags
    for error, _, loaded in (o["Fail"] for o in outcomes):
        assert error is not None and loaded is None
        assert "different tags (rank 0: 'rank0'; rank 1: 'rank1')" in error
        assert "nothing was saved" in error and 'tag_validation is "Fail"' in error
    assert not (root / "Fail").exists()


# ---- use_node_local_storage and load_universal ---------------------------------------------

NODE_LOCAL = {"use_node_local_storage": True}


def _save_per_node(rank, world, root):
    """Two simulated nodes (LOCAL_RANK 0 on both), each with its own save_dir: save after 2
    steps, go on 2 more (the uninterrupted losses); then a save into one directory both see."""
    from zero.checkpoint import CheckpointError

    engine = _engine(NODE_LOCAL, gas=2)
    training.train_engine(engine, rank, world, 2, 2)
    engine.save_checkpoint(f"{root}/node{rank}")
    weights = {k: v.clone() for k, v in engine.module_state_dict().items()}
    losses = training.train_engine(engine, rank, world, 2, 2, first_step=2)
    try:
        engine.save_checkpoint(f"{root}/shared")
        shared_error = None
    except CheckpointError as error:
        shared_error = str(error)
    return losses, weights, shared_error


def _resume_per_node(rank, world, root):
    engine = _engine(NODE_LOCAL, gas=2)
    path, _ = engine.load_checkpoint(f"{root}/node{rank}")
    assert engine.global_steps == 2 and path == f"{root}/node{rank}/global_step2"
    return training.train_engine(engine, rank, world, 2, 2, first_step=2)


def _load_at_1_rank(rank, world, root, universal_dir):
    """One node's copy lacks the other node's shard: named before anything loads. Then
    load_universal: a checkpoint saved at 2 ranks loads here as usual."""
    from zero.checkpoint import CheckpointError

    engine = _engine(NODE_LOCAL, gas=4)
    before = {k: v.clone() for k, v in engine.module_state_dict().items()}
    try:
        engine.load_checkpoint(f"{root}/node0")
        message = None
    except CheckpointError as error:
        message = str(error)
    after = engine.module_state_dict()
    untouched = all(torch.equal(before[k], after[k]) for k in before) and engine.global_steps == 0
    engine.destroy()

    engine = _engine({"load_universal": True}, gas=2)
    path, _ = engine.load_checkpoint(universal_dir)
    return message, untouched, os.path.basename(path), engine.global_steps, \
        {k: v.clone() for k, v in engine.module_state_dict().items()}


def test_node_local_storage_each_node_writes_and_resumes_from_its_own_copy(tmp_path, rank_tags):
    root = tmp_path
    node = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}  # every rank is its node's first
    saved = run_distributed(_save_per_node, 2, args=(str(root),), env=node, timeout=TIMEOUT)
    for rank in (0, 1):
        tag_dir = root / f"node{rank}" / "global_step2"
        assert sorted(os.listdir(tag_dir)) == sorted(
            ["manifest.json", "model_states.pt", f"zero_rank{rank}_optim_states.pt"])
        assert (root / f"node{rank}" / "latest").read_text() == "global_step2"
        assert (root / f"node{rank}" / "zero_to_fp32.py").is_file()
        # the shared directory: both "nodes" saw it, every rank says so, nothing was written
        shared_error = saved[rank][2]
        assert shared_error is not None and "use_node_local_storage is true but" in shared_error
        assert "ranks 0 and 1" in shared_error and "nothing was saved" in shared_error
    assert not (root / "shared" / "latest").exists()
    assert [name for name in os.listdir(root / "shared") if not name.startswith(".zero-node")] == []

    resumed = run_distributed(_resume_per_node, 2, args=(str(root),), env=node, timeout=TIMEOUT)
    assert resumed[0] == pytest.approx(saved[0][0], rel=1e-6)

    # at another world size node 0's copy lacks rank 1's shard; load_universal loads as usual
    universal_dir = rank_tags[0] / "Warn"
    message, untouched, tag, steps, weights = run_distributed(
        _load_at_1_rank, 1, args=(str(root), str(universal_dir)), timeout=TIMEOUT)[0]
    assert message is not None and "zero_rank1_optim_states.pt" in message
    assert "nothing was loaded" in message and "copy every node's" in message
    assert untouched
    assert (tag, steps) == ("rank0", 1)
    expected = torch.load(universal_dir / "rank0" / "model_states.pt", weights_only=False)["module"]
    assert all(torch.equal(weights[k], expected[k]) for k in expected)


def _save_on_one_node(rank, world, root):
    engine = _engine(NODE_LOCAL)
    training.train_engine(engine, rank, world, 1, 1)
    engine.save_checkpoint(root)
    engine.load_checkpoint(root)
    return engine.global_steps


def test_node_local_storage_on_one_node_saves_as_usual(tmp_path):
    # LOCAL_RANK 0 and 1: one node, so rank 0 writes the shared files as without the key
    assert run_distributed(_save_on_one_node, 2, args=(str(tmp_path),), timeout=TIMEOUT) == [1, 1]
    assert sorted(os.listdir(tmp_path / "global_step1")) == sorted(
        ["manifest.json", "model_states.pt", "zero_rank0_optim_states.pt",
         "zero_rank1_optim_states.pt"])
