#include "bindings/bindings.h"

#include "adapter/dtype_map.h"
#include "adapter/schedule_simulation.h"
#include "core/partition_plan.h"
#include "core/sharded_layout.h"

namespace zero::bindings {
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

}  // namespace

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

  using Simulation = adapter::ScheduleSimulation;
  py::class_<Simulation>(m, "ScheduleSimulation")
      .def_readonly("peak_numel", &Simulation::peak_numel)
      .def_readonly("live_at_peak", &Simulation::live_at_peak)
      .def_readonly("first_peak_numel", &Simulation::first_peak_numel)
      .def_readonly("gathers", &Simulation::gathers)
      .def_readonly("gathered_numel", &Simulation::gathered_numel)
      .def_readonly("prefetches", &Simulation::prefetches)
      .def_readonly("reuses", &Simulation::reuses)
      .def_readonly("peak_inflight_numel", &Simulation::peak_inflight_numel)
      .def_readonly("inflight_at_peak", &Simulation::inflight_at_peak);
  m.def("simulate_schedule", &adapter::simulate_schedule, py::arg("unit_numel"),
        py::arg("options"), py::arg("externals") = std::vector<std::pair<std::size_t, std::size_t>>{},
        py::arg("parents") = std::vector<std::size_t>{},
        "The engine's stage-3 gather schedule run on unit sizes (csrc/adapter/schedule_simulation.h)");
}

}  // namespace zero::bindings
