#pragma once
// Maps ATen scalar types onto the core's DType (the core never sees torch headers).
#include <c10/core/ScalarType.h>

#include "core/dtype.h"

namespace zero::adapter {

core::DType to_core_dtype(c10::ScalarType type);
c10::ScalarType to_scalar_type(core::DType dtype);

}  // namespace zero::adapter
