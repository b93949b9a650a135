#include "core/square_sum.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/cpu_adam_kernel.h"  // the 16-bit conversions

namespace zero::core {
namespace {

constexpr std::int64_t kBlock = 1 << 16;  // elements summed into one double, in order
constexpr int kLanes = 8;                 // independent accumulators: the loop vectorizes

template <typename Load>
double block_sum(Load load, std::int64_t begin, std::int64_t end) {
  double lanes[kLanes] = {};
  std::int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double x = load(i + l);
      lanes[l] += x * x;
    }
  }
  for (; i < end; ++i) {
    const double x = load(i);
    lanes[0] += x * x;
  }
  double total = 0.0;
  for (const double lane : lanes) total += lane;
  return total;
}

double block_sum(const void* data, ElemType type, std::int64_t begin, std::int64_t end) {
  switch (type) {
    case ElemType::kF32: {
      const float* f = static_cast<const float*>(data);
      return block_sum([f](std::int64_t i) { return f[i]; }, begin, end);
    }
    case ElemType::kBF16: {
      const auto* h = static_cast<const std::uint16_t*>(data);
      return block_sum([h](std::int64_t i) { return adam_detail::bf16_to_float(h[i]); }, begin, end);
    }
    case ElemType::kF16: {
      const auto* h = static_cast<const std::uint16_t*>(data);
      return block_sum([h](std::int64_t i) { return adam_detail::fp16_to_float(h[i]); }, begin, end);
    }
  }
  throw std::invalid_argument("square_sum: unknown element type");
}

}  // namespace

double square_sum(const void* data, ElemType type, std::int64_t n, int num_threads) {
  if (n < 0) throw std::invalid_argument("square_sum: n must be >= 0, got " + std::to_string(n));
  if (n == 0) return 0.0;
  if (data == nullptr) throw std::invalid_argument("square_sum: data is null");
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> sums(static_cast<std::size_t>(blocks));
  auto run = [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t b = first; b < last; ++b) {
      sums[static_cast<std::size_t>(b)] =
          block_sum(data, type, b * kBlock, std::min(n, (b + 1) * kBlock));
    }
  };
  const std::int64_t threads = std::clamp<std::int64_t>(num_threads, 1, blocks);
  const std::int64_t per = (blocks + threads - 1) / threads;
  std::vector<std::thread> workers;
  for (std::int64_t first = per; first < blocks; first += per) {
    const std::int64_t last = std::min(blocks, first + per);
    try {
      workers.emplace_back(run, first, last);
    } catch (const std::system_error&) {
      run(first, last);  // out of threads: sum this range here rather than fail the step
    }
  }
  run(0, std::min(blocks, per));
  for (auto& worker : workers) worker.join();
  double total = 0.0;
  for (const double sum : sums) total += sum;
  return total;
}

}  // namespace zero::core
