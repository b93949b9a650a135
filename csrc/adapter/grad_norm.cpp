#include "adapter/grad_norm.h"

#include <ATen/Parallel.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <c10/util/Exception.h>

#include "core/square_sum.h"

namespace zero::adapter {
namespace {

bool core_type(at::ScalarType type, core::ElemType* out) {
  switch (type) {
    case at::kFloat: *out = core::ElemType::kF32; return true;
    case at::kBFloat16: *out = core::ElemType::kBF16; return true;
    case at::kHalf: *out = core::ElemType::kF16; return true;
    default: return false;
  }
}

}  // namespace

double square_sum(const at::Tensor& grad) {
  if (!grad.defined() || grad.numel() == 0) return 0.0;
  core::ElemType type;
  if (grad.device().is_cpu() && grad.is_contiguous() && core_type(grad.scalar_type(), &type)) {
    return core::square_sum(grad.const_data_ptr(), type, grad.numel(), at::get_num_threads());
  }
  const double norm =
      at::linalg_vector_norm(grad, 2.0, std::nullopt, false, at::kFloat).item<double>();
  return norm * norm;
}

}  // namespace zero::adapter
