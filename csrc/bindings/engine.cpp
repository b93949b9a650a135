#include "bindings/bindings.h"

#include "adapter/backward_hooks.h"
#include "adapter/engine_core.h"
#include "adapter/grad_access.h"
#include "adapter/stage3_group.h"

namespace zero::bindings {
namespace {

using Core = py::class_<adapter::EngineCore, std::shared_ptr<adapter::EngineCore>>;

// A stage-3 group: engine group g, or with `frozen` frozen group g.
adapter::Stage3Group& stage3(adapter::EngineCore& e, std::size_t g, bool frozen = false) {
  if (frozen) return e.frozen_group(g);
  auto* group = dynamic_cast<adapter::Stage3Group*>(&e.group(g));
  TORCH_CHECK(group != nullptr, "zero: group ", g, " is not a stage-3 (partitioned) group");
  return *group;
}

// The stage-3 groups' own communicators of one kind (hpZ's secondary, MiCS's shard or
// replicate group), for those that have one.
std::vector<adapter::Communicator*> own_communicators(
    adapter::EngineCore& e, adapter::Communicator* (adapter::Stage3Group::*which)()) {
  std::vector<adapter::Communicator*> found;
  auto add = [&](adapter::Stage3Group* group) {
    if (group != nullptr && (group->*which)() != nullptr) found.push_back((group->*which)());
  };
  for (std::size_t g = 0; g < e.group_count(); ++g) {
    add(dynamic_cast<adapter::Stage3Group*>(&e.group(g)));
  }
  for (std::size_t g = 0; g < e.frozen_group_count(); ++g) add(&e.frozen_group(g));
  return found;
}

constexpr adapter::Communicator* (adapter::Stage3Group::*kOwnCommunicators[])() = {
    &adapter::Stage3Group::secondary_communicator,
    &adapter::Stage3Group::mics_shard_communicator,
    &adapter::Stage3Group::mics_replicate_communicator,
    &adapter::Stage3Group::data_group_communicator};

adapter::CommStats summed_stats(adapter::EngineCore& e,
                                adapter::Communicator* (adapter::Stage3Group::*which)()) {
  adapter::CommStats total;
  for (const adapter::Communicator* c : own_communicators(e, which)) total += c->stats();
  return total;
}

// Groups in, backward and the optimizer step, and what the engine is.
void add_training(Core& core) {
  core
    .def("span_norm", &adapter::EngineCore::span_norm, py::arg("weights"),
         py::arg("span_group"))
    .def("add_group",
         [](adapter::EngineCore& e, std::vector<at::Tensor> params,
            const adapter::GroupOptions& options) {
           return e.add_group(std::move(params), options);
         },
         py::arg("params"), py::arg("options"), py::call_guard<py::gil_scoped_release>())
    .def(
        "add_stage3_group",
        [](adapter::EngineCore& e, std::vector<at::Tensor> params,
           const std::vector<std::size_t>& unit_of_param,
           const std::vector<std::vector<std::int64_t>>& full_shapes,
           const adapter::GroupOptions& options) {
          at::NoGradGuard no_grad;
          return e.adopt_group(
              std::make_unique<adapter::Stage3Group>(std::move(params), unit_of_param,
                                                     full_shapes, options, e.registry(),
                                                     e.host_threads(), e.communicator()),
              3);
        },
        py::arg("params"), py::arg("unit_of_param"), py::arg("full_shapes"),
        py::arg("options"), py::call_guard<py::gil_scoped_release>())
    .def(
        "add_frozen_stage3_group",
        [](adapter::EngineCore& e, std::vector<at::Tensor> params,
           const std::vector<std::size_t>& unit_of_param,
           const std::vector<std::vector<std::int64_t>>& full_shapes,
           adapter::GroupOptions options) {
          at::NoGradGuard no_grad;
          options.frozen = true;
          return e.adopt_frozen_group(std::make_unique<adapter::Stage3Group>(
              std::move(params), unit_of_param, full_shapes, options, e.registry(),
              e.host_threads(), e.communicator()));
        },
        py::arg("params"), py::arg("unit_of_param"), py::arg("full_shapes"),
        py::arg("options"), py::call_guard<py::gil_scoped_release>())
    .def_property_readonly("frozen_group_count", &adapter::EngineCore::frozen_group_count)
    .def("prepare_backward", &adapter::EngineCore::prepare_backward, py::arg("boundary"),
         py::call_guard<py::gil_scoped_release>())
    .def_property_readonly("backward_pending", &adapter::EngineCore::backward_pending)
    .def("apply_delayed_update", &adapter::EngineCore::apply_delayed_update,
         py::call_guard<py::gil_scoped_release>())
    .def("close", &adapter::EngineCore::close, py::call_guard<py::gil_scoped_release>())
    .def("grad_ready", &adapter::EngineCore::grad_ready, py::arg("group"), py::arg("index"),
         py::arg("boundary"), py::call_guard<py::gil_scoped_release>())
    .def("finish_backward", &adapter::EngineCore::finish_backward, py::arg("boundary"),
         py::call_guard<py::gil_scoped_release>())
    .def("fail_backward", &adapter::EngineCore::fail_backward,
         py::call_guard<py::gil_scoped_release>())
    .def("agree_on_checkpoint", &adapter::EngineCore::agree_on_checkpoint, py::arg("save"),
         py::call_guard<py::gil_scoped_release>())
    .def(
        "step",
        &adapter::EngineCore::step, py::arg("hypers"), py::arg("loss_scale"),
        py::arg("max_norm"), py::arg("step"), py::arg("muon") = false,
        py::call_guard<py::gil_scoped_release>())
    .def("zero_grads", &adapter::EngineCore::zero_grads, py::call_guard<py::gil_scoped_release>())
    .def("offload_states", &adapter::EngineCore::offload_states, py::arg("kinds"),
         py::arg("pin"), py::call_guard<py::gil_scoped_release>())
    .def("reload_states", &adapter::EngineCore::reload_states,
         py::arg("kinds") = std::vector<adapter::StateKind>{},
         py::call_guard<py::gil_scoped_release>())
    .def_property_readonly("offloaded_states", &adapter::EngineCore::offloaded_states)
    .def_property_readonly("offloaded_bytes", &adapter::EngineCore::offloaded_bytes)
    .def_property_readonly("group_count", &adapter::EngineCore::group_count)
    .def_property_readonly("rank", [](adapter::EngineCore& e) { return e.communicator().rank(); })
    .def_property_readonly("world_size",
                           [](adapter::EngineCore& e) { return e.communicator().world_size(); })
    .def("registry", &adapter::EngineCore::shared_registry);
}

// Stage 3: the gather schedule's events, its hooks on autograd, and its account.
void add_stage3(Core& core) {
  core
    // `frozen`: g numbers the frozen groups (add_frozen_stage3_group)
    .def("commit", [](adapter::EngineCore& e, std::size_t g, std::size_t u, bool frozen) {
           at::NoGradGuard no_grad;
           e.reload_states();  // writes the shard and the master
           stage3(e, g, frozen).commit(u);
         }, py::arg("group"), py::arg("unit"), py::arg("frozen") = false,
         py::call_guard<py::gil_scoped_release>())
    .def("is_gathered", [](adapter::EngineCore& e, std::size_t g, std::size_t u, bool frozen) {
           return stage3(e, g, frozen).is_gathered(u);
         }, py::arg("group"), py::arg("unit"), py::arg("frozen") = false)
    .def("configure_schedule",
         [](adapter::EngineCore& e, std::vector<std::string> names,
            const adapter::ScheduleOptions& options) {
           e.configure_schedule(std::move(names), options);
         },
         py::arg("unit_names"), py::arg("options"), py::call_guard<py::gil_scoped_release>())
    .def("place", [](adapter::EngineCore& e, std::size_t unit, std::size_t g, std::size_t local,
                     bool frozen) {
           e.units().place(unit, &stage3(e, g, frozen), local);
         }, py::arg("unit"), py::arg("group"), py::arg("local"), py::arg("frozen") = false)
    .def("add_external", [](adapter::EngineCore& e, std::size_t user, std::size_t owner) {
           at::NoGradGuard no_grad;
           py::gil_scoped_release no_gil;  // (a user in use gathers the owner now)
           e.schedule().add_external(user, owner);
         }, py::arg("user"), py::arg("owner"))
    .def("before_forward", [](adapter::EngineCore& e, std::size_t unit, std::int64_t step,
                              bool expects_backward) {
           at::NoGradGuard no_grad;
           py::gil_scoped_release no_gil;
           e.reload_states({adapter::StateKind::kParams});
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
           e.reload_states({adapter::StateKind::kParams});
           e.schedule().hold(unit);
         }, py::arg("unit"))
    .def("unhold", [](adapter::EngineCore& e, std::size_t unit, bool hand_over) {
           at::NoGradGuard no_grad;
           py::gil_scoped_release no_gil;
           e.schedule().unhold(unit, hand_over);
         }, py::arg("unit"), py::arg("hand_over") = true)
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
    .def("release_gathered", &adapter::EngineCore::release_gathered,
         py::call_guard<py::gil_scoped_release>())
    .def("schedule_stats", [](adapter::EngineCore& e) { return e.schedule().stats(); })
    .def("gathered_numel", [](adapter::EngineCore& e, std::size_t g, bool frozen) {
           return stage3(e, g, frozen).gathered_numel();
         }, py::arg("group"), py::arg("frozen") = false);
}

// The communicators' byte counts and logs (the engine's own, hpZ's, MiCS's).
void add_communication(Core& core) {
  core
    .def("comm_stats", [](adapter::EngineCore& e) { return e.communicator().stats(); })
    .def("secondary_comm_stats",  // hpZ: the bytes that stayed within the secondary groups
         [](adapter::EngineCore& e) {
           return summed_stats(e, &adapter::Stage3Group::secondary_communicator);
         })
    .def("mics_shard_comm_stats",  // MiCS: the bytes within the shard groups
         [](adapter::EngineCore& e) {
           return summed_stats(e, &adapter::Stage3Group::mics_shard_communicator);
         })
    .def("mics_replicate_comm_stats",  // MiCS: the bytes within the replicate groups
         [](adapter::EngineCore& e) {
           return summed_stats(e, &adapter::Stage3Group::mics_replicate_communicator);
         })
    .def("data_group_comm_stats",  // MoE: the bytes within the expert data-parallel groups
         [](adapter::EngineCore& e) {
           adapter::CommStats total = summed_stats(e, &adapter::Stage3Group::data_group_communicator);
           for (const adapter::Communicator* c : e.data_group_communicators()) total += c->stats();
           return total;
         })
    .def("reset_comm_stats",
         [](adapter::EngineCore& e) {
           e.communicator().reset_stats();
           for (adapter::Communicator* c : e.data_group_communicators()) c->reset_stats();
           for (auto which : kOwnCommunicators) {
             for (adapter::Communicator* c : own_communicators(e, which)) c->reset_stats();
           }
         })
    .def("set_comm_logging",
         [](adapter::EngineCore& e, bool enabled) { e.communicator().log().set_enabled(enabled); },
         py::arg("enabled"))
    .def("set_comm_label",
         [](adapter::EngineCore& e, std::string label) {
           e.communicator().log().set_label(std::move(label));
         }, py::arg("label"))
    .def("drain_comm_records",
         [](adapter::EngineCore& e) { return e.communicator().log().drain(); });
}

// Group g, with every state offload_states moved off the device back in place.
adapter::Group& awake(adapter::EngineCore& e, std::size_t g) {
  e.reload_states();
  return e.group(g);
}

// One group's layout, state and offload, for checkpoints and reports.
void add_groups(Core& core) {
  core
    .def("group_numel",
         [](adapter::EngineCore& e, std::size_t g) { return e.group(g).layout().full_numel(); })
    .def("group_layout",
         [](adapter::EngineCore& e, std::size_t g) -> const core::ShardedLayout& {
           return e.group(g).layout();
         }, py::arg("group"), py::return_value_policy::reference_internal)
    .def("group_units",
         [](adapter::EngineCore& e, std::size_t g) { return e.group(g).layout().unit_count(); })
    .def("group_master_shard",
         [](adapter::EngineCore& e, std::size_t g) { return awake(e, g).master_shard(); })
    .def("group_has_master",  // false where the parameters' own shard is the master
         [](adapter::EngineCore& e, std::size_t g) {
           return e.group(g).shard_state().has_master();
         }, py::arg("group"))
    .def("group_refresh_master",
         [](adapter::EngineCore& e, std::size_t g) {
           at::NoGradGuard no_grad;
           awake(e, g).refresh_master();
         })
    .def("group_offload_info",
         [](adapter::EngineCore& e, std::size_t g) { return e.group(g).offload_info(); },
         py::arg("group"))
    .def("frozen_group_layout",
         [](adapter::EngineCore& e, std::size_t g) -> const core::ShardedLayout& {
           return e.frozen_group(g).layout();
         }, py::arg("group"), py::return_value_policy::reference_internal)
    .def("frozen_group_offload_info",
         [](adapter::EngineCore& e, std::size_t g) { return e.frozen_group(g).offload_info(); },
         py::arg("group"))
    .def("group_offload_timings",
         [](adapter::EngineCore& e, std::size_t g) {
           return e.group(g).shard_state().offload_timings();
         }, py::arg("group"))
    .def("group_host_copy_timings",
         [](adapter::EngineCore& e, std::size_t g) {
           return e.group(g).reducer().host_copy_timings();
         }, py::arg("group"))
    .def("group_load_optimizer_state",
         [](adapter::EngineCore& e, std::size_t g, const std::string& name,
            const at::Tensor& values) {
           at::NoGradGuard no_grad;
           awake(e, g).load_optimizer_state(name, values);
         }, py::arg("group"), py::arg("name"), py::arg("values"))
    .def("group_load_master_shard",
         [](adapter::EngineCore& e, std::size_t g, const at::Tensor& saved) {
           at::NoGradGuard no_grad;
           awake(e, g).load_master_shard(saved);
         })
    .def("group_optimizer_state",  // name -> tensor, as a state_dict holds them
         [](adapter::EngineCore& e, std::size_t g) {
           py::dict out;
           for (auto& [name, tensor] : awake(e, g).optimizer_state()) out[name.c_str()] = tensor;
           return out;
         })
    .def("group_state_names",  // the optimizer-state arrays group_optimizer_state holds
         [](adapter::EngineCore& e, std::size_t g) {
           return e.group(g).shard_state().state_names();
         }, py::arg("group"))
    // "master" or an optimizer state by shard position, fp32; with the GIL held, as the
    // whole-shard copies above (an NVMe store reads through one slot)
    .def("group_read_array",
         [](adapter::EngineCore& e, std::size_t g, const std::string& name, std::int64_t offset,
            std::int64_t numel) {
           at::NoGradGuard no_grad;
           return awake(e, g).read_array(name, offset, numel);
         }, py::arg("group"), py::arg("name"), py::arg("offset"), py::arg("numel"))
    .def("group_write_array",
         [](adapter::EngineCore& e, std::size_t g, const std::string& name, std::int64_t offset,
            const at::Tensor& values) {
           at::NoGradGuard no_grad;
           awake(e, g).write_array(name, offset, values);
         }, py::arg("group"), py::arg("name"), py::arg("offset"), py::arg("values"))
    .def("group_trust_ratios",  // LAMB's last step, per parameter of the group
         [](adapter::EngineCore& e, std::size_t g) { return e.group(g).trust_ratios(); },
         py::arg("group"))
    .def("group_accumulated_grad",  // stages 0-1: a view of one parameter's gradient buffer
         [](adapter::EngineCore& e, std::size_t g, std::size_t index) {
           return e.group(g).accumulated_grad(index);
         }, py::arg("group"), py::arg("index"))
    .def("group_read_grads",  // this rank's reduced gradients by shard position, fp32
         [](adapter::EngineCore& e, std::size_t g, std::int64_t offset, std::int64_t numel) {
           return adapter::read_grads(awake(e, g), offset, numel);
         }, py::arg("group"), py::arg("offset"), py::arg("numel"),
         py::call_guard<py::gil_scoped_release>())
    .def("group_write_grads",
         [](adapter::EngineCore& e, std::size_t g, std::int64_t offset, const at::Tensor& values) {
           adapter::write_grads(awake(e, g), offset, values);
         }, py::arg("group"), py::arg("offset"), py::arg("values"),
         py::call_guard<py::gil_scoped_release>())
    .def("group_bucket_info",
         [](adapter::EngineCore& e, std::size_t g) { return e.group(g).bucket_info(); },
         py::arg("group"));
}

}  // namespace

void bind_engine(py::module_& m) {
  using StepResult = adapter::StepResult;  // what EngineCore.step returns
  py::class_<StepResult>(m, "StepResult")
      .def_readonly("overflow", &StepResult::overflow)
      .def_readonly("grad_norm", &StepResult::grad_norm)
      .def_readonly("clip_coef", &StepResult::clip_coef)
      .def_readonly("failed_backward", &StepResult::failed_backward)
      .def("__repr__", [](const StepResult& r) {
        return "StepResult(overflow=" + std::string(r.overflow ? "True" : "False") +
               ", grad_norm=" + std::to_string(r.grad_norm) +
               ", clip_coef=" + std::to_string(r.clip_coef) + ")";
      });

  Core core(m, "EngineCore");
  core.def(py::init([](const std::string& group_name) {
             return std::shared_ptr<adapter::EngineCore>(new adapter::EngineCore(group_name),
                                                         DeleteWithoutGil<adapter::EngineCore>());
           }),
           py::arg("group_name"));
  add_training(core);
  add_stage3(core);
  add_communication(core);
  add_groups(core);
}

}  // namespace zero::bindings
