#include "services/spec/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace stagewise {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A minimal valid spec as top-level key -> YAML value, so each case below
// changes one thing and everything else stays valid.
using Overrides = std::map<std::string, std::string>;

std::string SpecYaml(const Overrides& overrides = {}) {
  Overrides keys = {
      {"name", "t"}, {"model", "{name: mlp}"}, {"data", "{dataset: synthetic}"}, {"epochs", "1"}};
  for (const auto& [key, value] : overrides) {
    if (value.empty()) {
      keys.erase(key);  // "" removes the key
    } else {
      keys[key] = value;
    }
  }
  std::string text;
  for (const auto& [key, value] : keys) absl::StrAppend(&text, key, ": ", value, "\n");
  return text;
}

JobSpec ParseOk(const std::string& text) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status() << "\n--- spec:\n" << text;
  return spec.ok() ? *spec : JobSpec{};
}

// Removes a test's file or directory when it goes out of scope.
struct RemoveAtExit {
  std::string path;
  ~RemoveAtExit() {
    std::error_code error;
    std::filesystem::remove_all(path, error);
  }
};

std::string WriteTempFile(const std::string& name, const std::string& text) {
  const std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(JobSpecTest, ParsesFullSpec) {
  const JobSpec spec = ParseOk(R"(
name: full-run_1.a
seed: 7
device: cuda:1
model: {name: revnet, depth: 34, width: 32, small_input: false, style: imagenet,
        blocks: [2, 2, 3, 2], hidden: [512, 128]}
data:
  dataset: synthetic
  path: /data/x
  augment: true
  crop_padding: 2
  horizontal_flip: false
  normalize: false
  train_size: 100
  test_size: 50
  shape: [1, 8, 9]
  classes: 5
  limit_train: 64
  limit_test: 32
algorithm: {name: petra, accumulation: 4}
stages: {count: 3, partition: auto}
optimizer: {name: adam, lr: 0.002, momentum: 0.5, nesterov: true, weight_decay: 5e-4,
            exclude_bn_and_bias: false, beta1: 0.8, beta2: 0.99, eps: 1e-7,
            scale_lr_by_batch: true}
schedule: {name: multistep, warmup_epochs: 0.5, milestones: [30, 60.5], gamma: 0.2,
           min_lr: 0.001}
batch_size: 64
eval_batch_size: 256
steps: 500
eval: {every_epochs: 2, every_steps: 100, at_end: false}
checkpoint: {dir: /tmp/ckpt, every_epochs: 1, every_steps: 50, keep: 5}
)");
  EXPECT_EQ(spec.name, "full-run_1.a");
  EXPECT_EQ(spec.seed, 7);
  EXPECT_EQ(spec.device, "cuda:1");

  EXPECT_EQ(spec.model.name, ModelKind::kRevNet);
  EXPECT_EQ(spec.model.depth, 34);
  EXPECT_EQ(spec.model.width, 32);
  EXPECT_FALSE(spec.model.small_input);
  EXPECT_EQ(spec.model.style, ResNetStyle::kImageNet);
  EXPECT_THAT(spec.model.blocks, ElementsAre(2, 2, 3, 2));
  EXPECT_THAT(spec.model.hidden, ElementsAre(512, 128));
  EXPECT_THAT(spec.model.input_shape, ElementsAre(1, 8, 9));
  EXPECT_EQ(spec.model.num_classes, 5);

  EXPECT_EQ(spec.data.dataset, DatasetKind::kSynthetic);
  EXPECT_EQ(spec.data.path, "/data/x");
  EXPECT_TRUE(spec.data.augment);
  EXPECT_EQ(spec.data.crop_padding, 2);
  EXPECT_FALSE(spec.data.horizontal_flip);
  EXPECT_FALSE(spec.data.normalize);
  EXPECT_EQ(spec.data.train_size, 100);
  EXPECT_EQ(spec.data.test_size, 50);
  EXPECT_THAT(spec.data.shape, ElementsAre(1, 8, 9));
  EXPECT_EQ(spec.data.classes, 5);
  EXPECT_EQ(spec.data.limit_train, 64);
  EXPECT_EQ(spec.data.limit_test, 32);

  EXPECT_EQ(spec.algorithm.name(), "petra");
  EXPECT_EQ(std::get<PetraOptions>(spec.algorithm.options).accumulation, 4);

  EXPECT_EQ(spec.stages.count, 3);
  EXPECT_EQ(spec.stages.partition, Partition::kAuto);
  EXPECT_TRUE(spec.stages.ranges.empty());

  EXPECT_EQ(spec.optimizer.name, OptimizerKind::kAdam);
  EXPECT_DOUBLE_EQ(spec.optimizer.lr, 0.002);
  EXPECT_DOUBLE_EQ(spec.optimizer.momentum, 0.5);
  EXPECT_TRUE(spec.optimizer.nesterov);
  EXPECT_DOUBLE_EQ(spec.optimizer.weight_decay, 5e-4);
  EXPECT_FALSE(spec.optimizer.exclude_bn_and_bias);
  EXPECT_DOUBLE_EQ(spec.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(spec.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(spec.optimizer.eps, 1e-7);
  EXPECT_TRUE(spec.optimizer.scale_lr_by_batch);

  EXPECT_EQ(spec.schedule.name, LrScheduleKind::kMultistep);
  EXPECT_DOUBLE_EQ(spec.schedule.warmup_epochs, 0.5);
  EXPECT_THAT(spec.schedule.milestones, ElementsAre(30.0, 60.5));
  EXPECT_DOUBLE_EQ(spec.schedule.gamma, 0.2);
  EXPECT_DOUBLE_EQ(spec.schedule.min_lr, 0.001);

  EXPECT_EQ(spec.batch_size, 64);
  EXPECT_EQ(spec.eval_batch_size, 256);
  EXPECT_EQ(spec.epochs, 0);
  EXPECT_EQ(spec.steps, 500);
  EXPECT_EQ(spec.eval.every_epochs, 2);
  EXPECT_EQ(spec.eval.every_steps, 100);
  EXPECT_FALSE(spec.eval.at_end);
  EXPECT_EQ(spec.checkpoint.dir, "/tmp/ckpt");
  EXPECT_EQ(spec.checkpoint.every_epochs, 1);
  EXPECT_EQ(spec.checkpoint.every_steps, 50);
  EXPECT_EQ(spec.checkpoint.keep, 5);
}

TEST(JobSpecTest, MinimalSpecGetsStructDefaults) {
  const JobSpec spec =
      ParseOk("name: q\nmodel: {name: mlp}\ndata: {dataset: fashion_mnist}\nepochs: 2.5\n");
  const JobSpec defaults;
  EXPECT_EQ(spec.name, "q");
  EXPECT_EQ(spec.seed, defaults.seed);
  EXPECT_EQ(spec.device, "cpu");
  EXPECT_EQ(spec.model.depth, defaults.model.depth);
  EXPECT_EQ(spec.model.style, ResNetStyle::kCifar);
  EXPECT_TRUE(spec.model.small_input);
  EXPECT_EQ(spec.model.width, 0);
  EXPECT_TRUE(spec.model.blocks.empty());
  EXPECT_THAT(spec.model.hidden, ElementsAre(256));
  EXPECT_EQ(spec.data.path, "");
  EXPECT_FALSE(spec.data.augment);
  EXPECT_EQ(spec.data.crop_padding, 4);
  EXPECT_TRUE(spec.data.horizontal_flip);
  EXPECT_TRUE(spec.data.normalize);
  EXPECT_EQ(spec.data.limit_train, 0);
  EXPECT_EQ(spec.algorithm.kind(), AlgorithmKind::kBackprop);
  EXPECT_EQ(AlgorithmParams(spec.algorithm).size(), 4u);
  EXPECT_EQ(spec.stages.count, 1);
  EXPECT_EQ(spec.stages.partition, Partition::kBalanced);
  EXPECT_EQ(spec.optimizer.name, OptimizerKind::kSgd);
  EXPECT_DOUBLE_EQ(spec.optimizer.lr, 0.1);
  EXPECT_DOUBLE_EQ(spec.optimizer.momentum, 0.9);
  EXPECT_FALSE(spec.optimizer.nesterov);
  EXPECT_DOUBLE_EQ(spec.optimizer.weight_decay, 0.0);
  EXPECT_TRUE(spec.optimizer.exclude_bn_and_bias);
  EXPECT_FALSE(spec.optimizer.scale_lr_by_batch);
  EXPECT_EQ(spec.schedule.name, LrScheduleKind::kConstant);
  EXPECT_DOUBLE_EQ(spec.schedule.gamma, 0.1);
  EXPECT_TRUE(spec.schedule.milestones.empty());
  EXPECT_EQ(spec.batch_size, 128);
  EXPECT_EQ(spec.eval_batch_size, 0);
  EXPECT_DOUBLE_EQ(spec.epochs, 2.5);
  EXPECT_EQ(spec.steps, 0);
  EXPECT_EQ(spec.eval.every_epochs, 1);
  EXPECT_TRUE(spec.eval.at_end);
  EXPECT_EQ(spec.checkpoint.dir, "");
  EXPECT_EQ(spec.checkpoint.keep, 3);
  // Filled from the dataset.
  EXPECT_THAT(spec.model.input_shape, ElementsAre(1, 28, 28));
  EXPECT_EQ(spec.model.num_classes, 10);
}

TEST(JobSpecTest, EmptySectionsMeanDefaults) {
  const JobSpec spec = ParseOk(SpecYaml({{"optimizer", "{}"}, {"eval", "~"}}));
  EXPECT_EQ(spec.optimizer.name, OptimizerKind::kSgd);
  EXPECT_EQ(spec.eval.every_epochs, 1);
}

TEST(JobSpecTest, AlgorithmAsBareNameOrMap) {
  const JobSpec bare = ParseOk(SpecYaml({{"algorithm", "petra"}}));
  EXPECT_EQ(bare.algorithm.name(), "petra");
  EXPECT_EQ(std::get<PetraOptions>(bare.algorithm.options).accumulation, 1);

  const JobSpec map = ParseOk(SpecYaml({{"algorithm", "{name: petra, accumulation: 8}"}}));
  EXPECT_EQ(map.algorithm.name(), "petra");
  EXPECT_EQ(std::get<PetraOptions>(map.algorithm.options).accumulation, 8);

  // A map without a name keeps the default algorithm.
  const JobSpec unnamed = ParseOk(SpecYaml({{"algorithm", "{micro_batches: 4}"}}));
  EXPECT_EQ(unnamed.algorithm.name(), "backprop");
  EXPECT_EQ(std::get<BackpropOptions>(unnamed.algorithm.options).micro_batches, 4);
}

TEST(JobSpecTest, EveryAlgorithmGetsItsDefaults) {
  const std::map<std::string, std::map<std::string, std::string>> expected = {
      {"backprop",
       {{"micro_batches", "1"}, {"schedule", "gpipe"}, {"recompute", "false"}, {"lookahead", "0"}}},
      {"delayed",
       {{"weights", "stash"},
        {"forward", "auto"},
        {"predict_weights", "false"},
        {"lr_by_delay", "constant"},
        {"momentum_by_delay", "constant"},
        {"max_in_flight", "0"},
        {"accumulation", "1"}}},
      {"features_replay", {}},
      {"petra",
       {{"accumulation", "1"},
        {"verify_rebuild", "false"},
        {"predict_weights", "false"},
        {"lr_by_delay", "constant"},
        {"momentum_by_delay", "constant"}}},
      {"nwise", {{"n", "2"}, {"mix_local", "false"}, {"micro_batches", "1"}, {"aux_head", "conv"}}},
      {"auxnet",
       {{"beta", "1e+05"},
        {"beta_factor", "1"},
        {"beta_every_epochs", "0"},
        {"aux_lr", "0.1"},
        {"auxnet", "resnet"},
        {"auxnet_blocks", "1"},
        {"noise_std", "0"},
        {"serial_loss_every", "10"},
        {"bn_statistics", "local"},
        {"aux_update", "distill"},
        {"penalty", "mse"}}},
  };
  for (const auto& [name, params] : expected) {
    SCOPED_TRACE(name);
    // nwise's default n = 2 needs two stages.
    const JobSpec spec = ParseOk(SpecYaml({{"algorithm", name}, {"stages", "2"}}));
    EXPECT_EQ(spec.algorithm.name(), name);
    EXPECT_EQ(AlgorithmParams(spec.algorithm), params);
  }
}

TEST(JobSpecTest, AlgorithmParamsAreCanonical) {
  JobSpec spec = ParseOk(SpecYaml(
      {{"algorithm", "{name: auxnet, beta: 2.50, beta_every_epochs: +03, aux_lr: 1e-2}"}}));
  EXPECT_EQ(AlgorithmParams(spec.algorithm).at("beta"), "2.5");
  EXPECT_EQ(AlgorithmParams(spec.algorithm).at("beta_every_epochs"), "3");
  EXPECT_EQ(AlgorithmParams(spec.algorithm).at("aux_lr"), "0.01");
  EXPECT_DOUBLE_EQ(std::get<AuxNetOptions>(spec.algorithm.options).aux_lr, 0.01);

  spec = ParseOk(SpecYaml({{"algorithm", "{name: backprop, recompute: yes, schedule: 1f1b}"}}));
  EXPECT_EQ(AlgorithmParams(spec.algorithm).at("recompute"), "true");
  EXPECT_TRUE(std::get<BackpropOptions>(spec.algorithm.options).recompute);
  EXPECT_EQ(std::get<BackpropOptions>(spec.algorithm.options).schedule,
            PipelineSchedule::kOneFOneB);
}

TEST(JobSpecTest, TypedOptions) {
  const JobSpec spec = ParseOk(
      SpecYaml({{"algorithm",
                 "{name: nwise, n: 3, mix_local: true, micro_batches: 2, aux_head: 'conv:32,16'}"},
                {"stages", "4"}}));
  const AlgorithmSpec& a = spec.algorithm;
  EXPECT_EQ(a.kind(), AlgorithmKind::kNwise);
  const NwiseOptions* nwise = a.get_if<NwiseOptions>();
  ASSERT_NE(nwise, nullptr);
  EXPECT_EQ(nwise->n, 3);
  EXPECT_TRUE(nwise->mix_local);
  EXPECT_EQ(nwise->micro_batches, 2);
  EXPECT_EQ(nwise->aux_head, "conv:32,16");
  // Another algorithm's options are not there.
  EXPECT_EQ(a.get_if<PetraOptions>(), nullptr);
  EXPECT_EQ(a.get_if<BackpropOptions>(), nullptr);
}

TEST(JobSpecTest, MakeAlgorithmSpecForHandBuiltSpecs) {
  absl::StatusOr<AlgorithmSpec> spec = MakeAlgorithmSpec("delayed", {{"weights", "current"}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->get_if<DelayedOptions>()->weights, DelayedWeights::kCurrent);
  EXPECT_EQ(spec->get_if<DelayedOptions>()->max_in_flight, 0);
  // What AlgorithmParams writes reads back to the same spec.
  absl::StatusOr<AlgorithmSpec> again = MakeAlgorithmSpec(spec->name(), AlgorithmParams(*spec));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(AlgorithmParams(*again), AlgorithmParams(*spec));

  // max_in_flight takes a number or auto, and writes back what it read.
  absl::StatusOr<AlgorithmSpec> deep = MakeAlgorithmSpec("delayed", {{"max_in_flight", "auto"}});
  ASSERT_TRUE(deep.ok()) << deep.status();
  EXPECT_EQ(deep->get_if<DelayedOptions>()->max_in_flight, kAutoInFlight);
  EXPECT_EQ(AlgorithmParams(*deep).at("max_in_flight"), "auto");
  absl::Status word = MakeAlgorithmSpec("delayed", {{"max_in_flight", "deep"}}).status();
  EXPECT_THAT(std::string(word.message()),
              HasSubstr("algorithm.max_in_flight: expected an integer or auto, got 'deep'"));

  absl::Status status = MakeAlgorithmSpec("petra", {{"accumulation", "0"}}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("algorithm.accumulation: must be >= 1"));

  status = MakeAlgorithmSpec("petra", {{"n", "2"}}).status();
  EXPECT_THAT(
      std::string(status.message()),
      StartsWith(
          "algorithm.n: unknown key for algorithm petra (known: accumulation, verify_rebuild, "
          "predict_weights, lr_by_delay, momentum_by_delay)"));

  status = MakeAlgorithmSpec("petro").status();
  EXPECT_THAT(std::string(status.message()), StartsWith("algorithm.name:"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("did you mean petra?"));
}

TEST(JobSpecTest, StagesAsCount) {
  const JobSpec spec = ParseOk(SpecYaml({{"stages", "4"}}));
  EXPECT_EQ(spec.stages.count, 4);
  EXPECT_EQ(spec.stages.partition, Partition::kBalanced);
  EXPECT_TRUE(spec.stages.ranges.empty());
}

TEST(JobSpecTest, StagesAsMap) {
  JobSpec spec = ParseOk(SpecYaml({{"stages", "{count: 3, partition: auto}"}}));
  EXPECT_EQ(spec.stages.count, 3);
  EXPECT_EQ(spec.stages.partition, Partition::kAuto);
  spec = ParseOk(SpecYaml({{"stages", "{count: 2}"}}));
  EXPECT_EQ(spec.stages.count, 2);
  EXPECT_EQ(spec.stages.partition, Partition::kBalanced);
  for (Partition mode : {Partition::kBalanced, Partition::kEven}) {
    spec =
        ParseOk(SpecYaml({{"stages", absl::StrCat("{count: 2, partition: ", NameOf(mode), "}")}}));
    EXPECT_EQ(spec.stages.partition, mode);
  }
  // "explicit" is what a list of ranges means, not a word to write.
  EXPECT_THAT(std::string(ParseJobSpec(SpecYaml({{"stages", "{count: 2, partition: explicit}"}}))
                              .status()
                              .message()),
              StartsWith("stages.partition: must be balanced, even, auto or a list"));
}

TEST(JobSpecTest, StagesAsExplicitRanges) {
  JobSpec spec = ParseOk(SpecYaml({{"stages", "{partition: [[0, 4], [4, 9], [9, 12]]}"}}));
  EXPECT_EQ(spec.stages.count, 3);
  EXPECT_EQ(spec.stages.partition, Partition::kExplicit);
  EXPECT_THAT(spec.stages.ranges, ElementsAre(std::pair(0, 4), std::pair(4, 9), std::pair(9, 12)));
  // A matching count is allowed.
  spec = ParseOk(SpecYaml({{"stages", "{count: 2, partition: [[0, 1], [1, 2]]}"}}));
  EXPECT_EQ(spec.stages.count, 2);
}

TEST(JobSpecTest, DataShapes) {
  struct Case {
    std::string dataset;
    std::vector<int64_t> shape;
    int classes;
  };
  for (const Case& c : std::vector<Case>{{"fashion_mnist", {1, 28, 28}, 10},
                                         {"cifar10", {3, 32, 32}, 10},
                                         {"cifar100", {3, 32, 32}, 100},
                                         {"synthetic", {3, 32, 32}, 10}}) {
    SCOPED_TRACE(c.dataset);
    const JobSpec spec =
        ParseOk(SpecYaml({{"data", absl::StrCat("{dataset: ", c.dataset, ", path: /d}")}}));
    EXPECT_EQ(spec.model.input_shape, c.shape);
    EXPECT_EQ(spec.model.num_classes, c.classes);
  }
  DataSpec data;
  data.dataset = DatasetKind::kSynthetic;
  data.shape = {2, 5, 7};
  data.classes = 3;
  ModelSpec model;
  ASSERT_TRUE(FillDataShape(data, &model).ok());
  EXPECT_THAT(model.input_shape, ElementsAre(2, 5, 7));
  EXPECT_EQ(model.num_classes, 3);
  data.classes = 1;
  EXPECT_EQ(FillDataShape(data, &model).code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobSpecTest, ModelVariantsThatAreValid) {
  for (const std::string model :
       {"{name: resnet, depth: 20}", "{name: resnet, depth: 110}",
        "{name: resnet, depth: 44}",  // any 6n+2
        "{name: resnet, style: imagenet, depth: 50}", "{name: revnet, depth: 18}",
        "{name: resnet, blocks: [2, 2, 2]}", "{name: revnet, blocks: [1, 1, 1, 1]}",
        "{name: mlp, hidden: []}", "{name: emulated, depth: 4}",
        "{name: emulated, depth: 2, forward_ms: 0.5, backward_ms: 0, reversible: false}",
        "{name: emulated, depth: 2, block_forward_ms: [1, 2], block_backward_ms: [0, 4]}"}) {
    SCOPED_TRACE(model);
    ParseOk(SpecYaml({{"model", model}}));
  }
}

// Every invalid case must be INVALID_ARGUMENT with a message that starts with
// the offending key path.
struct BadCase {
  std::string what;
  Overrides overrides;
  std::string key_path;
  std::string also_contains;  // optional
};

std::vector<BadCase> BadCases() {
  return {
      {"name missing", {{"name", ""}}, "name", "required"},
      {"name charset", {{"name", "'a b'"}}, "name", "a b"},
      {"device", {{"device", "gpu"}}, "device", "cuda:N"},
      {"device index", {{"device", "cuda:x"}}, "device", ""},
      {"seed negative", {{"seed", "-1"}}, "seed", ""},
      {"model missing", {{"model", ""}}, "model.name", "required"},
      {"model name", {{"model", "{name: vgg}"}}, "model.name", "vgg"},
      {"resnet depth", {{"model", "{name: resnet, depth: 21}"}}, "model.depth", "6n+2"},
      {"resnet imagenet depth",
       {{"model", "{name: resnet, style: imagenet, depth: 20}"}},
       "model.depth",
       "18, 34 or 50"},
      {"revnet depth", {{"model", "{name: revnet, depth: 20}"}}, "model.depth", "got 20"},
      {"emulated depth", {{"model", "{name: emulated}"}}, "model.depth", ">= 1"},
      {"emulated depth cap", {{"model", "{name: emulated, depth: 5000}"}}, "model.depth", "4096"},
      {"emulated forward",
       {{"model", "{name: emulated, depth: 2, forward_ms: -1}"}},
       "model.forward_ms",
       "milliseconds"},
      {"emulated backward",
       {{"model", "{name: emulated, depth: 2, backward_ms: .nan}"}},
       "model.backward_ms",
       "a number"},
      {"emulated backward cap",
       {{"model", "{name: emulated, depth: 2, backward_ms: 1e9}"}},
       "model.backward_ms",
       "milliseconds"},
      {"emulated block times count",
       {{"model", "{name: emulated, depth: 2, block_forward_ms: [1, 2, 3]}"}},
       "model.block_forward_ms",
       "one entry per block"},
      {"emulated block time",
       {{"model", "{name: emulated, depth: 2, block_backward_ms: [1, -2]}"}},
       "model.block_backward_ms[1]",
       "milliseconds"},
      {"model style", {{"model", "{name: resnet, depth: 20, style: tiny}"}}, "model.style", ""},
      {"blocks count",
       {{"model", "{name: resnet, blocks: [1, 1, 1, 1]}"}},
       "model.blocks",
       "3 entries"},
      {"revnet blocks count",
       {{"model", "{name: revnet, blocks: [1, 1, 1]}"}},
       "model.blocks",
       "4 entries"},
      {"blocks entry", {{"model", "{name: resnet, blocks: [1, 0, 1]}"}}, "model.blocks[1]", ">= 1"},
      {"width", {{"model", "{name: mlp, width: -1}"}}, "model.width", ""},
      {"hidden entry", {{"model", "{name: mlp, hidden: [16, 0]}"}}, "model.hidden[1]", ""},
      {"dataset", {{"data", "{dataset: imagenet}"}}, "data.dataset", "imagenet"},
      {"dataset missing", {{"data", ""}}, "data.dataset", "required"},
      {"cifar path", {{"data", "{dataset: cifar10}"}}, "data.path", "cifar10"},
      {"synthetic shape", {{"data", "{dataset: synthetic, shape: [3, 32]}"}}, "data.shape", ""},
      {"synthetic classes", {{"data", "{dataset: synthetic, classes: 1}"}}, "data.classes", ""},
      {"synthetic samples",
       {{"data", "{dataset: synthetic, train_size: 50000000}"}},
       "data.train_size",
       "must be <= 10000000, got 50000000"},
      {"synthetic bytes",
       {{"data", "{dataset: synthetic, train_size: 1000000, shape: [3, 64, 64]}"}},
       "data.train_size",
       "limited to 1024 MiB per split"},
      {"synthetic test bytes",
       {{"data", "{dataset: synthetic, test_size: 2000000, shape: [3, 32, 32]}"}},
       "data.test_size",
       "MiB"},
      {"synthetic dimension",
       {{"data", "{dataset: synthetic, shape: [1, 5000, 2]}"}},
       "data.shape[1]",
       "<= 4096"},
      {"synthetic class count",
       {{"data", "{dataset: synthetic, classes: 2000000}"}},
       "data.classes",
       "<= 1000000"},
      {"crop padding",
       {{"data", "{dataset: synthetic, crop_padding: -1}"}},
       "data.crop_padding",
       ""},
      {"limit", {{"data", "{dataset: synthetic, limit_train: -5}"}}, "data.limit_train", ""},
      {"algorithm name", {{"algorithm", "petro"}}, "algorithm", "did you mean petra?"},
      {"algorithm map name", {{"algorithm", "{name: sgd}"}}, "algorithm.name", ""},
      {"petra accumulation",
       {{"algorithm", "{name: petra, accumulation: 0}"}},
       "algorithm.accumulation",
       "must be >= 1, got 0"},
      {"backprop schedule",
       {{"algorithm", "{name: backprop, schedule: zigzag}"}},
       "algorithm.schedule",
       "gpipe, 1f1b"},
      {"delayed one forward without a stash",
       {{"algorithm", "{name: delayed, weights: current, forward: once}"}},
       "algorithm.forward",
       "once needs algorithm.weights: stash"},
      {"delayed forward spelt wrong",
       {{"algorithm", "{name: delayed, forward: twice}"}},
       "algorithm.forward",
       "auto, once, recompute"},
      {"delayed predicted weights without a stash",
       {{"algorithm", "{name: delayed, weights: current, predict_weights: true}"}},
       "algorithm.predict_weights",
       "needs algorithm.weights: stash"},
      {"delayed momentum rule with muon",
       {{"algorithm", "{name: delayed, momentum_by_delay: compensate}"},
        {"optimizer", "{name: muon}"}},
       "algorithm.momentum_by_delay",
       "compensate applies to optimizer.name sgd or adam, not muon"},
      {"petra momentum rule with muon",
       {{"algorithm", "{name: petra, momentum_by_delay: compensate}"},
        {"optimizer", "{name: muon}"}},
       "algorithm.momentum_by_delay",
       "compensate applies to optimizer.name sgd or adam, not muon"},
      {"petra lr rule",
       {{"algorithm", "{name: petra, lr_by_delay: 2}"}},
       "algorithm.lr_by_delay",
       "constant, inverse, inverse_sqrt"},
      {"delayed lr rule",
       {{"algorithm", "{name: delayed, lr_by_delay: linear}"}},
       "algorithm.lr_by_delay",
       "constant, inverse, inverse_sqrt"},
      {"backprop micro_batches",
       {{"algorithm", "{name: backprop, micro_batches: 0}"}},
       "algorithm.micro_batches",
       ""},
      {"micro_batches over batch",
       {{"algorithm", "{micro_batches: 64}"}, {"batch_size", "32"}},
       "algorithm.micro_batches",
       "batch_size"},
      {"delayed weights",
       {{"algorithm", "{name: delayed, weights: old}"}},
       "algorithm.weights",
       ""},
      {"delayed in flight",
       {{"algorithm", "{name: delayed, max_in_flight: -1}"}},
       "algorithm.max_in_flight",
       ""},
      {"delayed accumulation",
       {{"algorithm", "{name: delayed, weights: current, accumulation: 0}"}},
       "algorithm.accumulation",
       ">= 1"},
      {"nwise n > stages",
       {{"algorithm", "{name: nwise, n: 3}"}, {"stages", "2"}},
       "algorithm.n",
       "stages.count"},
      {"nwise n zero", {{"algorithm", "{name: nwise, n: 0}"}, {"stages", "2"}}, "algorithm.n", ""},
      {"nwise aux_head",
       {{"algorithm", "{name: nwise, aux_head: ''}"}, {"stages", "2"}},
       "algorithm.aux_head",
       "empty"},
      {"auxnet beta", {{"algorithm", "{name: auxnet, beta: 0}"}}, "algorithm.beta", "> 0"},
      {"auxnet beta_factor",
       {{"algorithm", "{name: auxnet, beta_factor: 0.5}"}},
       "algorithm.beta_factor",
       ">= 1"},
      {"auxnet aux_lr", {{"algorithm", "{name: auxnet, aux_lr: -0.1}"}}, "algorithm.aux_lr", ""},
      {"auxnet noise", {{"algorithm", "{name: auxnet, noise_std: -1}"}}, "algorithm.noise_std", ""},
      {"auxnet beta_every",
       {{"algorithm", "{name: auxnet, beta_every_epochs: -1}"}},
       "algorithm.beta_every_epochs",
       ""},
      {"petra unknown param",
       {{"algorithm", "{name: petra, accumulaton: 2}"}},
       "algorithm.accumulaton",
       "unknown key for algorithm petra"},
      {"features_replay takes none",
       {{"algorithm", "{name: features_replay, n: 2}"}},
       "algorithm.n",
       "no parameters"},
      {"stages zero", {{"stages", "0"}}, "stages.count", ""},
      {"stages map zero", {{"stages", "{count: -1}"}}, "stages.count", ""},
      {"partition word", {{"stages", "{partition: lopsided}"}}, "stages.partition", ""},
      {"partition start",
       {{"stages", "{partition: [[1, 4], [4, 9]]}"}},
       "stages.partition[0]",
       "start at block 0"},
      {"partition gap",
       {{"stages", "{partition: [[0, 4], [5, 9]]}"}},
       "stages.partition[1]",
       "previous range"},
      {"partition overlap",
       {{"stages", "{partition: [[0, 4], [3, 9]]}"}},
       "stages.partition[1]",
       ""},
      {"partition empty range",
       {{"stages", "{partition: [[0, 4], [4, 4]]}"}},
       "stages.partition[1]",
       "non-empty"},
      {"partition empty list", {{"stages", "{partition: []}"}}, "stages.partition", ""},
      {"partition pair", {{"stages", "{partition: [[0, 4, 5]]}"}}, "stages.partition[0]", ""},
      {"partition count",
       {{"stages", "{count: 2, partition: [[0, 4], [4, 9], [9, 12]]}"}},
       "stages.count",
       "does not match"},
      {"lr", {{"optimizer", "{lr: -0.1}"}}, "optimizer.lr", ">= 0"},
      {"momentum",
       {{"optimizer", "{momentum: 1.5}"}},
       "optimizer.momentum",
       "must be in [0, 1), got 1.5"},
      {"momentum negative", {{"optimizer", "{momentum: -0.1}"}}, "optimizer.momentum", ""},
      {"weight decay", {{"optimizer", "{weight_decay: -1e-4}"}}, "optimizer.weight_decay", ""},
      {"nesterov",
       {{"optimizer", "{momentum: 0, nesterov: true}"}},
       "optimizer.nesterov",
       "momentum"},
      {"optimizer name", {{"optimizer", "{name: adamw}"}}, "optimizer.name", "did you mean"},
      {"adam beta2", {{"optimizer", "{name: adam, beta2: 1}"}}, "optimizer.beta2", ""},
      {"adam eps", {{"optimizer", "{name: adam, eps: 0}"}}, "optimizer.eps", ""},
      {"schedule name", {{"schedule", "{name: linear}"}}, "schedule.name", ""},
      {"milestones order",
       {{"schedule", "{name: multistep, milestones: [60, 30]}"}},
       "schedule.milestones[1]",
       "increasing"},
      {"milestones positive",
       {{"schedule", "{name: multistep, milestones: [0, 30]}"}},
       "schedule.milestones[0]",
       ""},
      {"multistep without milestones",
       {{"schedule", "{name: multistep}"}},
       "schedule.milestones",
       ""},
      {"gamma zero", {{"schedule", "{gamma: 0}"}}, "schedule.gamma", "(0, 1]"},
      {"gamma above one", {{"schedule", "{gamma: 1.5}"}}, "schedule.gamma", ""},
      {"warmup", {{"schedule", "{warmup_epochs: -1}"}}, "schedule.warmup_epochs", ""},
      {"min_lr", {{"schedule", "{name: cosine, min_lr: -1}"}}, "schedule.min_lr", ""},
      {"batch size", {{"batch_size", "0"}}, "batch_size", ">= 1"},
      {"eval batch size", {{"eval_batch_size", "-1"}}, "eval_batch_size", ""},
      {"epochs and steps", {{"steps", "500"}}, "epochs", "exactly one"},
      {"neither epochs nor steps", {{"epochs", ""}}, "epochs", "steps"},
      {"epochs negative", {{"epochs", "-1"}, {"steps", "10"}}, "epochs", ""},
      {"eval every_epochs", {{"eval", "{every_epochs: -1}"}}, "eval.every_epochs", ""},
      {"keep", {{"checkpoint", "{keep: 0}"}}, "checkpoint.keep", ""},
      {"checkpoint epochs without dir",
       {{"checkpoint", "{every_epochs: 1}"}},
       "checkpoint.every_epochs",
       "checkpoint.dir"},
      {"checkpoint steps without dir",
       {{"checkpoint", "{every_steps: 100}"}},
       "checkpoint.every_steps",
       "checkpoint.dir"},
      // Unknown keys, at every level.
      {"unknown top-level key", {{"batchsize", "32"}}, "batchsize", "did you mean batch_size?"},
      {"unknown top-level key, no suggestion", {{"zzz", "1"}}, "zzz", "known: name"},
      {"unknown nested key",
       {{"data", "{datset: synthetic}"}},
       "data.datset",
       "unknown key (did you mean data.dataset?)"},
      {"unknown model key", {{"model", "{name: mlp, layers: 3}"}}, "model.layers", "unknown key"},
      {"unknown stages key", {{"stages", "{cnt: 2}"}}, "stages.cnt", "unknown key"},
      {"unknown optimizer key",
       {{"optimizer", "{learning_rate: 0.1}"}},
       "optimizer.learning_rate",
       "unknown key"},
      {"unknown eval key", {{"eval", "{every: 1}"}}, "eval.every", "unknown key"},
      {"unknown checkpoint key", {{"checkpoint", "{path: /x}"}}, "checkpoint.path", "unknown key"},
      {"unknown schedule key",
       {{"schedule", "{milestone: [1]}"}},
       "schedule.milestone",
       "did you mean schedule.milestones?"},
      // Wrong YAML types.
      {"int type", {{"batch_size", "abc"}}, "batch_size", "expected an integer, got 'abc'"},
      {"int given a float", {{"batch_size", "1.5"}}, "batch_size", "expected an integer"},
      {"int overflow", {{"stages", "4294967297"}}, "stages", "32 bits"},
      {"double type",
       {{"optimizer", "{lr: fast}"}},
       "optimizer.lr",
       "expected a number, got 'fast'"},
      {"non-finite double", {{"optimizer", "{lr: inf}"}}, "optimizer.lr", "expected a number"},
      {"bool type",
       {{"optimizer", "{nesterov: maybe}"}},
       "optimizer.nesterov",
       "expected a boolean"},
      {"list expected",
       {{"model", "{name: resnet, blocks: 3}"}},
       "model.blocks",
       "expected a list"},
      {"list element",
       {{"model", "{name: mlp, hidden: [8, x]}"}},
       "model.hidden[1]",
       "expected an integer"},
      {"map expected", {{"optimizer", "sgd"}}, "optimizer", "expected a map, got 'sgd'"},
      {"string expected", {{"device", "[cpu]"}}, "device", "expected a string, got a list"},
      {"null value", {{"batch_size", "~"}}, "batch_size", "null"},
      {"algorithm list", {{"algorithm", "[petra]"}}, "algorithm", "expected"},
      {"algorithm param type",
       {{"algorithm", "{name: petra, accumulation: [4]}"}},
       "algorithm.accumulation",
       "expected an integer, got a list"},
      {"algorithm param text",
       {{"algorithm", "{name: petra, accumulation: four}"}},
       "algorithm.accumulation",
       "expected an integer, got 'four'"},
      {"stages type", {{"stages", "two"}}, "stages", "expected an integer"},
      {"stages range type",
       {{"stages", "{partition: [[0, a]]}"}},
       "stages.partition[0]",
       "expected an integer"},
  };
}

// Keeps gtest from dumping the struct's bytes when a case fails.
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.what; }

class BadSpecTest : public testing::TestWithParam<BadCase> {};

TEST_P(BadSpecTest, IsInvalidArgumentNamingTheKey) {
  const BadCase& c = GetParam();
  const std::string text = SpecYaml(c.overrides);
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
  ASSERT_FALSE(spec.ok()) << "accepted:\n" << text;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  const std::string message(spec.status().message());
  EXPECT_THAT(message, StartsWith(c.key_path + ": ")) << text;
  EXPECT_THAT(message, HasSubstr(c.also_contains)) << text;
}

INSTANTIATE_TEST_SUITE_P(AllBadCases, BadSpecTest, testing::ValuesIn(BadCases()),
                         [](const testing::TestParamInfo<BadCase>& info) {
                           std::string name;
                           for (char c : info.param.what) {
                             name += absl::ascii_isalnum(c) ? c : '_';
                           }
                           return name;
                         });

TEST(JobSpecTest, TypeErrorsSayWhere) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(SpecYaml() + "batch_size: abc\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(
      std::string(spec.status().message()),
      ::testing::EndsWith("batch_size: expected an integer, got 'abc' (line 5, column 13)"));
}

TEST(JobSpecTest, DuplicateKeyIsAnError) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(SpecYaml() + "name: again\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("name: duplicate key"));
}

TEST(JobSpecTest, YamlSyntaxErrorHasLineAndColumn) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec("name: t\nepochs: 1\nmodel: {name: mlp\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("line 4, column 1: "));

  spec = ParseJobSpec("name: t\n\tepochs: 1\n");  // tabs cannot indent YAML
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("line 2, column "));
}

TEST(JobSpecTest, TopLevelMustBeAMap) {
  for (const std::string text : {"", "just a string", "- a\n- b\n"}) {
    SCOPED_TRACE(text);
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // An empty document is a map with nothing in it: the name is missing.
  EXPECT_THAT(std::string(ParseJobSpec("").status().message()), StartsWith("name: required"));
}

TEST(JobSpecTest, NothingThrowsOnGarbage) {
  // Odd but legal or illegal YAML must come back as a status, never throw.
  for (const std::string& text :
       std::vector<std::string>{"{", "[", "name: [", "? [a, b]\n: c\n", "&a [*a]",
                                "name: *undefined", "!!binary 3q2+7w==", std::string(200, '['),
                                std::string("\0\x01\xff", 3), "name: t\n? {a: 1}\n: 2\n"}) {
    EXPECT_NO_THROW({
      absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
      EXPECT_FALSE(spec.ok());
    }) << text;
  }
}

TEST(JobSpecTest, LoadJobSpecFromFile) {
  const std::string path = WriteTempFile("job_spec_ok.yaml", SpecYaml({{"seed", "42"}}));
  const RemoveAtExit remove_ok{path};
  absl::StatusOr<JobSpec> spec = LoadJobSpec(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->seed, 42);

  // A bad file reports exactly what ParseJobSpec would.
  const std::string bad = WriteTempFile("job_spec_bad.yaml", SpecYaml({{"batch_size", "0"}}));
  const RemoveAtExit remove_bad{bad};
  spec = LoadJobSpec(bad);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status(), ParseJobSpec(SpecYaml({{"batch_size", "0"}})).status());
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("batch_size: "));
}

TEST(JobSpecTest, LoadJobSpecMissingFile) {
  const std::string path = testing::TempDir() + "/no/such/job.yaml";
  absl::StatusOr<JobSpec> spec = LoadJobSpec(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path));

  spec = LoadJobSpec(testing::TempDir());
  EXPECT_FALSE(spec.ok());
}

TEST(JobSpecTest, OverrideKeysSetsNestedKeysAndNamesBadAssignments) {
  const std::string base =
      "name: x\nmodel: {name: mlp}\ndata: {dataset: synthetic}\nalgorithm: petra\n"
      "stages: 2\nsteps: 5\n";
  absl::StatusOr<std::string> text = OverrideKeys(
      base, {"steps=7", "data.limit_test=64", "optimizer.lr=0.5", "algorithm.accumulation=3",
             "stages.partition=even", "model.hidden=[8, 4]"});
  ASSERT_TRUE(text.ok()) << text.status();
  const JobSpec spec = ParseOk(*text);
  EXPECT_EQ(spec.steps, 7);
  EXPECT_EQ(spec.data.limit_test, 64);
  EXPECT_DOUBLE_EQ(spec.optimizer.lr, 0.5);
  ASSERT_NE(spec.algorithm.get_if<PetraOptions>(), nullptr);  // the short form kept its name
  EXPECT_EQ(spec.algorithm.get_if<PetraOptions>()->accumulation, 3);
  EXPECT_EQ(spec.stages.count, 2);
  EXPECT_EQ(spec.stages.partition, Partition::kEven);
  EXPECT_THAT(spec.model.hidden, ElementsAre(8, 4));
  EXPECT_EQ(OverrideKeys(base, {}).value(), base);  // nothing to set: the text as written

  for (const auto& [assignment, want] : std::vector<std::pair<std::string, std::string>>{
           {"steps", "--set steps: expected KEY=VALUE"},
           {"=3", "--set =3: expected KEY=VALUE"},
           {"steps.x=1", "--set steps.x=1: steps is '5', not a map"},
           {"data..x=1", "--set data..x=1: empty key"},
           {"data.limit_test=[1", "--set data.limit_test=[1: the value is not YAML"}}) {
    absl::StatusOr<std::string> bad = OverrideKeys(base, {assignment});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << assignment;
    EXPECT_THAT(std::string(bad.status().message()), StartsWith(want)) << assignment;
  }
}

TEST(JobSpecTest, NamesAreBoundedAndNotEchoedWhenLong) {
  JobSpec spec;
  spec.steps = 10;
  spec.name = std::string(128, 'a');
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.name = std::string(129, 'a');
  EXPECT_EQ(std::string(ValidateJobSpec(spec).message()), "name: at most 128 characters, got 129");
  spec.name = "a b";
  EXPECT_EQ(std::string(ValidateJobSpec(spec).message()),
            "name: must match [A-Za-z0-9_.-]+, got 'a b'");
}

TEST(JobSpecTest, ValidateJobSpecOnBuiltSpecs) {
  JobSpec spec;
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()), StartsWith("name: "));
  spec.name = "x";
  spec.model.name = ModelKind::kMlp;
  spec.data.dataset = DatasetKind::kSynthetic;
  spec.steps = 10;
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.optimizer.momentum = 1.0;
  EXPECT_EQ(std::string(ValidateJobSpec(spec).message()),
            "optimizer.momentum: must be in [0, 1), got 1");
}

