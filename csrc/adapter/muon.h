#pragma once
// Muon (Jordan et al., 2024) as DeepSpeed's MuonWithAuxAdam computes it for the parameters it
// tags "use_muon" (matrices; the rest of the model is stepped by Adam, in groups of their
// own): a momentum m = beta m + (1 - beta) g, the Nesterov blend b = (1 - beta) g + beta m,
// and b orthogonalized by a Newton-Schulz iteration as a matrix, scaled by
// sqrt(max(1, rows / cols)). The step then applies it like SGD with decoupled weight decay
// (optimizer_math.h's muon_apply).
//
// The momentum and the blend are element by element, on the rank's shard. Newton-Schulz needs
// whole matrices: each unit's blends are all-gathered, every rank orthogonalizes the
// parameters it holds a slice of and keeps its slices. The updates replace the gradients in
// the pieces: under ZeRO before the gradient norm is taken, so clipping scales the updates,
// as in DeepSpeed's ZeRO optimizers (EngineCore::step; at stage 0 after clipping).
#include <cstdint>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/optimizer_math.h"
#include "adapter/param_slices.h"
#include "adapter/shard_piece.h"

namespace zero::adapter {

class ShardState;

// Replaces the gradients in `pieces` (multiplied by grad_scale: 1 / the loss scale) by Muon's
// unscaled updates, advancing the momentum in `state` (on the device, or offloaded to host
// memory). The work runs on `device` (the model's), wherever the gradients and the momentum
// live. Every rank sharing the parameters calls it (one all-gather per piece).
void muon_updates(ShardState& state, const std::vector<ShardPiece>& pieces,
                  const ParamSlices& params, const OptimizerHyper& hyper, double grad_scale,
                  at::Device device);

// One parameter's update from its whole blend `blend` (fp32, `shape`'s elements, flat):
// hyper.ns_steps Newton-Schulz steps (hyper.ns_method in hyper.ns_dtype) on the matrix view
// (a 4-d tensor as [shape[0], rest], a 3-d one as a batch of matrices), times the
// aspect-ratio scale of shape's last two sizes, as DeepSpeed's muon_update. fp32, flat.
at::Tensor orthogonalized(const at::Tensor& blend, const std::vector<std::int64_t>& shape,
                          const OptimizerHyper& hyper);

}  // namespace zero::adapter
