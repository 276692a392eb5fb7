// `stagewise plan`: profile the job's model on this machine (cached), then
// print the partition, per-stage time and memory, the mode of every
// reversible block and each algorithm's predicted time per mini-batch.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/cli/command.h"
#include "clients/cli/commands.h"
#include "clients/cli/flags.h"
#include "clients/cli/format.h"
#include "clients/cli/output.h"
#include "clients/cli/script_job.h"
#include "services/models/model.h"
#include "services/planner/planner.h"
#include "services/profiler/profiler.h"
#include "services/spec/enums.h"
#include "services/spec/job_spec.h"

namespace stagewise::cli {
namespace {

const planner::Prediction* PredictionOf(const planner::Plan& plan) {
  for (const auto& p : plan.predictions) {
    if (p.key.algorithm == plan.algorithm) {
      return &p;
    }
  }
  return nullptr;
}

struct Candidate {
  int64_t batch;
  planner::ModelProfile profile;
  absl::StatusOr<planner::Plan> plan;
  bool cached;
  std::string schedule_note = {};  // backprop's schedule: auto, as chosen
};

void PrintPlanJson(const std::vector<Candidate>& candidates, const Candidate& chosen,
                   std::ostream& out) {
  Json sweep = Json::array();
  for (const Candidate& c : candidates) {
    Json row = {{"batch_size", c.batch}, {"feasible", c.plan.ok()}};
    if (c.plan.ok()) {
      if (const planner::Prediction* p = PredictionOf(*c.plan)) {
        row["seconds_per_batch"] = Number(p->seconds_per_batch);
        row["seconds_per_sample"] = Number(p->seconds_per_batch / static_cast<double>(c.batch));
      }
    } else {
      row["error"] = std::string(c.plan.status().message());
    }
    sweep.push_back(row);
  }
  out << JsonLine(
             Json{{"profile_key", chosen.profile.key},
                  {"profile_cached", chosen.cached},
                  {"sweep", sweep},
                  {"plan", Json::parse(planner::PlanJson(chosen.profile, *chosen.plan), nullptr,
                                       /*allow_exceptions=*/false)}})
      << "\n";
}

// `blocks`: the per-block profile and shapes to print first (null: none).
void PrintPlanText(const std::vector<Candidate>& candidates, const Candidate& chosen,
                   const std::vector<models::BlockInfo>* blocks, std::ostream& out) {
  if (blocks != nullptr) {
    out << planner::ProfileText(chosen.profile) << "\n";
    // What the blocks take and give, per sample (text: [T] bytes, then [T, width]).
    out << "shapes per sample (input > output):";
    for (const auto& b : *blocks) {
      out << (b.index % 4 == 0 ? "\n  " : "   ") << b.index << " " << ShapeText(b.in_shape) << " > "
          << ShapeText(b.out_shape);
    }
    out << "\n\n";
  }
  if (candidates.size() > 1) {
    out << "batch-size sweep (" << NameOf(chosen.plan->algorithm) << "):\n";
    out << absl::StrFormat("  %-6s %12s %12s %12s\n", "batch", "time/batch", "time/sample", "peak");
    for (const auto& c : candidates) {
      if (!c.plan.ok()) {
        out << absl::StrFormat("  %-6d %s\n", c.batch, c.plan.status().message());
        continue;
      }
      int64_t peak = 0;
      for (const auto& s : c.plan->stages) peak = std::max(peak, s.estimate.peak_bytes);
      const planner::Prediction* p = PredictionOf(*c.plan);
      out << absl::StrFormat("  %-6d %10.2fms %10.3fms %12s%s\n", c.batch,
                             p ? p->seconds_per_batch * 1e3 : 0.0,
                             p ? p->seconds_per_batch * 1e3 / c.batch : 0.0,
                             planner::HumanBytes(peak), &c == &chosen ? "  <- best" : "");
    }
    out << "\n";
  }
  out << chosen.schedule_note << planner::PlanText(chosen.profile, *chosen.plan);
}

}  // namespace

int Plan(const PlanArgs& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<JobFile> job = OpenJobFile(args.job_path, /*plan=*/true, args.sets);
  if (!job.ok()) {
    err << "error: " << args.job_path << ": " << job.status().message() << "\n";
    return kExitInvalid;
  }
  const JobSpec* spec = &job->spec;
  planner::PlanOptions options = planner::PlanOptionsForJob(*spec, job->ranges);
  if (EnumFromName<Partition>(args.partition) == Partition::kAuto) options.ranges.clear();
  if (!args.memory_budget.empty()) {
    auto bytes = ParseByteSize(args.memory_budget);
    if (!bytes.ok() || *bytes <= 0) {
      err << "error: --memory-budget: "
          << (bytes.ok() ? "must be positive" : bytes.status().message()) << "\n";
      return kExitInvalid;
    }
    options.memory_caps = {*bytes};
  }
  if (!args.modes.empty()) {
    const std::optional<BlockModes> modes = EnumFromName<BlockModes>(args.modes);
    if (!modes) {
      err << "error: --modes: must be one of auto, store, rebuild; got '" << args.modes << "'\n";
      return kExitInvalid;
    }
    options.modes = *modes;
  }
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int threads = args.threads > 0 ? args.threads : std::max(1, cores / options.num_stages);
  torch::set_num_threads(threads);
  auto device = torch::Device(args.device);
  planner::ProfileOptions po;
  po.repeats = args.repeats;
  po.warmup = args.warmup;
  po.cache_dir = args.cache_dir.empty() ? planner::DefaultProfileCacheDir() : args.cache_dir;
  po.refresh = args.refresh;
  if (!args.quiet) po.progress = [&err](const std::string& line) { err << "  " << line << "\n"; };

  std::vector<int64_t> batches = args.batch_sizes;
  if (batches.empty()) batches.push_back(spec->batch_size);
  // backprop's schedule: auto is the planner's choice, as the coordinator makes it.
  auto plan_of = [&](const planner::ModelProfile& p, std::string* note) {
    if (options.algorithm != AlgorithmKind::kBackprop || options.schedule.has_value()) {
      return planner::MakePlan(p, options);
    }
    auto choice = planner::ChooseSchedule(p, options);
    if (!choice.ok()) return absl::StatusOr<planner::Plan>(choice.status());
    *note =
        absl::StrCat("schedule auto: ", NameOf(choice->schedule), " (predicted per mini-batch:");
    for (const auto& [s, seconds] : choice->tried) {
      absl::StrAppend(note, " ", NameOf(s), " ",
                      seconds < 0 ? "does not fit" : absl::StrFormat("%.2fms", seconds * 1e3));
    }
    absl::StrAppend(note, ")\n");
    return absl::StatusOr<planner::Plan>(std::move(choice->plan));
  };
  std::vector<Candidate> candidates;
  for (int64_t b : batches) {
    if (!args.quiet) {
      err << "profiling " << NameOf(spec->model.name) << " at batch " << b << " on " << device.str()
          << " with " << threads << " threads (cache: " << po.cache_dir << ")\n";
    }
    bool cached = false;
    auto profile = planner::CachedProfile(*spec, b, device, po, &cached);
    if (!profile.ok()) {
      err << "error: profiling: " << profile.status().message() << "\n";
      return kExitFailed;
    }
    if (!args.quiet && cached) err << "  (cached)\n";
    std::string note;
    auto plan = plan_of(*profile, &note);
    candidates.push_back({b, *profile, std::move(plan), cached, std::move(note)});
  }
  // The best time per sample of the job's algorithm among feasible plans.
  int best = -1;
  double best_tps = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!candidates[i].plan.ok()) continue;
    const planner::Prediction* p = PredictionOf(*candidates[i].plan);
    if (p == nullptr) continue;
    const double tps = p->seconds_per_batch / static_cast<double>(candidates[i].batch);
    if (best < 0 || tps < best_tps) best = static_cast<int>(i), best_tps = tps;
  }
  if (best < 0) {
    for (const auto& c : candidates) {
      if (!c.plan.ok()) {
        err << "error: batch " << c.batch << ": " << c.plan.status().message() << "\n";
      }
    }
    if (candidates.size() == 1 && !candidates[0].plan.ok() &&
        candidates[0].plan.status().code() != absl::StatusCode::kResourceExhausted) {
      return kExitInvalid;
    }
    return kExitFailed;
  }
  const Candidate& chosen = candidates[best];
  if (args.output == "json") {
    PrintPlanJson(candidates, chosen, out);
  } else {
    PrintPlanText(candidates, chosen, args.show_profile ? &job->blocks : nullptr, out);
  }
  return kExitOk;
}

