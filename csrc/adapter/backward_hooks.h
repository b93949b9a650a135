#pragma once
// Stage 3's backward triggers as C++ autograd functions, so the scheduling never waits on
// Python: an identity on a unit's outputs whose backward runs just before the unit's own
// backward (gather the unit, queue the end-of-backward flush once), and an identity on the
// unit's inputs whose backward runs once the unit's backward is done (release it).
#include <memory>
#include <vector>

#include <ATen/Tensor.h>

namespace zero::adapter {

class EngineCore;

// Both return the tensors to use in place of the given ones (the same values, new autograd
// nodes). Tensors that do not require grad pass through untouched. The functions hold the
// engine weakly: a graph that outlives its engine does nothing in backward.
std::vector<at::Tensor> attach_pre_backward(const std::shared_ptr<EngineCore>& core,
                                            std::size_t unit, std::vector<at::Tensor> outputs);
std::vector<at::Tensor> attach_post_backward(const std::shared_ptr<EngineCore>& core,
                                             std::size_t unit, std::vector<at::Tensor> inputs);

}  // namespace zero::adapter
