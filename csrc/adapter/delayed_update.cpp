#include "adapter/delayed_update.h"

#include <ATen/ops/full.h>
#include <c10/util/Exception.h>

namespace zero::adapter {

DelayedUpdate::DelayedUpdate(core::MemoryRegistry& registry, ChunkGrid grid, c10::Device device,
                             at::ScalarType model_type, at::ScalarType grads_type,
                             bool pin_memory)
    : grid_(grid),
      grads_(registry, core::MemoryCategory::kStaging, grid.shard_numel, grads_type, pin_memory),
      params_(registry, core::MemoryCategory::kStaging, grid.shard_numel, model_type, pin_memory),
      copier_(device),
      worker_(std::make_unique<core::TaskWorker>()) {}

std::string DelayedUpdate::why_not_pinned() const {
  return grads_.pinned() ? params_.why_not_pinned() : grads_.why_not_pinned();
}

void DelayedUpdate::start(const std::vector<ShardPiece>& pieces, ChunkUpdate update) {
  wait();  // the running update has read grads_ and written params_
  const at::Tensor kept = grads_.tensor();
  std::shared_future<void> copied = copier_.submit([&pieces, kept] {
    for (const ShardPiece& piece : pieces) {
      CopyEngine::copy(kept.narrow(0, piece.offset, piece.grad.numel()), piece.grad);
    }
  });
  try {
    apply(pieces);  // meanwhile: the previous update's parameters, the model's from now on
  } catch (...) {
    copied.wait();  // the batch reads `pieces`
    throw;
  }
  copied.get();
  pending_ = true;
  job_ = worker_->submit([this, update = std::move(update)] {
    for (std::int64_t c = 0; c < grid_.count(); ++c) {
      const std::int64_t begin = c * grid_.chunk;
      update(grads_.tensor().narrow(0, begin, grid_.numel(c)),
             params_.tensor().narrow(0, begin, grid_.numel(c)), c);
    }
  });
}

void DelayedUpdate::apply(const std::vector<ShardPiece>& pieces) {
  wait();
  if (!pending_) return;
  for (const ShardPiece& piece : pieces) {
    store_params(piece, 0, params_.tensor().narrow(0, piece.offset, piece.grad.numel()));
  }
  pending_ = false;
}

void DelayedUpdate::wait() const {
  if (job_.valid()) job_.get();
}

std::vector<std::pair<std::string, at::Tensor>> DelayedUpdate::state() const {
  wait();
  return {{"delayed_params", params_.tensor().clone()},
          {"delayed_pending",
           at::full({1}, pending_ ? 1.0 : 0.0, at::TensorOptions().dtype(at::kFloat))}};
}

bool DelayedUpdate::load(const std::string& name, const at::Tensor& values) {
  wait();
  if (name == "delayed_pending") {
    pending_ = values.item<double>() != 0.0;
    return true;
  }
  if (name != "delayed_params") return false;
  TORCH_CHECK(values.numel() == grid_.shard_numel, "zero: saved delayed_params has ",
              values.numel(), " elements but this rank's shard has ", grid_.shard_numel);
  params_.tensor().copy_(values.reshape({-1}));
  return true;
}

}  // namespace zero::adapter