void AddPlanCommand(CommandSet& set) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = set.Add(
      "plan",
      "Profile the job's model here (cached per model, batch size, device and threads) and\n"
      "print the partition, per-stage time and memory, the store/rebuild mode of every\n"
      "reversible block and each algorithm's predicted time per mini-batch",
      [args](Invocation& run) {
        return run.Formatted(args->output,
                             [&](std::ostream& o) { return Plan(*args, o, run.err()); });
      });
  cmd->add_option("job", args->job_path, "Job spec (YAML)")->required()->check(CLI::ExistingFile);
  AddSetOption(cmd, args->sets);
  cmd->add_option("--memory-budget", args->memory_budget,
                  "Memory cap per worker, e.g. 2GiB or 512MiB (default: the job's "
                  "stages.memory_budget; none: no cap)");
  cmd->add_option("--modes", args->modes,
                  "Reversible blocks: auto (knapsack under the cap), store or rebuild "
                  "(default: the job's stages.modes)")
      ->check(CLI::IsMember(EnumNames<BlockModes>()));
  cmd->add_option("--partition", args->partition,
                  "job: the job's partition (auto ones are planned); auto: plan it anyway")
      ->check(CLI::IsMember({"job", "auto"}))
      ->capture_default_str();
  cmd->add_option("--batch-sizes", args->batch_sizes,
                  "Sweep these batch sizes and pick the best time per sample")
      ->delimiter(',');
  cmd->add_option("--threads", args->threads,
                  "LibTorch threads while profiling (default: max(1, cores / stages), as "
                  "`local` gives each worker)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--device", args->device, "Device to profile on (cpu, cuda:0)")
      ->capture_default_str();
  cmd->add_option(
         "--repeats", args->repeats,
         "Timed rounds per figure (every figure once per round; the lower quartile is kept)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--warmup", args->warmup,
                  "Untimed rounds before the timed ones (0 for a quick, rougher profile)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--cache-dir", args->cache_dir,
                  "Profile cache (default: $STAGEWISE_PROFILE_CACHE, else "
                  "~/.cache/stagewise/profiles)");
  cmd->add_flag("--refresh", args->refresh, "Profile again even when a cached profile exists");
  cmd->add_flag("!--no-profile", args->show_profile, "Do not print the per-block profile");
  cmd->add_flag("-q,--quiet", args->quiet, "No progress on stderr");
  AddOutputOption(cmd, args->output, "Output format");
}

}  // namespace stagewise::cli
