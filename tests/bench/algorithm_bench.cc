// Throughput and buffer memory of every training algorithm on the same RevNet
// and partition, J = 2 and J = 4, in one run: in-process workers over real
// gRPC on loopback. Prints one table with ratios to backprop; never a test.
//   build/bin/stagewise_algorithm_bench [JOB.yaml|-] [steps] [stages...]
//
// "buffered" is what a stage keeps between a mini-batch's forward and its
// backward, per stage, at its peak, from the job summary: stored inputs plus
// stashed parameter copies. For backprop it is the boundary tensors of the
// micro-batches in flight; its autograd graph (the activations inside the
// stage) comes on top and is not counted.
#include <chrono>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tests/integration/cluster.h"

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
  double seconds = 0;
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
  const auto& summary = st->summary();
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

int main(int argc, char** argv) {
  std::string base = kDefaultJob;
  if (argc > 1 && std::string(argv[1]) != "-") {
    auto spec_text = std::ifstream(argv[1]);
    if (!spec_text) {
      std::cerr << "cannot read " << argv[1] << "\n";
      return 2;
    }
    base.assign(std::istreambuf_iterator<char>(spec_text), {});
  }
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 40;
  std::vector<int> stage_counts;
  for (int i = 3; i < argc; ++i) stage_counts.push_back(std::stoi(argv[i]));
  if (stage_counts.empty()) stage_counts = {2, 4};
  auto spec = stagewise::ParseJobSpec(base + "steps: 1\n");
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    return 2;
  }
  const int64_t batch = spec->batch_size;
  base += absl::StrCat("steps: ", steps, "\n");
  std::cout << absl::StrFormat(
      "%s, batch %d, %d steps per run, %d intra-op threads shared by all stages\n",
      spec->model.name, batch, steps, at::get_num_threads());
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
  };
  std::cout << absl::StrFormat("%-4s %-20s %10s %8s %10s  %s\n", "J", "algorithm", "samples/s",
                               "vs bp", "bwd msg", "peak buffered per stage (s0/s1/...)");
  for (int J : stage_counts) {
    double backprop_rate = 0;
    for (const Row& row : rows) {
      const Result r =
          Run(base + absl::StrCat("stages: ", J, "\nalgorithm: ", row.algorithm, "\n"), J);
      const double rate = static_cast<double>(steps * batch) / r.seconds;
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
