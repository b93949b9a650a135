// The only translation unit that includes the Python binding headers. Everything here is a
// thin translation between Python values and the core/adapter types.
#include <torch/extension.h>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "core/memory_registry.h"
#include "core/partition_plan.h"
#include "core/sharded_layout.h"
#include "adapter/collectives.h"
#include "adapter/cpu_adam_op.h"
#include "adapter/dtype_map.h"
#include "adapter/engine_core.h"
#include "adapter/backward_hooks.h"
#include "adapter/stage3_group.h"
#include "adapter/flat_buffer.h"
#include "adapter/process_group.h"
#include "adapter/tracked_tensor.h"

namespace py = pybind11;
using namespace zero;

namespace {

std::vector<core::TensorSpec> to_specs(const std::vector<std::vector<std::int64_t>>& shapes,
                                       const std::vector<std::string>& dtypes) {
  TORCH_CHECK_VALUE(shapes.size() == dtypes.size(), "zero: got ", shapes.size(), " shapes but ",
                    dtypes.size(), " dtypes; give one dtype per shape");
  std::vector<core::TensorSpec> specs;
  specs.reserve(shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    specs.push_back({shapes[i], core::parse_dtype(dtypes[i])});
  }
  return specs;
}

py::dict usage_dict(const core::MemoryUsage& usage) {
  py::dict out;
  out["current"] = usage.current;
  out["peak"] = usage.peak;
  return out;
}

py::dict stats_dict(const adapter::CommStats& stats) {
  py::dict out;
  out["all_gather_bytes"] = stats.all_gather_bytes;
  out["reduce_scatter_bytes"] = stats.reduce_scatter_bytes;
  out["all_reduce_bytes"] = stats.all_reduce_bytes;
  out["broadcast_bytes"] = stats.broadcast_bytes;
  out["total_bytes"] = stats.total_bytes();
  out["calls"] = stats.calls;
  out["control_bytes"] = stats.control_bytes;
  out["control_calls"] = stats.control_calls;
  return out;
}

// Runs a collective; waits (without the GIL) unless async_op, in which case the caller
// owns the handle and must wait() on it.
py::object finish(std::unique_ptr<adapter::PendingCollective> pending, bool async_op) {
  if (async_op) return py::cast(std::move(pending));
  {
    py::gil_scoped_release no_gil;
    pending->wait();
  }
  return py::none();
}

void bind_planner(py::module_& m) {
  py::class_<core::ParamSlot>(m, "ParamSlot")
      .def_readonly("offset", &core::ParamSlot::offset)
      .def_readonly("numel", &core::ParamSlot::numel)
      .def_readonly("shape", &core::ParamSlot::shape);
  py::class_<core::OwnedSlice>(m, "OwnedSlice")
      .def_readonly("rank", &core::OwnedSlice::rank)
      .def_readonly("param_begin", &core::OwnedSlice::param_begin)
      .def_readonly("param_end", &core::OwnedSlice::param_end)
      .def_readonly("shard_offset", &core::OwnedSlice::shard_offset);
  py::class_<core::FlatBufferPlan>(m, "FlatBufferPlan")
      .def_property_readonly("dtype", [](const core::FlatBufferPlan& p) {
        return adapter::to_scalar_type(p.dtype());
      })
      .def_property_readonly("world_size", &core::FlatBufferPlan::world_size)
      .def_property_readonly("alignment", &core::FlatBufferPlan::alignment)
      .def_property_readonly("numel", &core::FlatBufferPlan::numel)
      .def_property_readonly("used_numel", &core::FlatBufferPlan::used_numel)
      .def_property_readonly("shard_numel", &core::FlatBufferPlan::shard_numel)
      .def_property_readonly("bytes", &core::FlatBufferPlan::bytes)
      .def_property_readonly("params", &core::FlatBufferPlan::params)
      .def("shard_range", [](const core::FlatBufferPlan& p, int rank) {
        const auto range = p.shard_range(rank);
        return py::make_tuple(range.begin, range.end);
      })
      .def("owned_slices", &core::FlatBufferPlan::owned_slices, py::arg("param_index"))
      .def("slices_owned_by", &core::FlatBufferPlan::slices_owned_by, py::arg("rank"));
  py::class_<core::ParamLocation>(m, "ParamLocation")
      .def_readonly("buffer", &core::ParamLocation::buffer)
      .def_readonly("index", &core::ParamLocation::index);
  py::class_<core::PartitionPlan>(m, "PartitionPlan")
      .def_readonly("buffers", &core::PartitionPlan::buffers)
      .def_readonly("locations", &core::PartitionPlan::locations);

  m.def(
      "plan_flat_buffer",
      [](const std::vector<std::vector<std::int64_t>>& shapes, const std::string& dtype,
         int world_size, std::int64_t alignment) {
        return core::plan_flat_buffer(
            to_specs(shapes, std::vector<std::string>(shapes.size(), dtype)), world_size,
            alignment);
      },
      py::arg("shapes"), py::arg("dtype"), py::arg("world_size"), py::arg("alignment") = 1);
  py::class_<core::ShardedLayout>(m, "ShardedLayout")
      .def(py::init([](const std::vector<std::vector<std::int64_t>>& shapes,
                       const std::string& dtype, int world_size, std::int64_t alignment,
                       std::int64_t unit_numel) {
             return core::ShardedLayout(
                 to_specs(shapes, std::vector<std::string>(shapes.size(), dtype)), world_size,
                 alignment, unit_numel);
           }),
           py::arg("shapes"), py::arg("dtype"), py::arg("world_size"), py::arg("alignment"),
           py::arg("unit_numel"))
      .def_property_readonly("world_size", &core::ShardedLayout::world_size)
      .def_property_readonly("unit_count", &core::ShardedLayout::unit_count)
      .def_property_readonly("full_numel", &core::ShardedLayout::full_numel)
      .def_property_readonly("shard_numel", &core::ShardedLayout::shard_numel)
      .def_property_readonly("max_unit_numel", &core::ShardedLayout::max_unit_numel)
      .def("unit", &core::ShardedLayout::unit, py::arg("index"))
      .def("full_offset", &core::ShardedLayout::full_offset, py::arg("unit"))
      .def("shard_offset", &core::ShardedLayout::shard_offset, py::arg("unit"))
      .def("param_offset", &core::ShardedLayout::param_offset, py::arg("param"));
  m.def(
      "plan_partition",
      [](const std::vector<std::vector<std::int64_t>>& shapes,
         const std::vector<std::string>& dtypes, const std::vector<std::size_t>& buffer_of_param,
         int world_size, std::int64_t alignment) {
        return core::plan_partition(to_specs(shapes, dtypes), buffer_of_param, world_size,
                                    alignment);
      },
      py::arg("shapes"), py::arg("dtypes"), py::arg("buffer_of_param"), py::arg("world_size"),
      py::arg("alignment") = 1);
}

void bind_memory(py::module_& m) {
  py::class_<core::MemoryRegistry, std::shared_ptr<core::MemoryRegistry>>(m, "MemoryRegistry")
      .def(py::init<>())
      .def("usage",
           [](const core::MemoryRegistry& r, const std::string& category,
              const std::string& location) {
             return usage_dict(
                 r.usage(core::parse_category(category), core::parse_location(location)));
           },
           py::arg("category"), py::arg("location") = "device")
      .def("category_usage",
           [](const core::MemoryRegistry& r, const std::string& category) {
             return usage_dict(r.category_usage(core::parse_category(category)));
           })
      .def("location_usage",
           [](const core::MemoryRegistry& r, const std::string& location) {
             return usage_dict(r.location_usage(core::parse_location(location)));
           })
      .def("total", [](const core::MemoryRegistry& r) { return usage_dict(r.total()); })
      .def("records",
           [](const core::MemoryRegistry& r) {
             py::list out;
             for (const auto& record : r.records()) {
               py::dict row = usage_dict(record.usage);
               row["category"] = core::category_name(record.category);
               row["location"] = core::location_name(record.location);
               out.append(row);
             }
             return out;
           })
      .def("reset_peaks", &core::MemoryRegistry::reset_peaks);

  py::class_<adapter::TrackedTensor>(m, "TrackedTensor")
      .def(py::init([](core::MemoryRegistry& registry, const std::string& category,
                       const std::string& location, std::int64_t numel, at::ScalarType dtype,
                       at::Device device) {
             return adapter::TrackedTensor(registry, core::parse_category(category),
                                           core::parse_location(location), numel,
                                           at::TensorOptions().dtype(dtype).device(device));
           }),
           py::arg("registry"), py::arg("category"), py::arg("location"), py::arg("numel"),
           py::arg("dtype"), py::arg("device"), py::keep_alive<1, 2>())
      .def_property_readonly("tensor", &adapter::TrackedTensor::tensor)
      .def_property_readonly("bytes", &adapter::TrackedTensor::bytes)
      .def("reset", &adapter::TrackedTensor::reset);

  py::class_<adapter::FlatBuffer>(m, "FlatBuffer")
      .def(py::init([](const core::FlatBufferPlan& plan, core::MemoryRegistry& registry,
                       const std::string& category, const std::string& location,
                       at::Device device) {
             return std::make_unique<adapter::FlatBuffer>(plan, registry,
                                                          core::parse_category(category),
                                                          core::parse_location(location), device);
           }),
           py::arg("plan"), py::arg("registry"), py::arg("category"), py::arg("location"),
           py::arg("device"), py::keep_alive<1, 3>())
      .def_property_readonly("data", &adapter::FlatBuffer::data)
      .def_property_readonly("bytes", &adapter::FlatBuffer::bytes)
      .def_property_readonly("plan", &adapter::FlatBuffer::plan)
      .def("shard", &adapter::FlatBuffer::shard, py::arg("rank"))
      .def("param_view", &adapter::FlatBuffer::param_view, py::arg("index"))
      .def("param_views", &adapter::FlatBuffer::param_views)
      .def("pack", &adapter::FlatBuffer::pack, py::arg("params"));

  m.def(
      "pack_shard",
      [](const core::FlatBufferPlan& plan, int rank, const std::vector<at::Tensor>& params,
         at::Tensor shard) { adapter::pack_shard(plan, rank, params, shard); },
      py::arg("plan"), py::arg("rank"), py::arg("params"), py::arg("shard"));
}

void bind_collectives(py::module_& m) {
  py::class_<adapter::PendingCollective>(m, "PendingCollective")
      .def("wait", &adapter::PendingCollective::wait, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("completed", &adapter::PendingCollective::completed);

  py::class_<adapter::Communicator>(m, "Communicator")
      .def(py::init([](const std::string& group_name) {
             return adapter::Communicator(adapter::resolve_group(group_name));
           }),
           py::arg("group_name"))
      .def_property_readonly("rank", &adapter::Communicator::rank)
      .def_property_readonly("world_size", &adapter::Communicator::world_size)
      .def("stats", [](const adapter::Communicator& c) { return stats_dict(c.stats()); })
      .def("reset_stats", &adapter::Communicator::reset_stats)
      .def(
          "all_gather",
          [](adapter::Communicator& c, at::Tensor full, at::Tensor shard, bool async_op) {
            return finish(c.all_gather(full, shard), async_op);
          },
          py::arg("full"), py::arg("shard"), py::arg("async_op") = false)
      .def(
          "reduce_scatter",
          [](adapter::Communicator& c, at::Tensor shard, at::Tensor full, const std::string& op,
             bool async_op) {
            return finish(c.reduce_scatter(shard, full, adapter::parse_reduction(op)), async_op);
          },
          py::arg("shard"), py::arg("full"), py::arg("op") = "sum", py::arg("async_op") = false)
      .def(
          "all_reduce",
          [](adapter::Communicator& c, at::Tensor tensor, const std::string& op, bool async_op) {
            return finish(c.all_reduce(tensor, adapter::parse_reduction(op)), async_op);
          },
          py::arg("tensor"), py::arg("op") = "sum", py::arg("async_op") = false)
      .def(
          "broadcast",
          [](adapter::Communicator& c, at::Tensor tensor, int root, bool async_op) {
            return finish(c.broadcast(tensor, root), async_op);
          },
          py::arg("tensor"), py::arg("root"), py::arg("async_op") = false);
}

adapter::OptimizerHyper to_hyper(const py::dict& d) {
  adapter::OptimizerHyper h;
  const std::string kind = d.contains("kind") ? d["kind"].cast<std::string>() : "adam";
  TORCH_CHECK_VALUE(kind == "adam" || kind == "sgd", "zero: optimizer kind '", kind,
                    "' is not adam or sgd");
  h.kind = kind == "adam" ? adapter::OptimizerKind::kAdam : adapter::OptimizerKind::kSgd;
  auto get = [&d](const char* key, double fallback) {
    return d.contains(key) ? d[key].cast<double>() : fallback;
  };
  h.lr = get("lr", h.lr);
  h.weight_decay = get("weight_decay", h.weight_decay);
  if (d.contains("betas")) {
    const auto betas = d["betas"].cast<std::pair<double, double>>();
    h.beta1 = betas.first;
    h.beta2 = betas.second;
  }
  h.eps = get("eps", h.eps);
  if (d.contains("decoupled_weight_decay")) h.decoupled_weight_decay = d["decoupled_weight_decay"].cast<bool>();
  if (d.contains("bias_correction")) h.bias_correction = d["bias_correction"].cast<bool>();
  h.momentum = get("momentum", h.momentum);
  h.dampening = get("dampening", h.dampening);
  if (d.contains("nesterov")) h.nesterov = d["nesterov"].cast<bool>();
  return h;
}

adapter::Stage3Group& stage3(adapter::EngineCore& e, std::size_t g) {
  auto* group = dynamic_cast<adapter::Stage3Group*>(&e.group(g));
  TORCH_CHECK(group != nullptr, "zero: group ", g, " is not a stage-3 (partitioned) group");
  return *group;
}

core::AioConfig aio_config(const py::dict& aio) {
  core::AioConfig config;
  if (aio.contains("block_size")) config.block_size = aio["block_size"].cast<std::size_t>();
  if (aio.contains("queue_depth")) config.queue_depth = aio["queue_depth"].cast<std::size_t>();
  if (aio.contains("intra_op_parallelism")) {
    config.intra_op_parallelism = aio["intra_op_parallelism"].cast<std::size_t>();
  }
  return config;
}

adapter::OffloadOptions offload_options(const py::dict& d) {
  adapter::OffloadOptions options;
  if (d.contains("enabled")) options.enabled = d["enabled"].cast<bool>();
  if (d.contains("pin_memory")) options.pin_memory = d["pin_memory"].cast<bool>();
  if (d.contains("tile_numel")) options.tile_numel = d["tile_numel"].cast<std::int64_t>();
  if (d.contains("num_threads")) options.num_threads = d["num_threads"].cast<int>();
  if (d.contains("delayed_update")) options.delayed_update = d["delayed_update"].cast<bool>();
  if (d.contains("ratio")) options.ratio = d["ratio"].cast<double>();
  if (d.contains("nvme_path") && !d["nvme_path"].is_none()) {
    options.nvme_path = d["nvme_path"].cast<std::string>();
  }
  if (d.contains("aio")) options.aio = aio_config(d["aio"].cast<py::dict>());
  if (d.contains("on_swap_write") && !d["on_swap_write"].is_none()) {
    options.on_swap_write = d["on_swap_write"].cast<std::function<void(std::int64_t)>>();
  }
  TORCH_CHECK_VALUE(options.num_threads >= 1, "zero: offload threads must be >= 1, got ",
                    options.num_threads);
  return options;
}

// offload_param: {"device": "none"|"cpu"|"nvme", "pin_memory", "nvme_path", "max_in_cpu",
// "buffer_count", "buffer_size", "aio": {...}} (the Python side validated the config).
adapter::ParamOffloadOptions param_offload_options(const py::dict& offload) {
  adapter::ParamOffloadOptions options;
  const std::string device =
      offload.contains("device") ? offload["device"].cast<std::string>() : "none";
  TORCH_CHECK_VALUE(device == "none" || device == "cpu" || device == "nvme",
                    "zero: offload_param device '", device, "' is not none, cpu or nvme");
  options.enabled = device != "none";
  if (offload.contains("pin_memory")) options.pin = offload["pin_memory"].cast<bool>();
  if (device != "nvme") return options;
  TORCH_CHECK_VALUE(offload.contains("nvme_path") && !offload["nvme_path"].is_none(),
                    "zero: offload_param device \"nvme\" needs nvme_path");
  options.nvme_path = offload["nvme_path"].cast<std::string>();
  if (offload.contains("max_in_cpu")) options.max_in_cpu = offload["max_in_cpu"].cast<std::int64_t>();
  if (offload.contains("buffer_count")) {
    options.buffer_count = offload["buffer_count"].cast<std::int64_t>();
  }
  if (offload.contains("buffer_size")) {
    options.buffer_numel = offload["buffer_size"].cast<std::int64_t>();
  }
  if (offload.contains("aio")) options.aio = aio_config(offload["aio"].cast<py::dict>());
  if (offload.contains("on_swap_write") && !offload["on_swap_write"].is_none()) {
    options.on_swap_write = offload["on_swap_write"].cast<std::function<void(std::int64_t)>>();
  }
  return options;
}

adapter::GroupOptions group_options(int stage, std::int64_t alignment, std::int64_t unit_numel,
                                    bool overlap_comm, const std::string& optimizer,
                                    bool sgd_momentum, const py::dict& offload) {
  adapter::GroupOptions options;
  options.offload = offload_options(offload);
  options.stage = stage;
  options.alignment = alignment;
  options.unit_numel = unit_numel;
  options.overlap_comm = overlap_comm;
  TORCH_CHECK_VALUE(optimizer == "adam" || optimizer == "sgd", "zero: optimizer '", optimizer,
                    "' is not adam or sgd");
  options.optimizer =
      optimizer == "adam" ? adapter::OptimizerKind::kAdam : adapter::OptimizerKind::kSgd;
  options.sgd_momentum = sgd_momentum;
  return options;
}

void bind_engine(py::module_& m) {
  py::class_<adapter::EngineCore, std::shared_ptr<adapter::EngineCore>>(m, "EngineCore")
      .def(py::init<const std::string&>(), py::arg("group_name"))
      .def(
          "add_group",
          [](adapter::EngineCore& e, std::vector<at::Tensor> params, int stage,
             std::int64_t alignment, std::int64_t unit_numel, bool overlap_comm,
             const std::string& optimizer, bool sgd_momentum, const py::dict& offload) {
            return e.add_group(std::move(params),
                               group_options(stage, alignment, unit_numel, overlap_comm,
                                             optimizer, sgd_momentum, offload));
          },
          py::arg("params"), py::arg("stage"), py::arg("alignment"), py::arg("unit_numel"),
          py::arg("overlap_comm"), py::arg("optimizer"), py::arg("sgd_momentum") = false,
          py::arg("offload") = py::dict())
      .def(
          "add_stage3_group",
          [](adapter::EngineCore& e, std::vector<at::Tensor> params,
             const std::vector<std::size_t>& unit_of_param,
             const std::vector<std::vector<std::int64_t>>& full_shapes, std::int64_t alignment,
             bool overlap_comm, const std::string& optimizer, bool sgd_momentum,
             const py::dict& offload, const py::dict& offload_param) {
            at::NoGradGuard no_grad;
            auto options =
                group_options(3, alignment, 1, overlap_comm, optimizer, sgd_momentum, offload);
            options.offload_param = param_offload_options(offload_param);
            return e.adopt_group(
                std::make_unique<adapter::Stage3Group>(std::move(params), unit_of_param,
                                                       full_shapes, options, e.registry(),
                                                       e.communicator()),
                3);
          },
          py::arg("params"), py::arg("unit_of_param"), py::arg("full_shapes"),
          py::arg("alignment"), py::arg("overlap_comm"), py::arg("optimizer"),
          py::arg("sgd_momentum") = false, py::arg("offload") = py::dict(),
          py::arg("offload_param") = py::dict())
      .def("commit", [](adapter::EngineCore& e, std::size_t g, std::size_t u) {
             at::NoGradGuard no_grad;
             stage3(e, g).commit(u);
           }, py::arg("group"), py::arg("unit"))
      .def("is_gathered", [](adapter::EngineCore& e, std::size_t g, std::size_t u) {
             return stage3(e, g).is_gathered(u);
           }, py::arg("group"), py::arg("unit"))
      .def(
          "configure_schedule",
          [](adapter::EngineCore& e, std::vector<std::string> names, std::int64_t prefetch_numel,
             std::int64_t max_live_numel, std::int64_t max_reuse_distance,
             std::int64_t max_inflight, at::Device device) {
            adapter::ScheduleOptions options;
            options.prefetch_numel = prefetch_numel;
            options.max_live_numel = max_live_numel;
            options.max_reuse_distance = max_reuse_distance;
            options.max_inflight = max_inflight;
            options.device = device;
            e.configure_schedule(std::move(names), options);
          },
          py::arg("unit_names"), py::arg("prefetch_numel"), py::arg("max_live_numel"),
          py::arg("max_reuse_distance"), py::arg("max_inflight"), py::arg("device"))
      .def("place", [](adapter::EngineCore& e, std::size_t unit, std::size_t g, std::size_t local) {
             e.schedule().place(unit, &stage3(e, g), local);
           }, py::arg("unit"), py::arg("group"), py::arg("local"))
      .def("add_external", [](adapter::EngineCore& e, std::size_t user, std::size_t owner) {
             e.schedule().add_external(user, owner);
           }, py::arg("user"), py::arg("owner"))
      .def("before_forward", [](adapter::EngineCore& e, std::size_t unit, std::int64_t step,
                                bool expects_backward) {
             at::NoGradGuard no_grad;
             py::gil_scoped_release no_gil;
             e.schedule().before_forward(unit, step, expects_backward);
           }, py::arg("unit"), py::arg("step"), py::arg("expects_backward"))
      .def("after_forward", [](adapter::EngineCore& e, std::size_t unit) {
             at::NoGradGuard no_grad;
             py::gil_scoped_release no_gil;
             e.schedule().after_forward(unit);
           }, py::arg("unit"))
      .def("hold", [](adapter::EngineCore& e, std::size_t unit) {
             at::NoGradGuard no_grad;
             py::gil_scoped_release no_gil;
             e.schedule().hold(unit);
           }, py::arg("unit"))
      .def("unhold", [](adapter::EngineCore& e, std::size_t unit) {
             at::NoGradGuard no_grad;
             py::gil_scoped_release no_gil;
             e.schedule().unhold(unit);
           }, py::arg("unit"))
      .def("attach_pre_backward",
           [](const std::shared_ptr<adapter::EngineCore>& e, std::size_t unit,
              std::vector<at::Tensor> outputs) {
             return adapter::attach_pre_backward(e, unit, std::move(outputs));
           }, py::arg("unit"), py::arg("outputs"))
      .def("attach_post_backward",
           [](const std::shared_ptr<adapter::EngineCore>& e, std::size_t unit,
              std::vector<at::Tensor> inputs) {
             return adapter::attach_post_backward(e, unit, std::move(inputs));
           }, py::arg("unit"), py::arg("inputs"))
      .def("schedule_stats", [](adapter::EngineCore& e) {
             py::dict out;
             out["prefetches"] = e.schedule().prefetches();
             out["gathers"] = e.schedule().gathers();
             out["reuses"] = e.schedule().reuses();
             out["max_inflight_seen"] = e.schedule().max_inflight_seen();
             out["gathered_numel"] = e.schedule().gathered_numel();
             out["peak_gathered_numel"] = e.schedule().peak_gathered_numel();
             out["notice"] = e.schedule().notice();
             return out;
           })
      .def("gathered_numel", [](adapter::EngineCore& e, std::size_t g) {
             return stage3(e, g).gathered_numel();
           }, py::arg("group"))
      .def("prepare_backward", &adapter::EngineCore::prepare_backward, py::arg("boundary"))
      .def_property_readonly("backward_pending", &adapter::EngineCore::backward_pending)
      .def("apply_delayed_update", &adapter::EngineCore::apply_delayed_update,
           py::call_guard<py::gil_scoped_release>())
      .def("grad_ready", &adapter::EngineCore::grad_ready, py::arg("group"), py::arg("index"),
           py::arg("boundary"), py::call_guard<py::gil_scoped_release>())
      .def("finish_backward", &adapter::EngineCore::finish_backward, py::arg("boundary"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "step",
          [](adapter::EngineCore& e, const std::vector<py::dict>& hypers, double loss_scale,
             double max_norm, bool check_overflow, std::int64_t step) {
            std::vector<adapter::OptimizerHyper> converted;
            for (const auto& h : hypers) converted.push_back(to_hyper(h));
            adapter::StepResult result;
            {
              py::gil_scoped_release no_gil;
              result = e.step(converted, loss_scale, max_norm, check_overflow, step);
            }
            py::dict out;
            out["overflow"] = result.overflow;
            out["grad_norm"] = result.grad_norm;
            out["clip_coef"] = result.clip_coef;
            return out;
          },
          py::arg("hypers"), py::arg("loss_scale"), py::arg("max_norm"),
          py::arg("check_overflow"), py::arg("step"))
      .def("zero_grads", &adapter::EngineCore::zero_grads)
      .def_property_readonly("group_count", &adapter::EngineCore::group_count)
      .def_property_readonly("rank", [](adapter::EngineCore& e) { return e.communicator().rank(); })
      .def_property_readonly("world_size",
                             [](adapter::EngineCore& e) { return e.communicator().world_size(); })
      .def("registry", &adapter::EngineCore::shared_registry)
      .def("comm_stats", [](adapter::EngineCore& e) { return stats_dict(e.communicator().stats()); })
      .def("reset_comm_stats", [](adapter::EngineCore& e) { e.communicator().reset_stats(); })
      .def("group_numel",
           [](adapter::EngineCore& e, std::size_t g) { return e.group(g).layout().full_numel(); })
      .def("group_layout",
           [](adapter::EngineCore& e, std::size_t g) -> const core::ShardedLayout& {
             return e.group(g).layout();
           }, py::arg("group"), py::return_value_policy::reference_internal)
      .def("group_units",
           [](adapter::EngineCore& e, std::size_t g) { return e.group(g).layout().unit_count(); })
      .def("group_master_shard",
           [](adapter::EngineCore& e, std::size_t g) { return e.group(g).master_shard(); })
      .def("group_refresh_master",
           [](adapter::EngineCore& e, std::size_t g) {
             at::NoGradGuard no_grad;
             e.group(g).refresh_master();
           })
      .def("group_offload_info",
           [](adapter::EngineCore& e, std::size_t g) {
             const adapter::ShardState& state = e.group(g).shard_state();
             py::dict out;
             out["offloaded"] = state.offloaded();
             out["pinned"] = state.pinned();
             out["why_not_pinned"] = state.why_not_pinned();
             out["swap"] = state.swap_description();
             out["delayed_pending"] = state.delayed_pending();
             out["offloaded_numel"] = state.offloaded_numel();
             out["grads_on_host"] = e.group(g).grads_on_host();
             auto* partitioned = dynamic_cast<adapter::Stage3Group*>(&e.group(g));
             out["params_offloaded"] = partitioned != nullptr && partitioned->params_offloaded();
             out["why_params_not_pinned"] =
                 partitioned != nullptr ? partitioned->why_params_not_pinned() : "";
             out["nvme_param_numel"] = partitioned != nullptr ? partitioned->nvme_param_numel() : 0;
             out["param_swap"] =
                 partitioned != nullptr ? partitioned->param_swap_description() : "";
             out["param_swap_reads"] =
                 partitioned != nullptr ? partitioned->param_swap_reads() : 0;
             out["param_swap_read_aheads"] =
                 partitioned != nullptr ? partitioned->param_swap_read_aheads() : 0;
             return out;
           }, py::arg("group"))
      .def("group_load_optimizer_state",
           [](adapter::EngineCore& e, std::size_t g, const std::string& name,
              const at::Tensor& values) {
             at::NoGradGuard no_grad;
             e.group(g).load_optimizer_state(name, values);
           }, py::arg("group"), py::arg("name"), py::arg("values"))
      .def("group_load_master_shard",
           [](adapter::EngineCore& e, std::size_t g, const at::Tensor& saved) {
             at::NoGradGuard no_grad;
             e.group(g).load_master_shard(saved);
           })
      .def("group_optimizer_state",
           [](adapter::EngineCore& e, std::size_t g) {
             py::dict out;
             for (auto& [name, tensor] : e.group(g).optimizer_state()) out[name.c_str()] = tensor;
             return out;
           })
      .def("group_bucket_info", [](adapter::EngineCore& e, std::size_t g) {
        py::dict out;
        out["buckets"] = e.group(g).bucket_count();
        out["bucket_bytes"] = e.group(g).bucket_bytes();
        out["max_unit_numel"] = e.group(g).layout().max_unit_numel();
        out["units"] = e.group(g).layout().unit_count();
        return out;
      });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "zero: C++ core of the ZeRO memory engine";
  // c10::Error carries a C++ backtrace in what(); users get the message alone.
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const c10::ValueError& error) {
      PyErr_SetString(PyExc_ValueError, error.what_without_backtrace());
    } catch (const c10::IndexError& error) {
      PyErr_SetString(PyExc_IndexError, error.what_without_backtrace());
    } catch (const c10::Error& error) {
      PyErr_SetString(PyExc_RuntimeError, error.what_without_backtrace());
    }
  });
#ifdef ZERO_WITH_CUDA
  m.attr("cuda_build") = true;
#else
  m.attr("cuda_build") = false;
#endif
  bind_planner(m);
  bind_memory(m);
  bind_collectives(m);
  bind_engine(m);
  m.def("cpu_adam_step", &adapter::cpu_adam_step, py::arg("params"), py::arg("grads"),
        py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("lr"), py::arg("beta1"),
        py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("adamw_mode"),
        py::arg("bias_correction"), py::arg("step"), py::arg("grad_scale"),
        py::arg("out16") = py::none(), py::arg("isa") = "auto", py::arg("num_threads") = 1,
        py::call_guard<py::gil_scoped_release>(),
        "Fused CPU Adam/AdamW step on a flat fp32 shard, in place (csrc/adapter/cpu_adam_op.h)");
}
