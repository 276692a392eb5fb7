// Oracles for `petra` (docs/algorithms.md; the PETRA paper, Algorithm 1 and
// eq. (4)-(5)):
//   - J = 1 equals backprop;
//   - with lr = 0 the rebuilt block inputs equal the forward ones and every
//     gradient equals backprop's for the same mini-batch;
//   - with lr > 0 and k in {1, 4} the parameters (and BN statistics) after S
//     steps equal a single-process simulation written here, which rebuilds
//     inputs with Block::inverse and recomputes like activation checkpointing
//     (the worker rebuilds and differentiates in one go); so they do with the
//     staleness corrections (look-ahead weights, learning rate and momentum by
//     delay), alone and together, and with k = 2;
//   - a fully reversible stage holds no activations between forward and
//     backward, where `delayed` holds 2(J-1-j)+1 inputs.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "services/models/batch_norm.h"
#include "services/models/loss.h"
#include "services/training/optimizer.h"
#include "services/training/reference_trainer.h"
#include "tests/integration/cluster.h"
#include "tests/oracle/oracle_util.h"

namespace stagewise::testing {
namespace {

// RevNet blocks: 0 stem, 1-2 reversible, 3 downsample, 4 reversible,
// 5-6 downsample, 7 head. Even over 3 stages: [0,3) [3,6) [6,8).
constexpr const char* kRevNet =
    R"(model: {name: revnet, depth: 18, width: 4, blocks: [2, 2, 1, 1]}
data: {dataset: synthetic, train_size: 128, test_size: 32, shape: [3, 8, 8], classes: 4}
)";
// The byte-level Reformer (docs/text.md): 0 embedding, 1-4 reversible
// Transformer blocks, 5 LM head. Even over 3 stages: [0,2) [2,4) [4,6), so
// stage 1 is fully reversible. Every mini-batch draws its own sequence length.
constexpr const char* kReformer =
    R"(model: {name: reformer, depth: 4, width: 16, heads: 2}
data: {dataset: fortunes, sequence_length: 16, min_sequence_length: 5, train_size: 256}
eval_batch_size: 512
)";

std::string JobYaml(const std::string& stages, const std::string& algorithm, int64_t steps,
                    double lr = 0.05, double weight_decay = 1e-4,
                    const char* model_and_data = kRevNet, bool eval = false) {
  return absl::StrCat(R"(name: petra-oracle
seed: 5
)",
                      model_and_data, "algorithm: ", algorithm, "\nstages: ", stages,
                      "\noptimizer: {name: sgd, lr: ", lr,
                      ", momentum: 0.9, weight_decay: ", weight_decay, R"(}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: )",
                      steps, "\neval: {every_epochs: 0, at_end: ", eval ? "true" : "false", "}\n");
}

