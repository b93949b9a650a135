#pragma once
// The optimizer side of a rank's shard: fp32 master (mixed precision, or offload), Adam's m
// and v or SGD's momentum, all laid out like the shard, and the step over its pieces.
//
// On the device (the default) the update runs with ATen ops. With offload (ZeRO-Offload) the
// state lives in one host pool (pinned when possible) and the step streams the shard tile by
// tile: a worker thread copies tile i+1's gradients to host staging and tile i-1's new
// parameters back to the device while the fused CPU Adam updates tile i.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/optimizer_math.h"
#include "adapter/tracked_tensor.h"
#include "core/host_pool.h"
#include "core/task_worker.h"

namespace zero::adapter {

struct OffloadOptions {
  bool enabled = false;
  bool pin_memory = false;
  std::int64_t tile_numel = std::int64_t{1} << 22;  // elements per streamed tile
  int num_threads = 1;                               // CPU Adam threads
};

// One contiguous piece of this rank's shard: its gradients and the parameters the step
// writes (both on the device, model dtype, `grad.numel()` elements) at `offset` in the shard.
struct ShardPiece {
  at::Tensor grad;
  at::Tensor param;
  std::int64_t offset = 0;
};

class ShardState {
 public:
  // keep_master: a separate fp32 master (mixed precision); offload always keeps one.
  ShardState(core::MemoryRegistry& registry, std::int64_t shard_numel,
             const c10::TensorOptions& device_options, OptimizerKind kind, bool sgd_momentum,
             bool keep_master, const OffloadOptions& offload);
  ~ShardState();

  bool has_master() const { return master_.defined(); }
  bool offloaded() const { return offload_.enabled; }
  bool pinned() const { return host_pool_ && host_pool_->pinned(); }
  // Why offloaded state is pageable ("" when pinned or not offloaded).
  std::string why_not_pinned() const {
    return host_pool_ && !host_pool_->pinned() ? host_pool_->why_not_pinned() : "";
  }
  at::Tensor master_piece(std::int64_t offset, std::int64_t numel) const;
  // Updates the pieces (grads multiplied by grad_scale) and leaves the new parameters in each
  // piece's `param`. step is 1-based and counts this update.
  void step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper, double grad_scale,
            std::int64_t step);
  std::vector<std::pair<std::string, at::Tensor>> optimizer_state() const;

 private:
  struct Tile {
    const ShardPiece* piece;
    std::int64_t begin;  // within the piece
    std::int64_t numel;
  };
  void check_kind(const OptimizerHyper& hyper) const;
  void update(at::Tensor master, const at::Tensor& grads, std::int64_t offset,
              const OptimizerHyper& hyper, std::int64_t step);
  void device_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                   double grad_scale, std::int64_t step);
  void offloaded_step(const std::vector<ShardPiece>& pieces, const OptimizerHyper& hyper,
                      double grad_scale, std::int64_t step);
  void update_tile(const Tile& tile, int slot, const OptimizerHyper& hyper, double grad_scale,
                   std::int64_t step);
  void allocate_on_host(core::MemoryRegistry& registry, std::int64_t shard_numel,
                        const c10::TensorOptions& device_options, bool sgd_momentum);

  OptimizerKind kind_;
  OffloadOptions offload_;
  std::vector<TrackedTensor> device_owned_;
  std::unique_ptr<core::HostPool> host_pool_;  // offload: owns the memory the tensors view
  std::unique_ptr<core::TaskWorker> copier_;
  at::Tensor master_;
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  at::Tensor momentum_;
  at::Tensor staged_grads_[2];   // offload: host copies of two tiles' gradients (model dtype)
  at::Tensor staged_params_[2];  // offload, 16-bit models: two tiles' new parameters
};

}  // namespace zero::adapter
