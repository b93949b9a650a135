#include "adapter/dtype_map.h"

#include <c10/util/Exception.h>

namespace zero::adapter {

core::DType to_core_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float: return core::DType::kFloat32;
    case c10::ScalarType::BFloat16: return core::DType::kBFloat16;
    case c10::ScalarType::Half: return core::DType::kFloat16;
    case c10::ScalarType::Double: return core::DType::kFloat64;
    default:
      TORCH_CHECK(false, "zero: unsupported dtype ", type,
                  "; flat buffers hold float32, bfloat16, float16 or float64");
  }
}

c10::ScalarType to_scalar_type(core::DType dtype) {
  switch (dtype) {
    case core::DType::kFloat32: return c10::ScalarType::Float;
    case core::DType::kBFloat16: return c10::ScalarType::BFloat16;
    case core::DType::kFloat16: return c10::ScalarType::Half;
    case core::DType::kFloat64: return c10::ScalarType::Double;
  }
  TORCH_CHECK(false, "zero: unknown core dtype");
}

std::vector<core::TensorSpec> param_specs(const std::vector<at::Tensor>& params) {
  TORCH_CHECK(!params.empty(), "zero: a parameter group has no parameters");
  std::vector<core::TensorSpec> specs;
  specs.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    TORCH_CHECK(p.scalar_type() == params.front().scalar_type(), "zero: parameter ", i,
                " of a group is ", p.scalar_type(), " but parameter 0 is ",
                params.front().scalar_type(), "; every managed parameter must have the training "
                "dtype (is a parameter outside the model passed in model_parameters?)");
    TORCH_CHECK(p.device() == params.front().device(), "zero: parameter ", i, " is on ",
                p.device(), " but parameter 0 is on ", params.front().device());
    specs.push_back({p.sizes().vec(), to_core_dtype(p.scalar_type())});
  }
  return specs;
}

}  // namespace zero::adapter
