// Rebalancing while training, measured (docs/performance.md, "Rebalancing a
// slowed worker"): J in-process workers on the `emulated` model, one job with
// stages.partition auto, placement.per_worker_profiles and rebalance on. After
// --slow-at steps the worker running --slow-stage is slowed to --slow (its
// --emulated-speed-file changes); the coordinator notices, checkpoints, re-plans
// on the measured speeds and resumes on the new cut. Each round prints the time
// per mini-batch before the slowdown, while slowed, and after the rebalance,
// beside the plan's predictions: the first plan's, the first cut's at the
// slowed speeds, and the new plan's. The table gives medians and the spread
// over the rounds. Never a test.
//
//   build/bin/stagewise_rebalance_bench [options]
//     --stages 4             J (and J workers)
//     --blocks-per-stage 2   the model has J x K emulated blocks (+ the head)
//     --forward-ms 20        per block and mini-batch
//     --backward-ms 40       per block and mini-batch
//     --micro-batches 8      1F1B with M micro-batches
//     --slow 0.5             the slowed worker's speed
//     --slow-stage 2         the stage whose worker is slowed
//     --slow-at 30           the step after which it is slowed
//     --window 30            rebalance.window_steps (threshold 0.15)
//     --after 40             steady steps measured after the rebalance
//     --rounds 3             repetitions (each a fresh job)
//
// Measured: the coordinator's progress events give (attempt, step, time); a
// phase's time per mini-batch is (t_last - t_first) / (s_last - s_first) over
// its steps. Before: from step 2J + 2 (the pipeline full) to --slow-at. Slowed:
// from 4 steps after the change (the worker reads its file every 250 ms) to
// the step before the first attempt's last. After: from 2J + 2 steps past the
// resume step, --after steps. The slowed prediction is 1F1B simulated on the
// first plan's stage times, the slowed stage's divided by --slow.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/planner/pipeline_schedule.h"
#include "tests/bench/bench_util.h"
#include "tests/integration/cluster.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = stagewise::v1;

struct Options {
  int stages = 4;
  int blocks_per_stage = 2;
  double forward_ms = 20;
  double backward_ms = 40;
  int micro_batches = 8;
  double slow = 0.5;
  int slow_stage = 2;
  int slow_at = 30;
  int window = 30;
  int after = 40;
  int rounds = 3;
};

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "stagewise_rebalance_bench: " << why
            << "\nsee the comment at the top of tests/bench/rebalance_bench.cc for the options\n";
  std::exit(2);
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Usage(absl::StrCat(flag, ": needs a value"));
    const std::string value = argv[++i];
    auto integer = [&](int* out, int min) {
      if (!absl::SimpleAtoi(value, out) || *out < min) {
        Usage(absl::StrCat(flag, ": '", value, "' is not an integer >= ", min));
      }
    };
    auto real = [&](double* out, double max) {
      if (!absl::SimpleAtod(value, out) || !(*out > 0) || *out > max) {
        Usage(absl::StrCat(flag, ": '", value, "' is not a number in (0, ", max, "]"));
      }
    };
    if (flag == "--stages") {
      integer(&o.stages, 2);
    } else if (flag == "--blocks-per-stage") {
      integer(&o.blocks_per_stage, 1);
    } else if (flag == "--forward-ms") {
      real(&o.forward_ms, 1e4);
    } else if (flag == "--backward-ms") {
      real(&o.backward_ms, 1e4);
    } else if (flag == "--micro-batches") {
      integer(&o.micro_batches, 1);
    } else if (flag == "--slow") {
      real(&o.slow, 1);
    } else if (flag == "--slow-stage") {
      integer(&o.slow_stage, 0);
    } else if (flag == "--slow-at") {
      integer(&o.slow_at, 1);
    } else if (flag == "--window") {
      integer(&o.window, 1);
    } else if (flag == "--after") {
      integer(&o.after, 2);
    } else if (flag == "--rounds") {
      integer(&o.rounds, 1);
    } else {
      Usage(absl::StrCat("unknown option ", flag));
    }
  }
  if (o.slow_stage >= o.stages) Usage("--slow-stage must be below --stages");
  if (o.slow_at <= 2 * o.stages + 4) Usage("--slow-at must leave steps after the pipeline fills");
  return o;
}

