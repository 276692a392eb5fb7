// Oracle (docs/algorithms.md, backprop): J stages exchanging activations and
// gradients over real gRPC streams end with the parameters of a single-process
// run: plain backprop for M = 1, and accumulation over the same micro-batches
// for M > 1, whatever the schedule (GPipe, 1F1B, ZB-H1, interleaved 1F1B with
// v chunks per worker, with recompute), also with stages.bottleneck's
// projections at the cuts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "services/models/loss.h"
#include "services/training/optimizer.h"
#include "services/training/reference_trainer.h"
#include "tests/integration/cluster.h"
#include "tests/oracle/oracle_util.h"

namespace stagewise {
namespace {

struct Case {
  int stages;
  int micro_batches;
  std::string schedule;
  bool recompute;
  // A byte-level GPT on the fortunes text (docs/text.md) instead of the
  // RevNet; with varying, every mini-batch draws its own sequence length.
  bool gpt = false;
  bool varying = false;
  // Interleaved: chunks per worker (stages = workers, stages x chunks
  // virtual stages).
  int chunks = 1;
  // Muon (orthogonalised momentum, Adam for biases and norms) instead of SGD.
  bool muon = false;
  // stages.bottleneck: this many channels cross each cut (0: none); the
  // reference is the same model, projections and all, in one process.
  int bottleneck = 0;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.gpt ? "gpt_" : "") << "J" << c.stages << "_M" << c.micro_batches << "_" << c.schedule
      << (c.chunks > 1 ? "_v" + std::to_string(c.chunks) : "") << (c.recompute ? "_recompute" : "")
      << (c.varying ? "_varying_length" : "") << (c.muon ? "_muon" : "")
      << (c.bottleneck > 0 ? "_bottleneck" + std::to_string(c.bottleneck) : "");
}

std::string ModelAndData(const Case& c) {
  if (!c.gpt) {
    // 6 blocks, or 10 for the virtual stages of interleaved runs.
    return absl::StrCat("model: {name: revnet, depth: 18, width: 4, blocks: ",
                        c.chunks > 1 ? "[2, 2, 2, 2]" : "[1, 1, 1, 1]", R"(}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [3, 8, 8], classes: 4}
)");
  }
  return absl::StrCat(R"(model: {name: gpt, depth: 3, width: 16, heads: 2}
data: {dataset: fortunes, sequence_length: 24, train_size: 128, limit_test: 6)",
                      c.varying ? ", min_sequence_length: 8" : "", "}\n");
}

std::string JobYaml(const Case& c) {
  return absl::StrCat(
      R"(name: oracle
seed: 5
)",
      ModelAndData(c), R"(algorithm: {name: backprop, micro_batches: )", c.micro_batches,
      ", schedule: ", c.schedule, ", recompute: ", c.recompute ? "true" : "false", R"(}
stages: )",
      c.chunks > 1 ? absl::StrCat("{count: ", c.stages, ", chunks_per_worker: ", c.chunks, "}")
      : c.bottleneck > 0
          ? absl::StrCat("{count: ", c.stages, ", bottleneck: {rank: ", c.bottleneck, "}}")
          : std::to_string(c.stages),
      R"(
optimizer: )",
      c.muon ? "{name: muon, lr: 0.02, adam_lr: 0.003, momentum: 0.95, nesterov: true, "
               "weight_decay: 0.01}"
             : "{name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}",
      R"(
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: 6
eval: {every_epochs: 0, at_end: true}
)");
}

// The single-process reference, written here independently of the worker.
std::map<std::string, torch::Tensor> Reference(const JobSpec& spec, int micro_batches,
                                               bool buffers) {
  auto trainer = testing::CreateReference(spec);  // on STAGEWISE_TEST_DEVICE
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  auto& t = **trainer;
  const int64_t per_epoch = t.train_sampler().batches_per_epoch();
  const double base = training::BaseLearningRate(spec.optimizer, spec.batch_size);
  for (int64_t s = 0; s < spec.steps; ++s) {
    data::Batch b = t.train_sampler().Get(s / per_epoch, s % per_epoch);
    const double lr = training::LearningRateAt(spec.schedule, base, s, per_epoch, spec.steps);
    if (micro_batches == 1) {
      t.Step(b, lr);  // the reference trainer itself
      continue;
    }
    t.model().train();
    t.optimizer().zero_grad();
    const int64_t B = b.y.size(0);
    std::vector<int64_t> sizes;
    for (int m = 0; m < micro_batches; ++m)
      sizes.push_back(B / micro_batches + (m < B % micro_batches));
    const torch::Device device = t.model().parameters().front().device();
    auto xs = b.x.to(device).split_with_sizes(sizes);
    auto ys = b.y.to(device).split_with_sizes(sizes);
    for (int m = 0; m < micro_batches; ++m) {
      torch::Tensor loss = models::CrossEntropy(t.model().forward(xs[m]), ys[m]) *
                           (static_cast<double>(sizes[m]) / B);
      loss.backward();
    }
    training::SetLearningRate(t.optimizer(), lr);
    t.optimizer().step();
  }
  std::map<std::string, torch::Tensor> out;
  if (buffers) {
    for (const auto& item : t.model().named_buffers())
      out[item.key()] = item.value().detach().cpu();
  } else {
    for (const auto& item : t.model().named_parameters()) {
      out[item.key()] = item.value().detach().cpu();
    }
  }
  return out;
}

