"""zero-mem: estimate, tune and render the engine's memory.

    zero-mem estimate --model zero.models.tiny_gpt:TinyGPT --world-size 8 --precision bf16
    zero-mem estimate --params 7B --world-size 64 --num-nodes 8 --config ds_config.json --json
    zero-mem tune --model pkg.mod:build --world-size 2 --budget 2GiB --out cfg.json
    zero-mem tune --model pkg.mod:build --world-size 8 --budget 16GiB --host-budget 200GiB \
                  --nvme-path /local_nvme --out cfg.json
    zero-mem estimate --model pkg.mod:pipe_layers --world-size 8 --pipeline-stages 2 \
                      --tensor-parallel 2
    zero-mem report runs/ --png memory.png --table

(also `python -m zero.reports.cli ...`). Exit codes: 0 done, 2 bad input, 3 tune found no
built configuration that fits. See docs/MEMORY.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

from ..parallel import sequence
from . import activations
from . import estimate as est
from . import render, table, tuner


def _count(text):
    try:
        return est.parse_count(text)
    except est.EstimateError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _size(text):
    try:
        return est.parse_bytes(text)
    except est.EstimateError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="MODULE:FACTORY",
                        help="import path of a callable returning the nn.Module (built on the "
                             "meta device: nothing is allocated); exact")
    source.add_argument("--params", type=_count, metavar="N",
                        help="parameter count (e.g. 7B, 350M); approximate: stands in "
                             "tensors of --tensor-numel elements for the real shapes")
    source.add_argument("--hf-config", metavar="CONFIG_JSON",
                        help="a Hugging Face config.json (needs `transformers`, not required "
                             "by zero)")
    parser.add_argument("--sample-input", action="append", default=[], metavar="SHAPE:DTYPE",
                        help="one positional input of a micro-batch, e.g. 4x128:int64 (repeat "
                             "for more inputs); with --model or --hf-config, the activations "
                             "autograd keeps for backward are estimated on the meta device")
    parser.add_argument("--tensor-numel", type=_count, metavar="T",
                        help="with --params: elements per stand-in tensor (default: "
                             "min(N, reduce_bucket_size))")
    parser.add_argument("--units", type=int, metavar="K",
                        help="with --params: assume K stage-3 gather units of equal size (e.g. "
                             "the transformer blocks); default: every stand-in tensor is one")
    parser.add_argument("--config", metavar="DS_CONFIG_JSON",
                        help="DeepSpeed-style config: stage, precision, optimizer, "
                             "reduce_bucket_size, overlap_comm (flags below override it)")
    parser.add_argument("--stage", type=int, choices=(0, 1, 2, 3))
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks in all (default: $WORLD_SIZE or 1); with pipeline stages "
                             "or tensor parallelism pipe x data x tensor")
    parser.add_argument("--num-nodes", type=int, default=1,
                        help="nodes the ranks are spread over (per-node = per-rank x "
                             "world-size / num-nodes)")
    parser.add_argument("--precision", choices=est.PRECISIONS)
    parser.add_argument("--sixteen-bit-master", action=argparse.BooleanOptionalAction,
                        default=None,
                        help="bf16/fp16 precision: the parameters are the master "
                             "(bf16_master_weights_and_grads; default off or the config's)")
    parser.add_argument("--sixteen-bit-states", action=argparse.BooleanOptionalAction,
                        default=None,
                        help="with --sixteen-bit-master: the optimizer state in the 16-bit "
                             "dtype too (bf16_optimizer_states; default off or the config's)")
    parser.add_argument("--fp32-grads", action=argparse.BooleanOptionalAction, default=None,
                        help="bf16/fp16 precision: gradients accumulate in fp32 buffers "
                             "(data_types.grad_accum_dtype \"fp32\"; default off or the "
                             "config's)")
    parser.add_argument("--optimizer", choices=est.OPTIMIZERS,
                        help="adam, lamb (8 bytes/element of state), sgd_momentum, adagrad, lion (4), "
                             "sgd (0); "
                             "default adam or the config's")
    parser.add_argument("--reduce-bucket-size", type=_count, metavar="ELEMENTS")
    parser.add_argument("--gradient-accumulation-steps", type=_count, metavar="STEPS",
                        help="micro-steps per step (default: the config's, else 1; with 1, "
                             "stage 1 shards its gradients as stage 2 does)")
    parser.add_argument("--overlap-comm", action=argparse.BooleanOptionalAction, default=None,
                        help="two reduce buckets instead of one (default: the config's, else "
                             "DeepSpeed's: on at stage 3 only)")
    stage3 = parser.add_argument_group("stage 3 (default: the config's, else the schema's)")
    stage3.add_argument("--persistence-threshold", type=_count, metavar="ELEMENTS",
                        help="stage3_param_persistence_threshold: parameters this small stay "
                             "whole (default 1e5)")
    stage3.add_argument("--prefetch-bucket-size", type=_count, metavar="ELEMENTS",
                        help="stage3_prefetch_bucket_size (default 5e7)")
    stage3.add_argument("--max-live-parameters", type=_count, metavar="ELEMENTS",
                        help="stage3_max_live_parameters (default 1e9)")
    stage3.add_argument("--max-reuse-distance", type=_count, metavar="ELEMENTS",
                        help="stage3_max_reuse_distance (default 1e9)")
    stage3.add_argument("--max-inflight-gathers", type=int, metavar="K",
                        help="stage3_max_inflight_gathers (default 2)")
    offload = parser.add_argument_group("offload (default: the config's, else none)")
    offload.add_argument("--offload-optimizer", choices=est.OFFLOAD_DEVICES,
                         help="where the fp32 master and optimizer state live: the row the "
                              "estimate marks (every option is listed anyway)")
    offload.add_argument("--offload-param", choices=est.OFFLOAD_DEVICES,
                         help="stage 3: where the parameter shard lives (nvme: with --config for "
                              "buffer_count, buffer_size, max_in_cpu)")
    offload.add_argument("--sub-group-size", type=_count, metavar="ELEMENTS",
                         help="elements per chunk of the offloaded step (capped at 4,194,304 and "
                              "the shard; default 1e9)")
    offload.add_argument("--offload-ratio", type=float, metavar="R",
                         help="offload_optimizer.ratio: the fraction of each shard whose state "
                              "and step are offloaded (default 1)")
    offload.add_argument("--cpu-only", action="store_true", default=None,
                         help="training runs on the CPU: device and host bytes share the RAM "
                              "(tune: offload to the host saves nothing; NVMe does), and the "
                              "offloaded step updates the model in place, without staging")
    offload.add_argument("--delayed-update", action=argparse.BooleanOptionalAction, default=None,
                         help="offload_optimizer.delayed_update (cpu): the host also keeps the "
                              "shard's gradients and new parameters")
    offload.add_argument("--grads-on-device", action=argparse.BooleanOptionalAction,
                         default=None,
                         help="offload_optimizer.grads_on_device: stages 2-3 keep the gradient "
                              "shard on the device, not in host memory")


def _setup(args) -> tuple[est.Setup, int | None, dict | None]:
    world = args.world_size or int(os.environ.get("WORLD_SIZE", "1"))
    overrides = dict(precision=args.precision, optimizer=args.optimizer,
                     sixteen_bit_master=args.sixteen_bit_master,
                     sixteen_bit_states=args.sixteen_bit_states, fp32_grads=args.fp32_grads,
                     reduce_bucket_size=args.reduce_bucket_size, overlap_comm=args.overlap_comm,
                     gradient_accumulation_steps=args.gradient_accumulation_steps,
                     persistence_threshold=args.persistence_threshold,
                     prefetch_bucket_size=args.prefetch_bucket_size,
                     max_live_parameters=args.max_live_parameters,
                     max_reuse_distance=args.max_reuse_distance,
                     max_inflight_gathers=args.max_inflight_gathers,
                     offload_optimizer=args.offload_optimizer, offload_param=args.offload_param,
                     sub_group_size=args.sub_group_size, delayed_update=args.delayed_update,
                     offload_ratio=args.offload_ratio, grads_on_device=args.grads_on_device,
                     cpu_only=args.cpu_only)
    base = None
    if args.config:
        with open(args.config, encoding="utf-8") as handle:
            base = json.load(handle)
        autotp_alone = _tensor_size(args, base) > 1 and \
            (getattr(args, "pipeline_stages", 1) or 1) == 1
        setup, stage = est.setup_from_config(args.config, world, args.num_nodes, stage=args.stage,
                                             data_ranks=_data_ranks(args, world, base),
                                             all_ranks=world if autotp_alone else None,
                                             **overrides)
        return setup, stage, base
    values = {k: v for k, v in overrides.items() if v is not None}
    return est.Setup(world_size=world, num_nodes=args.num_nodes, **values), args.stage, base


def _shapes(args, setup: est.Setup) -> est.ModelShapes:
    if args.units is not None and args.params is None:
        raise est.EstimateError("--units goes with --params (a model's own gather units come "
                                "from the model)")
    if args.model:
        return est.shapes_from_factory(args.model, setup.unit_rules(), setup.expert_parallel)
    if args.hf_config:
        return est.shapes_from_hf_config(args.hf_config, setup.unit_rules(),
                                         setup.expert_parallel)
    return est.shapes_from_count(args.params, args.tensor_numel, setup.reduce_bucket_size,
                                 units=args.units)


def _activations(args, setup: est.Setup) -> dict | None:
    if not args.sample_input:
        return None
    if not (args.model or args.hf_config):
        raise est.EstimateError("--sample-input needs the model itself (--model or --hf-config), "
                                "not a parameter count")
    samples = [activations.SampleInput.parse(text) for text in args.sample_input]
    factory = (est.import_factory(args.model) if args.model
               else lambda: est.model_from_hf_config(args.hf_config, on_meta=False))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[setup.precision]
    return {"bytes": activations.estimate_activations(factory, samples, dtype),
            "sample_input": [list(s.shape) for s in samples], "dtype": str(dtype),
            "what": "tensors autograd keeps for backward at the end of one micro-batch's "
                    "forward, per rank (CPU kernels' choices, e.g. for attention)"}


def _add_mesh_arguments(parser: argparse.ArgumentParser) -> None:
    mesh = parser.add_argument_group(
        "model parallelism (each rank holds one part: a stage's layers, split linears cut to "
        "their tensor slice; its states shard over the data-parallel ranks)")
    mesh.add_argument("--pipeline-stages", type=int, default=1, metavar="P",
                      help="PipelineModule num_stages: --model must return its layer list (or "
                           "an nn.Sequential); each stage is estimated")
    mesh.add_argument("--partition-method", default="parameters",
                      help="PipelineModule partition_method: parameters, uniform or type:REGEX")
    mesh.add_argument("--tensor-parallel", type=int, default=None, metavar="T",
                      help="tensor_parallel.autotp_size (default: the config's, else 1): the "
                           "linears AutoTP splits are cut to 1/T")


def _tensor_size(args, base: dict | None) -> int:
    """--tensor-parallel, else the config's tensor_parallel.autotp_size, else 1."""
    return getattr(args, "tensor_parallel", None) or int(
        ((base or {}).get("tensor_parallel") or {}).get("autotp_size") or 1)