std::string JobYaml(const Options& o, const std::string& checkpoints, int steps) {
  return absl::StrCat(
      "name: rebalance-bench\nseed: 0\n",
      absl::StrFormat("model: {name: emulated, depth: %d, forward_ms: %g, backward_ms: %g}\n",
                      o.stages * o.blocks_per_stage, o.forward_ms, o.backward_ms),
      "data: {dataset: synthetic, train_size: 4096, test_size: 32, shape: [2, 16, 16], "
      "classes: 10}\n",
      "optimizer: {name: sgd, lr: 0.01}\nbatch_size: 32\nsteps: ", steps, "\n",
      "eval: {every_epochs: 0, at_end: false}\n",
      "algorithm: {name: backprop, schedule: 1f1b, micro_batches: ", o.micro_batches, "}\n",
      "stages: {count: ", o.stages, ", partition: auto}\n",
      "placement: {per_worker_profiles: true}\n", "checkpoint: {dir: ", checkpoints,
      ", every_steps: 100000, keep: 2}\n", "recovery: {max_restarts: 0}\n",
      "rebalance: {threshold: 0.15, window_steps: ", o.window, "}\n");
}

void WriteSpeed(const std::string& file, double speed) {
  std::ofstream out(file + ".tmp");
  out << speed << "\n";
  out.close();
  std::filesystem::rename(file + ".tmp", file);
}

double Summary(const v1::JobStatus& st, const std::string& key) {
  const auto it = st.summary().find(key);
  return it == st.summary().end() ? -1 : it->second;
}

std::string Cut(const v1::JobStatus& st, int J) {
  std::string cut;
  for (int j = 0; j < J; ++j) {
    absl::StrAppend(&cut, j ? " " : "", "[",
                    Summary(st, absl::StrCat("plan.stage", j, ".block_begin")), ",",
                    Summary(st, absl::StrCat("plan.stage", j, ".block_end")), ")");
  }
  return cut;
}

// The first plan's cut at the slowed speeds: 1F1B played out on its stages'
// planned times (the slowed stage's over --slow), as the planner predicts a
// schedule (services/planner/planner.cc), with the emulated blocks' forward
// and backward shares.
double SlowedPrediction(const Options& o, const v1::JobStatus& st) {
  namespace pl = stagewise::pipeline;
  const int J = o.stages, M = o.micro_batches;
  pl::ScheduleOptions so{.stages = J, .micro_batches = M};
  const double forward_share = o.forward_ms / (o.forward_ms + o.backward_ms);
  for (int j = 0; j < J; ++j) {
    double t = Summary(st, absl::StrCat("plan.stage", j, ".seconds_per_batch"));
    if (t <= 0) return -1;
    if (j == o.slow_stage) t /= o.slow;
    so.costs.push_back({t * forward_share / M, t * (1 - forward_share) / (2.0 * M),
                        t * (1 - forward_share) / (2.0 * M)});
  }
  auto orders = pl::StageOrders(stagewise::PipelineSchedule::kOneFOneB, so);
  if (!orders.ok()) return -1;
  auto sim = pl::Simulate(*orders, so);
  return sim.ok() ? sim->seconds : -1;
}

// One round's figures, seconds per mini-batch.
struct Round {
  double before = 0, slowed = 0, after = 0;
  double predicted = 0, predicted_slowed = 0, predicted_after = 0;
  std::string cut, new_cut, reason;
};

struct Progress {
  std::mutex mu;
  // attempt (1-based) -> step -> the first time it was seen.
  std::map<int, std::map<int64_t, Clock::time_point>> seen;