TEST(JobSpecTest, DocumentedExampleParses) {
  // docs/job_spec.md promises its full example is valid; hold it to that.
  std::ifstream in(STAGEWISE_SOURCE_DIR "/docs/job_spec.md");
  ASSERT_TRUE(in) << "docs/job_spec.md is missing";
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  const size_t section = doc.find("## Full example");
  ASSERT_NE(section, std::string::npos);
  const size_t begin = doc.find("```yaml\n", section);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = doc.find("```", begin + 8);
  ASSERT_NE(end, std::string::npos);
  const JobSpec spec = ParseOk(doc.substr(begin + 8, end - begin - 8));
  EXPECT_EQ(spec.name, "cifar10-revnet18-petra");
  EXPECT_EQ(std::get<PetraOptions>(spec.algorithm.options).accumulation, 2);
  EXPECT_EQ(spec.stages.count, 3);
  EXPECT_EQ(spec.stages.partition, Partition::kExplicit);
  EXPECT_THAT(spec.model.input_shape, ElementsAre(3, 32, 32));
  EXPECT_EQ(spec.recovery.max_restarts, 5);
  EXPECT_EQ(spec.transport.compression, Compression::kBf16);
}

// Parses every example job shipped in examples/ (there may be none yet).
std::vector<std::pair<std::string, absl::Status>> ParseAllUnder(const std::string& dir) {
  std::vector<std::pair<std::string, absl::Status>> results;
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) return results;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, error)) {
    const std::string extension = entry.path().extension().string();
    if (!entry.is_regular_file() || (extension != ".yaml" && extension != ".yml")) continue;
    results.emplace_back(entry.path().string(), LoadJobSpec(entry.path().string()).status());
  }
  return results;
}

