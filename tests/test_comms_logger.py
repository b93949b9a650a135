"""comms_logger: every collective the engine issues, with its size and bandwidth, summarised as
DeepSpeed's log_summary does; the payload of one step against the ZeRO formulas (2 ranks)."""
import contextlib
import io

import pytest

import training
from distributed_harness import run_distributed
from zero.boundary import as_dict

pytestmark = pytest.mark.timeout(180)

WORLD = 2


def _step_logged(rank, world, stage, logger=None, call_summary=False, zero_extra=None):
    """One warm-up step, then one logged step; the summary and what the engine counted."""
    import zero
    import zero.compat.deepspeed as deepspeed

    zero_extra = dict(zero_extra or {})
    if stage == 3:
        zero_extra["stage3_param_persistence_threshold"] = 0
    config = training.engine_config(stage, gas=1, **zero_extra)
    config["comms_logger"] = {"enabled": True, **(logger or {})}
    engine, *_ = zero.initialize(model=training.make_model(), config=config)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        training.train_engine(engine, rank, world, 1, 1)
        engine.watch.log_comms(print_log=False)  # the warm-up step's records, then forget them
        engine.watch.comms.reset_data()
        engine.core.reset_comm_stats()
        training.train_engine(engine, rank, world, 1, 1, first_step=1)
        if call_summary:
            summary = deepspeed.comm.log_summary(show_straggler=True, return_dict=True)
        else:
            summary = engine.watch.log_comms(print_log=False, return_dict=True)
        result = {"summary": summary["summary"], "straggler": summary["straggler_analysis"],
                  "payload": dict(engine.watch.comms.payload_bytes),
                  "stats": as_dict(engine.core.comm_stats()),
                  "psi": sum(engine.core.group_numel(g) for g in range(engine.core.group_count))}
        engine.destroy()
    result["stdout"] = out.getvalue()
    return result


def _bytes(summary, op):
    return sum(size * row["count"] for size, row in summary.get(op, {}).items())


@pytest.mark.parametrize("stage", [1, 2])
def test_a_stage_1_or_2_step_logs_psi_reduce_scattered_and_psi_gathered(stage):
    for result in run_distributed(_step_logged, WORLD, args=(stage,)):
        psi_bytes = 4 * result["psi"]  # fp32
        assert _bytes(result["summary"], "reduce_scatter_tensor") == psi_bytes
        assert _bytes(result["summary"], "all_gather_into_tensor") == psi_bytes


def test_a_stage_3_step_that_keeps_the_model_gathered_logs_psi_gathered_and_psi_reduced():
    # the defaults (max live and reuse distance 1e9) keep this small model's units gathered
    # from their forward to their backward: one gather of each per step
    for result in run_distributed(_step_logged, WORLD, args=(3,)):
        psi_bytes = 4 * result["psi"]
        assert _bytes(result["summary"], "all_gather_into_tensor") == psi_bytes
        assert _bytes(result["summary"], "reduce_scatter_tensor") == psi_bytes


def test_a_stage_3_step_without_reuse_logs_the_papers_3_psi():
    # no reuse: every unit is gathered for its forward and again for its backward (2 psi), and
    # its gradients reduce-scattered once (psi)
    knobs = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}
    for result in run_distributed(_step_logged, WORLD, args=(3, None, False, knobs)):
        psi_bytes = 4 * result["psi"]
        assert _bytes(result["summary"], "all_gather_into_tensor") == 2 * psi_bytes
        assert _bytes(result["summary"], "reduce_scatter_tensor") == psi_bytes


def test_the_logged_payload_is_what_the_engine_counted():
    for result in run_distributed(_step_logged, WORLD, args=(2,)):
        stats, payload = result["stats"], result["payload"]
        assert payload["reduce_scatter_tensor"] == stats["reduce_scatter_bytes"]
        assert payload["all_gather_into_tensor"] == stats["all_gather_bytes"]
        assert payload.get("all_reduce", 0) == stats["all_reduce_bytes"]
        assert sum(payload.values()) == stats["total_bytes"]


def test_the_summary_has_deepspeeds_fields_and_bandwidths():
    result = run_distributed(_step_logged, WORLD, args=(2,))[0]
    for sizes in result["summary"].values():
        for size, row in sizes.items():
            assert row["msg_size_bytes"] == size and row["count"] >= 1
            assert row["total_latency_ms"] > 0 and row["avg_latency_ms"] > 0
            assert row["busbw_avg_gbps"] == pytest.approx(row["tput_avg_gbps"] * (WORLD - 1) / WORLD,
                                                          rel=1e-6) or "all_reduce" in str(sizes)


def test_verbose_prints_each_collective_on_rank_0():
    ranks = run_distributed(_step_logged, WORLD, args=(2, {"verbose": True}))
    lines = [line for line in ranks[0]["stdout"].splitlines() if line.startswith("comm op: ")]
    logged = sum(row["count"] for sizes in ranks[0]["summary"].values() for row in sizes.values())
    assert len(lines) >= logged  # the warm-up step's are printed too
    assert " | time (ms): " in lines[0] and " | busbw (Gbps): " in lines[0]
    assert not [line for line in ranks[1]["stdout"].splitlines() if line.startswith("comm op: ")]


def test_prof_ops_limits_the_log_to_the_named_collectives():
    result = run_distributed(_step_logged, WORLD,
                             args=(2, {"prof_all": False, "prof_ops": ["all_gather_into_tensor"]}))[0]
    # (and the engine's own control all-gathers: the ranks' places, rank_places.h)
    assert set(result["summary"]) - {"all_gather_into_tensor (control)"} == \
        {"all_gather_into_tensor"}


def test_debug_names_what_the_engine_was_doing():
    result = run_distributed(_step_logged, WORLD, args=(2, {"debug": True}))[0]
    assert "reduce_scatter_tensor | [Caller Func: bwd_inner]" in result["summary"]
    assert "all_gather_into_tensor | [Caller Func: step]" in result["summary"]


def test_deepspeed_log_summary_prints_the_table_and_the_straggler_breakdown():
    ranks = run_distributed(_step_logged, WORLD, args=(2, None, True))
    text = ranks[0]["stdout"]
    assert "Comm. Op            Message Size        Count               Total Latency(ms)" in text
    assert "Breakdown with straggler effect" in text
    assert "Comm. Op" not in ranks[1]["stdout"]  # rank 0 prints
    assert text.count("Comm. Op ") == 2  # one table, not again at destroy (then the breakdown)
    for result in ranks:
        straggler = result["straggler"]["reduce_scatter_tensor"]
        assert all(row["total_straggler_ms"] >= 0 for row in straggler.values())
