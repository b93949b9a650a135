#include "adapter/shard_state.h"

#include <algorithm>
#include <cmath>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include "adapter/host_adam.h"

namespace zero::adapter {

ShardState::ShardState(core::MemoryRegistry& registry, core::RangePool& host_threads,
                       std::int64_t shard_numel, const c10::TensorOptions& device_options,
                       OptimizerKind kind, std::vector<std::string> state_names,
                       ShardPrecision precision, const OffloadOptions& offload)
    : registry_(registry),
      host_threads_(host_threads),
      kind_(kind),
      precision_(precision),
      shard_numel_(shard_numel),
      device_numel_(shard_numel),
      state_names_(std::move(state_names)) {
  // An external optimizer steps one tensor, the separate fp32 master.
  TORCH_CHECK_VALUE(kind != OptimizerKind::kExternal || precision_.all_fp32(), "zero: an "
                    "optimizer zero does not build itself steps an fp32 master; set "
                    "bf16_master_weights_and_grads / fp16_master_weights_and_grads and "
                    "bf16_optimizer_states to false, or use Adam, AdamW, Adagrad, Lion or SGD");
  if (kind == OptimizerKind::kExternal) precision_.keep_master = true;
  TORCH_CHECK_VALUE(kind != OptimizerKind::kLamb || (!offload.enabled && precision_.all_fp32()),
                    "zero: LAMB steps an fp32 master on the device (as DeepSpeed's FusedLamb, "
                    "which has no CPU version); remove offload_optimizer and "
                    "bf16_master_weights_and_grads / fp16_master_weights_and_grads, or use Adam");
  // Muon's transform reads and writes its momentum through read_array / write_array, which
  // reach host memory (not a swap file in flight, nor a delayed update's running step)
  const bool muon_offload = offload.enabled && (offload.delayed_update || offload.ratio != 1.0 ||
                                                !offload.nvme_path.empty());
  TORCH_CHECK_VALUE(kind != OptimizerKind::kMuon || (precision_.all_fp32() && !muon_offload),
                    "zero: Muon keeps fp32 momentum, on the device or all of it in host memory; "
                    "remove bf16_master_weights_and_grads / fp16_master_weights_and_grads / "
                    "bf16_optimizer_states, and offload_optimizer's nvme, ratio and "
                    "delayed_update, or use Adam");
  if (offload.enabled) {
    TORCH_CHECK(offload.ratio >= 0.0 && offload.ratio <= 1.0, "zero: offload_optimizer.ratio "
                "must be in [0, 1], got ", offload.ratio);
    const auto host = static_cast<std::int64_t>(std::llround(offload.ratio * shard_numel));
    TORCH_CHECK(host == shard_numel || !offload.delayed_update, "zero: the delayed parameter "
                "update needs the whole optimizer step on the host (ratio 1)");
    device_numel_ = shard_numel - host;
    precision_.keep_master = true;  // parameters and master are separate wherever it steps
    if (host > 0) {
      offloaded_ = std::make_unique<OffloadedState>(registry, host_threads, host,
                                                    device_options, kind, state_names_,
                                                    precision_, offload);
    }
  }
  if (device_numel_ == 0) return;
  auto buffer = [&](core::MemoryCategory category, at::ScalarType dtype) {
    device_owned_.push_back(
        device_buffer(registry, category, device_numel_, device_options.dtype(dtype)));
    return device_owned_.back().tensor();
  };
  if (precision_.keep_master) master_ = buffer(core::MemoryCategory::kMaster, precision_.master);
  for (std::size_t i = 0; i < state_names_.size(); ++i) {
    states_.push_back(buffer(core::MemoryCategory::kOptimizerState, precision_.states));
  }
}

std::vector<TrackedTensor*> ShardState::device_buffers(StateKind kind) {
  if (kind != StateKind::kMaster && kind != StateKind::kOptimizerStates) return {};
  const core::MemoryCategory category = kind == StateKind::kMaster
                                            ? core::MemoryCategory::kMaster
                                            : core::MemoryCategory::kOptimizerState;
  std::vector<TrackedTensor*> buffers;
  for (TrackedTensor& buffer : device_owned_) {
    if (buffer.category() == category) buffers.push_back(&buffer);
  }
  return buffers;
}

at::Tensor ShardState::state(const std::string& name) const {
  if (name == "master") return master_;
  for (std::size_t i = 0; i < states_.size(); ++i) {
    if (state_names_[i] == name) return states_[i];
  }
  return at::Tensor();
}

std::vector<std::pair<std::string, at::Tensor>> ShardState::optimizer_state() const {
  if (!on_device_only()) return offloaded_->optimizer_state();
  std::vector<std::pair<std::string, at::Tensor>> copies;
  for (const std::string& name : state_names()) copies.emplace_back(name, state(name).clone());
  if (offloaded_) {  // the tail's part of each array follows the head's
    for (auto& [name, tail] : offloaded_->optimizer_state()) {
      for (auto& [head_name, head] : copies) {
        if (head_name == name) head = at::cat({head, tail.to(head.device())});
      }
    }
  }
  return copies;
}

std::vector<std::string> ShardState::state_names() const {
  if (!on_device_only()) return offloaded_->state_names();
  return states_.empty() ? std::vector<std::string>{} : state_names_;
}

at::Tensor ShardState::read_array(const std::string& name, std::int64_t offset,
                                  std::int64_t numel) const {
  TORCH_CHECK(name != "master" || has_master(),
              "zero: this shard keeps no separate master (its parameters are the master)");
  const std::int64_t head = std::clamp(device_numel_ - offset, std::int64_t{0}, numel);
  std::vector<at::Tensor> parts;
  if (head > 0) {
    const at::Tensor values = state(name);
    TORCH_CHECK(values.defined(), "zero: the optimizer state has no '", name, "'");
    parts.push_back(values.narrow(0, offset, head).clone());
  }
  if (head < numel) {
    TORCH_CHECK(offloaded_, "zero: the optimizer state has no '", name, "'");
    at::Tensor tail = offloaded_->read(name, offset + head - device_numel_, numel - head);
    parts.push_back(parts.empty() ? tail : tail.to(parts.front().device()));
  }
  if (parts.empty()) return at::empty({0}, at::TensorOptions().dtype(precision_.of(name)));
  return parts.size() == 1 ? parts.front() : at::cat(parts);
}

void ShardState::write_array(const std::string& name, std::int64_t offset,
                             const at::Tensor& values) {
  TORCH_CHECK(name != "master" || has_master(),
              "zero: this shard keeps no separate master (its parameters are the master)");
  const at::Tensor source = values.reshape({-1});
  const std::int64_t numel = source.numel();
  const std::int64_t head = std::clamp(device_numel_ - offset, std::int64_t{0}, numel);
  if (head > 0) {
    const at::Tensor target = state(name);
    TORCH_CHECK(target.defined(), "zero: the optimizer state has no '", name, "'");
    target.narrow(0, offset, head).copy_(source.narrow(0, 0, head));
  }
  if (head < numel) {
    TORCH_CHECK(offloaded_, "zero: the optimizer state has no '", name, "'");
    offloaded_->write(name, offset + head - device_numel_, source.narrow(0, head, numel - head));
  }
}

void ShardState::load_optimizer_state(const std::string& name, const at::Tensor& values) {
  if (!on_device_only()) return offloaded_->load_optimizer_state(name, values);
  TORCH_CHECK(name != "master", "zero: the optimizer state has no 'master'");
  const at::Tensor target = state(name);
  TORCH_CHECK(target.defined(), "zero: the optimizer state has no '", name, "'");
  TORCH_CHECK(values.numel() == shard_numel_, "zero: saved ", name, " has ", values.numel(),
              " elements but this rank's shard has ", shard_numel_);
  const at::Tensor source = values.reshape({-1});
  target.copy_(source.narrow(0, 0, device_numel_));
  if (offloaded_) {
    offloaded_->load_optimizer_state(name, source.narrow(0, device_numel_, offloaded_numel()));
  }
}

std::pair<std::vector<ShardPiece>, std::vector<ShardPiece>> ShardState::split(
    const std::vector<ShardPiece>& pieces) const {
  std::vector<ShardPiece> head, tail;
  for (const ShardPiece& piece : pieces) {
    const std::int64_t numel = piece.grad.numel();
    const std::int64_t in_head = std::clamp(device_numel_ - piece.offset, std::int64_t{0}, numel);
    if (in_head > 0) head.push_back(sub_piece(piece, 0, in_head, piece.offset));
    if (in_head < numel) {
      tail.push_back(sub_piece(piece, in_head, numel - in_head,
                               piece.offset + in_head - device_numel_));
    }
  }
  return {std::move(head), std::move(tail)};
}

void ShardState::check_kind(const OptimizerHyper& hyper) const {
  TORCH_CHECK(hyper.kind == kind_, "zero: the group was built for ", optimizer_name(kind_),
              " but stepped with ", optimizer_name(hyper.kind));
  TORCH_CHECK(kind_ != OptimizerKind::kSgd || hyper.momentum == 0.0 || !state_names_.empty(),
              "zero: SGD momentum was enabled after the engine was built without it");
}

void ShardState::update(at::Tensor master, const at::Tensor& grads, std::int64_t offset,
                        const OptimizerHyper& hyper, std::int64_t step) {
  std::vector<at::Tensor> states;
  for (const at::Tensor& array : states_) states.push_back(array.narrow(0, offset, master.numel()));
  optimizer_update(master, grads, states, hyper, step);
}

void ShardState::step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                      double grad_scale, std::int64_t step,
                      const std::function<void(std::size_t)>& stepped) {
  check_kind(hyper);
  if (kind_ == OptimizerKind::kExternal) return external_step(pieces, hyper, grad_scale, stepped);
  if (!offloaded_) {
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      step_on_device(pieces[i], hyper, grad_scale, step);
      if (stepped) stepped(i);
    }
    return;
  }
  auto [head, tail] = split(pieces);
  // The head first: parameters stored through ShardPiece::store arrive in shard order.
  for (const ShardPiece& piece : head) step_on_device(piece, hyper, grad_scale, step);
  if (!tail.empty()) offloaded_->step(tail, hyper, grad_scale, step);
  for (std::size_t i = 0; stepped && i < pieces.size(); ++i) stepped(i);
}

