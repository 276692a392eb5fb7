// Maps an algorithm name to its implementation.
#include "absl/strings/str_cat.h"
#include "worker/stage_context.h"

namespace stagewise::worker {

std::unique_ptr<Algorithm> MakeBackprop(const AlgorithmSpec& spec);
std::unique_ptr<Algorithm> MakeDelayed(const AlgorithmSpec& spec);
std::unique_ptr<Algorithm> MakePetra(const AlgorithmSpec& spec);
std::unique_ptr<Algorithm> MakeFeaturesReplay(const AlgorithmSpec& spec);
std::unique_ptr<Algorithm> MakeNwise(const AlgorithmSpec& spec);
std::unique_ptr<Algorithm> MakeAuxNet(const AlgorithmSpec& spec);

absl::StatusOr<std::unique_ptr<Algorithm>> MakeAlgorithm(const AlgorithmSpec& spec) {
  try {
    if (spec.name == "backprop") return MakeBackprop(spec);
    if (spec.name == "delayed") return MakeDelayed(spec);
    if (spec.name == "petra") return MakePetra(spec);
    if (spec.name == "features_replay") return MakeFeaturesReplay(spec);
    if (spec.name == "nwise") return MakeNwise(spec);
    if (spec.name == "auxnet") return MakeAuxNet(spec);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm: ", e.what()));
  }
  return absl::UnimplementedError(
      absl::StrCat("algorithm: '", spec.name, "' is not available on this worker yet"));
}

}  // namespace stagewise::worker