// Single-process simulation of PETRA over J stage models, in the same 1F1B
// order as the workers (2(J-1-j)+1 in flight at stage j, the last stage at
// once). Each stage's state depends only on the order of its own operations,
// so a round-robin event loop reproduces the distributed run.
// The corrections as worker/algorithms/delay_corrections.h describes them,
// written out here: s_j = 2(J-1-j)/k; the forward at w + s_j (w - w_prev);
// the step at lr x 1/(1+s_j) or 1/sqrt(1+s_j), SGD's momentum lowered by
// s_j/(1+s_j).
std::map<std::string, torch::Tensor> Simulate(const JobSpec& spec, const PetraOptions& o) {
  const int64_t k = o.accumulation;
  const Simulation sim = StartSimulation(spec);
  const int64_t per_epoch = sim.per_epoch;
  const int64_t S = spec.steps;
  const int J = sim.stages();
  const double base = training::BaseLearningRate(spec.optimizer, spec.batch_size, k);

  struct Sim {
    std::shared_ptr<models::Model> model;
    std::unique_ptr<torch::optim::Optimizer> opt;
    int64_t depth = 1, next_f = 0, next_b = 0, backwards = 0;
    std::map<int64_t, std::vector<torch::Tensor>> buffer;  // non-reversible block inputs
    std::map<int64_t, std::pair<torch::Tensor, torch::Tensor>> fwd_in;  // x, labels
    std::map<int64_t, std::pair<torch::Tensor, torch::Tensor>> bwd_in;  // x~, delta
    testing::SimulatedCorrections c;
  };
  std::vector<Sim> st(J);
  for (int j = 0; j < J; ++j) {
    st[j].model = sim.StageModel(spec, j);
    st[j].opt = training::MakeOptimizer(spec.optimizer, *st[j].model);
    st[j].opt->zero_grad();
    st[j].depth = 2 * (J - 1 - j) + 1;
    const double delay =
        j == J - 1 ? 0 : static_cast<double>(st[j].depth - 1) / static_cast<double>(k);
    st[j].c =
        testing::SimulatedCorrections(delay, o.lr_by_delay, o.momentum_by_delay, o.predict_weights);
  }
  // Algorithm 1, lines 19-22: Delta += grad / k; update every k-th pass.
  auto accumulate = [&](Sim& s) {
    if (++s.backwards % k != 0) return;
    torch::NoGradGuard ng;
    for (auto& p : s.model->parameters()) {
      if (p.grad().defined()) p.grad().div_(static_cast<double>(k));
    }
    s.c.Step(*s.opt, s.model->parameters(),
             training::LearningRateAt(spec.schedule, base, s.backwards - k, per_epoch, S),
             spec.optimizer.momentum);
    s.opt->zero_grad();
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int j = 0; j < J; ++j) {
      Sim& s = st[j];
      const bool last = j == J - 1;
      const auto& blocks = s.model->blocks();
      const int64_t t = s.next_f;
      const bool want_forward = t < S && (last || t - s.next_b < s.depth);
      if (want_forward && (j == 0 || s.fwd_in.count(t))) {
        auto [x, y] = sim.TakeInput(j, t, s.fwd_in);
        if (last) {
          if (j > 0) x.requires_grad_(true);
          models::CrossEntropy(s.model->forward(x), y).backward();
          accumulate(s);
          if (j > 0) st[j - 1].bwd_in[t] = {x.detach(), x.grad()};
          ++s.next_b;
        } else {
          torch::NoGradGuard g;
          models::FreezeRunningStats freeze;
          const std::vector<torch::Tensor> params = s.model->parameters();
          const std::vector<torch::Tensor> current = s.c.Predict(params);
          std::vector<torch::Tensor> stored(blocks.size());
          torch::Tensor h = x;
          for (size_t i = 0; i < blocks.size(); ++i) {
            if (!blocks[i]->reversible()) stored[i] = h;
            h = blocks[i]->forward(h);
          }
          testing::SimulatedCorrections::Restore(params, current);
          s.buffer[t] = stored;
          st[j + 1].fwd_in[t] = {h, y};
        }
        ++s.next_f;
        progress = true;
        continue;
      }
      const int64_t b = s.next_b;
      if (!last && b < S && !want_forward && s.bwd_in.count(b)) {
        auto [out, delta] = s.bwd_in[b];
        s.bwd_in.erase(b);
        std::vector<torch::Tensor> stored = s.buffer[b];
        s.buffer.erase(b);
        // Eq. (4): the input of every block, rebuilt from the output with the
        // current parameters (reversible) or taken from the buffer.
        std::vector<torch::Tensor> inputs(blocks.size());
        {
          torch::NoGradGuard g;
          models::FreezeRunningStats freeze;
          torch::Tensor h = out;
          for (int i = static_cast<int>(blocks.size()) - 1; i >= 0; --i) {
            h = blocks[i]->reversible() ? blocks[i]->inverse(h) : stored[i];
            inputs[i] = h;
          }
        }
        // Then the VJP of each block at its rebuilt input (recomputed with a
        // graph, which is where running statistics move).
        torch::Tensor g = delta;
        for (int i = static_cast<int>(blocks.size()) - 1; i >= 0; --i) {
          torch::Tensor in = inputs[i].detach();
          const bool need = i > 0 || j > 0;
          if (need) in.requires_grad_(true);
          blocks[i]->forward(in).backward(g);
          g = need ? in.grad() : torch::Tensor();
        }
        accumulate(s);
        if (j > 0) st[j - 1].bwd_in[b] = {inputs[0], g};
        ++s.next_b;
        progress = true;
      }
    }
  }
  std::map<std::string, torch::Tensor> out;
  for (int j = 0; j < J; ++j) {
    EXPECT_EQ(st[j].backwards, S) << "stage " << j;
    for (auto& [name, v] : Tensors(*st[j].model)) out[name] = v;
  }
  return out;
}

TEST(PetraOracle, OneStageEqualsBackprop) {
  const std::string yaml = JobYaml("1", "{name: petra}", 6);
  ExpectClose(RunJob(yaml, 1).tensors, testing::ReferenceTensors(yaml));
}

