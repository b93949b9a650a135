#include "adapter/shard_piece.h"

namespace zero::adapter {

void store_params(const ShardPiece& piece, std::int64_t begin, const at::Tensor& values,
                  void (*copy)(const at::Tensor& dst, const at::Tensor& src)) {
  if (piece.store) {
    piece.store(piece.store_base + begin, values);
  } else if (copy != nullptr) {
    copy(piece.param.narrow(0, begin, values.numel()), values);
  } else {
    piece.param.narrow(0, begin, values.numel()).copy_(values);
  }
}

ShardPiece sub_piece(const ShardPiece& piece, std::int64_t begin, std::int64_t numel,
                     std::int64_t offset) {
  ShardPiece part{piece.grad.narrow(0, begin, numel), at::Tensor(), offset, piece.store,
                  piece.store_base + begin};
  if (piece.param.defined()) part.param = piece.param.narrow(0, begin, numel);
  return part;
}

}  // namespace zero::adapter
