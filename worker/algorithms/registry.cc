// Maps an algorithm's typed options (services/spec/job_spec.h) to its
// implementation, one file each in worker/algorithms/. The visit has one
// overload per AlgorithmOptions alternative: an algorithm added to the spec
// without a factory here does not compile.
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "worker/stage_context.h"

namespace stagewise::worker {

std::unique_ptr<Algorithm> MakeBackprop(const BackpropOptions& options);
std::unique_ptr<Algorithm> MakeDelayed(const DelayedOptions& options);
std::unique_ptr<Algorithm> MakePetra(const PetraOptions& options);
std::unique_ptr<Algorithm> MakeFeaturesReplay(const FeaturesReplayOptions& options);
std::unique_ptr<Algorithm> MakeNwise(const NwiseOptions& options);
std::unique_ptr<Algorithm> MakeAuxNet(const AuxNetOptions& options);

namespace {

struct Factory {
  std::unique_ptr<Algorithm> operator()(const BackpropOptions& o) const { return MakeBackprop(o); }
  std::unique_ptr<Algorithm> operator()(const DelayedOptions& o) const { return MakeDelayed(o); }
  std::unique_ptr<Algorithm> operator()(const FeaturesReplayOptions& o) const {
    return MakeFeaturesReplay(o);
  }
  std::unique_ptr<Algorithm> operator()(const PetraOptions& o) const { return MakePetra(o); }
  std::unique_ptr<Algorithm> operator()(const NwiseOptions& o) const { return MakeNwise(o); }
  std::unique_ptr<Algorithm> operator()(const AuxNetOptions& o) const { return MakeAuxNet(o); }
};

}  // namespace

std::unique_ptr<Algorithm> MakeAlgorithm(const AlgorithmSpec& spec) {
  return std::visit(Factory{}, spec.options);
}

}  // namespace stagewise::worker
