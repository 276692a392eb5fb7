// Throughput and buffer memory of every training algorithm on the same RevNet
// and partition, J = 2 and J = 4, in one run: in-process workers over real
// gRPC on loopback. Prints one table with ratios to backprop; never a test.
//   build/bin/stagewise_algorithm_bench [JOB.yaml|-] [steps] [stages...]
//   build/bin/stagewise_algorithm_bench --interlock [JOB.yaml|-] [steps] [stages]
//   build/bin/stagewise_algorithm_bench --auxnet [JOB.yaml|-] [steps] [K...]
//   build/bin/stagewise_algorithm_bench --planner [JOB.yaml|-] [steps] [stages]
//   build/bin/stagewise_algorithm_bench --modes-sweep JOB.yaml STEPS STAGES CAP_MIB BATCH...
// --interlock measures nwise's time per mini-batch for n in {1, 2, J} and
// M in {1, 2, 4}, fits c(M) = c0 + c1/M of the paper's model T(A, M, N) to all
// of them and prints measured against predicted.
// --auxnet measures auxnet with K = 1 (layer-serial: T_d, T_f, T_b) and the
// given K (default 2 and 4; AuxNet and penalty times from the run) and
// compares the measured speed-up with the paper's eq. (27).
// --planner (1 intra-op thread per stage) profiles the model, then (a) runs
// backprop with every reversible block rebuilding, every one storing, and the
// knapsack's mix under a memory budget that forces one, printing planned and
// measured peak memory per stage and the time per mini-batch; (b) compares
// the planner's predicted time per mini-batch with the measured one for
// backprop, delayed, petra, features_replay and nwise. Each configuration
// runs STAGEWISE_BENCH_ROUNDS times (default 3), interleaved; medians count.
//
// "buffered" is what a stage keeps between a mini-batch's forward and its
// backward, per stage, at its peak, from the job summary: stored inputs plus
// stashed parameter copies. For backprop it is the boundary tensors of the
// micro-batches in flight; its autograd graph (the activations inside the
// stage) comes on top and is not counted.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/planner/planner.h"
#include "services/planner/timing_model.h"
#include "services/profiler/profiler.h"
#include "tests/integration/cluster.h"
#include "tests/oracle/planner_util.h"

namespace {

constexpr const char* kDefaultJob = R"(name: algorithm-bench
seed: 0
model: {name: revnet, depth: 18, width: 16, small_input: true}
data: {dataset: synthetic, train_size: 8192, test_size: 128, shape: [1, 28, 28], classes: 10}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: 128
eval: {every_epochs: 0, at_end: false}
)";

struct Result {
  std::map<std::string, double> summary;
  double seconds = 0;
  double batch_seconds = 0;      // per mini-batch while RUNNING (coordinator's throughput)
  std::vector<double> buffered;  // per stage
  double backward_message_bytes = 0;
};

Result Run(const std::string& yaml, int stages) {
  stagewise::testing::Cluster cluster({.workers = stages});
  cluster.WaitForWorkers(stages);
  const auto t0 = std::chrono::steady_clock::now();
  auto id = cluster.manager().Submit(yaml);
  if (!id.ok()) {
    std::cerr << id.status() << "\n";
    std::exit(2);
  }
  auto st = cluster.WaitForJob(*id, absl::Minutes(60));
  Result r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok() || st->state() != stagewise::v1::SUCCEEDED) {
    std::cerr << "job failed: " << (st.ok() ? st->reason() : st.status().ToString()) << "\n";
    std::exit(1);
  }
  if (st->samples_per_second() > 0) {
    auto spec = stagewise::ParseJobSpec(yaml);
    r.batch_seconds = static_cast<double>(spec->batch_size) / st->samples_per_second();
  }
  const auto& summary = st->summary();
  r.summary.insert(summary.begin(), summary.end());
  auto get = [&](int j, const std::string& key) {
    auto it = summary.find(absl::StrCat("stage", j, ".", key));
    return it == summary.end() ? 0.0 : it->second;
  };
  for (int j = 0; j < stages; ++j) {
    r.buffered.push_back(get(j, "peak_input_bytes") + get(j, "peak_stashed_parameter_bytes"));
    r.backward_message_bytes = std::max(r.backward_message_bytes, get(j, "backward_message_bytes"));
  }
  return r;
}

