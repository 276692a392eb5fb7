// Helpers the algorithm oracles share: run a job on an in-process cluster and
// collect every stage's tensors, and compare tensor maps.
#ifndef STAGEWISE_TESTS_ORACLE_ORACLE_UTIL_H_
#define STAGEWISE_TESTS_ORACLE_ORACLE_UTIL_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

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

}  // namespace stagewise::testing

#endif  // STAGEWISE_TESTS_ORACLE_ORACLE_UTIL_H_