def _data_ranks(args, world: int, base: dict | None) -> int:
    """The data-parallel ranks a config's batch keys (and data_parallel_size) count: world /
    (pipeline stages x tensor size x sequence size); the world when those do not divide it
    (the mesh's own error names the sizes later). ZeRO still shards over every rank of a
    sequence group."""
    parts = _tensor_size(args, base) * (getattr(args, "pipeline_stages", 1) or 1) * \
        sequence.requested_size(base or {})
    return world // parts if world % parts == 0 else world


def _estimate_mesh(args, setup: est.Setup, stage: int | None, base: dict | None) -> int:
    tensor = _tensor_size(args, base)
    sizes = est.MeshSizes.of(setup.world_size, args.pipeline_stages, tensor)
    if args.params is not None or args.sample_input:
        raise est.EstimateError("--pipeline-stages / --tensor-parallel need the model's layers "
                                "(--model or --hf-config), and do not take --sample-input")
    if args.model:
        with torch.device("meta"):
            model = est.import_factory(args.model)()
        description = args.model
    else:
        model = est.model_from_hf_config(args.hf_config)
        description = type(model).__name__
    parts = est.mesh_parts(model, sizes, args.partition_method, description)
    # N = the data-parallel ranks of a part; one node: the per-node column is those ranks
    part_setup = dataclasses.replace(setup, world_size=sizes.data, num_nodes=1)
    # the options the engine builds with model parallelism: ZeRO 0-2, not 2 with layers tied
    # across stages
    estimates = [[e for e in est.estimate_all(part.shapes, part_setup)
                  if e.option.stage in part.zero_stages] for part in parts]
    if args.json:
        print(json.dumps({
            "mesh": {**sizes.to_dict(), "world_size": setup.world_size},
            "setup": part_setup.to_dict(), "selected_stage": stage,
            "parts": [{"pipeline_stage": part.stage, "layers": list(part.layers),
                       "tensor_ranks": sizes.tensor, "model": _model_dict(part.shapes),
                       "options": [e.to_dict() for e in part_estimates]}
                      for part, part_estimates in zip(parts, estimates)],
        }, indent=2, ensure_ascii=False))
        return 0
    print(f"mesh: pipe {sizes.pipe} x data {sizes.data} x tensor {sizes.tensor} = "
          f"{setup.world_size} ranks. Each part below is one pipeline stage as each of its "
          f"{sizes.tensor} tensor rank(s) holds it, sharded over its {sizes.data} data-parallel "
          f"rank(s) (N = {sizes.data}; the per-node column is those ranks together). ZeRO "
          f"stages built with model parallelism: {', '.join(map(str, parts[0].zero_stages))}")
    for part, part_estimates in zip(parts, estimates):
        print(f"\n==== pipeline stage {part.stage} of {sizes.pipe} ====")
        print(est.format_estimates(part.shapes, part_setup, part_estimates,
                                   selected_stage=stage))
    return 0


