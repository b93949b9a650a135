#pragma once
// Maps ATen scalar types onto the core's DType (the core never sees torch headers).
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

#include "core/dtype.h"
#include "core/partition_plan.h"

namespace zero::adapter {

core::DType to_core_dtype(c10::ScalarType type);
c10::ScalarType to_scalar_type(core::DType dtype);

// The shapes and dtype of a parameter group, for the planner. Checks the group is non-empty
// and shares one dtype and one device, naming the first parameter that does not.
std::vector<core::TensorSpec> param_specs(const std::vector<at::Tensor>& params);

}  // namespace zero::adapter
