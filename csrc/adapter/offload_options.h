#pragma once
// What offload_optimizer asks of the engine (filled from the validated config in
// zero/boundary.py and offload/options.py; bound field by field as _C.OffloadOptions).
#include <cstdint>
#include <functional>
#include <string>

#include "core/io_backend.h"

namespace zero::adapter {

struct OffloadOptions {
  bool enabled = false;
  bool pin_memory = true;  // the schema's default (DeepSpeed 0.19.8's)
  std::int64_t tile_numel = std::int64_t{1} << 22;  // elements per streamed chunk
  std::string nvme_path;  // non-empty: the state lives in a swap file in this directory
  core::AioConfig aio;
  bool delayed_update = false;  // ZeRO-Offload's DPU (host only)
  // Fraction of the shard whose state and step go to the host / NVMe (the shard's tail);
  // the rest stays on the device.
  double ratio = 1.0;
  // The gradient shard (stages 2-3) stays on the device instead of host memory: backward
  // reduces into it as without offload, and the streamed step copies it to the host chunk by
  // chunk behind the CPU optimizer (offloaded_state.h; the delayed update copies it whole at
  // its start). Costs the shard's bytes on the device; saves the host shard's copies in
  // backward (one per micro-step, and at gradient accumulation a device round trip for each
  // later one).
  bool grads_on_device = false;
  // With NVMe: told the bytes of each chunk written outside the step (start-up, checkpoint
  // load, commit), for a progress display. Never called from the step.
  std::function<void(std::int64_t bytes)> on_swap_write;
};

}  // namespace zero::adapter
