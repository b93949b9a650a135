// The module zero._C: one exception translation, then each concern's bindings.
#include "bindings/bindings.h"

#include "adapter/cpu_adam_op.h"

using namespace zero;
using namespace zero::bindings;

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
  bind_options(m);
  bind_planner(m);
  bind_memory(m);
  bind_collectives(m);
  bind_engine(m);
  bind_reports(m);
  m.def("cpu_adam_step", &adapter::cpu_adam_step, py::arg("params"), py::arg("grads"),
        py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("lr"), py::arg("beta1"),
        py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("adamw_mode"),
        py::arg("bias_correction"), py::arg("step"), py::arg("grad_scale"),
        py::arg("out16") = py::none(), py::arg("isa") = "auto", py::arg("num_threads") = 1,
        py::call_guard<py::gil_scoped_release>(),
        "Fused CPU Adam/AdamW step on a flat fp32 shard, in place (csrc/adapter/cpu_adam_op.h)");
}

