#pragma once
// zero._C, bound by concern (one file each, registered by module.cpp). Bindings translate
// between Python values and the core/adapter types and hold no logic of their own.
#include <torch/csrc/utils/pybind.h>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

namespace zero::bindings {

namespace py = pybind11;

void bind_options(py::module_& m);      // options.cpp: the typed configuration
void bind_planner(py::module_& m);      // planner.cpp: flat buffers, layouts, partitions
void bind_memory(py::module_& m);       // memory.cpp: the accounting registry, tracked buffers
void bind_collectives(py::module_& m);  // collectives.cpp: Communicator, PendingCollective
void bind_engine(py::module_& m);       // engine.cpp: EngineCore
void bind_reports(py::module_& m);      // reports.cpp: what the engine reports back

// Deletes a bound object without the GIL. An object that owns a process group (Communicator,
// EngineCore) may hold its last reference once Python has destroyed the group, and
// ~ProcessGroupGloo joins workers that may be dropping a finished work item's tensors, which
// takes the GIL when their Python objects are gone: deleting under the GIL deadlocks. The
// same holds for a PendingCollective, whose destructor waits for its collective.
template <class T>
struct DeleteWithoutGil {
  void operator()(T* object) const {
    if (PyGILState_Check() == 0) {  // already released (a C++ owner let go)
      delete object;
      return;
    }
    py::gil_scoped_release no_gil;
    delete object;
  }
};
template <class T>
using NoGilHolder = std::unique_ptr<T, DeleteWithoutGil<T>>;

}  // namespace zero::bindings
