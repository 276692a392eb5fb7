#include "worker/reshard.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/models/optimizer_state_key.h"

namespace stagewise::worker {
namespace {

std::string Shape(const torch::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

// Every parameter and buffer of `model`, by its dotted name.
std::map<std::string, torch::Tensor> Named(models::Model& model, bool parameters) {
  std::map<std::string, torch::Tensor> out;
  if (parameters) {
    for (const auto& p : model.named_parameters()) out.emplace(p.key(), p.value());
  } else {
    for (const auto& b : model.named_buffers()) {
      if (b.value().defined()) out.emplace(b.key(), b.value());
    }
  }
  return out;
}

}  // namespace

absl::Status RegroupShards(const std::vector<ReshardSource>& sources, models::Model& model,
                           torch::optim::Optimizer& optimizer, const BuildStageModel& build_model,
                           const BuildOptimizer& build_optimizer) {
  const std::map<std::string, torch::Tensor> params = Named(model, true);
  const std::map<std::string, torch::Tensor> buffers = Named(model, false);
  std::map<std::string, std::string> filled;  // tensor name -> the shard it came from
  torch::NoGradGuard no_grad;
  for (const ReshardSource& source : sources) {
    absl::StatusOr<std::shared_ptr<models::Model>> built =
        build_model(source.block_begin, source.block_end);
    if (!built.ok()) {
      return absl::Status(built.status().code(),
                          absl::StrCat("resharding ", source.path, ": ", built.status().message()));
    }
    models::Model& from = **built;
    std::unique_ptr<torch::optim::Optimizer> from_optimizer;
    if (absl::Status s = source.shard->LoadModel(from); !s.ok()) {
      return absl::DataLossError(absl::StrCat(source.path, ": does not hold blocks [",
                                              source.block_begin, ", ", source.block_end,
                                              ") of this job's model: ", s.message()));
    }
    from_optimizer = build_optimizer(from);
    if (absl::Status s = source.shard->LoadOptimizer(*from_optimizer); !s.ok()) {
      return absl::DataLossError(absl::StrCat(source.path, ": does not hold blocks [",
                                              source.block_begin, ", ", source.block_end,
                                              ") of this job's model: ", s.message()));
    }
    const auto& states = from_optimizer->state();
    size_t known_states = 0;  // the shard's parameters with a state, any stage's
    for (const auto& p : from.parameters())
      known_states += states.count(models::OptimizerStateKey(p));
    if (known_states != states.size()) {
      return absl::InternalError(absl::StrCat(
          "resharding ", source.path, ": ", states.size() - known_states, " of the optimizer's ",
          states.size(), " parameter states belong to no parameter (unknown state keys)"));
    }
    for (const bool parameters : {true, false}) {
      const std::map<std::string, torch::Tensor>& wanted = parameters ? params : buffers;
      for (const auto& [name, value] : Named(from, parameters)) {
        const auto it = wanted.find(name);
        if (it == wanted.end()) continue;  // another stage's block
        if (it->second.sizes() != value.sizes()) {
          return absl::DataLossError(absl::StrCat(source.path, ": ", name, " is ", Shape(value),
                                                  ", this stage's is ", Shape(it->second)));
        }
        if (const auto [at, fresh] = filled.emplace(name, source.path); !fresh) {
          return absl::DataLossError(
              absl::StrCat(name, " is in two shards: ", at->second, " and ", source.path));
        }
        it->second.copy_(value);
        if (!parameters) continue;
        const auto state = states.find(models::OptimizerStateKey(value));
        if (state == states.end()) continue;  // no step taken with it yet
        optimizer.state()[models::OptimizerStateKey(it->second)] = state->second->clone();
      }
    }
  }
  std::vector<std::string> missing;
  for (const auto* named : {&params, &buffers}) {
    for (const auto& [name, value] : *named) {
      if (filled.count(name) == 0) missing.push_back(name);
    }
  }
  if (!missing.empty()) {
    const size_t shown = std::min<size_t>(missing.size(), 5);
    return absl::DataLossError(absl::StrCat(
        "resharding: ", missing.size(), " tensor(s) of the stage in none of the shards: ",
        absl::StrJoin(missing.begin(), missing.begin() + shown, ", "),
        missing.size() > shown ? ", ..." : ""));
  }
  return absl::OkStatus();
}

}  // namespace stagewise::worker