def _model_dict(shapes: est.ModelShapes) -> dict:
    return {"description": shapes.description, "exact": shapes.exact,
            "trainable_numel": shapes.trainable_numel, "frozen_numel": shapes.frozen_numel,
            "tensors": shapes.tensor_count, "largest_param_numel": shapes.largest_param_numel,
            "note": shapes.note, "stage3_units": list(shapes.unit_names)}


def cmd_estimate(args) -> int:
    setup, stage, base = _setup(args)
    if args.pipeline_stages != 1 or (args.tensor_parallel or 1) != 1 or \
            (((base or {}).get("tensor_parallel") or {}).get("autotp_size") or 0) > 1:
        return _estimate_mesh(args, setup, stage, base)
    shapes = _shapes(args, setup)
    estimates = est.estimate_all(shapes, setup)
    acts = _activations(args, setup)
    if args.json:
        print(json.dumps({
            "model": _model_dict(shapes),
            "setup": setup.to_dict(), "selected_stage": stage,
            "options": [e.to_dict() for e in estimates],
            "activations": acts,
            "not_included": ([] if acts else ["activations"]) + [
                "autograd transient gradients", "optimizer-step temporaries",
                "framework/allocator overhead"],
        }, indent=2, ensure_ascii=False))
    else:
        print(est.format_estimates(shapes, setup, estimates, selected_stage=stage))
        if acts:
            print(f"activations: {est.format_bytes(acts['bytes'])} per rank for one micro-batch "
                  f"of {acts['sample_input']} ({acts['dtype']}): {acts['what']}; add them to the "
                  "device column")
    return 0


