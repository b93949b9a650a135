#pragma once
// LAMB (You et al., 2019) as DeepSpeed's FusedLamb computes it, on a rank's shard. Adam's
// moments m and v (uncorrected), the update u = m / (sqrt(v) + eps) + weight_decay * w (eps
// under the square root with eps_inside_sqrt), and per parameter the trust ratio
// ||w|| / ||u|| clamped to [min_coeff, max_coeff] (1 where either norm is 0); then
// w -= step_size * ratio * u, step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t), or lr
// without bias correction.
//
// The norms are over whole parameters although a rank holds slices of them: each rank sums
// its slices' squares per parameter and one all-reduce adds them up over the ranks sharing
// the parameters. (DeepSpeed's ZeRO steps its flat fp32 partition as one tensor, one trust
// ratio for all of it; zero keeps LAMB's per-parameter ratio at every stage.) A parameter
// split by tensor parallelism gets the ratio of each rank's slice, as in DeepSpeed.
#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/Tensor.h>

#include "adapter/optimizer_math.h"
#include "adapter/param_slices.h"
#include "adapter/shard_piece.h"

namespace zero::adapter {

class ShardState;

// One LAMB step of `state`'s pieces (gradients multiplied by grad_scale) on the device; the
// new parameters land in the pieces and stepped(i) follows piece i's. step is 1-based.
// Returns every parameter's trust ratio (the same on every rank sharing them).
std::vector<double> lamb_step(ShardState& state, const std::vector<ShardPiece>& pieces,
                              const ParamSlices& params, const OptimizerHyper& hyper,
                              double grad_scale, std::int64_t step,
                              const std::function<void(std::size_t)>& stepped);

}  // namespace zero::adapter
