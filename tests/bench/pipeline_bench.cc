// Step time of pipelined backprop across J in-process workers (real gRPC on
// loopback) against the single-process reference trainer on the same model
// and data. Prints a table with ratios; never a test.
//   build/bin/stagewise_pipeline_bench [JOB.yaml] [steps]
#include <chrono>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "services/training/reference_trainer.h"
#include "tests/integration/cluster.h"

namespace {

constexpr const char* kDefaultJob = R"(name: bench
seed: 0
model: {name: revnet, depth: 18, width: 16, small_input: true}
data: {dataset: synthetic, train_size: 4096, test_size: 128, shape: [1, 28, 28], classes: 10}
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
batch_size: 128
eval: {every_epochs: 0, at_end: false}
)";

double ReferenceSeconds(const std::string& yaml) {
  auto spec = stagewise::ParseJobSpec(yaml);
  if (!spec.ok()) {
    std::cerr << spec.status() << "\n";
    std::exit(2);
  }
  auto trainer = stagewise::training::ReferenceTrainer::Create(*spec);
  if (!trainer.ok()) {
    std::cerr << trainer.status() << "\n";
    std::exit(2);
  }
  auto r = (*trainer)->Run();
  return r.ok() ? r->seconds : -1;
}

double PipelineSeconds(const std::string& yaml, int stages) {
  stagewise::testing::Cluster cluster({.workers = stages});
  cluster.WaitForWorkers(stages);
  const auto t0 = std::chrono::steady_clock::now();
  auto id = cluster.manager().Submit(yaml);
  if (!id.ok()) {
    std::cerr << id.status() << "\n";
    std::exit(2);
  }
  auto st = cluster.WaitForJob(*id, absl::Minutes(30));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok() || st->state() != stagewise::v1::SUCCEEDED) {
    std::cerr << "job failed: " << (st.ok() ? st->reason() : st.status().ToString()) << "\n";
    std::exit(1);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string base = kDefaultJob;
  if (argc > 1 && std::string(argv[1]) != "-") {
    auto spec_text = std::ifstream(argv[1]);
    base.assign(std::istreambuf_iterator<char>(spec_text), {});
  }
  const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 30;
  base += absl::StrCat("steps: ", steps, "\n");
  std::cout << absl::StrFormat("threads %d, %d steps per run\n", at::get_num_threads(), steps);
  const double ref = ReferenceSeconds(base + "stages: 1\n");
  std::cout << absl::StrFormat("%-34s %12s %10s\n", "run", "s/step", "vs ref");
  std::cout << absl::StrFormat("%-34s %12.4f %10.2f\n", "reference (one process)", ref / steps,
                               1.0);
  struct Row {
    std::string name;
    int stages;
    std::string algorithm;
  };
  for (const Row& row : std::vector<Row>{
           {"backprop J=1 (worker)", 1, "backprop"},
           {"backprop J=2, M=1", 2, "backprop"},
           {"backprop J=2, M=4 (GPipe)", 2, "{name: backprop, micro_batches: 4}"},
           {"backprop J=2, M=4 (1F1B)", 2, "{name: backprop, micro_batches: 4, schedule: 1f1b}"}}) {
    const std::string yaml =
        base + absl::StrCat("stages: ", row.stages, "\nalgorithm: ", row.algorithm, "\n");
    const double s = PipelineSeconds(yaml, row.stages);
    std::cout << absl::StrFormat("%-34s %12.4f %10.2f\n", row.name, s / steps, s / ref);
  }
  return 0;
}
