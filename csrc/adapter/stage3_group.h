#pragma once
// ZeRO-3: a group whose parameters are partitioned. Each rank keeps only its 1/N of every
// unit (16-bit params, fp32 master, optimizer state, gradients); a unit's full parameters
// exist only between gather(u) and release(u), in a buffer counted as `gathered_param`.
//
//   forward:  gather(u) before the unit's module runs, release(u) after;
//   backward: gather(u) again before the unit's backward, and as each gradient becomes
//             final it is copied into the unit's reduce-scatter bucket and freed; when the
//             unit's last trainable gradient is in, the bucket is reduce-scattered into this
//             rank's gradient shard and the unit is released;
//   step:     the update runs on the shard alone; nothing is gathered afterwards.
//
// ZeRO++ hpZ (GroupOptions::hpz_group): a unit's first gather after the parameters changed
// runs over every rank; then each rank keeps a secondary copy of its 1/H of the unit (H: the
// secondary group's size, ranks of one node), and the unit's later gathers (backward, the next
// micro-batches) all-gather those copies within the group. The copies are counted as
// `gathered_param` (working copies, like the gathered units) and dropped whenever the
// parameters change (step, commit, load).
//
// MiCS (GroupOptions::mics_shard_group): the parameters are partitioned within a shard group
// of S ranks instead of the world, and replicated across the N/S shard groups. Gathers and
// reduce-scatters stay within the shard group; each reduced gradient piece is then averaged
// over the replicate group (the ranks holding the same shard) with one all-reduce.
//
// With offload_param the shard lives in host memory (each gather first copies the unit's
// piece to the device), or with device "nvme" in a swap file (param_swap.h) except for the
// first units up to max_in_cpu elements; the gather schedule hints which NVMe units to read
// ahead, and the optimizer step streams the new parameters back to the file.
//
// A frozen group (GroupOptions::frozen: parameters with requires_grad false, as a LoRA base
// model's) is partitioned, gathered, offloaded and committed the same way, but keeps nothing
// else: no gradient shard memory, master or optimizer state, and it never reduces. With
// GroupOptions::quantized_storage its shard is kept packed (block-wise int8, per unit) and each
// gather moves and decodes the packed pieces.
//
// While released, a parameter's data is an empty tensor of its dtype and device, and the
// unit's gathered storage keeps its identity but holds no memory (its bytes are freed in
// place, as FSDP does with resize_(0)): views that autograd saved during forward, such as a
// weight's transpose, would otherwise keep every unit alive until backward. Gathering again
// re-fills the same storage, so those saved views see the parameters again in backward.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/collectives.h"
#include "adapter/grad_reducer.h"
#include "adapter/host_pinning.h"
#include "adapter/group.h"
#include "adapter/param_group.h"
#include "adapter/param_swap.h"
#include "adapter/shard_state.h"
#include "adapter/tracked_tensor.h"

namespace zero::adapter {

class Stage3Group : public Group {
 public:
  // unit_of_param[i]: the gather unit of params[i] (units numbered 0..k-1 in forward order).
  // full_shapes[i], when not empty, is the shape of a parameter that arrives already
  // partitioned (zero.Init: its data is empty); its piece of the shard starts at zero and is
  // filled by gather + copy + commit, one unit at a time.
  Stage3Group(std::vector<at::Tensor> params, const std::vector<std::size_t>& unit_of_param,
              const std::vector<std::vector<std::int64_t>>& full_shapes,
              const GroupOptions& options, core::MemoryRegistry& registry,
              core::RangePool& host_threads, Communicator& communicator);

  // --- gathering ---
  void fetch(std::size_t unit);    // starts the all-gather (no-op if gathered or in flight)
  void read_ahead(std::size_t unit);  // NVMe: start reading the unit's shard (a hint)
  void gather(std::size_t unit);   // fetch + wait; the unit's parameters are full afterwards
  // Frees the gathered buffer in place (autograd's saved views see it filled again at the next
  // gather); parameters become empty. leave_shared: a buffer something else still references
  // is not freed but let go, and the next gather makes a new one (GroupUnits::release_after_hold).
  void release(std::size_t unit, bool leave_shared = false);
  bool is_gathered(std::size_t unit) const { return units_.at(unit).resident; }
  bool is_in_flight(std::size_t unit) const { return units_.at(unit).in_flight != nullptr; }
  // Trainable parameters of the unit whose gradients have not arrived in this backward.
  std::size_t pending_grads(std::size_t unit) const { return units_.at(unit).pending_grads; }
  std::size_t unit_count() const { return layout_.unit_count(); }
  std::int64_t gathered_numel() const;  // elements of every unit gathered now
  // hpZ: the secondary group's collectives; MiCS: the shard and replicate groups' (null
  // without them).
  Communicator* secondary_communicator() { return secondary_.get(); }
  Communicator* mics_shard_communicator() {
    return options_.mics_shard_group.empty() ? nullptr : shard_.get();
  }
  // MoE's experts (GroupOptions::data_group): the expert data-parallel group they shard over.
  Communicator* data_group_communicator() {
    return options_.data_group.empty() ? nullptr : shard_.get();
  }
  Communicator* mics_replicate_communicator() { return replicate_.get(); }
  // Writes the gathered unit's (possibly modified) full parameters back into this rank's
  // shard and master, e.g. after loading a checkpoint or GatheredParameters edits.
  void commit(std::size_t unit);

