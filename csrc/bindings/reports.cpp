#include "bindings/bindings.h"

#include "adapter/build_info.h"
#include "adapter/gather_schedule.h"
#include "adapter/group.h"
#include "adapter/offloaded_state.h"
#include "core/memory_registry.h"

namespace zero::bindings {

// Every value the engine reports back is one of these structs, bound field by field and read
// only: a name Python misspells is an AttributeError, and zero.boundary.as_dict turns one
// into the plain dict a JSON report needs.
void bind_reports(py::module_& m) {
  using Build = adapter::BuildInfo;
  py::class_<Build>(m, "BuildInfo")
      .def_readonly("cuda", &Build::cuda)
      .def_readonly("torch_version", &Build::torch_version)
      .def_readonly("compiler", &Build::compiler)
      .def_readonly("cxx11_abi", &Build::cxx11_abi)
      .def_readonly("io_uring", &Build::io_uring)
      .def_readonly("cpu_isa", &Build::cpu_isa)
      .def_readonly("cpu_isa_detected", &Build::cpu_isa_detected);
  m.def("build_info", &adapter::build_info,
        "How this zero._C was built and what it finds here (zero/env_report.py)");

  using Comm = adapter::CommStats;
  py::class_<Comm>(m, "CommStats")
      .def(py::init<>())
      .def_readonly("all_gather_bytes", &Comm::all_gather_bytes)
      .def_readonly("reduce_scatter_bytes", &Comm::reduce_scatter_bytes)
      .def_readonly("all_reduce_bytes", &Comm::all_reduce_bytes)
      .def_readonly("broadcast_bytes", &Comm::broadcast_bytes)
      .def_property_readonly("total_bytes", &Comm::total_bytes)
      .def_readonly("calls", &Comm::calls)
      .def_readonly("control_bytes", &Comm::control_bytes)
      .def_readonly("control_calls", &Comm::control_calls)
      .def("__add__", [](Comm a, const Comm& b) { return a += b; });

  using Usage = core::MemoryUsage;
  py::class_<Usage>(m, "MemoryUsage")
      .def_readonly("current", &Usage::current)
      .def_readonly("peak", &Usage::peak);

  using Record = core::MemoryRecord;
  py::class_<Record>(m, "MemoryRecord")
      .def_property_readonly("category",
                             [](const Record& r) { return core::category_name(r.category); })
      .def_property_readonly("location",
                             [](const Record& r) { return core::location_name(r.location); })
      .def_property_readonly("current", [](const Record& r) { return r.usage.current; })
      .def_property_readonly("peak", [](const Record& r) { return r.usage.peak; });

  using Schedule = adapter::ScheduleStats;
  py::class_<Schedule>(m, "ScheduleStats")
      .def_readonly("prefetches", &Schedule::prefetches)
      .def_readonly("gathers", &Schedule::gathers)
      .def_readonly("reuses", &Schedule::reuses)
      .def_readonly("max_inflight_seen", &Schedule::max_inflight_seen)
      .def_readonly("gathered_numel", &Schedule::gathered_numel)
      .def_readonly("peak_gathered_numel", &Schedule::peak_gathered_numel)
      .def_readonly("notice", &Schedule::notice);

  using Buckets = adapter::BucketInfo;
  py::class_<Buckets>(m, "BucketInfo")
      .def_readonly("buckets", &Buckets::buckets)
      .def_readonly("bucket_bytes", &Buckets::bucket_bytes)
      .def_readonly("max_unit_numel", &Buckets::max_unit_numel)
      .def_readonly("units", &Buckets::units);

  using Info = adapter::OffloadInfo;
  py::class_<Info>(m, "OffloadInfo")
      .def_readonly("offloaded", &Info::offloaded)
      .def_readonly("pinned", &Info::pinned)
      .def_readonly("why_not_pinned", &Info::why_not_pinned)
      .def_readonly("swap", &Info::swap)
      .def_readonly("delayed_pending", &Info::delayed_pending)
      .def_readonly("offloaded_numel", &Info::offloaded_numel)
      .def_readonly("grads_on_host", &Info::grads_on_host)
      .def_readonly("params_offloaded", &Info::params_offloaded)
      .def_readonly("why_params_not_pinned", &Info::why_params_not_pinned)
      .def_readonly("nvme_param_numel", &Info::nvme_param_numel)
      .def_readonly("param_swap", &Info::param_swap)
      .def_readonly("param_swap_reads", &Info::param_swap_reads)
      .def_readonly("param_swap_read_aheads", &Info::param_swap_read_aheads);

  using Timings = adapter::OffloadTimings;
  py::class_<Timings>(m, "OffloadTimings")
      .def_readonly("steps", &Timings::steps)
      .def_readonly("grads_in_wait_s", &Timings::grads_in_wait_s)
      .def_readonly("cpu_optimizer_s", &Timings::cpu_optimizer_s)
      .def_readonly("params_out_wait_s", &Timings::params_out_wait_s)
      .def_readonly("step_s", &Timings::step_s);

  using CopyTimings = adapter::HostCopyTimings;
  py::class_<CopyTimings>(m, "HostCopyTimings")
      .def_readonly("batches", &CopyTimings::batches)
      .def_readonly("copy_s", &CopyTimings::copy_s)
      .def_readonly("wait_s", &CopyTimings::wait_s);
}

}  // namespace zero::bindings
