#pragma once
// Frees or re-allocates a storage's memory in place: every tensor viewing it (autograd's saved
// views, a reducer's target, a step's shard pieces) keeps pointing at the same StorageImpl and
// sees the new memory. Between the two, the views must not be read.
#include <cstddef>

#include <ATen/Tensor.h>

namespace zero::adapter {

inline void free_storage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(0));
  storage->set_nbytes(0);
}

inline void allocate_storage(const at::Tensor& tensor, std::size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

}  // namespace zero::adapter