def cmd_tune(args) -> int:
    setup, _, base = _setup(args)
    if _tensor_size(args, base) > 1:
        raise est.EstimateError("zero-mem tune does not search a mesh yet (the config sets "
                                "tensor_parallel.autotp_size): estimate each layout with "
                                "zero-mem estimate --tensor-parallel T instead")
    shapes = _shapes(args, setup)
    gas = 1
    if base is not None:
        gas = int(base.get("gradient_accumulation_steps") or 1)
    nvme_path = os.path.abspath(args.nvme_path) if args.nvme_path else None
    rec = tuner.tune(shapes, setup, args.budget, host_budget=args.host_budget,
                     reserve=args.reserve, headroom=args.headroom,
                     gradient_accumulation_steps=gas, nvme_path=nvme_path,
                     nvme_budget=args.nvme_budget, offload=not args.no_offload,
                     partial=not args.no_partial_offload)
    if not args.cpu_only and not torch.cuda.is_available():
        rec.notes.append("this machine has no CUDA device: if the run trains on its CPU, pass "
                         "--cpu-only (device and host bytes then share the RAM, and only NVMe "
                         "offload saves memory)")
    config = notes = None
    if rec.chosen is not None:
        config, notes = tuner.recommended_config(rec, setup, base, micro_batch=args.micro_batch)
        rec.notes.extend(notes)
    if args.json:
        print(json.dumps({**rec.to_dict(), "config": config}, indent=2, ensure_ascii=False))
    else:
        print(tuner.format_recommendation(rec, setup))
    if config is not None and args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(tuner.dump_config(config))
        if not args.json:
            print(f"wrote {args.out}")
    return 0 if rec.chosen is not None else 3