  // Seconds per step between the first seen step >= `from` and the last
  // <= `to` of `attempt`; negative when there are fewer than two.
  double Rate(int attempt, int64_t from, int64_t to) {
    std::lock_guard<std::mutex> lock(mu);
    const auto& steps = seen[attempt];
    auto a = steps.lower_bound(from);
    auto b = steps.upper_bound(to);
    if (a == steps.end() || b == steps.begin()) return -1;
    --b;
    if (b->first <= a->first) return -1;
    return std::chrono::duration<double>(b->second - a->second).count() /
           static_cast<double>(b->first - a->first);
  }
  int64_t Last(int attempt) {
    std::lock_guard<std::mutex> lock(mu);
    const auto& steps = seen[attempt];
    return steps.empty() ? -1 : steps.rbegin()->first;
  }
};

absl::StatusOr<Round> RunRound(stagewise::testing::Cluster& cluster, const Options& o,
                               const std::vector<std::string>& speed_files,
                               const std::string& checkpoints) {
  for (const std::string& f : speed_files) WriteSpeed(f, 1);
  // Every worker back at full speed before the job profiles them.
  for (const auto& w : cluster.workers()) {
    while (w->emulated_speed() != 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::filesystem::remove_all(checkpoints);
  const int J = o.stages, warm = 2 * J + 2;
  // Enough steps that a job which never rebalances still ends.
  const int total = o.slow_at + 10 * o.window + warm + o.after + 100;
  auto id = cluster.manager().Submit(JobYaml(o, checkpoints, total));
  if (!id.ok()) return id.status();
  Progress progress;
  auto sub = cluster.manager().Subscribe(*id, [&](const v1::JobEvent& e) {
    const auto now = Clock::now();
    if (e.status().state() != v1::RUNNING) return;
    std::lock_guard<std::mutex> lock(progress.mu);
    progress.seen[e.status().attempts_size()].emplace(e.status().step(), now);
  });
  Round round;
  std::string slowed_worker;
  int64_t resume = -1;
  absl::Status failure;
  for (;;) {
    auto st = cluster.manager().GetJob(*id);
    if (!st.ok()) {
      failure = st.status();
      break;
    }
    if (st->state() == v1::SUCCEEDED || st->state() == v1::FAILED || st->state() == v1::CANCELLED) {
      failure =
          absl::InternalError(absl::StrCat("the job ended (", v1::JobState_Name(st->state()),
                                           ") before the rebalance was measured: ", st->reason()));
      break;
    }
    if (st->state() == v1::RUNNING && st->attempts_size() == 1 && slowed_worker.empty() &&
        st->step() >= o.slow_at) {
      round.predicted =
          Summary(*st, absl::StrCat("plan.predicted.backprop_1f1b_M", o.micro_batches));
      round.predicted_slowed = SlowedPrediction(o, *st);
      round.cut = Cut(*st, J);
      slowed_worker = st->attempts(0).workers(o.slow_stage);
      const int index = std::atoi(slowed_worker.c_str() + 1);  // the cluster names them w<i>
      WriteSpeed(speed_files.at(index), o.slow);
    }
    if (st->state() == v1::RUNNING && st->attempts_size() == 2) {
      if (resume < 0) {
        resume = st->attempts(1).from_step();
        round.reason = st->attempts(0).end_reason();
        round.new_cut = Cut(*st, J);
        round.predicted_after =
            Summary(*st, absl::StrCat("plan.predicted.backprop_1f1b_M", o.micro_batches));
      }
      if (progress.Last(2) >= resume + warm + o.after) break;
    }
    if (st->attempts_size() > 2) {
      failure = absl::InternalError("more than one rebalance");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  (void)cluster.manager().Cancel(*id, "measured");
  cluster.manager().Unsubscribe(*sub);
  (void)cluster.WaitForJob(*id, absl::Minutes(2));
  if (!failure.ok()) return failure;
  round.before = progress.Rate(1, warm, o.slow_at);
  round.slowed = progress.Rate(1, o.slow_at + 4, progress.Last(1) - 1);
  round.after = progress.Rate(2, resume + warm, resume + warm + o.after);
  if (round.before < 0 || round.slowed < 0 || round.after < 0) {
    return absl::InternalError("too few progress reports in a phase");
  }
  return round;
}

using stagewise::bench::Median;

std::string Spread(const std::vector<double>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return absl::StrFormat("%.1f-%.1f", 1e3 * *lo, 1e3 * *hi);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  at::set_num_threads(1);
  std::cout << absl::StrFormat(
      "rebalancing: %d stages of %d emulated blocks (%.3g / %.3g ms), 1F1B M=%d; stage %d's worker "
      "slowed to %.2g after step %d; rebalance.window_steps %d; %d rounds\n",
      o.stages, o.blocks_per_stage, o.forward_ms, o.backward_ms, o.micro_batches, o.slow_stage,
      o.slow, o.slow_at, o.window, o.rounds);
  char pattern[] = "/tmp/stagewise-rebalance-bench-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = pattern;
  std::vector<std::string> speed_files;
  for (int i = 0; i < o.stages; ++i) speed_files.push_back(absl::StrCat(dir, "/speed-", i));
  for (const std::string& f : speed_files) WriteSpeed(f, 1);
  int rc = 0;
  {
    stagewise::testing::Cluster::Options co;
    co.workers = o.stages;
    co.emulated_speed_files = speed_files;
    stagewise::testing::Cluster cluster(co);
    if (!cluster.WaitForWorkers(co.workers, absl::Seconds(60))) {
      std::cerr << "workers did not come up\n";
      rc = 1;
    }
    std::vector<Round> rounds;
    for (int r = 0; rc == 0 && r < o.rounds; ++r) {
      auto round = RunRound(cluster, o, speed_files, dir + "/checkpoints");
      if (!round.ok()) {
        std::cerr << "round " << r + 1 << ": " << round.status() << "\n";
        rc = 1;
        continue;
      }
      std::cerr << absl::StrFormat(
          "round %d: before %.1f ms (plan %.1f) %s; slowed %.1f ms (%.1f); after %.1f ms (%.1f) "
          "%s\n  %s\n",
          r + 1, 1e3 * round->before, 1e3 * round->predicted, round->cut, 1e3 * round->slowed,
          1e3 * round->predicted_slowed, 1e3 * round->after, 1e3 * round->predicted_after,
          round->new_cut, round->reason);
      rounds.push_back(*round);
    }
    if (!rounds.empty()) {
      std::cout << absl::StrFormat("%-8s %-26s %12s %10s %14s %14s\n", "phase", "cut",
                                   "predicted ms", "median ms", "min-max ms", "over plan");
      auto row = [&](const char* phase, const std::string& cut, double Round::*m,
                     double Round::*p) {
        std::vector<double> v, ratio;
        for (const Round& r : rounds) {
          v.push_back(r.*m);
          ratio.push_back(r.*m / r.*p);
        }
        std::cout << absl::StrFormat("%-8s %-26s %12.1f %10.1f %14s %13.1f%%\n", phase, cut,
                                     1e3 * Median([&] {
                                       std::vector<double> q;
                                       for (const Round& r : rounds) q.push_back(r.*p);
                                       return q;
                                     }()),
                                     1e3 * Median(v), Spread(v), 100 * (Median(ratio) - 1));
      };
      row("before", rounds[0].cut, &Round::before, &Round::predicted);
      row("slowed", rounds[0].cut, &Round::slowed, &Round::predicted_slowed);
      row("after", rounds[0].new_cut, &Round::after, &Round::predicted_after);
      for (size_t r = 1; r < rounds.size(); ++r) {
        if (rounds[r].new_cut != rounds[0].new_cut) {
          std::cout << "round " << r + 1 << " moved to " << rounds[r].new_cut
                    << " (its own plan's prediction is its after row's)\n";
        }
      }
      std::vector<double> gain, predicted_gain;
      for (const Round& r : rounds) {
        gain.push_back(r.slowed / r.after);
        predicted_gain.push_back(r.predicted_slowed / r.predicted_after);
      }
      std::cout << absl::StrFormat(
          "the rebalance made the job %.2fx faster (median over rounds; predicted %.2fx)\n",
          Median(gain), Median(predicted_gain));
    }
  }
  std::filesystem::remove_all(dir);
  return rc;
}
