"""`deepspeed.comm` (zero/compat/deepspeed/comm.py) as DeepSpeed scripts call it: every public
function of DeepSpeed 0.19.8's deepspeed/comm/comm.py that is not about DeepSpeed's own backends
or clusters, with DeepSpeed's arguments (prof, log_name, debug included), on 2 ranks against
the values torch.distributed gives."""
import inspect

import pytest
import torch

from distributed_harness import run_distributed

pytestmark = pytest.mark.timeout(120)

# deepspeed/comm/comm.py's public functions (DeepSpeed 0.19.8, its pip sdist) as written: each
# parameter with its default ("debug=": DeepSpeed's is the caller's name, zero's None), but for
# the backend and cluster plumbing; init_distributed is zero's own (tests/test_launcher.py).
DEEPSPEED = {
    "all_gather": "tensor_list tensor group=None async_op=False prof=False log_name='all_gather' "
        "debug=",
    "all_gather_coalesced": "output_tensors input_tensors group=None async_op=False",
    "all_gather_into_tensor": "output_tensor tensor group=None async_op=False prof=False "
        "log_name='all_gather_into_tensor' debug=",
    "all_gather_object": "object_list obj group=None prof=False log_name='all_gather_object' "
        "debug=",
    "all_reduce": "tensor op=ReduceOp.SUM group=None async_op=False prof=False "
        "log_name='all_reduce' debug=",
    "all_reduce_coalesced": "tensors op=ReduceOp.SUM group=None async_op=False prof=False "
        "log_name='all_reduce' debug=",
    "all_to_all": "output_tensor_list input_tensor_list group=None async_op=False prof=False "
        "log_name='all_to_all' debug=",
    "all_to_all_single": "output tensor output_split_sizes=None input_split_sizes=None "
        "group=None async_op=False prof=False log_name='all_to_all_single' debug=",
    "allgather_fn": "output_tensor input_tensor group=None async_op=False debug=",
    "barrier": "group=None async_op=False device_ids=None prof=False log_name='barrier' debug=",
    "batch_isend_irecv": "p2p_op_list prof=False log_name='batch_isend_irecv' debug=",
    "broadcast": "tensor src group=None async_op=False prof=False log_name='broadcast' debug=",
    "broadcast_object_list": "object_list src group=None device=None prof=False "
        "log_name='broadcast_object_list' debug=",
    "configure": "deepspeed_config=None enabled=None prof_all=None prof_ops=None verbose=None "
        "debug=",
    "destroy_process_group": "group=None",
    "gather": "tensor gather_list=None dst=0 group=None async_op=False prof=False "
        "log_name='gather' debug=",
    "get_all_ranks_from_group": "group=None",
    "get_comm_operation_count": "",
    "get_global_rank": "group=None group_rank=0",
    "get_local_rank": "",
    "get_logged_comm_ops": "",
    "get_rank": "group=None",
    "get_world_group": "",
    "get_world_size": "group=None",
    "has_all_gather_into_tensor": "",
    "has_all_reduce_coalesced": "",
    "has_coalescing_manager": "",
    "has_comm_data": "",
    "has_reduce_scatter_tensor": "",
    "inference_all_reduce": "tensor op=ReduceOp.SUM group=None async_op=False prof=False "
        "log_name='all_reduce' debug=",
    "initialize_mesh_device": "mesh_shape mesh_dim_names",
    "irecv": "tensor src=None group=None tag=0 prof=False log_name='irecv' debug=",
    "is_available": "",
    "is_initialized": "",
    "isend": "tensor dst group=None tag=0 prof=False log_name='isend' debug=",
    "log_summary": "show_straggler=False return_dict=False",
    "monitored_barrier": "group=None timeout=None wait_all_ranks=False prof=False "
        "log_name='monitored_barrier' debug=",
    "new_group": "ranks",
    "recv": "tensor src=None group=None tag=0 prof=False log_name='recv' debug=",
    "reduce": "tensor dst op=ReduceOp.SUM group=None async_op=False prof=False log_name='reduce' "
        "debug=",
    "reduce_scatter": "output input_list op=ReduceOp.SUM group=None async_op=False prof=False "
        "log_name='reduce_scatter' debug=",
    "reduce_scatter_fn": "output_tensor tensor op=ReduceOp.SUM group=None async_op=False "
        "prof=False debug=",
    "reduce_scatter_tensor": "output_tensor tensor op=ReduceOp.SUM group=None async_op=False "
        "prof=False log_name='reduce_scatter_tensor' debug=",
    "reset_log": "",
    "scatter": "tensor scatter_list=None src=0 group=None async_op=False prof=False "
        "log_name='scatter' debug=",
    "send": "tensor dst group=None tag=0 prof=False log_name='send' debug=",
}


