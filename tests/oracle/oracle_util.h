// Helpers the algorithm oracles share: run a job on an in-process cluster and
// collect every stage's tensors, and compare tensor maps.
#ifndef STAGEWISE_TESTS_ORACLE_ORACLE_UTIL_H_
#define STAGEWISE_TESTS_ORACLE_ORACLE_UTIL_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "services/models/optimizer_state_key.h"
#include "services/models/plan.h"
#include "services/training/optimizer.h"
#include "services/training/reference_trainer.h"
#include "tests/integration/cluster.h"

namespace stagewise::testing {

// The device the oracles run on: STAGEWISE_TEST_DEVICE (e.g. cuda:0) when set,
// else cpu. In-process workers (tests/integration/cluster.cc) and the reference
// trainers below both use it, so a GPU run compares like with like.
inline std::string TestDevice() {
  const char* env = std::getenv("STAGEWISE_TEST_DEVICE");
  return env != nullptr && *env != '\0' ? env : "cpu";
}

// The reference trainer for `spec` on TestDevice().
inline absl::StatusOr<std::unique_ptr<training::ReferenceTrainer>> CreateReference(JobSpec spec) {
  spec.device = TestDevice();
  if (torch::Device(spec.device).is_cuda()) UseExactCudaMath();
  return training::ReferenceTrainer::Create(spec);
}

// Parameters and buffers of `m` by name, detached copies.
inline std::map<std::string, torch::Tensor> Tensors(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : m.named_parameters())
    out[item.key()] = item.value().detach().cpu().clone();
  for (const auto& item : m.named_buffers()) out[item.key()] = item.value().detach().cpu().clone();
  return out;
}

// Same names, and every tensor within `tolerance` relative (L2) of `want`, or
// within kOracleNoise absolute (L2). The absolute floor is for tensors that
// stay at rounding-noise size: after an oracle's few steps the proj_bn biases
// of the ResNet blocks hold values of norm 1e-9 to 2e-8, identical between two
// runs on one device but not between a CPU simulation and GPU workers, where
// their relative difference is of order 1 (docs/cuda.md).
constexpr double kOracleNoise = 1e-6;
inline void ExpectClose(const std::map<std::string, torch::Tensor>& got,
                        const std::map<std::string, torch::Tensor>& want, double tolerance = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const torch::Tensor g = got.at(name).to(torch::kCPU, torch::kDouble);
    const torch::Tensor wd = w.to(torch::kCPU, torch::kDouble);
    const double diff = (g - wd).norm().item<double>();
    const double scale = wd.norm().item<double>();
    if (diff <= kOracleNoise) continue;
    const double err = diff / std::max(scale, 1e-12);
    EXPECT_LE(err, tolerance) << name << ": |got| " << g.norm().item<double>() << ", |want| "
                              << scale << ", |got - want| " << diff;
  }
}

// The largest element-wise difference between two runs' tensors (by the
// names of `a`): oracles use it to show that a variant's trajectory differs.
inline double MaxDifference(const std::map<std::string, torch::Tensor>& a,
                            const std::map<std::string, torch::Tensor>& b) {
  double max_diff = 0;
  for (const auto& [name, w] : a) {
    max_diff = std::max(max_diff, (b.at(name) - w).abs().max().item<double>());
  }
  return max_diff;
}

// The staleness corrections of delayed and petra as
// worker/algorithms/delay_corrections.h describes them, written out for the
// oracles' simulations of one stage with delay s (in updates).
struct SimulatedCorrections {
  double s = 0;
  double lr_scale = 1;  // lr_by_delay: 1, 1/(1+s) or 1/sqrt(1+s)
  bool predict = false;
  bool compensate = false;              // at momentum (SGD's, Adam's beta1) max(0, m - s/(1+s))
  std::vector<torch::Tensor> previous;  // predict: the parameters before the last step

  SimulatedCorrections() = default;
  SimulatedCorrections(double delay, DelayLr lr, DelayMomentum momentum, bool predict_weights)
      : s(delay),
        lr_scale(lr == DelayLr::kInverse       ? 1 / (1 + delay)
                 : lr == DelayLr::kInverseSqrt ? 1 / std::sqrt(1 + delay)
                                               : 1.0),
        predict(predict_weights && delay > 0),
        compensate(momentum == DelayMomentum::kCompensate && delay > 0) {}