void ShardState::external_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                               double grad_scale,
                               const std::function<void(std::size_t)>& stepped) {
  const at::TensorOptions options = at::TensorOptions().dtype(precision_.master);
  at::Tensor master = master_.defined() ? master_ : at::empty({0}, options);  // an empty shard
  // The whole shard's gradients in one tensor, as the optimizer sees one parameter; what no
  // piece covers (alignment padding) is 0.
  at::Tensor grads = at::zeros({shard_numel_}, master.options());
  for (const ShardPiece& piece : pieces) {
    grads.narrow(0, piece.offset, piece.grad.numel()).copy_(piece.grad);
  }
  if (grad_scale != 1.0) grads.mul_(grad_scale);
  optimizer_update(master, grads, states_, hyper, /*step=*/0);  // (it keeps its own count)
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    store_params(pieces[i], 0, master.narrow(0, pieces[i].offset, pieces[i].grad.numel()));
    if (stepped) stepped(i);
  }
}

void ShardState::step_on_device(const ShardPiece& piece, const OptimizerHyper& hyper,
                                double grad_scale, std::int64_t step) {
  if (host_adam(piece, hyper, grad_scale, step)) return;
  // a copy of 16-bit gradients; fp32 ones are scaled in place (zeroed after the step anyway)
  at::Tensor grads = piece.grad.to(at::kFloat);
  if (grad_scale != 1.0) grads.mul_(grad_scale);
  if (!master_.defined()) {  // the parameters are the master (fp32, or a 16-bit master)
    update(piece.param, grads, piece.offset, hyper, step);
    return;
  }
  at::Tensor master = master_.narrow(0, piece.offset, piece.grad.numel());
  update(master, grads, piece.offset, hyper, step);
  store_params(piece, 0, master);
}

