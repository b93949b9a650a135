#include "adapter/rank_places.h"

#include <sstream>

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

namespace zero::adapter {

void RankPlaces::verify(const RankPlace& mine, c10::Device device, const std::string& header,
                        const std::string& advice) const {
  if (communicator_ == nullptr || communicator_->world_size() == 1) return;
  const int world = communicator_->world_size();
  const auto options = at::TensorOptions().dtype(at::kLong);
  at::Tensor local = at::tensor({static_cast<std::int64_t>(mine.place), mine.detail, mine.count},
                                options)
                         .to(device);
  at::Tensor everyone = at::zeros({3 * world}, options.device(device));
  communicator_->all_gather(everyone, local, /*control=*/true)->wait();
  everyone = everyone.cpu();
  const auto* values = everyone.data_ptr<std::int64_t>();
  bool agree = true;
  for (int r = 0; r < world && agree; ++r) {
    agree = values[3 * r] == static_cast<std::int64_t>(mine.place) &&
            values[3 * r + 1] == mine.detail && values[3 * r + 2] == mine.count;
  }
  if (agree) return;
  std::ostringstream message;
  message << header << ": ";
  for (int r = 0; r < world; ++r) {
    const RankPlace theirs{static_cast<Place>(values[3 * r]), values[3 * r + 1],
                           values[3 * r + 2]};
    message << (r ? "; " : "") << "rank " << r << " is at " << describe(theirs);
  }
  message << ". " << advice;
  TORCH_CHECK(false, message.str());
}

std::string RankPlaces::unit_name(std::int64_t unit) const {
  const bool named = unit >= 0 && static_cast<std::size_t>(unit) < unit_names_.size() &&
                     !unit_names_[static_cast<std::size_t>(unit)].empty();
  return named ? unit_names_[static_cast<std::size_t>(unit)] : "<root module>";
}

std::string RankPlaces::describe(const RankPlace& place) const {
  std::ostringstream text;
  const auto engine = [&](const char* what) {
    text << what << " after " << place.detail << " reducing backward"
         << (place.detail == 1 ? "" : "s") << " and " << place.count << " optimizer step"
         << (place.count == 1 ? "" : "s");
  };
  switch (place.place) {
    case Place::kUnitForward:
      text << "forward of '" << unit_name(place.detail) << "' of step " << place.count;
      break;
    case Place::kUnitBackward:
      text << "backward of '" << unit_name(place.detail) << "' of step " << place.count;
      break;
    case Place::kBackwardEnd:
      text << "the end of backward of step " << place.count;
      break;
    case Place::kUnitHold:
      text << "a gather of '" << unit_name(place.detail)
           << "' outside forward and backward (a state dict, a save or GatheredParameters) of "
              "step "
           << place.count;
      break;
    case Place::kReduce:
      engine("the gradient reduction of a backward");
      break;
    case Place::kStep:
      engine("engine.step()");
      break;
    case Place::kSave:
      engine("save_checkpoint");
      break;
    case Place::kLoad:
      engine("load_checkpoint");
      break;
    default:
      text << "a collective outside the engine (values " << static_cast<std::int64_t>(place.place)
           << ", " << place.detail << ", " << place.count << ")";
  }
  return text.str();
}

}  // namespace zero::adapter