TEST(JobSpecTest, ParseAllUnderFindsEveryYamlFile) {
  // Guards the examples test below against silently iterating nothing.
  const std::string dir = testing::TempDir() + "/job_spec_examples";
  const RemoveAtExit remove_dir{dir};
  std::filesystem::create_directories(dir + "/nested");
  std::ofstream(dir + "/good.yaml") << SpecYaml();
  std::ofstream(dir + "/nested/bad.yml") << SpecYaml({{"batch_size", "0"}});
  std::ofstream(dir + "/notes.txt") << "not a spec";
  const auto results = ParseAllUnder(dir);
  ASSERT_EQ(results.size(), 2u);
  int failures = 0;
  for (const auto& [path, status] : results) failures += status.ok() ? 0 : 1;
  EXPECT_EQ(failures, 1);
}

TEST(JobSpecTest, EveryExampleParses) {
  const auto results = ParseAllUnder(STAGEWISE_SOURCE_DIR "/examples");
  for (const auto& [path, status] : results) {
    EXPECT_TRUE(status.ok()) << path << ": " << status;
  }
  RecordProperty("examples", static_cast<int>(results.size()));
  std::cout << "[ INFO     ] parsed " << results.size() << " example spec(s)\n";
}

}  // namespace
}  // namespace stagewise