std::string Human(double bytes) {
  if (bytes >= 1 << 20) return absl::StrFormat("%.1fM", bytes / (1 << 20));
  if (bytes >= 1 << 10) return absl::StrFormat("%.0fK", bytes / (1 << 10));
  return absl::StrFormat("%.0f", bytes);
}

}  // namespace

int Interlock(const std::string& base, int64_t steps, int J) {
  std::cout << absl::StrFormat("nwise on %d stages, %d steps per run\n", J, steps);
  std::vector<stagewise::timing::InterlockSample> samples;
  struct Measured {
    int64_t n, m;
    double seconds;
  };
  std::vector<Measured> runs;
  for (int64_t n : std::vector<int64_t>{1, 2, J}) {
    for (int64_t m : {1, 2, 4}) {
      const std::string yaml =
          base + absl::StrCat("stages: ", J, "\nalgorithm: {name: nwise, n: ", n,
                              ", micro_batches: ", m, ", aux_head: 'conv:16,16'}\n");
      const Result r = Run(yaml, J);
      runs.push_back({n, m, r.batch_seconds});
      samples.push_back({J, m, n, r.batch_seconds});
      std::cerr << "n=" << n << " M=" << m << ": " << r.batch_seconds << " s/batch\n";
    }
  }
  auto fit = stagewise::timing::FitMicroBatchCost(samples);
  if (!fit.ok()) {
    std::cerr << fit.status() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat("fitted c0 = %.4f s, c1 = %.4f s\n", fit->c0, fit->c1);
  std::cout << absl::StrFormat("%-4s %-4s %12s %12s %8s\n", "n", "M", "measured s", "T(A,M,N) s",
                               "ratio");
  for (const auto& run : runs) {
    const double predicted = *stagewise::timing::InterlockTimePerBatch(J, run.m, run.n, *fit);
    std::cout << absl::StrFormat("%-4d %-4d %12.4f %12.4f %8.2f\n", run.n, run.m, run.seconds,
                                 predicted, run.seconds / predicted);
  }
  return 0;
}

int AuxNetSpeedups(const std::string& base, int64_t steps, const std::vector<int>& ks) {
  std::cout << absl::StrFormat("auxnet, %d steps per run; times in ms per iteration\n", steps);
  auto stat = [](const Result& r, const std::string& key, int stages, bool max) {
    double v = max ? 0.0 : 0.0;
    for (int j = 0; j < stages; ++j) {
      auto it = r.summary.find(absl::StrCat("stage", j, ".", key));
      if (it == r.summary.end()) continue;
      v = max ? std::max(v, it->second) : v + it->second;
    }
    return v;
  };
  const std::string algorithm = "\nalgorithm: {name: auxnet, serial_loss_every: 0}\n";
  const Result serial = Run(base + "stages: 1" + algorithm, 1);
  stagewise::timing::AuxNetTimes t;
  t.data = stat(serial, "data_seconds", 1, true);
  t.forward = stat(serial, "forward_seconds", 1, true);
  t.backward = stat(serial, "backward_seconds", 1, true) + stat(serial, "penalty_seconds", 1, true);
  std::cout << absl::StrFormat("K=1: %.1f ms/iteration (T_d %.1f, T_f %.1f, T_b %.1f)\n",
                               1e3 * serial.batch_seconds, 1e3 * t.data, 1e3 * t.forward,
                               1e3 * t.backward);
  std::cout << absl::StrFormat("%-4s %10s %8s %8s %8s %10s %10s %8s\n", "K", "ms/iter", "t_psi",
                               "t_f_aux", "t_b_aux", "measured", "eq. (27)", "ratio");
  for (int K : ks) {
    const Result r = Run(base + absl::StrCat("stages: ", K) + algorithm, K);
    stagewise::timing::AuxNetTimes k = t;
    k.penalty = stat(r, "penalty_seconds", K, true);
    k.aux_forward = stat(r, "aux_forward_seconds", K, true);
    k.aux_backward = stat(r, "aux_backward_seconds", K, true);
    const double measured = serial.batch_seconds / r.batch_seconds;
    const double predicted = *stagewise::timing::AuxNetSpeedup(K, k);
    std::cout << absl::StrFormat("%-4d %10.1f %8.2f %8.2f %8.2f %10.2f %10.2f %8.2f\n", K,
                                 1e3 * r.batch_seconds, 1e3 * k.penalty, 1e3 * k.aux_forward,
                                 1e3 * k.aux_backward, measured, predicted, measured / predicted);
  }
  return 0;
}

int Planner(const std::string& base, int J) {
  namespace planner = stagewise::planner;
  at::set_num_threads(1);
  const std::string cache = absl::StrCat("/tmp/stagewise-bench-profiles-", getpid());
  setenv("STAGEWISE_PROFILE_CACHE", cache.c_str(), 1);
  const std::string job =
      base + absl::StrCat("stages: {count: ", J, ", partition: even}\nalgorithm: backprop\n");
  auto spec = stagewise::ParseJobSpec(job);
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  planner::ProfileOptions po;
  po.cache_dir = cache;
  auto profile = planner::CachedProfile(*spec, spec->batch_size, torch::kCPU, po);
  if (!profile.ok()) {
    std::cerr << profile.status() << "\n";
    return 1;
  }
  std::cout << planner::ProfileText(*profile) << "\n";
  auto job_options = stagewise::testing::JobPlanOptions(*spec);
  if (!job_options.ok()) {
    std::cerr << job_options.status() << "\n";
    return 1;
  }
  planner::PlanOptions options = *job_options;
  auto extremes = stagewise::testing::FindModeMix(*profile, options);
  if (!extremes.ok()) {
    std::cerr << extremes.status() << "\n";
    return 1;
  }
  const planner::Plan *low = &extremes->rebuild, *high = &extremes->store,
                      *mixed = &extremes->mixed;
  const int64_t cap = extremes->cap;
  std::cout << "(a) backprop, J=" << J << ", memory budget " << planner::HumanBytes(cap)
            << " per worker:\n"
            << planner::PlanText(*profile, *mixed) << "\n";
  // Timings on a shared 2-core machine drift by 10-20% between runs: every
  // configuration runs `rounds` times, interleaved, and the median counts.
  int rounds = 3;
  if (const char* env = std::getenv("STAGEWISE_BENCH_ROUNDS")) rounds = std::max(1, std::atoi(env));
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  struct Case {
    const char* name;
    std::string extra;
    const planner::Plan* plan;
    std::vector<double> seconds;
    Result last;
  };
  std::vector<Case> cases = {{"rebuild", "modes: rebuild", low, {}, {}},
                             {"store", "modes: store", high, {}, {}},
                             {"knapsack", absl::StrCat("memory_budget: ", cap), mixed, {}, {}}};
  for (int round = 0; round < rounds; ++round) {
    for (Case& c : cases) {
      c.last = Run(base + absl::StrCat("stages: {count: ", J, ", partition: even, ", c.extra,
                                       "}\nalgorithm: backprop\n"),
                   J);
      c.seconds.push_back(c.last.batch_seconds);
    }
  }
  std::cout << absl::StrFormat("%-10s %-6s %12s %12s %8s %16s %12s\n", "modes", "stage",
                               "planned peak", "measured", "ratio", "ms/batch median", "predicted");
  const double rebuild_seconds = median(cases[0].seconds);
  for (const Case& c : cases) {
    for (int j = 0; j < J; ++j) {
      const double planned = static_cast<double>(c.plan->stages[j].estimate.peak_bytes);
      const double measured = c.last.summary.at(absl::StrCat("stage", j, ".peak_memory_bytes"));
      std::cout << absl::StrFormat(
          "%-10s %-6d %12s %12s %8.3f %16s %12s\n", c.name, j, Human(planned), Human(measured),
          measured / planned, j ? "" : absl::StrFormat("%.1f", 1e3 * median(c.seconds)),
          j ? "" : absl::StrFormat("%.1f", 1e3 * c.plan->predictions[0].seconds_per_batch));
    }
    std::vector<std::string> each;
    for (double t : c.seconds) each.push_back(absl::StrFormat("%.1f", 1e3 * t));
    std::cout << absl::StrFormat("  runs: %s ms; all-rebuild's median / this median: %.2f\n",
                                 absl::StrJoin(each, ", "), rebuild_seconds / median(c.seconds));
  }
  // (b) Predicted against measured time per mini-batch.
  po.aux_head = "conv:16,16";
  auto with_head = planner::CachedProfile(*spec, spec->batch_size, torch::kCPU, po);
  if (!with_head.ok()) {
    std::cerr << with_head.status() << "\n";
    return 1;
  }
  options = *job_options;
  auto plan = planner::MakePlan(*with_head, options);
  std::cout << "\n(b) J=" << J << ", partition "
            << absl::StrJoin(plan->stages, " ",
                             [](std::string* out, const planner::StagePlan& s) {
                               absl::StrAppend(out, "[", s.begin, ",", s.end, ")");
                             })
            << ", default modes, 1 thread per stage:\n";
  std::cout << absl::StrFormat("%-16s %12s %12s %8s\n", "algorithm", "predicted ms", "measured ms",
                               "ratio");
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"backprop", "backprop"},
      {"delayed", "{name: delayed, weights: current}"},
      {"petra", "petra"},
      {"features_replay", "features_replay"},
      {"nwise n=1", "{name: nwise, n: 1, aux_head: 'conv:16,16'}"},
      {absl::StrCat("nwise n=", J), absl::StrCat("{name: nwise, n: ", J, "}")}};
  std::vector<std::vector<double>> measured(rows.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const Result r =
          Run(base + absl::StrCat("stages: ", J, "\nalgorithm: ", rows[i].second, "\n"), J);
      measured[i].push_back(r.batch_seconds);
    }
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    double predicted = 0;
    for (const auto& p : plan->predictions) {
      if (p.label() == rows[i].first) predicted = p.seconds_per_batch;
    }
    const double m = median(measured[i]);
    std::cout << absl::StrFormat("%-16s %12.1f %12.1f %8.2f\n", rows[i].first, 1e3 * predicted,
                                 1e3 * m, m / predicted);
  }
  std::filesystem::remove_all(cache);
  return 0;
}

