#pragma once
// One optimizer parameter group of one dtype, laid out by a ShardedLayout:
//
//   stage | model params (param) | grads (gradient)   | fp32 master + optimizer state
//   0     | full                 | full               | full (nothing is sharded)
//   1     | full                 | full               | this rank's 1/N of every unit
//   2     | full                 | this rank's 1/N    | this rank's 1/N
//
// The model's parameters become views of the full param buffer, so the all-gather after the
// step writes straight into them. At stages 0 and 1 param.grad are views of the full grad
// buffer (autograd accumulates in place); at stage 2 grads are copied into unit buckets as
// they become ready and released. Stage 1 with GroupOptions::shard_grads (one micro-step per
// step: nothing to accumulate) reduces as stage 2 does and keeps no full grad buffer. In
// fp32 training the master is the param buffer itself (this rank's pieces of it): no extra
// copy.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/collectives.h"
#include "adapter/grad_reducer.h"
#include "adapter/group.h"
#include "adapter/host_pinning.h"
#include "adapter/shard_state.h"
#include "adapter/tracked_tensor.h"
#include "core/dtype.h"
#include "core/io_backend.h"
#include "core/sharded_layout.h"

namespace zero::adapter {

// Stage 3: where this rank's parameter shard lives when it is not on the device.
struct ParamOffloadOptions {
  bool enabled = false;  // in host memory (offload_param device "cpu" or "nvme")
  bool pin_memory = true;  // the schema's default (DeepSpeed 0.19.8's)
  std::string nvme_path;  // non-empty: on NVMe, but for the first units up to max_in_cpu
  std::int64_t max_in_cpu = 0;  // shard elements kept in host memory with NVMe
  std::int64_t buffer_count = 5;  // host buffers carrying NVMe units in and out
  std::int64_t buffer_numel = 100'000'000;  // the most shard elements one NVMe unit may have
  core::AioConfig aio;
  // Told the bytes of each unit written to the swap file at start-up (a progress display).
  std::function<void(std::int64_t bytes)> on_swap_write;
};

struct GroupOptions;
// Stages 2-3 with the whole optimizer step offloaded: the gradient shard lives in host memory
// (ZeRO-Offload), unless the config keeps it on the device (OffloadOptions::grads_on_device) or
// the device still updates part of the shard (ratio < 1).
bool grads_offloaded(const GroupOptions& options);
// A new accumulation window for a gradient shard: on the device its memory is given back
// (zero-filled when taken again); in host memory it is left as it is, every unit's next
// reduction overwriting its range (GradReducer::grads_discarded).
void start_grad_window(PlacedBuffer& shard, GradReducer& reducer);
// The reduce buckets' options: the gradients' (`model`), in the communication dtype if one
// is set.
c10::TensorOptions bucket_options(const c10::TensorOptions& model, const GroupOptions& options);
// The gradient buffers' options for a model of `model` options: fp32 with grads_in_fp32 (a
// 16-bit model's gradients accumulated in fp32), else the model's.
c10::TensorOptions grad_options(const c10::TensorOptions& model, const GroupOptions& options);
// The optimizer-state arrays a group of these options keeps (optimizer_state_names).
std::vector<std::string> optimizer_arrays(const GroupOptions& options);
// The dtypes of a group's shard state for a model of `model` dtype; separate_master: the
// group needs a master apart from its parameters whatever their dtype (stage 3's parameters
// offloaded to the host while the step runs on the device).
ShardPrecision shard_precision(const GroupOptions& options, at::ScalarType model,
                               bool separate_master);

struct GroupOptions {
  int stage = 0;
  std::int64_t alignment = 1;  // elements
  std::int64_t unit_numel = 500'000'000;
  bool overlap_comm = true;
  // Stage 1: gradients go into this rank's shard in backward, as at stage 2, instead of a
  // full buffer reduced at the accumulation boundary (the engine sets it when every step is
  // one micro-step, where the full buffer would only cost memory).
  bool shard_grads = false;
  OptimizerKind optimizer = OptimizerKind::kAdam;
  bool sgd_momentum = false;  // SGD keeps a momentum buffer only when momentum != 0
  // kExternal: the per-element arrays the optimizer keeps (zero/external_optimizer.py)
  std::vector<std::string> external_states;
  OffloadOptions offload;     // optimizer state in host memory (stages 1-3)
  ParamOffloadOptions offload_param;
  // Indices (in this group) of parameters the model holds under more than one name (tied
  // weights). Their gradient may reach the engine more than once in one backward (each
  // reentrant activation-checkpointed region accumulates its own), so their units reduce at
  // the end of backward, after every contribution (GradReducer, Stage3Group).
  std::vector<std::size_t> shared_params;
  // Stage 3, ZeRO++ (quantized_comm.h): units all-gathered (qwZ) and gradients
  // reduce-scattered (qgZ) as block-wise int8.
  bool quantized_weights = false;
  bool quantized_gradients = false;
  // Stage 3 (DeepSpeed's stage3_use_all_reduce_for_fetch_params): units are gathered by an
  // all-reduce (Communicator::all_gather_by_all_reduce); not the quantized or hpZ gathers.
  bool all_reduce_fetch = false;
  // DeepSpeed's bf16_master_weights_and_grads / fp16_master_weights_and_grads: the master
  // weights in the parameters' 16-bit dtype (the parameters themselves where no separate copy
  // is needed; shard_precision.h), and bf16_optimizer_states: the optimizer's arrays too.
  bool master_in_model_dtype = false;
  bool states_in_model_dtype = false;
  // DeepSpeed's data_types.grad_accum_dtype "fp32" under bf16/fp16: the gradient buffers
  // (stages 0-1's full one, stages 2-3's shard) are fp32. Autograd's 16-bit gradient of each
  // micro-step is added into them by the hook and released; reductions still go in the
  // model's dtype (or communication_dtype) through a converting copy (GradReducer).
  bool grads_in_fp32 = false;
  // The dtype gradients are reduced in (DeepSpeed's communication_data_type); none: the
  // gradients' own. Another dtype reduces a copy of each unit (GradReducer's buckets) and
  // casts the result back into the gradients.
  std::optional<core::DType> communication_dtype;
  // Stage 3, ZeRO++ hpZ: the registered name of this rank's secondary group (a few ranks of
  // one node; empty: none). After a unit's first gather of a step, each rank keeps its 1/H of
  // the unit; later gathers until the parameters change come from those copies, inside the group.
  std::string hpz_group;
  // Stage 3, MiCS: the registered names of this rank's shard group (the ranks that partition
  // the parameters among themselves) and replicate group (the ranks holding the same shard,
  // which average their reduced gradient shards). Empty: the engine's world group shards.
  std::string mics_shard_group;
  std::string mics_replicate_group;
  // DeepSpeed-MoE's expert parameters: the registered name of the group this group shards
  // and reduces over instead of the engine's (the expert data-parallel group: the ranks
  // holding the same experts); empty: the engine's. average_over: what its gradient mean
  // divides by (the whole data-parallel world, as DeepSpeed does); 0: that group's size.
  std::string data_group;
  int average_over = 0;
  // Stage 3: parameters that train nothing (requires_grad false, as a LoRA base model's),
  // partitioned and gathered like the rest but keeping no gradients, master or optimizer
  // state (EngineCore::adopt_frozen_group); the optimizer options above are ignored.
  bool frozen = false;
  // A frozen group only (DeepSpeed's zero_quantized_nontrainable_weights): its shard is kept
  // as the block-wise int8 code of quantized_comm.h (about 1 byte per element), gathered
  // packed and decoded into the unit's buffer; not with offload_param "nvme".
  bool quantized_storage = false;
};

class ParamGroup : public Group {
 public:
  ParamGroup(std::vector<at::Tensor> params, const GroupOptions& options,
             core::MemoryRegistry& registry, core::RangePool& host_threads,
             Communicator& communicator);

