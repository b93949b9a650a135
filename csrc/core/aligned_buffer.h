#pragma once
// A page-aligned, zero-filled host buffer for swap I/O. O_DIRECT needs the buffer address and
// the transfer length to be multiples of the device's logical block size; allocating with that
// alignment and rounding the size up to it means any AlignedBuffer can be handed to the swap
// store whole, whatever the filesystem underneath.
#include <cstddef>
#include <new>
#include <string>

namespace zero::core {

// The alignment (bytes) of every swap-file offset, length and buffer. 4096 covers 512-byte and
// 4K-native NVMe devices and the page size on x86-64 and most arm64 kernels.
inline constexpr std::size_t kIoAlignment = 4096;

// Rounds `bytes` up to a multiple of `alignment` (a power of two).
std::size_t round_up(std::size_t bytes, std::size_t alignment = kIoAlignment);

// Thrown when the aligned allocation fails; a std::bad_alloc so callers that handle
// out-of-memory generically still do, with a message that says how much was asked for.
class AlignedAllocError : public std::bad_alloc {
 public:
  explicit AlignedAllocError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

class AlignedBuffer {
 public:
  AlignedBuffer() = default;  // empty: data() is null, size() is 0
  // Allocates round_up(bytes, alignment) zeroed bytes. `alignment` must be a power of two and a
  // multiple of sizeof(void*) (posix_memalign's rule); std::invalid_argument otherwise.
  explicit AlignedBuffer(std::size_t bytes, std::size_t alignment = kIoAlignment);
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }  // the rounded size: all of it may be used
  std::size_t alignment() const { return alignment_; }
  bool empty() const { return size_ == 0; }

 private:
  void release() noexcept;

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t alignment_ = kIoAlignment;
};

}  // namespace zero::core