// With lr = 0 nothing moves, so (a) every rebuilt block input must equal the
// one the forward saw (verify_rebuild reports the largest relative error per
// block) and (b) every gradient must be backprop's for the same mini-batch:
// SGD's momentum buffers accumulate them, so equal buffers after S steps mean
// equal gradient sequences.
TEST(PetraOracle, ZeroLearningRateRebuildsInputsAndGivesBackpropGradients) {
  const std::string yaml =
      JobYaml("{count: 3, partition: even}", "{name: petra, verify_rebuild: true}", 6, /*lr=*/0.0,
              /*weight_decay=*/0.0);
  const testing::MomentumOutcome run = testing::RunMomentumOracle(yaml, 3);
  ASSERT_EQ(run.status.state(), v1::SUCCEEDED) << run.status.reason();
  ExpectClose(run.got, run.want);
  const v1::JobStatus* st = &run.status;

  // Stages 0 and 1 rebuild blocks 0-5; the reversible ones (1, 2, 4) through
  // their inverse, the others from the buffer (exactly).
  const auto& summary = st->summary();
  int checked = 0;
  for (int j = 0; j < 2; ++j) {
    for (int block = 0; block < 6; ++block) {
      const std::string key = absl::StrCat("stage", j, ".rebuild_error.block", block);
      if (!summary.count(key)) continue;
      ++checked;
      EXPECT_LE(summary.at(key), 1e-5) << key;
      if (block != 1 && block != 2 && block != 4) {
        EXPECT_EQ(summary.at(key), 0.0) << key;
      }
    }
  }
  EXPECT_EQ(checked, 6);
}

struct TrajectoryCase {
  std::string options;  // more keys of the algorithm map, e.g. ", accumulation: 4"
  std::string name;
};

class PetraTrajectory : public ::testing::TestWithParam<TrajectoryCase> {};