class BackpropOracle : public ::testing::TestWithParam<Case> {};

TEST_P(BackpropOracle, ParametersEqualTheSingleProcessRun) {
  const Case& c = GetParam();
  const std::string yaml = JobYaml(c);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();

  testing::Cluster cluster({.workers = c.stages});
  ASSERT_TRUE(cluster.WaitForWorkers(c.stages));
  auto id = cluster.manager().Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
  EXPECT_EQ(st->step(), 6);
  EXPECT_GT(st->eval_accuracy(), 0.0);
  if (c.schedule == "auto") {
    // Every candidate's predicted time per mini-batch is in the summary; with
    // no memory cap the fastest, ZB-H1, runs.
    for (const char* s : {"gpipe", "1f1b", "zb_h1"}) {
      EXPECT_GT(st->summary().count(absl::StrCat("plan.schedule.", s)), 0u) << s;
    }
  }

  auto got = cluster.StageTensors(*id, /*buffers=*/false);
  auto want = Reference(*spec, c.micro_batches, /*buffers=*/false);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const double err = ((got[name] - w).norm() / w.norm().clamp_min(1e-12)).item<double>();
    EXPECT_LE(err, 1e-5) << name;
  }
  // BatchNorm running statistics: updated once per micro-batch, also with recompute.
  auto got_buffers = cluster.StageTensors(*id, /*buffers=*/true);
  auto want_buffers = Reference(*spec, c.micro_batches, /*buffers=*/true);
  for (const auto& [name, w] : want_buffers) {
    ASSERT_TRUE(got_buffers.count(name)) << name;
    EXPECT_TRUE(torch::allclose(got_buffers[name].to(w.dtype()), w, 1e-5, 1e-6)) << name;
  }
}

// Two phases of interleaved 1F1B with different micro-batch counts: the
// worker's device turns start over with the second phase's order (its steps
// count from 0 again), and the job ends with every step done; the status
// names the virtual stages and the chunks.
TEST(InterleavedPhases, RunOnTheSameChunksToTheEnd) {
  const std::string yaml = R"(name: phases
seed: 5
model: {name: revnet, depth: 18, width: 4, blocks: [2, 2, 2, 2]}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [3, 8, 8], classes: 4}
stages: {count: 2, chunks_per_worker: 2}
batch_size: 16
eval: {every_epochs: 0, at_end: true}
phases:
  - {name: a, steps: 3, algorithm: {name: backprop, micro_batches: 4, schedule: interleaved}}
  - {name: b, steps: 2, algorithm: {name: backprop, micro_batches: 2, schedule: interleaved}}
)";
  testing::Cluster cluster({.workers = 2});
  ASSERT_TRUE(cluster.WaitForWorkers(2));
  auto id = cluster.manager().Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  auto st = cluster.WaitForJob(*id);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
  EXPECT_EQ(st->step(), 5);
  EXPECT_EQ(st->num_stages(), 4);
  EXPECT_EQ(st->chunks_per_worker(), 2);
  EXPECT_GT(st->eval_accuracy(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Stages, BackpropOracle,
                         ::testing::Values(Case{1, 1, "gpipe", false}, Case{1, 4, "gpipe", false},
                                           Case{2, 1, "gpipe", false}, Case{2, 4, "gpipe", false},
                                           Case{3, 1, "gpipe", false}, Case{3, 4, "gpipe", false},
                                           Case{3, 4, "1f1b", false}, Case{2, 4, "gpipe", true},
                                           Case{2, 1, "gpipe", false, true},
                                           Case{3, 1, "gpipe", false, true},
                                           Case{3, 4, "1f1b", false, true, true},
                                           Case{2, 4, "gpipe", true, true, true},
                                           // zero bubble: B and W split on stages > 0
                                           Case{2, 4, "zb-h1", false}, Case{3, 4, "zb-h1", false},
                                           Case{4, 6, "zb-h1", false}, Case{3, 4, "zb-h1", true},
                                           Case{4, 4, "zb-h1", true, true, true},
                                           // the planner picks (a profile first)
                                           Case{3, 4, "auto", false},
                                           // interleaved: v chunks on each of J workers
                                           Case{2, 4, "interleaved", false, false, false, 2},
                                           Case{3, 6, "interleaved", false, false, false, 2},
                                           Case{4, 8, "interleaved", false, false, false, 2},
                                           Case{2, 4, "interleaved", false, false, false, 3},
                                           Case{3, 6, "interleaved", true, false, false, 2},
                                           Case{2, 4, "interleaved", false, true, true, 2},
                                           // Muon steps every stage as in one process
                                           Case{3, 4, "1f1b", false, false, false, 1, true},
                                           Case{2, 4, "zb-h1", false, true, false, 1, true},
                                           // a learned bottleneck at every cut
                                           Case{3, 4, "1f1b", false, false, false, 1, false, 2},
                                           Case{2, 4, "zb-h1", false, true, false, 1, false, 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::ostringstream os;
                           PrintTo(info.param, &os);
                           std::string name = os.str();  // letters, digits, underscores
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace stagewise