  // The step at `lr` x lr_scale (gradients already averaged), the momentum
  // `m` (SGD's, or Adam's beta1) lowered when compensating; w_prev taken
  // first.
  void Step(torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& params, double lr,
            double m) {
    if (predict) {
      torch::NoGradGuard ng;
      previous.clear();
      for (const auto& p : params) previous.push_back(p.detach().clone());
    }
    training::SetLearningRate(opt, lr * lr_scale);
    const double momentum = compensate ? std::max(0.0, m - s / (1 + s)) : m;
    for (auto& group : opt.param_groups()) {
      if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&group.options())) {
        adam->betas({momentum, std::get<1>(adam->betas())});
      } else {
        static_cast<torch::optim::SGDOptions&>(group.options()).momentum(momentum);
      }
    }
    opt.step();
  }
  // predict: moves `params` to w + s (w - w_prev) and returns w (empty when
  // nothing is predicted); Restore puts it back.
  std::vector<torch::Tensor> Predict(const std::vector<torch::Tensor>& params) const {
    std::vector<torch::Tensor> current;
    if (previous.empty()) return current;
    torch::NoGradGuard ng;
    for (size_t i = 0; i < params.size(); ++i) {
      current.push_back(params[i].detach().clone());
      params[i].detach().add_(params[i].detach() - previous[i], s);
    }
    return current;
  }
  static void Restore(const std::vector<torch::Tensor>& params,
                      const std::vector<torch::Tensor>& current) {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < current.size(); ++i) params[i].detach().copy_(current[i]);
  }
};

// The reference trainer's model after running `yaml` in one process.
inline std::map<std::string, torch::Tensor> ReferenceTensors(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return {};
  auto trainer = CreateReference(*spec);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return {};
  EXPECT_TRUE((*trainer)->Run().ok());
  return Tensors((*trainer)->model());
}

struct Outcome {
  v1::JobStatus status;
  std::map<std::string, torch::Tensor> tensors;  // parameters and buffers of every stage
};

// Runs `yaml` on `stages` in-process workers; expects it to succeed.
// Outcome.tensors: parameters, and buffers unless `buffers` is false.
inline Outcome RunJob(const std::string& yaml, int stages, bool buffers = true) {
  Cluster cluster({.workers = stages});
  EXPECT_TRUE(cluster.WaitForWorkers(stages));
  auto id = cluster.manager().Submit(yaml);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return {};
  auto st = cluster.WaitForJob(*id);
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return {};
  EXPECT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
  Outcome out{*st, cluster.StageTensors(*id, /*buffers=*/false)};
  if (!buffers) return out;
  for (auto& [name, v] : cluster.StageTensors(*id, /*buffers=*/true)) out.tensors[name] = v;
  return out;
}

// Backprop's gradients, seen through SGD's momentum buffers: with lr = 0 the
// parameters never move, so every gradient must be backprop's for the same
// mini-batch, and equal buffers after S steps mean equal gradient sequences.
struct MomentumOutcome {
  v1::JobStatus status;                       // of the distributed run
  std::map<std::string, torch::Tensor> want;  // the reference trainer's buffers
  std::map<std::string, torch::Tensor> got;   // every stage's, by global name
};

using models::OptimizerStateKey;  // services/models/optimizer_state_key.h

// The momentum buffer of parameter `p` in `opt` (SGD).
inline torch::Tensor MomentumBuffer(torch::optim::Optimizer& opt, const torch::Tensor& p) {
  using Key = std::decay_t<decltype(opt.state())>::key_type;
  auto it = opt.state().find(OptimizerStateKey<Key>(p));
  EXPECT_TRUE(it != opt.state().end());
  if (it == opt.state().end()) return torch::Tensor();
  return static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().clone();
}