  // --- Group ---
  void prepare_backward() override;
  bool reduces(bool boundary) const override;
  std::optional<std::size_t> grad_ready(std::size_t index, bool boundary) override;
  GradReducer& reducer() override { return *reducer_; }
  void finish_backward(bool boundary) override;
  double grad_square_sum() const override;
  void gather_params() override;  // parameters are gathered on demand; flushes NVMe writes
  void hold_grads() override;
  void zero_grads() override;  // on the device: the gradient shard's memory is given back
  const core::ShardedLayout& layout() const override { return layout_; }
  const std::vector<at::Tensor>& params() const override { return params_; }
  at::Device device() const override { return model_options_.device(); }
  bool grads_on_host() const override { return grad_shard_.on_host(); }
  bool params_offloaded() const { return options_.offload_param.enabled; }
  bool frozen() const { return options_.frozen; }
  // With the parameter shard's offload: where it is (host, NVMe: the swap file, its reads).
  OffloadInfo offload_info() const override;
  at::Tensor master_shard() const override;
  void load_master_shard(const at::Tensor& saved) override;
  void refresh_master() override;
  at::Tensor read_params(std::int64_t offset, std::int64_t numel) const override;
  // Writes the master (when kept) and the parameter shard at once, as load_master_shard.
  void write_master_range(std::int64_t offset, const at::Tensor& values) override;
  ShardState& shard_state() override { return state_; }
  const ShardState& shard_state() const override { return state_; }
  std::vector<ShardPiece> shard_pieces() const override;
  ParamSlices param_slices() override;
  std::size_t bucket_count() const override { return reducer_->bucket_count(); }
  std::int64_t bucket_bytes() const override { return reducer_->bucket_bytes(); }
  // kParams: the device shard (every unit must be released first).
  std::vector<TrackedTensor*> device_buffers(StateKind kind) override;
  // kParams: hpZ's copies of the units are dropped, not moved.
  void states_parked(StateKind kind, const std::vector<at::Tensor>& hosts) override;

 private:
  // Waits for the host-to-device copies fetch() queued from param_shard_ (before the host
  // writes it outside a step: a loaded checkpoint, a master range).
  void finish_fetch_copies() const;
  struct Unit {
    std::vector<std::size_t> params;  // indices into params_
    std::size_t trainable = 0;        // params that produce gradients
    std::size_t pending_grads = 0;    // still to arrive in this backward
    at::Tensor gathered;              // one storage for the unit's life; memory only while resident
    core::TrackedBytes tracking;      // counts the memory while resident
    bool resident = false;
    std::unique_ptr<PendingCollective> in_flight;
    TrackedTensor staging;  // offload_param: the shard piece brought to the device to send
    TrackedTensor secondary;  // hpZ: this rank's 1/H of the unit, while `secondary_valid`
    bool secondary_valid = false;
  };

  bool on_nvme(std::size_t unit) const { return param_swap_ && param_swap_->holds(unit); }
  bool packed() const { return options_.quantized_storage; }
  // This rank's piece of the unit in param_shard_: its elements, or its packed bytes.
  at::Tensor param_piece(std::size_t unit) const;
  void store_piece(std::size_t unit, const at::Tensor& values);  // into param_piece(unit)
  void place_param_shard();  // the host / device shard and the NVMe units
  void fill_shard(const std::vector<std::vector<std::int64_t>>& full_shapes);
  at::Tensor shard_piece(const at::Tensor& shard, std::size_t unit) const;
  void attach(std::size_t unit);  // point the unit's parameters at the gathered buffer
  void allocate_gathered(std::size_t unit);  // the unit's storage, counted as gathered
  // Runs `launch` (the unit's all-gather); if it throws, the unit is released again.
  void launch_or_release(std::size_t unit, const std::function<void()>& launch);
  void keep_secondary(std::size_t unit);     // hpZ: copy this rank's 1/H of the gathered unit
  void drop_secondaries();                   // hpZ: the parameters changed

  std::vector<at::Tensor> params_;
  GroupOptions options_;
  core::MemoryRegistry& registry_;
  // MiCS's shard group or MoE's expert data-parallel group (then communicator_)
  std::unique_ptr<Communicator> shard_;
  std::unique_ptr<Communicator> replicate_;  // MiCS: the ranks holding the same shard
  Communicator& communicator_;               // the ranks that partition the parameters
  std::unique_ptr<Communicator> secondary_;  // hpZ
  core::ShardedLayout layout_;
  // This rank's 16-bit (or fp32) parameters: on the device, or in host memory with
  // offload_param (then each gather first copies the unit's piece to the device).
  PlacedBuffer param_shard_;  // the shard's first host_numel_ elements (all but NVMe's)
  std::int64_t host_numel_ = 0;
  std::vector<std::int64_t> packed_offsets_;  // quantized_storage: unit u's bytes start here
  std::unique_ptr<ParamSwap> param_swap_;  // offload_param "nvme": the rest
  c10::TensorOptions model_options_;  // the parameters' dtype and device
  PlacedBuffer grad_shard_;           // on the device, or in host memory (grads_offloaded)
  ShardState state_;
  std::vector<Unit> units_;
  std::unique_ptr<GradReducer> reducer_;
};

}  // namespace zero::adapter
