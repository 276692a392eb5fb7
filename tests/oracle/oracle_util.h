// Helpers the algorithm oracles share: run a job on an in-process cluster and
// collect every stage's tensors, and compare tensor maps.
#ifndef STAGEWISE_TESTS_ORACLE_ORACLE_UTIL_H_
#define STAGEWISE_TESTS_ORACLE_ORACLE_UTIL_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "services/training/reference_trainer.h"
#include "tests/integration/cluster.h"

namespace stagewise::testing {

// Parameters and buffers of `m` by name, detached copies.
inline std::map<std::string, torch::Tensor> Tensors(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : m.named_parameters()) out[item.key()] = item.value().detach().clone();
  for (const auto& item : m.named_buffers()) out[item.key()] = item.value().detach().clone();
  return out;
}

// Same names, and every tensor within `tolerance` relative (L2) of `want`.
inline void ExpectClose(const std::map<std::string, torch::Tensor>& got,
                        const std::map<std::string, torch::Tensor>& want, double tolerance = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const torch::Tensor g = got.at(name).to(torch::kDouble), wd = w.to(torch::kDouble);
    const double err = ((g - wd).norm() / wd.norm().clamp_min(1e-12)).item<double>();
    EXPECT_LE(err, tolerance) << name;
  }
}

// The reference trainer's model after running `yaml` in one process.
inline std::map<std::string, torch::Tensor> ReferenceTensors(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return {};
  auto trainer = training::ReferenceTrainer::Create(*spec);
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
inline Outcome RunJob(const std::string& yaml, int stages) {
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

// The momentum buffer of parameter `p` in `opt` (SGD).
inline torch::Tensor MomentumBuffer(torch::optim::Optimizer& opt, const torch::Tensor& p) {
  auto it = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
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
  auto trainer = training::ReferenceTrainer::Create(*spec);
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

}  // namespace stagewise::testing

#endif  // STAGEWISE_TESTS_ORACLE_ORACLE_UTIL_H_