def _written(function) -> str:
    """`function`'s parameters as DEEPSPEED writes them."""
    from torch.distributed import ReduceOp

    def one(parameter):
        if parameter.default is inspect.Parameter.empty:
            return parameter.name
        if parameter.name == "debug":
            return "debug="
        default = "ReduceOp.SUM" if parameter.default is ReduceOp.SUM else repr(parameter.default)
        return f"{parameter.name}={default}"
    return " ".join(one(p) for p in inspect.signature(function).parameters.values())


def test_every_function_a_script_calls_is_there_with_deepspeeds_parameters():
    from zero.compat.deepspeed import comm

    for name, parameters in DEEPSPEED.items():
        assert callable(getattr(comm, name, None)), name
        assert _written(getattr(comm, name)) == parameters, name
    assert "init_distributed" in comm.__all__ and set(DEEPSPEED) <= set(comm.__all__)


def test_a_script_annotating_with_deepspeeds_process_group_imports():
    """DeepSpeed's own Ulysses code names `dist.ProcessGroup` in its signatures."""
    namespace = {}
    exec("from zero.compat.deepspeed import comm as dist\n"
         "def all_to_all(x, group: dist.ProcessGroup = None):\n    return x\n", namespace)
    assert namespace["all_to_all"].__annotations__["group"] is torch.distributed.ProcessGroup


def _collectives(rank, world):
    from zero.compat.deepspeed import comm as dist

    got = {"rank": dist.get_rank(), "world": dist.get_world_size(),
           "ranks": dist.get_all_ranks_from_group(), "global": dist.get_global_rank(None, 1)}
    mine = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
    t = mine.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM, prof=True, log_name="loss", debug="f")
    got["all_reduce"] = t.tolist()
    t = mine.clone()
    dist.inference_all_reduce(t)
    got["inference_all_reduce"] = t.tolist()
    out = torch.zeros(2 * world)
    dist.all_gather_into_tensor(out, mine, async_op=True, prof=True).wait()
    got["all_gather_into_tensor"] = out.tolist()
    out = torch.zeros(2 * world)
    dist.allgather_fn(out, mine)
    got["allgather_fn"] = out.tolist()
    parts = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(parts, mine)
    got["all_gather"] = [p.tolist() for p in parts]
    shard = torch.zeros(1)
    dist.reduce_scatter_tensor(shard, mine, op=dist.ReduceOp.SUM)
    got["reduce_scatter_tensor"] = shard.tolist()
    shard = torch.zeros(1)
    dist.reduce_scatter_fn(shard, mine)
    got["reduce_scatter_fn"] = shard.tolist()
    shard = torch.zeros(1)
    dist.reduce_scatter(shard, list(mine.chunk(world)))
    got["reduce_scatter"] = shard.tolist()
    tensors = [mine.clone(), mine[:1].clone() * 3]
    dist.all_reduce_coalesced(tensors, async_op=True).wait()
    got["all_reduce_coalesced"] = [t.tolist() for t in tensors]
    outs = [torch.zeros(2 * world), torch.zeros(world)]
    handle = dist.all_gather_coalesced(outs, [mine, mine[1:]], async_op=True)
    handle.wait()
    got["all_gather_coalesced"] = [o.tolist() for o in outs]
    received = torch.zeros(2)
    dist.all_to_all_single(received, mine)
    got["all_to_all_single"] = received.tolist()
    pieces = [torch.zeros(1) for _ in range(world)]
    dist.all_to_all(pieces, list(mine.chunk(world)))
    got["all_to_all"] = [p.item() for p in pieces]
    t = mine.clone()
    dist.broadcast(t, 1, log_name="weights")
    got["broadcast"] = t.tolist()
    t = mine.clone()
    dist.reduce(t, 0)
    got["reduce"] = t.tolist()
    gathered = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    dist.gather(mine, gathered, dst=0)
    got["gather"] = [g.tolist() for g in gathered] if rank == 0 else None
    t = torch.zeros(2)
    dist.scatter(t, [torch.full((2,), 7.0 + r) for r in range(world)] if rank == 0 else None,
                 src=0)
    got["scatter"] = t.tolist()
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    got["all_gather_object"] = objects
    listed = [f"from {rank}"]
    dist.broadcast_object_list(listed, 1)
    got["broadcast_object_list"] = listed
    t = mine.clone()
    if rank == 0:
        dist.send(t, 1)
        dist.isend(t * 2, 1).wait()
    else:
        dist.recv(t, 0)
        second = torch.zeros(2)
        dist.irecv(second, 0).wait()
        got["irecv"] = second.tolist()
    got["send"] = t.tolist()
    outgoing, incoming = mine * 5, torch.zeros(2)
    peer = 1 - rank
    for handle in dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, peer),
                                          dist.P2POp(dist.irecv, incoming, peer)]):
        handle.wait()
    got["batch_isend_irecv"] = incoming.tolist()
    pair = dist.new_group([0, 1])
    t = mine.clone()
    dist.all_reduce(t, group=pair)
    got["new_group"] = t.tolist()
    got["pair"] = (dist.get_all_ranks_from_group(pair), dist.get_global_rank(pair, 1),
                   dist.get_world_size(pair), dist.get_rank(pair))
    dist.barrier(prof=True)
    dist.monitored_barrier()
    got["world_group"] = dist.get_world_group() is torch.distributed.group.WORLD
    got["has"] = [dist.is_available(), dist.is_initialized(), dist.has_all_gather_into_tensor(),
                  dist.has_reduce_scatter_tensor()]
    return got


