// `stagewise validate`: parse a job, plan its model and partition, print both.
#include <iostream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/flags.h"
#include "clients/cli/format.h"
#include "clients/cli/job_format.h"
#include "clients/cli/output.h"
#include "clients/cli/script_job.h"
#include "services/models/model.h"
#include "services/models/plan.h"
#include "services/spec/job_spec.h"

namespace stagewise::cli {
int Validate(const ValidateArgs& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<JobFile> job = OpenJobFile(args.job_path, /*plan=*/true, args.sets);
  if (!job.ok()) {
    err << "error: " << args.job_path << ": " << job.status().message() << "\n";
    return kExitInvalid;
  }
  const JobSpec* spec = &job->spec;
  const std::vector<models::BlockInfo>* plan = &job->blocks;
  const std::vector<std::pair<int, int>>* ranges = &job->ranges;
  auto stage_of = [&](int block) {
    for (size_t j = 0; j < ranges->size(); ++j) {
      if (block >= (*ranges)[j].first && block < (*ranges)[j].second) return static_cast<int>(j);
    }
    return -1;
  };
  if (args.output == "json") {
    Json blocks = Json::array();
    for (const auto& b : *plan) {
      blocks.push_back({{"index", b.index},
                        {"kind", b.kind},
                        {"reversible", b.reversible},
                        {"in", b.in_shape},
                        {"out", b.out_shape},
                        {"stage", stage_of(b.index)}});
    }
    out << JsonLine(Json{{"job", spec->name},
                         {"algorithm", spec->algorithm.name()},
                         {"stages", ranges->size()},
                         {"blocks", blocks}})
        << "\n";
    return kExitOk;
  }
  out << absl::StrFormat("job %s is valid: %s on %s, algorithm %s, %d stage(s)\n", spec->name,
                         NameOf(spec->model.name), NameOf(spec->data.dataset),
                         spec->algorithm.name(), ranges->size());
  out << absl::StrFormat("%-6s %-6s %-16s %-4s %-16s %-16s\n", "block", "stage", "kind", "rev",
                         "input", "output");
  for (const auto& b : *plan) {
    out << absl::StrFormat("%-6d %-6d %-16s %-4s %-16s %-16s\n", b.index, stage_of(b.index), b.kind,
                           b.reversible ? "yes" : "no", ShapeText(b.in_shape),
                           ShapeText(b.out_shape));
  }
  // Each stage's share of the estimated work (models::EstimateBlockWork).
  double total = 0;
  std::vector<double> work(ranges->size(), 0);
  for (const auto& b : *plan) {
    const double w = models::EstimateBlockWork(b);
    total += w;
    if (stage_of(b.index) >= 0) work[stage_of(b.index)] += w;
  }
  out << "partition: " << NameOf(spec->stages.partition) << "; estimated work per stage:";
  for (double w : work) out << absl::StrFormat(" %.1f%%", total > 0 ? 100 * w / total : 0);
  out << "\n";
  // Per stage: parameters, and the memory they take with their gradients and
  // optimizer state; the block inputs one mini-batch brings (what backprop
  // keeps at the least; `stagewise plan` profiles the graphs on top).
  // Muon: one momentum buffer for its weights (Adam's two for the small rest).
  const double per_parameter =
      4.0 *
      (2 + (spec->optimizer.name == OptimizerKind::kAdam                                   ? 2
            : spec->optimizer.name == OptimizerKind::kMuon || spec->optimizer.momentum > 0 ? 1
                                                                                           : 0));
  out << absl::StrFormat("%-6s %-12s %-24s %-18s\n", "stage", "parameters",
                         "weights+grads+optimizer", "inputs per batch");
  for (size_t j = 0; j < ranges->size(); ++j) {
    double parameters = 0, inputs = 0;
    for (int b = (*ranges)[j].first; b < (*ranges)[j].second; ++b) {
      parameters += models::EstimateParameters((*plan)[b]);
      double values = static_cast<double>(spec->batch_size);
      for (int64_t d : (*plan)[b].in_shape) values *= static_cast<double>(d);
      // Byte sequences arrive as int64, activations as float32.
      inputs += values * ((*plan)[b].kind == "embedding" ? 8 : 4);
    }
    out << absl::StrFormat("%-6d %-12s %-24s %-18s\n", j,
                           HumanCount(static_cast<int64_t>(parameters)),
                           HumanBytes(static_cast<int64_t>(parameters * per_parameter)),
                           HumanBytes(static_cast<int64_t>(inputs)));
  }
  if (spec->stages.partition == Partition::kAuto) {
    out << "partition: auto: the stage column shows the balanced estimate; the coordinator plans\n"
           "the real one from a worker's profile (see it with `stagewise plan`)\n";
  }
  if (spec->stages.memory_budget > 0 || spec->stages.modes != BlockModes::kAuto) {
    out << "reversible blocks: modes " << NameOf(spec->stages.modes);
    if (spec->stages.memory_budget > 0) {
      out << ", memory budget " << spec->stages.memory_budget << " bytes per worker";
    }
    out << "\n";
  }
  return kExitOk;
}

void AddValidateCommand(CommandSet& set) {
  auto args = std::make_shared<ValidateArgs>();
  CLI::App* cmd =
      set.Add("validate", "Check a job spec and print its model's blocks and stage partition",
              [args](Invocation& run) {
                return run.Formatted(
                    args->output, [&](std::ostream& o) { return Validate(*args, o, run.err()); });
              });
  cmd->add_option("job", args->job_path, "Job spec (YAML)")->required()->check(CLI::ExistingFile);
  AddOutputOption(cmd, args->output, "Output format");
  AddSetOption(cmd, args->sets);
}

}  // namespace stagewise::cli