  // Stages 0/1: makes every param.grad our view again (a user's zero_grad may have set it
  // to None).
  void prepare_backward() override;
  bool reduces(bool boundary) const override;
  std::optional<std::size_t> grad_ready(std::size_t index, bool boundary) override;
  GradReducer& reducer() override { return *reducer_; }
  at::Tensor accumulated_grad(std::size_t index) const override;
  void finish_backward(bool boundary) override;
  bool reduced_in_place() const override { return reduced_in_place_; }

  double grad_square_sum() const override;
  void gather_params() override;
  void hold_grads() override;
  void zero_grads() override;  // stage 2 (device): the gradient shard's memory is given back

  const core::ShardedLayout& layout() const override { return layout_; }
  const std::vector<at::Tensor>& params() const override { return params_; }
  at::Device device() const override { return param_buffer_.tensor().device(); }
  bool grads_on_host() const override { return grad_shard_.on_host(); }
  at::Tensor master_shard() const override;
  void load_master_shard(const at::Tensor& saved) override;
  void refresh_master() override;
  at::Tensor read_params(std::int64_t offset, std::int64_t numel) const override;
  void write_master_range(std::int64_t offset, const at::Tensor& values) override;
  ShardState& shard_state() override { return state_; }
  const ShardState& shard_state() const override { return state_; }
  std::vector<ShardPiece> shard_pieces() const override;
  void piece_stepped(std::size_t unit) override;  // stages 1, 2: starts the unit's all-gather
  ParamSlices param_slices() override;
  std::size_t bucket_count() const override { return reducer_->bucket_count(); }
  std::int64_t bucket_bytes() const override { return reducer_->bucket_bytes(); }
  std::vector<TrackedTensor*> device_buffers(StateKind kind) override;
  // The model's parameters (kParams) and, at stages 0-1, their .grad (kGrads) view the
  // host copies while parked.
  void states_parked(StateKind kind, const std::vector<at::Tensor>& hosts) override;
  void states_restored(StateKind kind) override;