def test_the_collectives_give_torch_distributeds_values_on_two_ranks():
    both = run_distributed(_collectives, 2)
    one, two = [1.0, 10.0], [2.0, 20.0]
    for rank, got in enumerate(both):
        assert (got["rank"], got["world"], got["ranks"], got["global"]) == (rank, 2, [0, 1], 1)
        for name in ("all_reduce", "inference_all_reduce", "new_group"):
            assert got[name] == [3.0, 30.0], name
        for name in ("all_gather_into_tensor", "allgather_fn"):
            assert got[name] == one + two, name
        assert got["all_gather"] == [one, two]
        for name in ("reduce_scatter_tensor", "reduce_scatter_fn", "reduce_scatter"):
            assert got[name] == [[3.0], [30.0]][rank], name
        assert got["all_reduce_coalesced"] == [[3.0, 30.0], [9.0]]
        assert got["all_gather_coalesced"] == [one + two, [10.0, 20.0]]
        assert got["all_to_all_single"] == [[1.0, 2.0], [10.0, 20.0]][rank]
        assert got["all_to_all"] == [[1.0, 2.0], [10.0, 20.0]][rank]
        assert got["broadcast"] == two
        assert got["scatter"] == [7.0 + rank] * 2
        assert got["all_gather_object"] == [{"rank": 0}, {"rank": 1}]
        assert got["broadcast_object_list"] == ["from 1"]
        assert got["send"] == one  # rank 1 received rank 0's
        assert got["world_group"] and got["has"] == [True] * 4
        assert got["pair"] == ([0, 1], 1, 2, rank)
        assert got["batch_isend_irecv"] == [[10.0, 100.0], [5.0, 50.0]][rank]  # the peer's
    assert both[0]["reduce"] == [3.0, 30.0] and both[0]["gather"] == [one, two]
    assert both[1]["irecv"] == [2.0, 20.0]


def _logged(rank, world):
    import training
    import zero
    from zero.compat.deepspeed import comm as dist

    config = training.engine_config(2, gas=1)
    config["comms_logger"] = {"enabled": True, "prof_all": True}
    engine, *_ = zero.initialize(model=training.make_model(), config=config)
    before = dist.has_comm_data()
    training.train_engine(engine, rank, world, 1, 1)
    after = (dist.has_comm_data(), dist.get_comm_operation_count(), dist.get_logged_comm_ops())
    dist.reset_log()
    cleared = (dist.has_comm_data(), dist.get_comm_operation_count())
    engine.destroy()
    return before, after, cleared


def test_the_logged_collectives_are_the_engines():
    for before, (has, count, ops), cleared in run_distributed(_logged, 2):
        assert not before and has and count > 0
        assert {"reduce_scatter_tensor", "all_gather_into_tensor"} <= set(ops)
        assert cleared == (False, 0)