// Runs `yaml` (lr 0, SGD with momentum, `steps:`) in the reference trainer
// and on `workers` in-process workers; expects the job to succeed.
inline MomentumOutcome RunMomentumOracle(const std::string& yaml, int workers) {
  MomentumOutcome out;
  auto spec = ParseJobSpec(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return out;
  auto trainer = CreateReference(*spec);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return out;
  auto& t = **trainer;
  for (int64_t s = 0; s < spec->steps; ++s) t.Step(t.train_sampler().Get(0, s), 0.0);
  for (const auto& item : t.model().named_parameters()) {
    out.want[item.key()] = MomentumBuffer(t.optimizer(), item.value());
  }
  Cluster cluster({.workers = workers});
  EXPECT_TRUE(cluster.WaitForWorkers(workers));
  auto id = cluster.manager().Submit(yaml);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return out;
  auto st = cluster.WaitForJob(*id);
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return out;
  EXPECT_EQ(st->state(), v1::SUCCEEDED) << st->reason();
  out.status = *st;
  for (auto& w : cluster.workers()) {
    auto rt = w->runtime();
    for (const auto& item : rt->model().named_parameters()) {
      out.got[item.key()] = MomentumBuffer(rt->optimizer(), item.value());
    }
  }
  return out;
}

// A small byte-level GPT job on the fortunes text (docs/text.md): 4 blocks
// (embedding, 2 Transformer blocks, LM head) over `stages`, SGD with momentum
// at `lr`, sequences of 16 bytes, batch 8.
inline std::string GptJobYaml(int stages, const std::string& algorithm, double lr, int steps) {
  std::ostringstream yaml;
  yaml << "name: gpt-oracle\nseed: 7\nmodel: {name: gpt, depth: 2, width: 16, heads: 2}\n"
       << "data: {dataset: fortunes, sequence_length: 16, train_size: 64, limit_test: 4}\n"
       << "algorithm: " << algorithm << "\nstages: {count: " << stages << ", partition: even}\n"
       << "optimizer: {name: sgd, lr: " << lr << ", momentum: 0.9}\nbatch_size: 8\nsteps: " << steps
       << "\neval: {every_epochs: 0, at_end: false}\n";
  return yaml.str();
}

// $STAGEWISE_TEST_SEED, or a fresh random seed (the tests that draw their
// faults at random print it, so a failure can be replayed).
inline uint64_t TestSeed() {
  if (const char* env = std::getenv("STAGEWISE_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return std::random_device{}();
}

// What a single-process simulation of a pipelined algorithm starts from: the
// reference trainer's batches (the distributed run's order), the model's
// blocks and the job's stage ranges.
struct Simulation {
  std::unique_ptr<training::ReferenceTrainer> trainer;
  std::vector<models::BlockInfo> plan;
  std::vector<std::pair<int, int>> ranges;
  int64_t per_epoch = 1;

  int stages() const { return static_cast<int>(ranges.size()); }
  // Mini-batch t of the training order.
  data::Batch Batch(int64_t t) const {
    return trainer->train_sampler().Get(t / per_epoch, t % per_epoch);
  }
  // Stage j's blocks with the job's initial parameters, in training mode.
  std::shared_ptr<models::Model> StageModel(const JobSpec& spec, int j) const {
    auto model = models::BuildModel(spec.model, spec.seed, ranges[j].first, ranges[j].second);
    EXPECT_TRUE(model.ok()) << model.status();
    (*model)->train();
    return *model;
  }
  // Stage j's input of mini-batch t: the batch at the first stage, else the
  // activation and labels its predecessor left in `inbox` (taken out).
  std::pair<torch::Tensor, torch::Tensor> TakeInput(
      int j, int64_t t, std::map<int64_t, std::pair<torch::Tensor, torch::Tensor>>& inbox) const {
    if (j > 0) return std::move(inbox.extract(t).mapped());
    data::Batch b = Batch(t);
    return {b.x, b.y};
  }
};

inline Simulation StartSimulation(const JobSpec& spec) {
  Simulation sim;
  auto trainer = training::ReferenceTrainer::Create(
      spec);  // on CPU: the simulations build their own tensors there
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  auto plan = models::PlanModel(spec.model);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!trainer.ok() || !plan.ok()) return sim;
  sim.trainer = *std::move(trainer);
  sim.plan = *std::move(plan);
  auto ranges = models::ResolvePartition(spec.stages, sim.plan);
  EXPECT_TRUE(ranges.ok()) << ranges.status();
  if (ranges.ok()) sim.ranges = *std::move(ranges);
  sim.per_epoch = sim.trainer->train_sampler().batches_per_epoch();
  return sim;
}

}  // namespace stagewise::testing

#endif  // STAGEWISE_TESTS_ORACLE_ORACLE_UTIL_H_