// --modes-sweep: the reversible-architectures framework's table (time per
// iteration and per sample against the batch size for all-store, all-rebuild
// and the knapsack under one memory cap), on `base` (a job without
// batch_size, stages or algorithm): for every batch size it profiles, plans
// the three modes, runs each once for `steps` steps with backprop over J
// stages (even partition, 1 intra-op thread per stage) and prints planned and
// measured peak memory (the larger stage) and time per mini-batch. A mode
// whose planned peak exceeds the cap is marked: on a device it would not fit.
int ModesSweep(const std::string& base, int64_t steps, int J, int64_t cap,
               const std::vector<int64_t>& batches) {
  namespace planner = stagewise::planner;
  at::set_num_threads(1);
  const std::string cache = absl::StrCat("/tmp/stagewise-bench-profiles-", getpid());
  std::cout << absl::StrFormat(
      "backprop over %d stages, memory cap %s per worker, %d steps per run\n"
      "%6s %-9s %11s %11s %10s %10s %12s  %s\n",
      J, planner::HumanBytes(cap), steps, "batch", "modes", "planned ms", "measured ms",
      "ms/sample", "planned", "measured", "fits the cap");
  for (int64_t batch : batches) {
    const std::string job =
        absl::StrCat(base, "batch_size: ", batch, "\nsteps: ", steps, "\nalgorithm: backprop\n");
    auto spec =
        stagewise::ParseJobSpec(absl::StrCat(job, "stages: {count: ", J, ", partition: even}\n"));
    if (!spec.ok()) {
      std::cerr << spec.status() << "\n";
      return 2;
    }
    planner::ProfileOptions po;
    po.cache_dir = cache;
    po.repeats = 3;
    auto profile = planner::CachedProfile(*spec, batch, torch::kCPU, po);
    auto options = stagewise::testing::JobPlanOptions(*spec);
    if (!profile.ok() || !options.ok()) {
      std::cerr << (profile.ok() ? options.status() : profile.status()) << "\n";
      return 1;
    }
    struct Mode {
      const char* name;
      stagewise::BlockModes modes;
      std::string stages;
    };
    const Mode modes[] = {
        {"store", stagewise::BlockModes::kStore, "modes: store"},
        {"rebuild", stagewise::BlockModes::kRebuild, "modes: rebuild"},
        {"knapsack", stagewise::BlockModes::kAuto, absl::StrCat("memory_budget: ", cap)}};
    for (const Mode& m : modes) {
      planner::PlanOptions o = *options;
      o.modes = m.modes;
      if (m.modes == stagewise::BlockModes::kAuto) o.memory_caps = {cap};
      auto plan = planner::MakePlan(*profile, o);
      if (!plan.ok()) {
        std::cout << absl::StrFormat("%6d %-9s %s\n", batch, m.name, plan.status().message());
        continue;
      }
      double planned = 0, measured = 0;
      const Result r =
          Run(absl::StrCat(job, "stages: {count: ", J, ", partition: even, ", m.stages, "}\n"), J);
      for (int j = 0; j < J; ++j) {
        planned = std::max(planned, static_cast<double>(plan->stages[j].estimate.peak_bytes));
        measured = std::max(measured, r.summary.at(absl::StrCat("stage", j, ".peak_memory_bytes")));
      }
      std::cout << absl::StrFormat(
          "%6d %-9s %11.1f %11.1f %10.2f %10s %12s  %s\n", batch, m.name,
          1e3 * plan->predictions[0].seconds_per_batch, 1e3 * r.batch_seconds,
          1e3 * r.batch_seconds / static_cast<double>(batch), Human(planned), Human(measured),
          planned <= static_cast<double>(cap) ? "yes" : "no (would not fit)");
      std::cout.flush();
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool interlock = !args.empty() && args[0] == "--interlock";
  if (interlock) args.erase(args.begin());
  const bool auxnet = !args.empty() && args[0] == "--auxnet";
  if (auxnet) args.erase(args.begin());
  const bool plan = !args.empty() && args[0] == "--planner";
  if (plan) args.erase(args.begin());
  const bool sweep = !args.empty() && args[0] == "--modes-sweep";
  if (sweep) args.erase(args.begin());
  std::string base = kDefaultJob;
  if (!args.empty() && args[0] != "-") {
    auto spec_text = std::ifstream(args[0]);
    if (!spec_text) {
      std::cerr << "cannot read " << args[0] << "\n";
      return 2;
    }
    base.assign(std::istreambuf_iterator<char>(spec_text), {});
  }
  const int64_t steps = args.size() > 1 ? std::stoll(args[1]) : 40;
  if (sweep) {
    // --modes-sweep JOB.yaml STEPS J CAP_MIB B1 B2 ...
    if (args.size() < 5) {
      std::cerr << "usage: --modes-sweep JOB.yaml STEPS STAGES CAP_MIB BATCH...\n";
      return 2;
    }
    std::vector<int64_t> batches;
    for (size_t i = 4; i < args.size(); ++i) batches.push_back(std::stoll(args[i]));
    return ModesSweep(base, steps, std::stoi(args[2]), std::stoll(args[3]) << 20, batches);
  }
  std::vector<int> stage_counts;
  for (size_t i = 2; i < args.size(); ++i) stage_counts.push_back(std::stoi(args[i]));
  if (stage_counts.empty()) stage_counts = interlock ? std::vector<int>{4} : std::vector<int>{2, 4};
  auto spec = stagewise::ParseJobSpec(base + "steps: 1\n");
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  const int64_t batch = spec->batch_size;
  base += absl::StrCat("steps: ", steps, "\n");
  if (interlock) return Interlock(base, steps, stage_counts.front());
  if (auxnet) return AuxNetSpeedups(base, steps, stage_counts);
  if (plan) return Planner(base, stage_counts.front());  // fixed rounds; steps unused
  std::cout << absl::StrFormat(
      "%s, batch %d, %d steps per run, %d intra-op threads shared by all stages\n",
      NameOf(spec->model.name), batch, steps, at::get_num_threads());
  struct Row {
    std::string name;
    std::string algorithm;
  };
  const std::vector<Row> rows = {
      {"backprop", "backprop"},
      {"backprop 1F1B M=4", "{name: backprop, micro_batches: 4, schedule: 1f1b}"},
      {"delayed stash", "{name: delayed, weights: stash}"},
      {"delayed current", "{name: delayed, weights: current}"},
      {"petra", "{name: petra}"},
      {"petra k=4", "{name: petra, accumulation: 4}"},
      {"features_replay", "features_replay"},
      {"nwise n=1", "{name: nwise, n: 1, aux_head: 'conv:16,16'}"},
      {"nwise n=2", "{name: nwise, n: 2, aux_head: 'conv:16,16'}"},
      {"nwise n=J", "{name: nwise, n: J, aux_head: 'conv:16,16'}"},
      {"auxnet", "{name: auxnet, serial_loss_every: 0}"},
  };
  std::cout << absl::StrFormat("%-4s %-20s %10s %8s %10s  %s\n", "J", "algorithm", "samples/s",
                               "vs bp", "bwd msg", "peak buffered per stage (s0/s1/...)");
  // STAGEWISE_BENCH_ONLY=backprop,auxnet keeps those rows (the first is the
  // baseline of the ratios).
  std::vector<std::string> only;
  if (const char* env = std::getenv("STAGEWISE_BENCH_ONLY")) only = absl::StrSplit(env, ',');
  for (int J : stage_counts) {
    double backprop_rate = 0;
    for (const Row& row : rows) {
      if (!only.empty() && std::find(only.begin(), only.end(), row.name) == only.end()) continue;
      std::string algorithm = row.algorithm;
      if (auto pos = algorithm.find("n: J"); pos != std::string::npos) {
        algorithm.replace(pos, 4, absl::StrCat("n: ", J));
      }
      const Result r = Run(base + absl::StrCat("stages: ", J, "\nalgorithm: ", algorithm, "\n"), J);
      const double rate = static_cast<double>(batch) / r.batch_seconds;
      if (backprop_rate == 0) backprop_rate = rate;
      std::vector<std::string> per_stage;
      for (double b : r.buffered) per_stage.push_back(Human(b));
      std::cout << absl::StrFormat("%-4d %-20s %10.1f %8.2f %10s  %s\n", J, row.name, rate,
                                   rate / backprop_rate, Human(r.backward_message_bytes),
                                   absl::StrJoin(per_stage, " / "))
                << std::flush;
    }
  }
  return 0;
}