bool ShardState::host_adam(const ShardPiece& piece, const OptimizerHyper& hyper,
                           double grad_scale, std::int64_t step) {
  if (kind_ != OptimizerKind::kAdam || states_.empty() || !states_[0].device().is_cpu()) {
    return false;
  }
  const std::int64_t numel = piece.grad.numel();
  // fp32 or a 16-bit master: the parameters are the master; a separate master: the kernel
  // also writes the 16-bit parameters when they are a plain host tensor, in the same pass.
  const at::Tensor master = master_.defined() ? master_.narrow(0, piece.offset, numel)
                                              : piece.param;
  const bool writes_params = master_.defined() && !piece.store && host_adam_takes(piece.param) &&
                             piece.param.scalar_type() != at::kFloat;
  if (!host_adam_takes(master) || !host_adam_takes(piece.grad)) {
    return false;
  }
  host_adam_update(master, piece.grad, states_[0].narrow(0, piece.offset, numel),
                   states_[1].narrow(0, piece.offset, numel), hyper, grad_scale, step,
                   writes_params ? piece.param : at::Tensor(), host_threads_);
  if (master_.defined() && !writes_params) store_params(piece, 0, master);
  return true;
}

at::Tensor ShardState::master_of(const ShardPiece& piece) const {
  TORCH_CHECK(!offloaded_, "zero: this update runs on the device; the state is offloaded");
  return master_.defined() ? master_.narrow(0, piece.offset, piece.grad.numel()) : piece.param;
}

std::vector<at::Tensor> ShardState::states_of(const ShardPiece& piece) const {
  TORCH_CHECK(!offloaded_, "zero: this update runs on the device; the state is offloaded");
  std::vector<at::Tensor> views;
  for (const at::Tensor& array : states_) {
    views.push_back(array.narrow(0, piece.offset, piece.grad.numel()));
  }
  return views;
}

void ShardState::apply_delayed(const std::vector<ShardPiece>& pieces) {
  if (offloaded_) offloaded_->apply_delayed(split(pieces).second);
}

}  // namespace zero::adapter
