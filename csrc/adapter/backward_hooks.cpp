#include "adapter/backward_hooks.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include "adapter/engine_core.h"

namespace zero::adapter {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a node needs in backward; kept in the autograd context as a capsule.
struct UnitRef : torch::CustomClassHolder {
  UnitRef(std::weak_ptr<EngineCore> core, std::size_t unit) : core(std::move(core)), unit(unit) {}
  std::weak_ptr<EngineCore> core;
  std::size_t unit;
};

c10::intrusive_ptr<UnitRef> unit_ref(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<UnitRef>(ctx->saved_data.at("unit").toCapsule());
}

// Backward gets one gradient slot per forward argument: none for the capsule.
variable_list pass_through(variable_list grads) {
  grads.insert(grads.begin(), at::Tensor());
  return grads;
}

// An identity on a unit's tensors whose backward runs `Event` for the unit. The outputs share
// the inputs' storage but are not autograd views of them: an input returned as is becomes one
// of several views of one node, which autograd forbids to modify in place (the HF Trainer
// scales its loss with `loss *= ...`); an in-place op on a detached alias keeps this node.
template <typename Event>
struct UnitEvent : torch::autograd::Function<UnitEvent<Event>> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<UnitRef> ref,
                               at::TensorList tensors) {
    ctx->saved_data["unit"] = c10::IValue::make_capsule(std::move(ref));
    variable_list outputs;
    outputs.reserve(tensors.size());
    for (const at::Tensor& t : tensors) outputs.push_back(t.detach());
    return outputs;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto ref = unit_ref(ctx);
    if (const auto core = ref->core.lock()) Event::run(core, ref->unit);
    return pass_through(std::move(grads));
  }
};

// Before the unit's backward: gather it; the first one of a backward also queues the flush
// that autograd's engine runs once the whole backward is done.
struct BackwardBegins {
  static void run(const std::shared_ptr<EngineCore>& core, std::size_t unit) {
    if (!core->unit_backward_begins(unit)) return;
    std::weak_ptr<EngineCore> weak = core;
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (const auto live = weak.lock()) live->finish_backward(live->backward_boundary());
    });
  }
};

// After the unit's backward (its inputs have their gradients): the unit may be released.
struct BackwardEnds {
  static void run(const std::shared_ptr<EngineCore>& core, std::size_t unit) {
    core->unit_backward_ends(unit);
  }
};

template <typename Fn>
std::vector<at::Tensor> attach(const std::shared_ptr<EngineCore>& core, std::size_t unit,
                               std::vector<at::Tensor> tensors) {
  variable_list differentiable;
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.requires_grad()) differentiable.push_back(t);
  }
  if (differentiable.empty()) return tensors;
  // A TensorList (not a vector) is what autograd counts as differentiable inputs.
  variable_list wrapped =
      Fn::apply(c10::make_intrusive<UnitRef>(core, unit), at::TensorList(differentiable));
  std::size_t next = 0;
  for (at::Tensor& t : tensors) {
    if (t.defined() && t.requires_grad()) t = wrapped[next++];
  }
  return tensors;
}

}  // namespace

std::vector<at::Tensor> attach_pre_backward(const std::shared_ptr<EngineCore>& core,
                                            std::size_t unit, std::vector<at::Tensor> outputs) {
  return attach<UnitEvent<BackwardBegins>>(core, unit, std::move(outputs));
}

std::vector<at::Tensor> attach_post_backward(const std::shared_ptr<EngineCore>& core,
                                             std::size_t unit, std::vector<at::Tensor> inputs) {
  return attach<UnitEvent<BackwardEnds>>(core, unit, std::move(inputs));
}

}  // namespace zero::adapter
