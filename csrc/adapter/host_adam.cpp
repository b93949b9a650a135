#include "adapter/host_adam.h"

#include <algorithm>
#include <optional>

#include <ATen/TensorIterator.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "core/cpu_adam.h"

namespace zero::adapter {
namespace {

// Elements widened at once: three fp32 tiles of 64 KiB each stay in a core's L2. Below the
// grain of torch's elementwise ops, so a tile's copies on a pool thread start no threads.
constexpr std::int64_t kTile = 16384;
static_assert(kTile < at::internal::GRAIN_SIZE);
// Elements below which a range is not worth a thread of its own.
constexpr std::int64_t kMinRange = 32 * 1024;

// The kernel's element type for a tensor's dtype; none for a dtype it does not take.
std::optional<core::ElemType> elem_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return core::ElemType::kF32;
    case at::kBFloat16: return core::ElemType::kBF16;
    case at::kHalf: return core::ElemType::kF16;
    default: return std::nullopt;
  }
}

core::AdamParams adam_params(const OptimizerHyper& hyper, double grad_scale, std::int64_t step) {
  core::AdamParams params;
  params.lr = hyper.lr;
  params.beta1 = hyper.beta1;
  params.beta2 = hyper.beta2;
  params.eps = hyper.eps;
  params.weight_decay = hyper.weight_decay;
  params.adamw_mode = hyper.decoupled_weight_decay;
  params.bias_correction = hyper.bias_correction;
  params.step = step;
  params.grad_scale = static_cast<float>(grad_scale);
  return params;
}

// The kernel over fp32 master and moments, [begin, end) of each on one thread.
void fused_range(const core::AdamParams& params, const at::Tensor& master,
                 const at::Tensor& grads, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                 const at::Tensor& out16, std::int64_t begin, std::int64_t end) {
  const auto at_begin = [begin](const at::Tensor& t) {
    return static_cast<char*>(t.data_ptr()) + begin * static_cast<std::int64_t>(t.element_size());
  };
  const bool has_out = out16.defined();
  core::adam_step(params, reinterpret_cast<float*>(at_begin(master)), at_begin(grads),
                  *elem_type(grads.scalar_type()), reinterpret_cast<float*>(at_begin(exp_avg)),
                  reinterpret_cast<float*>(at_begin(exp_avg_sq)), end - begin,
                  has_out ? at_begin(out16) : nullptr,
                  has_out ? *elem_type(out16.scalar_type()) : core::ElemType::kBF16,
                  core::best_isa(), /*num_threads=*/1);
}

// The kernel over fp32 master and moments, split among the pool's threads.
void fused_step(const core::AdamParams& params, const at::Tensor& master, const at::Tensor& grads,
                const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& out16,
                core::RangePool& threads) {
  threads.run(master.numel(), kMinRange, [&](std::int64_t begin, std::int64_t end) {
    fused_range(params, master, grads, exp_avg, exp_avg_sq, out16, begin, end);
  });
}

// [begin, end) of every array, one tile at a time: each 16-bit array widened into its fp32
// scratch row, the kernel on one thread, the rows rounded back.
void widened_range(const core::AdamParams& params, const at::Tensor& master,
                   const at::Tensor& grads, const at::Tensor& exp_avg,
                   const at::Tensor& exp_avg_sq, const at::Tensor& out16, std::int64_t begin,
                   std::int64_t end) {
  const at::Tensor scratch = at::empty({3, std::min(kTile, end - begin)},
                                       master.options().dtype(at::kFloat));
  const at::Tensor arrays[3] = {master, exp_avg, exp_avg_sq};
  for (std::int64_t offset = begin; offset < end; offset += kTile) {
    const std::int64_t n = std::min(kTile, end - offset);
    at::Tensor wide[3];
    for (int a = 0; a < 3; ++a) {
      const at::Tensor part = arrays[a].narrow(0, offset, n);
      wide[a] = part.scalar_type() == at::kFloat ? part : scratch[a].narrow(0, 0, n).copy_(part);
    }
    fused_range(params, wide[0], grads.narrow(0, offset, n), wide[1], wide[2],
                out16.defined() ? out16.narrow(0, offset, n) : at::Tensor(), 0, n);
    for (int a = 0; a < 3; ++a) {
      if (arrays[a].scalar_type() != at::kFloat) arrays[a].narrow(0, offset, n).copy_(wide[a]);
    }
  }
}

// The widened step split among the pool's threads. Its tile copies are torch ops: each
// range runs them under the caller's thread-local state (grad mode, inference mode, ...).
void widened_step(const core::AdamParams& params, const at::Tensor& master,
                  const at::Tensor& grads, const at::Tensor& exp_avg,
                  const at::Tensor& exp_avg_sq, const at::Tensor& out16,
                  core::RangePool& threads) {
  const at::ThreadLocalState callers;
  threads.run(master.numel(), kTile, [&](std::int64_t begin, std::int64_t end) {
    const at::ThreadLocalStateGuard as_the_caller(callers);
    widened_range(params, master, grads, exp_avg, exp_avg_sq, out16, begin, end);
  });
}

}  // namespace

bool host_adam_takes(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
         t.is_contiguous() && elem_type(t.scalar_type()).has_value();
}

void host_adam_update(const at::Tensor& master, const at::Tensor& grads, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq, const OptimizerHyper& hyper,
                      double grad_scale, std::int64_t step, const at::Tensor& out16,
                      core::RangePool& threads) {
  for (const at::Tensor* t : {&master, &grads, &exp_avg, &exp_avg_sq}) {
    TORCH_CHECK(host_adam_takes(*t) && t->numel() == master.numel(), "zero: the host Adam "
                "step needs contiguous fp32/bf16/fp16 host tensors of ", master.numel(),
                " elements");
  }
  TORCH_CHECK(!out16.defined() || (host_adam_takes(out16) && out16.numel() == master.numel()),
              "zero: the host Adam step writes 16-bit parameters into a contiguous host tensor "
              "of ", master.numel(), " elements");
  const core::AdamParams params = adam_params(hyper, grad_scale, step);
  const bool fp32 = master.scalar_type() == at::kFloat &&
                    exp_avg.scalar_type() == at::kFloat && exp_avg_sq.scalar_type() == at::kFloat;
  if (fp32) {
    fused_step(params, master, grads, exp_avg, exp_avg_sq, out16, threads);
  } else {
    widened_step(params, master, grads, exp_avg, exp_avg_sq, out16, threads);
  }
  // raw writes: bump the version counters as in-place ops would (autograd's checks)
  for (const at::Tensor* t : {&master, &exp_avg, &exp_avg_sq, &out16}) {
    if (t->defined() && !t->is_inference()) t->unsafeGetTensorImpl()->bump_version();
  }
}

}  // namespace zero::adapter
