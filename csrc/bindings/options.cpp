// The typed configuration Python hands C++ (built from the validated config in one place,
// zero/boundary.py). Plain structs with named fields: assigning a field that does not exist is
// an AttributeError, so a misspelled option cannot silently take a default. Each default
// that has a config key matches the schema's (tests/test_boundary.py).
#include "bindings/bindings.h"

#include "adapter/gather_schedule.h"
#include "adapter/muon.h"
#include "adapter/offloaded_state.h"
#include "adapter/optimizer_math.h"
#include "adapter/param_group.h"
#include "adapter/parked_states.h"
#include "core/dtype.h"
#include "core/io_backend.h"

namespace zero::bindings {

void bind_options(py::module_& m) {
  py::enum_<core::DType>(m, "DType")
      .value("float32", core::DType::kFloat32)
      .value("bfloat16", core::DType::kBFloat16)
      .value("float16", core::DType::kFloat16)
      .value("float64", core::DType::kFloat64);

  py::enum_<adapter::OptimizerKind>(m, "OptimizerKind")
      .value("adam", adapter::OptimizerKind::kAdam)
      .value("sgd", adapter::OptimizerKind::kSgd)
      .value("adagrad", adapter::OptimizerKind::kAdagrad)
      .value("lion", adapter::OptimizerKind::kLion)
      .value("lamb", adapter::OptimizerKind::kLamb)
      .value("muon", adapter::OptimizerKind::kMuon)
      .value("external", adapter::OptimizerKind::kExternal);
  // The fp32 arrays a kind keeps per element, by name: the one list the estimator and the
  // memory report count (an external optimizer's come from its probe instead).
  m.def("optimizer_state_names",
        [](adapter::OptimizerKind kind, bool sgd_momentum) {
          return adapter::optimizer_state_names(kind, sgd_momentum, {});
        },
        py::arg("kind"), py::arg("sgd_momentum") = false);

  py::enum_<adapter::NsMethod>(m, "NsMethod")
      .value("gram", adapter::NsMethod::kGram)
      .value("standard", adapter::NsMethod::kStandard);

  // offload_states' kinds, under DeepSpeed's OffloadStateTypeEnum names
  py::enum_<adapter::StateKind>(m, "StateKind")
      .value("optim_states", adapter::StateKind::kOptimizerStates)
      .value("hp_params", adapter::StateKind::kMaster)
      .value("lp_params", adapter::StateKind::kParams)
      .value("lp_grads", adapter::StateKind::kGrads);

  using Hyper = adapter::OptimizerHyper;
  py::class_<Hyper>(m, "OptimizerHyper")
      .def(py::init<>())
      .def_readwrite("kind", &Hyper::kind)
      .def_readwrite("lr", &Hyper::lr)
      .def_readwrite("weight_decay", &Hyper::weight_decay)
      .def_readwrite("beta1", &Hyper::beta1)
      .def_readwrite("beta2", &Hyper::beta2)
      .def_readwrite("eps", &Hyper::eps)
      .def_readwrite("decoupled_weight_decay", &Hyper::decoupled_weight_decay)
      .def_readwrite("bias_correction", &Hyper::bias_correction)
      .def_readwrite("momentum", &Hyper::momentum)
      .def_readwrite("dampening", &Hyper::dampening)
      .def_readwrite("nesterov", &Hyper::nesterov)
      .def_readwrite("lr_decay", &Hyper::lr_decay)
      .def_readwrite("max_coeff", &Hyper::max_coeff)
      .def_readwrite("min_coeff", &Hyper::min_coeff)
      .def_readwrite("eps_inside_sqrt", &Hyper::eps_inside_sqrt)
      .def_readwrite("ns_method", &Hyper::ns_method)
      .def_readwrite("ns_steps", &Hyper::ns_steps)
      .def_readwrite("ns_dtype", &Hyper::ns_dtype)
      .def_readwrite("external", &Hyper::external);

  // One parameter's Muon update from its blend, as the engine computes it (tests compare it
  // with DeepSpeed's muon_update).
  m.def("muon_orthogonalized", &adapter::orthogonalized, py::arg("blend"), py::arg("shape"),
        py::arg("hyper"));

  py::class_<core::AioConfig>(m, "AioConfig")
      .def(py::init<>())
      .def_readwrite("block_size", &core::AioConfig::block_size)
      .def_readwrite("queue_depth", &core::AioConfig::queue_depth)
      .def_readwrite("intra_op_parallelism", &core::AioConfig::intra_op_parallelism);

  using Offload = adapter::OffloadOptions;
  py::class_<Offload>(m, "OffloadOptions")
      .def(py::init<>())
      .def_readwrite("enabled", &Offload::enabled)
      .def_readwrite("pin_memory", &Offload::pin_memory)
      .def_readwrite("tile_numel", &Offload::tile_numel)
      .def_readwrite("nvme_path", &Offload::nvme_path)
      .def_readwrite("aio", &Offload::aio)
      .def_readwrite("delayed_update", &Offload::delayed_update)
      .def_readwrite("ratio", &Offload::ratio)
      .def_readwrite("grads_on_device", &Offload::grads_on_device)
      .def_readwrite("on_swap_write", &Offload::on_swap_write);

  using ParamOffload = adapter::ParamOffloadOptions;
  py::class_<ParamOffload>(m, "ParamOffloadOptions")
      .def(py::init<>())
      .def_readwrite("enabled", &ParamOffload::enabled)
      .def_readwrite("pin_memory", &ParamOffload::pin_memory)
      .def_readwrite("nvme_path", &ParamOffload::nvme_path)
      .def_readwrite("max_in_cpu", &ParamOffload::max_in_cpu)
      .def_readwrite("buffer_count", &ParamOffload::buffer_count)
      .def_readwrite("buffer_numel", &ParamOffload::buffer_numel)
      .def_readwrite("aio", &ParamOffload::aio)
      .def_readwrite("on_swap_write", &ParamOffload::on_swap_write);

  using Group = adapter::GroupOptions;
  py::class_<Group>(m, "GroupOptions")
      .def(py::init<>())
      .def_readwrite("stage", &Group::stage)
      .def_readwrite("alignment", &Group::alignment)
      .def_readwrite("unit_numel", &Group::unit_numel)
      .def_readwrite("overlap_comm", &Group::overlap_comm)
      .def_readwrite("shard_grads", &Group::shard_grads)
      .def_readwrite("optimizer", &Group::optimizer)
      .def_readwrite("sgd_momentum", &Group::sgd_momentum)
      .def_readwrite("external_states", &Group::external_states)
      .def_readwrite("offload", &Group::offload)
      .def_readwrite("offload_param", &Group::offload_param)
      .def_readwrite("shared_params", &Group::shared_params)
      .def_readwrite("quantized_weights", &Group::quantized_weights)
      .def_readwrite("quantized_gradients", &Group::quantized_gradients)
      .def_readwrite("all_reduce_fetch", &Group::all_reduce_fetch)
      .def_readwrite("master_in_model_dtype", &Group::master_in_model_dtype)
      .def_readwrite("states_in_model_dtype", &Group::states_in_model_dtype)
      .def_readwrite("grads_in_fp32", &Group::grads_in_fp32)
      .def_readwrite("communication_dtype", &Group::communication_dtype)
      .def_readwrite("hpz_group", &Group::hpz_group)
      .def_readwrite("mics_shard_group", &Group::mics_shard_group)
      .def_readwrite("data_group", &Group::data_group)
      .def_readwrite("average_over", &Group::average_over)
      .def_readwrite("mics_replicate_group", &Group::mics_replicate_group)
      .def_readwrite("frozen", &Group::frozen)
      .def_readwrite("quantized_storage", &Group::quantized_storage);

  using Schedule = adapter::ScheduleOptions;
  py::class_<Schedule>(m, "ScheduleOptions")
      .def(py::init<>())
      .def_readwrite("prefetch_numel", &Schedule::prefetch_numel)
      .def_readwrite("max_live_numel", &Schedule::max_live_numel)
      .def_readwrite("max_reuse_distance", &Schedule::max_reuse_distance)
      .def_readwrite("max_inflight", &Schedule::max_inflight)
      .def_readwrite("device", &Schedule::device);
}

}  // namespace zero::bindings