TEST_P(PetraTrajectory, EqualsTheSingleProcessSimulationOfAlgorithm1) {
  const TrajectoryCase& c = GetParam();
  const std::string yaml =
      JobYaml("{count: 3, partition: even}", absl::StrCat("{name: petra", c.options, "}"), 12);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const PetraOptions options = std::get<PetraOptions>(spec->algorithm.options);
  const int64_t k = options.accumulation;
  auto want = Simulate(*spec, options);
  Outcome got = RunJob(yaml, 3);
  ExpectClose(got.tensors, want);
  // The oracle can tell: a different k gives a different trajectory, and so
  // does the plain rule's where a correction is on.
  PetraOptions other = options;
  other.accumulation = k == 1 ? 2 : 1;
  EXPECT_GT(MaxDifference(want, Simulate(*spec, other)), 1e-4);
  const bool corrected = options.predict_weights || options.lr_by_delay != DelayLr::kConstant ||
                         options.momentum_by_delay != DelayMomentum::kConstant;
  if (corrected) {
    PetraOptions plain = options;
    plain.predict_weights = false;
    plain.lr_by_delay = DelayLr::kConstant;
    plain.momentum_by_delay = DelayMomentum::kConstant;
    EXPECT_GT(MaxDifference(want, Simulate(*spec, plain)), 1e-4);
  }
  // Staleness in optimizer steps: 2(J-1-j) backward passes, over k.
  EXPECT_EQ(got.status.summary().at("stage0.staleness_steps"), (4 + k - 1) / k);
  // PETRA stashes no parameter versions; the look-ahead keeps one copy of
  // the parameters, w_prev, on the stages with a delay (not the last).
  const auto& summary = got.status.summary();
  for (int j = 0; j < 3; ++j) {
    const std::string stage = absl::StrCat("stage", j, ".");
    EXPECT_EQ(summary.at(stage + "peak_stashed_parameter_bytes"), 0) << stage;
    if (options.predict_weights && j < 2) {
      ASSERT_TRUE(summary.count(stage + "previous_parameter_bytes")) << stage;
      EXPECT_GT(summary.at(stage + "previous_parameter_bytes"), 0) << stage;
    } else {
      EXPECT_FALSE(summary.count(stage + "previous_parameter_bytes")) << stage;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Options, PetraTrajectory,
    ::testing::Values(TrajectoryCase{"", "plain"},
                      TrajectoryCase{", accumulation: 4", "accumulated"},
                      // the staleness corrections, alone and together
                      TrajectoryCase{", predict_weights: true", "predicted"},
                      TrajectoryCase{", lr_by_delay: inverse_sqrt", "lr_inverse_sqrt"},
                      TrajectoryCase{", momentum_by_delay: compensate", "compensated"},
                      TrajectoryCase{", accumulation: 2, predict_weights: true, lr_by_delay: "
                                     "inverse, momentum_by_delay: compensate",
                                     "accumulated_all_corrections"}),
    [](const ::testing::TestParamInfo<TrajectoryCase>& info) { return info.param.name; });

// The Reformer's two-function couplings rebuilt and differentiated in one go
// (ReversibleTransformerBlock::RebuildBackward) against the simulation's
// inverse + autograd, on sequences whose length changes every mini-batch;
// the evaluation reads the whole validation split, whose last window is
// shorter than the others.
TEST(PetraReformer, EqualsTheSingleProcessSimulationOnVaryingLengths) {
  const std::string yaml =
      JobYaml("{count: 3, partition: even}", "{name: petra, verify_rebuild: true}", 10, 0.05, 1e-4,
              kReformer, /*eval=*/true);
  auto spec = ParseJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto want = Simulate(*spec, PetraOptions{});
  Outcome got = RunJob(yaml, 3);
  ExpectClose(got.tensors, want);
  // An evaluation ran over the validation split, the shorter last window
  // included, and scored below the 8 bits per byte of a uniform guess.
  EXPECT_GT(got.status.eval_loss(), 0.0);
  EXPECT_LT(got.status.eval_loss() / std::log(2.0), 8.0);
  // verify_rebuild (which changes nothing above) on a model whose first input
  // is token ids: the embedding's input comes back from the buffer, equal;
  // a reversible block's rebuilt input differs from what the forward saw (the
  // weights moved in between; at this learning rate by more than its norm).
  const auto& summary = got.status.summary();
  ASSERT_TRUE(summary.count("stage0.rebuild_error.block0"));
  EXPECT_EQ(summary.at("stage0.rebuild_error.block0"), 0.0);
  ASSERT_TRUE(summary.count("stage1.rebuild_error.block2"));
  EXPECT_GT(summary.at("stage1.rebuild_error.block2"), 0.0);
  EXPECT_TRUE(std::isfinite(summary.at("stage1.rebuild_error.block2")));
}

// Stage 1 holds blocks 1-2, both reversible. PETRA keeps nothing for it
// between forward and backward; delayed keeps 2(J-1-j)+1 = 3 inputs there
// and 5 at stage 0.
TEST(PetraMemory, FullyReversibleStageHoldsNoActivationsWhereDelayedHoldsInputs) {
  const std::string stages = "{partition: [[0, 1], [1, 3], [3, 8]]}";
  Outcome petra = RunJob(JobYaml(stages, "{name: petra}", 10), 3);
  Outcome delayed = RunJob(JobYaml(stages, "{name: delayed, weights: stash}", 10), 3);
  const auto& p = petra.status.summary();
  const auto& d = delayed.status.summary();
  ASSERT_TRUE(p.count("stage1.peak_input_bytes"));
  EXPECT_EQ(p.at("stage1.reversible_blocks"), 2);
  EXPECT_EQ(p.at("stage1.peak_input_bytes"), 0);
  EXPECT_EQ(p.at("stage1.peak_inputs"), 0);
  EXPECT_EQ(p.at("stage1.peak_stashed_parameter_bytes"), 0);
  EXPECT_EQ(p.at("stage1.staleness_steps"), 2);
  // The stem is not invertible: stage 0 buffers its inputs, 2(J-1)+1 of them.
  EXPECT_EQ(p.at("stage0.peak_inputs"), 5);
  EXPECT_GT(p.at("stage0.peak_input_bytes"), 0);

  EXPECT_EQ(d.at("stage0.peak_inputs"), 5);
  EXPECT_EQ(d.at("stage1.peak_inputs"), 3);
  EXPECT_GT(d.at("stage1.peak_input_bytes"), 0);
  EXPECT_GT(d.at("stage1.peak_stashed_parameter_bytes"), 0);

  // Backward messages carry the rebuilt activation and the gradient: twice
  // the forward volume of the same boundary (plus the labels there).
  for (int j = 1; j < 3; ++j) {
    const double back = p.at(absl::StrCat("stage", j, ".backward_message_bytes"));
    const double fwd = p.at(absl::StrCat("stage", j - 1, ".forward_message_bytes"));
    const double delayed_back = d.at(absl::StrCat("stage", j, ".backward_message_bytes"));
    EXPECT_GT(back / fwd, 1.8) << j;
    EXPECT_LT(back / fwd, 2.1) << j;
    EXPECT_GT(back / delayed_back, 1.9) << j;
  }
}

}  // namespace
}  // namespace stagewise::testing
