#include "bindings/bindings.h"

#include <functional>

#include "adapter/collectives.h"
#include "adapter/process_group.h"
#include "adapter/quantized_comm.h"
#include "core/block_quantizer.h"

namespace zero::bindings {
namespace {

// The Python handle of an async collective: one dropped without wait() waits in its
// destructor, without the GIL (DeleteWithoutGil).
using PendingHandle = NoGilHolder<adapter::PendingCollective>;

// Starts a collective and, unless async_op, waits for it and drops it, all without the GIL:
// c10d's gloo enqueue takes the lock its workers hold while they drop a finished work item,
// and dropping a tensor whose Python object is gone needs the GIL, so a caller holding the
// GIL can deadlock with a worker. With async_op the caller owns the handle and must wait().
py::object run(const std::function<std::unique_ptr<adapter::PendingCollective>()>& start,
               bool async_op) {
  std::unique_ptr<adapter::PendingCollective> pending;
  {
    py::gil_scoped_release no_gil;
    pending = start();
    if (!async_op) {
      pending->wait();
      pending.reset();
    }
  }
  if (async_op) return py::cast(PendingHandle(pending.release()));
  return py::none();
}

}  // namespace

void bind_collectives(py::module_& m) {
  py::enum_<adapter::CollectiveOp>(m, "CollectiveOp")
      .value("all_gather", adapter::CollectiveOp::kAllGather)
      .value("reduce_scatter", adapter::CollectiveOp::kReduceScatter)
      .value("all_reduce", adapter::CollectiveOp::kAllReduce)
      .value("broadcast", adapter::CollectiveOp::kBroadcast);

  py::class_<adapter::CollectiveRecord>(m, "CollectiveRecord")
      .def_readonly("op", &adapter::CollectiveRecord::op)
      .def_readonly("message_bytes", &adapter::CollectiveRecord::message_bytes)
      .def_readonly("latency_ms", &adapter::CollectiveRecord::latency_ms)
      .def_readonly("control", &adapter::CollectiveRecord::control)
      .def_readonly("label", &adapter::CollectiveRecord::label);

  py::class_<adapter::PendingCollective, PendingHandle>(m, "PendingCollective")
      .def("wait", &adapter::PendingCollective::wait, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("completed", &adapter::PendingCollective::completed);

  py::class_<adapter::Communicator, NoGilHolder<adapter::Communicator>>(m, "Communicator")
      .def(py::init([](const std::string& group_name) {
             return NoGilHolder<adapter::Communicator>(
                 new adapter::Communicator(adapter::resolve_group(group_name)));
           }),
           py::arg("group_name"))
      .def_property_readonly("rank", &adapter::Communicator::rank)
      .def_property_readonly("world_size", &adapter::Communicator::world_size)
      .def("stats", &adapter::Communicator::stats)
      .def("reset_stats", &adapter::Communicator::reset_stats)
      .def(
          "all_gather",
          [](adapter::Communicator& c, at::Tensor full, at::Tensor shard, bool async_op) {
            return run([&] { return c.all_gather(full, shard); }, async_op);
          },
          py::arg("full"), py::arg("shard"), py::arg("async_op") = false)
      .def(
          "reduce_scatter",
          [](adapter::Communicator& c, at::Tensor shard, at::Tensor full, const std::string& op,
             bool async_op) {
            const adapter::Reduction reduction = adapter::parse_reduction(op);
            return run([&] { return c.reduce_scatter(shard, full, reduction); }, async_op);
          },
          py::arg("shard"), py::arg("full"), py::arg("op") = "sum", py::arg("async_op") = false)
      .def(
          "all_reduce",
          [](adapter::Communicator& c, at::Tensor tensor, const std::string& op, bool async_op) {
            const adapter::Reduction reduction = adapter::parse_reduction(op);
            return run([&] { return c.all_reduce(tensor, reduction); }, async_op);
          },
          py::arg("tensor"), py::arg("op") = "sum", py::arg("async_op") = false)
      .def(
          "broadcast",
          [](adapter::Communicator& c, at::Tensor tensor, int root, bool async_op) {
            return run([&] { return c.broadcast(tensor, root); }, async_op);
          },
          py::arg("tensor"), py::arg("root"), py::arg("async_op") = false)
      .def(
          "quantized_all_gather",
          [](adapter::Communicator& c, at::Tensor full, at::Tensor shard, bool async_op) {
            return run([&] { return adapter::quantized_all_gather(c, full, shard); }, async_op);
          },
          py::arg("full"), py::arg("shard"), py::arg("async_op") = false)
      .def(
          "quantized_reduce_scatter",
          [](adapter::Communicator& c, at::Tensor shard, at::Tensor full, const std::string& op,
             bool async_op) {
            const adapter::Reduction reduction = adapter::parse_reduction(op);
            return run([&] { return adapter::quantized_reduce_scatter(c, shard, full, reduction); },
                       async_op);
          },
          py::arg("shard"), py::arg("full"), py::arg("op") = "sum", py::arg("async_op") = false);

  m.def("quantized_bytes", [](std::int64_t n) { return core::quantized_bytes(n); }, py::arg("n"),
        "Bytes of n values in the block-wise int8 code of quantized communication (ZeRO++).");
  m.def("quantize_int8", &adapter::quantize, py::arg("values"),
        "The packed int8 code of `values` (uint8, on their device): what ZeRO++ sends.");
  m.def("dequantize_int8", &adapter::dequantize, py::arg("packed"), py::arg("numel"),
        "The fp32 values a packed piece of `numel` values holds.");
}

}  // namespace zero::bindings