 private:
  // Parameter `index`'s place in `flat`, a buffer laid out like the param buffer (the
  // param buffer itself, the full gradients, their host copies), shaped like the parameter.
  at::Tensor place_in(const at::Tensor& flat, std::size_t index) const;
  // Every parameter's data (or .grad) made its place in `flat`.
  void point_params_at(const at::Tensor& flat);
  void point_grads_at(const at::Tensor& flat);
  bool sharded_grads() const {
    return options_.stage == 2 || (options_.stage == 1 && options_.shard_grads);
  }
  // Stages 0-1 with the full gradient buffer in another dtype than the parameters
  // (grads_in_fp32): param.grad cannot view it, so the hook adds autograd's gradient in.
  bool grads_apart() const {
    return grad_full_.defined() &&
           grad_full_.tensor().scalar_type() != param_buffer_.tensor().scalar_type();
  }
  // grads_apart(): adds parameter `index`'s .grad into the full buffer and releases it.
  void fold_grad(std::size_t index);
  // A backward begun after a boundary reduced the full buffer in place, before the step.
  void carry_reduced_pieces();
  std::int64_t piece_numel(std::size_t unit) const { return layout_.unit(unit).shard_numel(); }
  at::Tensor full_piece(const at::Tensor& full, std::size_t unit) const;
  // The pieces of the param buffer holding shard [offset, offset + numel), in order: each a
  // view, and where it starts in the range.
  std::vector<std::pair<at::Tensor, std::int64_t>> param_range(std::int64_t offset,
                                                               std::int64_t numel) const;
  at::Tensor shard_piece(const at::Tensor& shard, std::size_t unit) const;
  at::Tensor grad_piece(std::size_t unit) const;
  at::Tensor param_view(std::size_t index) const;

  std::vector<at::Tensor> params_;
  GroupOptions options_;
  Communicator& communicator_;
  int rank_;  // rank within the layout (0 at stage 0, where nothing is sharded)
  core::ShardedLayout layout_;
  TrackedTensor param_buffer_;
  TrackedTensor grad_full_;   // stages 0, 1
  PlacedBuffer grad_shard_;  // sharded_grads(): on the device, or (grads_offloaded) the host
  ShardState state_;
  std::unique_ptr<GradReducer> reducer_;
  // The full buffer was reduced in place at a boundary and not zeroed (stepped) since;
  // carried_: its averaged pieces, set aside while another backward reduces.
  bool reduced_in_place_ = false;
  at::Tensor carried_;
  // The all-gathers of stepped units still on the wire (gather_params waits for them).
  std::vector<std::unique_ptr<PendingCollective>> gathers_;
  std::vector<bool> gathering_;  // per unit: its all-gather is in gathers_
};

}  // namespace zero::adapter
