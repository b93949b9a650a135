#include "bindings/bindings.h"

#include "adapter/flat_buffer.h"
#include "adapter/tracked_tensor.h"
#include "core/memory_registry.h"

namespace zero::bindings {

void bind_memory(py::module_& m) {
  py::class_<core::MemoryRegistry, std::shared_ptr<core::MemoryRegistry>>(m, "MemoryRegistry")
      .def(py::init<>())
      .def("usage",
           [](const core::MemoryRegistry& r, const std::string& category,
              const std::string& location) {
             return r.usage(core::parse_category(category), core::parse_location(location));
           },
           py::arg("category"), py::arg("location") = "device")
      .def("category_usage",
           [](const core::MemoryRegistry& r, const std::string& category) {
             return r.category_usage(core::parse_category(category));
           })
      .def("location_usage",
           [](const core::MemoryRegistry& r, const std::string& location) {
             return r.location_usage(core::parse_location(location));
           })
      .def("total", &core::MemoryRegistry::total)
      .def("records", &core::MemoryRegistry::records)
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

}  // namespace zero::bindings