def cmd_report(args) -> int:
    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else None
    loaded = render.load(args.paths, run=args.run, ranks=ranks)
    for warning in loaded.warnings:
        print(f"zero-mem: {warning}", file=sys.stderr)
    if args.table or not args.png:
        print(table.format_table(loaded.last_reports()))
    if args.png:
        render.plot(loaded.series, args.png)
        print(f"wrote {args.png}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zero-mem", description="Memory of the zero engine: estimate it before training, "
        "tune a config to a budget, render what a run measured.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("estimate", help="per-rank and per-node bytes by category and location "
                       "(device, host, NVMe), stages 0-3 and offload")
    _add_model_arguments(p)
    _add_mesh_arguments(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=cmd_estimate)

    p = sub.add_parser("tune", help="the config that fits a budget with the least offload, "
                       "then the least communication")
    _add_model_arguments(p)
    p.add_argument("--budget", type=_size, required=True,
                   help="memory per device (per rank), e.g. 2GiB, 40GB")
    p.add_argument("--host-budget", type=_size,
                   help="host RAM per node the offload options may use (default: not checked)")
    p.add_argument("--nvme-path", metavar="DIR",
                   help="a directory on NVMe: lets the tuner recommend optimizer offload to "
                        "NVMe (written as offload_optimizer.nvme_path)")
    p.add_argument("--nvme-budget", type=_size,
                   help="NVMe bytes per node the swap files may use (default: not checked)")
    p.add_argument("--no-offload", action="store_true",
                   help="recommend no offload (stages 0-3 only)")
    p.add_argument("--no-partial-offload", action="store_true",
                   help="offload the whole optimizer step or none of it: skip every partial "
                        "offload (offload_optimizer.ratio < 1; zero's at stages 1-2, where "
                        "DeepSpeed ignores a ratio)")
    p.add_argument("--reserve", type=_size, default=0,
                   help="bytes of the budget kept for activations and overhead (default 0)")
    p.add_argument("--headroom", type=float, default=0.0,
                   help="fraction of the budget kept free (default 0)")
    p.add_argument("--micro-batch", type=int, default=1,
                   help="train_micro_batch_size_per_gpu of the written config when there is "
                        "no --config (otherwise the config's, unchanged)")
    p.add_argument("--out", help="write the recommended DeepSpeed JSON config here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_tune)

    p = sub.add_parser("report", help="table and PNG timeline of a run's memory reports")
    p.add_argument("paths", nargs="+", metavar="RUN_DIR_OR_JSONL",
                   help="*.rank<r>.jsonl files, or folders holding them")
    p.add_argument("--png", help="write the timeline here")
    p.add_argument("--table", action="store_true",
                   help="print the table (the default when there is no --png)")
    p.add_argument("--run", type=int, default=-1,
                   help="which run of a file several runs appended to (default -1: the last)")
    p.add_argument("--ranks", help="comma-separated ranks to show (default all)")
    p.set_defaults(handler=cmd_report)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (est.EstimateError, render.ReportError) as error:
        print(f"zero-mem {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