namespace stagewise {
namespace {

std::string ParseError(const std::string& text) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(text);
  EXPECT_FALSE(spec.ok()) << text;
  return spec.ok() ? std::string() : std::string(spec.status().message());
}

TEST(JobSpecPhases, InheritOptimizerAndScheduleAndSumTheLength) {
  const JobSpec spec = ParseOk(SpecYaml({{"epochs", ""},
                                         {"stages", "3"},
                                         {"optimizer", "{lr: 0.1, momentum: 0.8}"},
                                         {"schedule", "{name: cosine, warmup_epochs: 0.5}"},
                                         {"phases", R"(
  - {name: local, epochs: 2, algorithm: {name: nwise, n: 1}}
  - name: finetune
    epochs: 0.5
    algorithm: backprop
    optimizer: {lr: 0.01}
    schedule: {warmup_epochs: 0}
    reset_optimizer: false)"}}));
  ASSERT_EQ(spec.phases.size(), 2u);
  EXPECT_EQ(spec.phases[0].name, "local");
  EXPECT_EQ(std::get<NwiseOptions>(spec.phases[0].algorithm.options).n, 1);
  EXPECT_DOUBLE_EQ(spec.phases[0].optimizer.lr, 0.1);
  EXPECT_TRUE(spec.phases[0].reset_optimizer);
  EXPECT_EQ(spec.phases[1].algorithm.name(), "backprop");
  EXPECT_DOUBLE_EQ(spec.phases[1].optimizer.lr, 0.01);
  EXPECT_DOUBLE_EQ(spec.phases[1].optimizer.momentum, 0.8);          // inherited
  EXPECT_EQ(spec.phases[1].schedule.name, LrScheduleKind::kCosine);  // inherited
  EXPECT_DOUBLE_EQ(spec.phases[1].schedule.warmup_epochs, 0);
  EXPECT_FALSE(spec.phases[1].reset_optimizer);
  EXPECT_EQ(spec.algorithm.name(), "nwise");  // the first phase's
  EXPECT_DOUBLE_EQ(spec.epochs, 2.5);
  EXPECT_EQ(Phases(spec).size(), 2u);
}

TEST(JobSpecPhases, WithoutPhasesThereIsOneFromTheTopLevel) {
  const JobSpec spec = ParseOk(SpecYaml({{"algorithm", "{name: petra, accumulation: 2}"}}));
  const std::vector<PhaseSpec> phases = Phases(spec);
  ASSERT_EQ(phases.size(), 1u);
  EXPECT_EQ(std::get<PetraOptions>(phases[0].algorithm.options).accumulation, 2);
  EXPECT_DOUBLE_EQ(phases[0].epochs, 1);
}

TEST(JobSpecPhases, ErrorsNameThePhaseAndTheKey) {
  const std::string one = "[{epochs: 1, algorithm: backprop}]";
  EXPECT_THAT(ParseError(SpecYaml({{"phases", one}})),
              HasSubstr("epochs: not allowed with phases"));
  EXPECT_THAT(ParseError(SpecYaml({{"epochs", ""}, {"algorithm", "backprop"}, {"phases", one}})),
              HasSubstr("algorithm: not allowed with phases"));
  EXPECT_THAT(ParseError(SpecYaml({{"epochs", ""}, {"phases", "[]"}})), HasSubstr("phases"));
  EXPECT_THAT(ParseError(SpecYaml({{"epochs", ""}, {"phases", "[{epochs: 1}]"}})),
              StartsWith("phases[0].algorithm: required"));
  EXPECT_THAT(ParseError(SpecYaml({{"epochs", ""},
                                   {"phases",
                                    "[{epochs: 1, algorithm: backprop}, "
                                    "{epochs: 1, algorithm: {name: nwise, n: 0}}]"}})),
              StartsWith("phases[1].algorithm.n: must be >= 1"));
  EXPECT_THAT(ParseError(SpecYaml({{"epochs", ""},
                                   {"phases",
                                    "[{epochs: 1, algorithm: backprop, "
                                    "optimizer: {lr: -1}}]"}})),
              StartsWith("phases[0].optimizer.lr"));
  EXPECT_THAT(ParseError(SpecYaml({{"epochs", ""},
                                   {"phases",
                                    "[{epochs: 1, algorithm: backprop}, "
                                    "{steps: 5, algorithm: backprop}]"}})),
              HasSubstr("every phase's length in epochs"));
  EXPECT_THAT(ParseError(SpecYaml(
                  {{"epochs", ""}, {"phases", "[{epochs: 1, steps: 2, algorithm: backprop}]"}})),
              StartsWith("phases[0].epochs: set exactly one"));
  EXPECT_THAT(ParseError(SpecYaml(
                  {{"epochs", ""}, {"phases", "[{epochs: 1, algorithm: backprop, lr: 1}]"}})),
              HasSubstr("phases[0].lr"));
}

// momentum_by_delay: compensate is checked against the optimizer the phase
// steps with, not the job's.
TEST(JobSpecPhases, TheMomentumRuleFollowsThePhasesOptimizer) {
  const std::string muon_phase =
      "[{epochs: 1, algorithm: backprop}, {epochs: 1, optimizer: {name: muon}, "
      "algorithm: {name: petra, momentum_by_delay: compensate}}]";
  EXPECT_THAT(ParseError(SpecYaml({{"epochs", ""}, {"phases", muon_phase}})),
              StartsWith("phases[1].algorithm.momentum_by_delay: compensate applies to "
                         "optimizer.name sgd or adam, not muon"));
  const JobSpec sgd_phase = ParseOk(SpecYaml(
      {{"epochs", ""},
       {"optimizer", "{name: muon}"},
       {"phases",
        "[{epochs: 1, algorithm: backprop}, {epochs: 1, optimizer: {name: sgd, momentum: 0.9}, "
        "algorithm: {name: delayed, momentum_by_delay: compensate}}]"}}));
  EXPECT_EQ(sgd_phase.phases[1].optimizer.name, OptimizerKind::kSgd);
}

TEST(JobSpecAuxHead, ParsesTheKnownHeadsAndRejectsOthers) {
  EXPECT_TRUE(ParseAuxHeadSpec("linear")->conv_channels.empty());
  EXPECT_THAT(ParseAuxHeadSpec("conv")->conv_channels, ElementsAre(128, 64));
  EXPECT_THAT(ParseAuxHeadSpec("conv:32,16,8")->conv_channels, ElementsAre(32, 16, 8));
  for (const char* bad : {"mlp", "conv:", "conv:0", "conv:a,2"}) {
    EXPECT_THAT(std::string(ParseAuxHeadSpec(bad).status().message()),
                StartsWith("algorithm.aux_head"))
        << bad;
  }
  EXPECT_THAT(
      ParseError(SpecYaml({{"algorithm", "{name: nwise, n: 1, aux_head: mlp}"}, {"stages", "2"}})),
      StartsWith("algorithm.aux_head: unknown head 'mlp'"));
}

}  // namespace
}  // namespace stagewise

namespace stagewise {
namespace {

TEST(JobSpecPhases, EveryPhaseAlgorithmGetsItsDefaults) {
  const JobSpec spec = ParseOk(SpecYaml(
      {{"epochs", ""},
       {"stages", "2"},
       {"phases", "[{steps: 2, algorithm: {name: nwise, n: 1}}, {steps: 2, algorithm: petra}]"}}));
  ASSERT_EQ(spec.phases.size(), 2u);
  EXPECT_FALSE(std::get<NwiseOptions>(spec.phases[0].algorithm.options).mix_local);
  EXPECT_EQ(std::get<NwiseOptions>(spec.phases[0].algorithm.options).aux_head, "conv");
  EXPECT_EQ(std::get<PetraOptions>(spec.phases[1].algorithm.options).accumulation, 1);
}

}  // namespace
}  // namespace stagewise

namespace stagewise {
namespace {

TEST(JobSpecTest, PlacementAndTheStallWatchdog) {
  const JobSpec defaults = ParseOk(SpecYaml({}));
  EXPECT_TRUE(defaults.placement.distinct_identities);
  EXPECT_EQ(defaults.recovery.stall_seconds, 0);
  const JobSpec set = ParseOk(SpecYaml(
      {{"placement", "{distinct_identities: false}"}, {"recovery", "{stall_seconds: 90.5}"}}));
  EXPECT_FALSE(set.placement.distinct_identities);
  EXPECT_EQ(set.recovery.stall_seconds, 90.5);
  EXPECT_THAT(ParseError(SpecYaml({{"recovery", "{stall_seconds: -1}"}})),
              StartsWith("recovery.stall_seconds: must be in [0, 1000000000], got -1"));
  EXPECT_THAT(ParseError(SpecYaml({{"placement", "{distinct: false}"}})),
              HasSubstr("placement.distinct"));
  EXPECT_THAT(ParseError(SpecYaml({{"placement", "{distinct_identities: maybe}"}})),
              HasSubstr("placement.distinct_identities"));
}

TEST(JobSpecTest, TransportCompression) {
  EXPECT_EQ(ParseOk(SpecYaml({})).transport.compression, Compression::kNone);
  for (Compression c : {Compression::kNone, Compression::kFp16, Compression::kBf16,
                        Compression::kInt8, Compression::kInt4}) {
    const JobSpec spec =
        ParseOk(SpecYaml({{"transport", absl::StrCat("{compression: ", NameOf(c), "}")}}));
    EXPECT_EQ(spec.transport.forward.compression, c);
    EXPECT_EQ(spec.transport.backward.compression, c);
  }
  EXPECT_THAT(ParseError(SpecYaml({{"transport", "{compression: fp8}"}})),
              StartsWith("transport.compression: must be one of none, fp16, bf16, int8, int4, "
                         "auto; got 'fp8'"));
  EXPECT_THAT(ParseError(SpecYaml({{"transport", "{compresion: fp16}"}})),
              HasSubstr("transport.compresion"));
}

TEST(JobSpecTest, TraceIsOffUnlessAskedForWithAWindowAndALimit) {
  EXPECT_FALSE(ParseOk(SpecYaml({})).trace.enabled);
  JobSpec spec = ParseOk(SpecYaml({{"trace", "{}"}}));
  EXPECT_TRUE(spec.trace.enabled);
  EXPECT_EQ(spec.trace.from, 0);
  EXPECT_EQ(spec.trace.to, 10);
  EXPECT_EQ(spec.trace.max_spans, 20000);
  spec = ParseOk(SpecYaml({{"trace", "{steps: [100, 120], max_spans: 500}"}}));
  EXPECT_EQ(spec.trace.from, 100);
  EXPECT_EQ(spec.trace.to, 120);
  EXPECT_EQ(spec.trace.max_spans, 500);
  EXPECT_TRUE(ParseOk(SpecYaml({{"trace", "~"}})).trace.enabled);  // `trace:` alone
  EXPECT_THAT(ParseError(SpecYaml({{"trace", "{steps: [5, 5]}"}})),
              StartsWith("trace.steps: must be [from, to] with 0 <= from < to, got [5, 5]"));
  EXPECT_THAT(ParseError(SpecYaml({{"trace", "{steps: [3]}"}})), HasSubstr("trace.steps"));
  EXPECT_THAT(ParseError(SpecYaml({{"trace", "{max_spans: 0}"}})),
              StartsWith("trace.max_spans: must be in [1, 1000000], got 0"));
  EXPECT_THAT(ParseError(SpecYaml({{"trace", "{step: [0, 1]}"}})), HasSubstr("trace.step"));
}

TEST(JobSpecTest, AuxnetSerialStatisticsNeedTheSerialForward) {
  EXPECT_EQ(std::get<AuxNetOptions>(
                ParseOk(SpecYaml({{"algorithm", "{name: auxnet}"}})).algorithm.options)
                .bn_statistics,
            BnStatistics::kLocal);
  ParseOk(SpecYaml({{"algorithm", "{name: auxnet, bn_statistics: serial}"}}));
  EXPECT_THAT(ParseError(SpecYaml(
                  {{"algorithm", "{name: auxnet, bn_statistics: serial, serial_loss_every: 0}"}})),
              StartsWith("algorithm.bn_statistics: serial needs the serial forward"));
  EXPECT_THAT(ParseError(SpecYaml({{"algorithm", "{name: auxnet, bn_statistics: both}"}})),
              HasSubstr("algorithm.bn_statistics"));
}

TEST(JobSpecTest, StagesModesAndMemoryBudget) {
  JobSpec spec = ParseOk(SpecYaml({{"stages", "{count: 2, memory_budget: 512MiB}"}}));
  EXPECT_EQ(spec.stages.memory_budget, int64_t{512} << 20);
  EXPECT_EQ(spec.stages.modes, BlockModes::kAuto);
  spec = ParseOk(SpecYaml({{"stages", "{count: 2, modes: rebuild, memory_budget: 1.5G}"}}));
  EXPECT_EQ(spec.stages.modes, BlockModes::kRebuild);
  EXPECT_EQ(spec.stages.memory_budget, 1500000000);
  spec = ParseOk(SpecYaml({{"stages", "{count: 2, memory_budget: 1000000}"}}));
  EXPECT_EQ(spec.stages.memory_budget, 1000000);
  const std::string modes = ParseError(SpecYaml({{"stages", "{count: 2, modes: sometimes}"}}));
  EXPECT_THAT(modes, HasSubstr("stages.modes"));
  EXPECT_THAT(modes, HasSubstr("auto, store or rebuild"));
  EXPECT_THAT(ParseError(SpecYaml(
                  {{"stages", "{count: 2, modes: store}"}, {"algorithm", "{name: delayed}"}})),
              HasSubstr("applies to backprop and petra, not to 'delayed'"));
  EXPECT_THAT(ParseError(SpecYaml({{"stages", "{count: 2, memory_budget: lots}"}})),
              HasSubstr("stages.memory_budget"));
  EXPECT_THAT(ParseError(SpecYaml({{"stages", "{count: 2, memory_budget: 0}"}})),
              HasSubstr("stages.memory_budget"));
  EXPECT_THAT(ParseError(SpecYaml({{"stages", "{count: 2, memory_budget: 2 parsecs}"}})),
              HasSubstr("unknown unit"));
}

// backprop's schedule: auto is the planner's to resolve, in the first phase
// only; a worker resolves it from its assignment (1f1b without one).
TEST(JobSpecTest, AutoScheduleResolvesInTheFirstPhaseOnly) {
  JobSpec spec =
      ParseOk(SpecYaml({{"algorithm", "{name: backprop, micro_batches: 4, schedule: auto}"}}));
  std::vector<PhaseSpec> phases = Phases(spec);
  EXPECT_EQ(std::get<BackpropOptions>(phases[0].algorithm.options).schedule, std::nullopt);
  ASSERT_TRUE(ResolveAutoSchedule(PipelineSchedule::kZbH1, phases).ok());
  EXPECT_EQ(std::get<BackpropOptions>(phases[0].algorithm.options).schedule,
            PipelineSchedule::kZbH1);
  phases = Phases(spec);
  ASSERT_TRUE(ResolveAutoSchedule(std::nullopt, phases).ok());
  EXPECT_EQ(std::get<BackpropOptions>(phases[0].algorithm.options).schedule,
            PipelineSchedule::kOneFOneB);
  phases = Phases(spec);
  EXPECT_THAT(std::string(ResolveAutoSchedule(PipelineSchedule::kInterleaved, phases).message()),
              HasSubstr("StageAssignment.schedule"));
  const std::string later = ParseError(SpecYaml({{"epochs", ""}, {"phases", R"(
  - {name: local, epochs: 1, algorithm: {name: nwise, n: 1}}
  - {name: tune, epochs: 1, algorithm: {name: backprop, schedule: auto}})"}}));
  EXPECT_THAT(later, HasSubstr("algorithm.schedule"));
  EXPECT_THAT(later, HasSubstr("first phase only"));
}

TEST(JobSpecTest, ParseByteSize) {
  EXPECT_EQ(*ParseByteSize("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("64 KiB"), 65536);
  EXPECT_EQ(*ParseByteSize("300MB"), 300000000);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("MiB").ok());
}

}  // namespace
}  // namespace stagewise
