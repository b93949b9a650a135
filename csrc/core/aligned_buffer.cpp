#include "core/aligned_buffer.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace zero::core {
namespace {

bool is_power_of_two(std::size_t value) { return value != 0 && (value & (value - 1)) == 0; }

}  // namespace

std::size_t round_up(std::size_t bytes, std::size_t alignment) {
  if (!is_power_of_two(alignment)) {
    throw std::invalid_argument("round_up: alignment must be a power of two, got " +
                                std::to_string(alignment));
  }
  if (bytes > static_cast<std::size_t>(-1) - (alignment - 1)) {
    throw std::overflow_error("round_up: " + std::to_string(bytes) +
                              " bytes cannot be rounded up to a multiple of " +
                              std::to_string(alignment) + " without overflowing");
  }
  return (bytes + alignment - 1) & ~(alignment - 1);
}

AlignedBuffer::AlignedBuffer(std::size_t bytes, std::size_t alignment) : alignment_(alignment) {
  if (!is_power_of_two(alignment) || alignment % sizeof(void*) != 0) {
    throw std::invalid_argument(
        "AlignedBuffer: alignment must be a power of two and a multiple of " +
        std::to_string(sizeof(void*)) + ", got " +
                                std::to_string(alignment));
  }
  const std::size_t rounded = round_up(bytes, alignment);
  if (rounded == 0) return;
  void* memory = nullptr;
  // posix_memalign reports failure through its return value, not errno.
  const int error = ::posix_memalign(&memory, alignment, rounded);
  if (error != 0) {
    throw AlignedAllocError("AlignedBuffer: posix_memalign of " + std::to_string(rounded) +
                            " bytes aligned to " + std::to_string(alignment) +
                            " failed: " + std::strerror(error));
  }
  // Zero-filled so a tile that is read back before it was ever written, or the padding past a
  // tensor's end, never exposes stale heap contents.
  std::memset(memory, 0, rounded);
  data_ = static_cast<std::byte*>(memory);
  size_ = rounded;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      alignment_(other.alignment_) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    alignment_ = other.alignment_;
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { release(); }

void AlignedBuffer::release() noexcept {
  std::free(data_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace zero::core
