// Maps an algorithm name to its implementation: one table row per file of
// worker/algorithms/. The names match the job-spec schemas (KnownAlgorithms(),
// services/common/job_spec.h); tests/unit/algorithms_test.cc checks both ways.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/stage_context.h"

namespace stagewise::worker {

std::unique_ptr<Algorithm> MakeBackprop(const AlgorithmSpec& spec);
std::unique_ptr<Algorithm> MakeDelayed(const AlgorithmSpec& spec);
std::unique_ptr<Algorithm> MakePetra(const AlgorithmSpec& spec);
std::unique_ptr<Algorithm> MakeFeaturesReplay(const AlgorithmSpec& spec);
std::unique_ptr<Algorithm> MakeNwise(const AlgorithmSpec& spec);
std::unique_ptr<Algorithm> MakeAuxNet(const AlgorithmSpec& spec);

namespace {

struct Entry {
  const char* name;
  std::unique_ptr<Algorithm> (*make)(const AlgorithmSpec& spec);
};

constexpr Entry kAlgorithms[] = {
    {"backprop", MakeBackprop}, {"delayed", MakeDelayed}, {"features_replay", MakeFeaturesReplay},
    {"petra", MakePetra},       {"nwise", MakeNwise},     {"auxnet", MakeAuxNet},
};

}  // namespace

std::vector<std::string> RegisteredAlgorithms() {
  std::vector<std::string> names;
  for (const Entry& e : kAlgorithms) names.emplace_back(e.name);
  return names;
}

absl::StatusOr<std::unique_ptr<Algorithm>> MakeAlgorithm(const AlgorithmSpec& spec) {
  for (const Entry& e : kAlgorithms) {
    if (spec.name != e.name) continue;
    try {
      return e.make(spec);
    } catch (const std::exception& ex) {
      return absl::InvalidArgumentError(absl::StrCat("algorithm: ", ex.what()));
    }
  }
  return absl::UnimplementedError(
      absl::StrCat("algorithm: '", spec.name, "' is not available on this worker"));
}

}  // namespace stagewise::worker
