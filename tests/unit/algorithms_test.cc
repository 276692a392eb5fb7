// Unit tests of the training algorithms on FakeJob (in-memory stages, no
// gRPC): the registry matches the job-spec schemas; backprop over J fake
// stages ends with the parameters of a plain single-process loop; petra,
// features_replay and nwise reduce to backprop where their papers say they
// do; delayed reports the staleness and buffers docs/algorithms.md documents;
// malformed gradients and stopped jobs end the algorithm with the right
// status; a job resumed from a checkpoint continues on exactly the
// trajectory of the job that wrote it (every algorithm), and does not
// without the algorithm's saved state. The real-process versions of these
// checks are tests/oracle/.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "services/models/modal_pass.h"
#include "services/spec/job_spec.h"
#include "services/tensor/codec.h"
#include "services/training/optimizer.h"
#include "services/training/reference_trainer.h"
#include "tests/unit/fake_stage_context.h"
#include "worker/algorithms/common.h"
#include "worker/stage_assignment.h"
#include "worker/stage_context.h"

namespace stagewise {
namespace {

using testing::FakeCheckpoint;
using testing::FakeJob;

// A tiny RevNet (reversible and non-reversible blocks) on synthetic data.
std::string JobYaml(const std::string& algorithm, int stages, int steps = 4,
                    const std::string& eval = "{every_epochs: 0, at_end: true}") {
  return absl::StrCat(R"(name: unit
seed: 7
model: {name: revnet, depth: 18, width: 4, blocks: [1, 1, 1, 1]}
data: {dataset: synthetic, train_size: 64, test_size: 16, shape: [3, 8, 8], classes: 4}
algorithm: )",
                      algorithm, R"(
stages: )",
                      stages, R"(
optimizer: {name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}
schedule: {name: cosine, warmup_epochs: 0.25}
batch_size: 16
steps: )",
                      steps, R"(
eval: )",
                      eval, "\n");
}

std::unique_ptr<FakeJob> MakeJob(const std::string& algorithm, int stages, int steps = 4) {
  auto job = FakeJob::FromYaml(JobYaml(algorithm, stages, steps));
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? std::move(*job) : nullptr;
}

// Runs every stage; all must succeed.
void RunAll(FakeJob& job) {
  std::vector<absl::Status> results = job.Run();
  for (size_t j = 0; j < results.size(); ++j)
    EXPECT_TRUE(results[j].ok()) << j << ": " << results[j];
}

// Parameters of the whole model after plain single-process backprop (the
// reference trainer's own step) with the schedule the stages use.
std::vector<torch::Tensor> ReferenceParameters(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto trainer = training::ReferenceTrainer::Create(*spec);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  auto& t = **trainer;
  const int64_t per_epoch = t.train_sampler().batches_per_epoch();
  const double base = training::BaseLearningRate(spec->optimizer, spec->batch_size);
  for (int64_t s = 0; s < spec->steps; ++s) {
    t.Step(t.train_sampler().Get(s / per_epoch, s % per_epoch),
           training::LearningRateAt(spec->schedule, base, s, per_epoch, spec->steps));
  }
  std::vector<torch::Tensor> out;
  for (const auto& p : t.model().parameters()) out.push_back(p.detach().clone());
  return out;
}

void ExpectSameParameters(const std::vector<torch::Tensor>& got,
                          const std::vector<torch::Tensor>& want, double rtol = 1e-5,
                          double atol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].sizes().equals(want[i].sizes())) << i;
    EXPECT_TRUE(torch::allclose(got[i], want[i], rtol, atol))
        << "parameter " << i << ": max diff " << (got[i] - want[i]).abs().max().item<double>();
  }
}

double SummaryValue(const testing::FakeStageContext& stage, const std::string& key) {
  auto summary = stage.summary();
  auto it = summary.find(key);
  return it == summary.end() ? -1.0 : it->second;
}

// Every algorithm the spec knows builds on the worker (the factory is a visit
// over AlgorithmOptions, so this is also checked at compile time); a name
// outside the spec is refused by the spec, naming the key.
TEST(AlgorithmRegistryTest, EveryAlgorithmOfTheSpecBuilds) {
  const std::vector<std::string> known = KnownAlgorithms();
  EXPECT_EQ(known.size(), std::variant_size_v<AlgorithmOptions>);
  for (const std::string& name : known) {
    absl::StatusOr<AlgorithmSpec> spec = MakeAlgorithmSpec(name);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->name(), name);
    EXPECT_NE(worker::MakeAlgorithm(*spec), nullptr) << name;
  }
  absl::StatusOr<AlgorithmSpec> unknown = MakeAlgorithmSpec("no_such_algorithm");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), ::testing::StartsWith("algorithm.name:"));
}

TEST(BackpropTest, OneAndTwoStagesMatchSingleProcessBackprop) {
  const std::vector<torch::Tensor> want = ReferenceParameters(JobYaml("{name: backprop}", 1));
  for (int stages : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("J=", stages));
    auto job = MakeJob("{name: backprop}", stages);
    ASSERT_NE(job, nullptr);
    RunAll(*job);
    ExpectSameParameters(job->Parameters(), want);
    const auto& last = job->stage(stages - 1);
    ASSERT_EQ(last.steps().size(), 4u);
    EXPECT_EQ(last.steps().back().steps_done, 4);
    EXPECT_EQ(last.steps().back().samples, 16);
    EXPECT_GT(last.steps().back().loss, 0.0);
    ASSERT_EQ(last.evals().size(), 1u);  // at_end
    EXPECT_EQ(last.evals()[0].steps_done, 4);
    EXPECT_EQ(last.evals()[0].samples, 16);
  }
}

TEST(TransportTest, HalfPrecisionWireHalvesTheBytesAndStaysNearExact) {
  // Float32 activations and gradients cross in 2 bytes a value; int64 labels
  // as they are.
  v1::StageMessage m;
  ASSERT_TRUE(worker::PutTensor(&m, "x", torch::randn({4, 8}), v1::COMPRESSION_FP16).ok());
  ASSERT_TRUE(worker::PutTensor(&m, "labels", torch::arange(4), v1::COMPRESSION_FP16).ok());
  EXPECT_EQ(m.tensors().at("x").data().size(), 4u * 8u * 2u);
  EXPECT_EQ(m.tensors().at("x").compression(), v1::COMPRESSION_FP16);
  EXPECT_EQ(m.tensors().at("labels").data().size(), 4u * 8u);
  EXPECT_EQ(m.tensors().at("labels").compression(), v1::COMPRESSION_NONE);

  // Two stages over a half-precision wire follow exact backprop closely, but
  // not bit for bit (the rounding is really applied).
  const std::vector<torch::Tensor> want = ReferenceParameters(JobYaml("{name: backprop}", 1));
  for (const char* compression : {"fp16", "bf16"}) {
    SCOPED_TRACE(compression);
    auto spec = ParseJobSpec(JobYaml("{name: backprop}", 2) +
                             absl::StrCat("transport: {compression: ", compression, "}\n"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(worker::WireOptions(*spec, /*to_next=*/true).compression,
              std::string(compression) == "fp16" ? v1::COMPRESSION_FP16 : v1::COMPRESSION_BF16);
    auto job = FakeJob::FromYaml(JobYaml("{name: backprop}", 2) +
                                 absl::StrCat("transport: {compression: ", compression, "}\n"));
    ASSERT_TRUE(job.ok()) << job.status();
    RunAll(**job);
    const std::vector<torch::Tensor> got = (*job)->Parameters();
    // bf16 keeps 8 significant bits, fp16 11: four steps stay within these.
    const bool fp16 = std::string(compression) == "fp16";
    ExpectSameParameters(got, want, /*rtol=*/0.05, /*atol=*/fp16 ? 5e-3 : 3e-2);
    double max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_diff = std::max(max_diff, (got[i] - want[i]).abs().max().item<double>());
    }
    EXPECT_GT(max_diff, 0.0);
  }
}

// A stage's assignment resolved once (worker/stage_assignment.h): each side's
// encoding takes the plan's format where the job says compression: auto and
// keeps the job's where it fixes one, and carries the job's block size and
// rotation seed; the parsed spec is left as submitted; the planned depth, the
// schedule and the block modes come along; an unknown format or a negative
// depth names its field.
TEST(TransportTest, AnAssignmentIsResolvedOnceWithoutPatchingTheSpec) {
  auto spec = ParseJobSpec(JobYaml("{name: backprop}", 2) +
                           "transport: {forward: {compression: auto, block: 32}, backward: "
                           "{compression: fp16}}\nplacement: {link_gbps: 1}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  v1::StageAssignment a;
  a.set_stage(0);
  a.set_num_stages(2);
  a.set_block_begin(0);
  a.set_block_end(2);
  a.set_forward_compression(v1::COMPRESSION_INT8);
  a.set_backward_compression(v1::COMPRESSION_INT4);  // the job fixes fp16: ignored
  a.set_max_in_flight(7);
  a.set_schedule(v1::PIPELINE_SCHEDULE_ZB_H1);
  absl::StatusOr<worker::ResolvedStage> r = worker::ResolveStage(a, *spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->to_next.compression, v1::COMPRESSION_INT8);
  EXPECT_EQ(r->to_next.block_size, 32);
  EXPECT_EQ(r->to_prev.compression, v1::COMPRESSION_FP16);
  EXPECT_EQ(r->to_next.rotation_seed, r->to_prev.rotation_seed);
  EXPECT_EQ(&r->wire(true), &r->to_next);
  EXPECT_EQ(r->in_flight, 7);
  EXPECT_EQ(r->schedule, PipelineSchedule::kZbH1);
  EXPECT_TRUE(r->block_modes.empty());
  EXPECT_EQ(spec->transport.forward.compression, Compression::kAuto);  // not patched
  // No plan: auto sends float32.
  v1::StageAssignment none = a;
  none.clear_forward_compression();
  EXPECT_EQ(worker::ResolveStage(none, *spec)->to_next.compression, v1::COMPRESSION_NONE);
  v1::StageAssignment bad = a;
  bad.set_forward_compression(static_cast<v1::Compression>(42));
  EXPECT_THAT(std::string(worker::ResolveStage(bad, *spec).status().message()),
              ::testing::HasSubstr("StageAssignment.forward_compression"));
  bad = a;
  bad.set_max_in_flight(-3);
  EXPECT_THAT(std::string(worker::ResolveStage(bad, *spec).status().message()),
              ::testing::HasSubstr("StageAssignment.max_in_flight"));
}

TEST(BackpropTest, MicroBatchSchedulesAgree) {
  // GPipe, 1F1B and ZB-H1 over two stages accumulate the same micro-batch gradients.
  auto gpipe = MakeJob("{name: backprop, micro_batches: 3, schedule: gpipe}", 2);
  auto one_f_one_b = MakeJob("{name: backprop, micro_batches: 3, schedule: 1f1b}", 2);
  auto recompute = MakeJob("{name: backprop, micro_batches: 3, recompute: true}", 2);
  // One micro-batch of lookahead, and more than there are micro-batches.
  auto classic = MakeJob("{name: backprop, micro_batches: 3, schedule: 1f1b, lookahead: 1}", 2);
  auto deep = MakeJob("{name: backprop, micro_batches: 3, schedule: 1f1b, lookahead: 5}", 2);
  // Zero bubble: stage 1 splits each backward into B and W.
  auto zb = MakeJob("{name: backprop, micro_batches: 3, schedule: zb-h1}", 2);
  auto zb_recompute =
      MakeJob("{name: backprop, micro_batches: 3, schedule: zb-h1, recompute: true}", 2);
  ASSERT_TRUE(gpipe && one_f_one_b && recompute && classic && deep && zb && zb_recompute);
  RunAll(*gpipe);
  RunAll(*one_f_one_b);
  RunAll(*recompute);
  RunAll(*classic);
  RunAll(*deep);
  RunAll(*zb);
  RunAll(*zb_recompute);
  ExpectSameParameters(zb->Parameters(), gpipe->Parameters());
  ExpectSameParameters(zb_recompute->Parameters(), gpipe->Parameters());
  ExpectSameParameters(one_f_one_b->Parameters(), gpipe->Parameters());
  ExpectSameParameters(recompute->Parameters(), gpipe->Parameters());
  ExpectSameParameters(classic->Parameters(), gpipe->Parameters());
  ExpectSameParameters(deep->Parameters(), gpipe->Parameters());
}

TEST(BackpropTest, InterleavedEqualsGpipe) {
  // Two fake workers holding two chunks each (4 virtual stages, taking each
  // worker's turns), with and without recompute: the same accumulated
  // micro-batch gradients as GPipe on two stages.
  auto gpipe = MakeJob("{name: backprop, micro_batches: 4, schedule: gpipe}", 2);
  ASSERT_TRUE(gpipe);
  RunAll(*gpipe);
  for (const char* recompute : {"false", "true"}) {
    SCOPED_TRACE(recompute);
    const std::string yaml = absl::StrReplaceAll(
        JobYaml(absl::StrCat("{name: backprop, micro_batches: 4, schedule: interleaved, "
                             "recompute: ",
                             recompute, "}"),
                2),
        {{"stages: 2", "stages: {count: 2, chunks_per_worker: 2}"}});
    auto job = FakeJob::FromYaml(yaml);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ((*job)->num_stages(), 4);
    RunAll(**job);
    ExpectSameParameters((*job)->Parameters(), gpipe->Parameters());
    // Each worker's order ran to its end in every step.
    for (int s = 0; s < 4; ++s) {
      worker::DeviceTurns* turns = (*job)->stage(s).device_turns();
      ASSERT_NE(turns, nullptr);
      EXPECT_EQ(turns->position(), 0);
      EXPECT_EQ(turns->step(), 3);
    }
    EXPECT_EQ((*job)->stage(0).device_turns(), (*job)->stage(2).device_turns());
    EXPECT_NE((*job)->stage(0).device_turns(), (*job)->stage(1).device_turns());
  }
}

TEST(PetraTest, OneStageEqualsBackprop) {
  auto petra = MakeJob("{name: petra}", 1);
  auto backprop = MakeJob("{name: backprop}", 1);
  ASSERT_TRUE(petra && backprop);
  RunAll(*petra);
  RunAll(*backprop);
  ExpectSameParameters(petra->Parameters(), backprop->Parameters());
  EXPECT_EQ(SummaryValue(petra->stage(0), "peak_stashed_parameter_bytes"), 0.0);
}

TEST(FeaturesReplayTest, OneStageEqualsBackprop) {
  auto replay = MakeJob("{name: features_replay}", 1);
  auto backprop = MakeJob("{name: backprop}", 1);
  ASSERT_TRUE(replay && backprop);
  RunAll(*replay);
  RunAll(*backprop);
  ExpectSameParameters(replay->Parameters(), backprop->Parameters());
}

TEST(FeaturesReplayTest, TwoStagesReportTheirLag) {
  auto job = MakeJob("{name: features_replay}", 2);
  ASSERT_NE(job, nullptr);
  RunAll(*job);
  EXPECT_EQ(SummaryValue(job->stage(0), "staleness_steps"), 1.0);
  EXPECT_EQ(SummaryValue(job->stage(1), "staleness_steps"), 0.0);
  EXPECT_EQ(SummaryValue(job->stage(0), "peak_inputs"), 2.0);  // J - j inputs
}

TEST(NwiseTest, NEqualToStagesIsBackprop) {
  auto nwise = MakeJob("{name: nwise, n: 2}", 2);
  auto backprop = MakeJob("{name: backprop}", 2);
  ASSERT_TRUE(nwise && backprop);
  RunAll(*nwise);
  RunAll(*backprop);
  ExpectSameParameters(nwise->Parameters(), backprop->Parameters());
  EXPECT_EQ(SummaryValue(nwise->stage(0), "aux_head_parameters"), -1.0);  // no aux head
}

TEST(DelayedTest, TwoStagesReportStalenessAndBuffers) {
  auto job = MakeJob("{name: delayed}", 2, 6);
  ASSERT_NE(job, nullptr);
  RunAll(*job);
  // Stage 0 keeps d_0 = 2(J-1)+1 = 3 mini-batches in flight, 2 steps stale.
  EXPECT_EQ(SummaryValue(job->stage(0), "staleness_steps"), 2.0);
  EXPECT_EQ(SummaryValue(job->stage(0), "peak_inputs"), 3.0);
  EXPECT_EQ(SummaryValue(job->stage(0), "peak_stashed_versions"), 3.0);
  EXPECT_GT(SummaryValue(job->stage(0), "peak_stashed_parameter_bytes"), 0.0);
  // The last stage steps at once: never stale, nothing held.
  EXPECT_LE(SummaryValue(job->stage(1), "staleness_steps"), 0.0);
  EXPECT_LE(SummaryValue(job->stage(1), "peak_inputs"), 0.0);
  EXPECT_EQ(job->stage(1).steps().size(), 6u);
  EXPECT_EQ(job->stage(0).steps().size(), 6u);
}

TEST(DelayedTest, MaxInFlightCapsTheDepth) {
  auto job = MakeJob("{name: delayed, max_in_flight: 2, weights: current}", 2, 6);
  ASSERT_NE(job, nullptr);
  RunAll(*job);
  EXPECT_EQ(SummaryValue(job->stage(0), "peak_inputs"), 2.0);
  EXPECT_EQ(SummaryValue(job->stage(0), "staleness_steps"), 1.0);
  EXPECT_EQ(SummaryValue(job->stage(0), "peak_stashed_versions"), 0.0);
}

// max_in_flight: auto: a stage keeps the depth its assignment carries (the
// plan's, deeper than the natural one to cover a round trip), and its
// gradients are that depth - 1 steps stale; the last stage keeps 1, and
// without a planned depth the natural one stays.
TEST(DelayedTest, MaxInFlightAutoKeepsThePlannedDepth) {
  auto job = MakeJob("{name: delayed, max_in_flight: auto, weights: current}", 2, 8);
  ASSERT_NE(job, nullptr);
  job->stage(0).set_planned_in_flight(5);
  job->stage(1).set_planned_in_flight(1);
  RunAll(*job);
  EXPECT_EQ(SummaryValue(job->stage(0), "peak_inputs"), 5.0);
  EXPECT_EQ(SummaryValue(job->stage(0), "staleness_steps"), 4.0);
  EXPECT_LE(SummaryValue(job->stage(1), "staleness_steps"), 0.0);
  EXPECT_EQ(job->stage(0).steps().size(), 8u);

  auto natural = MakeJob("{name: delayed, max_in_flight: auto, weights: current}", 2, 8);
  ASSERT_NE(natural, nullptr);
  RunAll(*natural);
  EXPECT_EQ(SummaryValue(natural->stage(0), "peak_inputs"), 3.0);
}

// Stage 0 of a two-stage job, with stage 1 played by the test: a BACKWARD
// message whose tensor has the wrong shape is rejected, naming the tensor.
struct BadGradientCase {
  std::string algorithm;
  std::string tensor;  // the one the error must name
};

class BadGradientTest : public ::testing::TestWithParam<BadGradientCase> {};

TEST_P(BadGradientTest, IsInvalidArgumentNamingTheTensor) {
  auto job = MakeJob(GetParam().algorithm, 2);
  ASSERT_NE(job, nullptr);
  v1::StageMessage back;
  back.set_kind(v1::StageMessage::BACKWARD);
  back.set_step(0);
  back.set_micro_batch(0);
  back.set_origin_stage(1);  // nwise: the last stage's loss
  const torch::Tensor wrong = torch::zeros({16, 1, 2, 2});
  ASSERT_TRUE(EncodeTensor(wrong, &(*back.mutable_tensors())["grad"]).ok());
  ASSERT_TRUE(EncodeTensor(wrong, &(*back.mutable_tensors())["x"]).ok());
  ASSERT_TRUE(job->backward_queue(0).Push(back));
  std::vector<absl::Status> results = job->Run({0});
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].code(), absl::StatusCode::kInvalidArgument) << results[0];
  EXPECT_NE(results[0].message().find("tensors['" + GetParam().tensor + "']"), std::string::npos)
      << results[0];
  EXPECT_NE(results[0].message().find("does not match"), std::string::npos) << results[0];
}

INSTANTIATE_TEST_SUITE_P(Algorithms, BadGradientTest,
                         ::testing::Values(BadGradientCase{"{name: backprop}", "grad"},
                                           BadGradientCase{"{name: delayed}", "grad"},
                                           BadGradientCase{"{name: features_replay}", "grad"},
                                           BadGradientCase{"{name: petra}", "x"},
                                           BadGradientCase{"{name: nwise, n: 2}", "grad"}));

TEST(MissingGradientTest, IsInvalidArgument) {
  auto job = MakeJob("{name: backprop}", 2);
  ASSERT_NE(job, nullptr);
  v1::StageMessage back;
  back.set_kind(v1::StageMessage::BACKWARD);
  ASSERT_TRUE(job->backward_queue(0).Push(back));
  std::vector<absl::Status> results = job->Run({0});
  EXPECT_EQ(results[0].code(), absl::StatusCode::kInvalidArgument) << results[0];
  EXPECT_NE(results[0].message().find("missing 'grad'"), std::string::npos) << results[0];
}

// A stopped job ends every algorithm with CANCELLED, whether it was blocked on
// a peer or checking Interrupted() between steps.
class CancelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CancelTest, StoppedJobEndsTheAlgorithm) {
  {
    // Stage 0 alone: it blocks waiting for stage 1, which never answers.
    auto job = MakeJob(GetParam(), 2, 1000);
    ASSERT_NE(job, nullptr);
    std::thread stopper([&job] {
      // Wait until stage 0 has sent something, then stop the job.
      auto first = job->forward_queue(0).Pop();
      EXPECT_TRUE(first.has_value());
      job->Stop(absl::CancelledError("job cancelled"));
    });
    std::vector<absl::Status> results = job->Run({0});
    stopper.join();
    EXPECT_EQ(results[0].code(), absl::StatusCode::kCancelled) << results[0];
  }
  {
    // A single stage never blocks: Interrupted() stops it.
    auto job = MakeJob(GetParam(), 1, 1000);
    ASSERT_NE(job, nullptr);
    job->Stop(absl::CancelledError("job cancelled"));
    std::vector<absl::Status> results = job->Run();
    EXPECT_EQ(results[0].code(), absl::StatusCode::kCancelled) << results[0];
    EXPECT_TRUE(job->stage(0).steps().empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, CancelTest,
                         ::testing::Values("{name: backprop}", "{name: delayed}", "{name: petra}",
                                           "{name: features_replay}", "{name: nwise, n: 1}",
                                           "{name: auxnet}"));

TEST(AuxNetTest, TwoStagesTrainAndReport) {
  auto job = MakeJob("{name: auxnet, beta: 1.0, aux_lr: 0.01, serial_loss_every: 2}", 2);
  ASSERT_NE(job, nullptr);
  RunAll(*job);
  EXPECT_GT(SummaryValue(job->stage(1), "auxnet_parameters"), 0.0);
  EXPECT_EQ(SummaryValue(job->stage(0), "auxnet_parameters"), -1.0);
  EXPECT_GE(SummaryValue(job->stage(1), "serial_train_loss"), 0.0);
  EXPECT_EQ(job->stage(1).steps().size(), 4u);
  for (const auto& p : job->Parameters()) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
}

// bn_statistics: where BatchNorm running statistics move. With the serial
// forward only at step 0 (serial_loss_every: 100), they count 4 local
// forwards by default and the 1 serial forward with bn_statistics: serial.
TEST(AuxNetTest, RunningStatisticsMoveWhereBnStatisticsSays) {
  for (const auto& [mode, want] :
       std::vector<std::pair<std::string, int64_t>>{{"local", 4}, {"serial", 1}}) {
    auto job = MakeJob(absl::StrCat("{name: auxnet, beta: 1.0, aux_lr: 0.01, serial_loss_every: "
                                    "100, bn_statistics: ",
                                    mode, "}"),
                       2);
    ASSERT_NE(job, nullptr);
    RunAll(*job);
    int counted = 0;
    for (const auto& b : job->stage(1).model().named_buffers()) {
      if (b.key().find("num_batches_tracked") == std::string::npos) continue;
      EXPECT_EQ(b.value().item<int64_t>(), want) << mode << ": " << b.key();
      ++counted;
    }
    EXPECT_GT(counted, 0);
  }
}

// ---- Checkpoints and resume ----

// The largest |got - want| of any tensor relative to that tensor's largest
// magnitude (0 when bitwise equal); infinity if the shapes differ. `where`
// gets the tensor and the difference of the first that is not bitwise equal.
double MaxRelativeDiff(const std::vector<torch::Tensor>& got,
                       const std::vector<torch::Tensor>& want, std::string* where = nullptr) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].sizes().equals(want[i].sizes())) return std::numeric_limits<double>::infinity();
    if (torch::equal(got[i], want[i])) continue;
    const torch::Tensor g = got[i].to(torch::kFloat64), w = want[i].to(torch::kFloat64);
    const double err = (g - w).abs().max().item<double>();
    const double rel = err / std::max(w.abs().max().item<double>(), 1e-30);
    if (where != nullptr && where->empty()) {
      *where = absl::StrCat("tensor ", i, ": max diff ", err, " (relative ", rel, ")");
    }
    worst = std::max(worst, rel);
  }
  return worst;
}

// The contract: bitwise the same parameters and BatchNorm buffers.
void ExpectIdentical(const FakeJob& got, const FakeJob& want) {
  std::string where;
  EXPECT_EQ(MaxRelativeDiff(got.Parameters(), want.Parameters(), &where), 0.0)
      << "parameters: " << where;
  where.clear();
  EXPECT_EQ(MaxRelativeDiff(got.Buffers(), want.Buffers(), &where), 0.0) << "buffers: " << where;
}

// aux_update: distill fits the AuxNet to lambda corrected with step aux_lr;
// direct hands it the gradient of the penalty and the stage's loss, so aux_lr
// plays no part: two direct runs that differ only in aux_lr end bitwise
// equal, two distill runs do not. Both report how far lambda and the true
// activations are apart.
TEST(AuxNetTest, AuxLrMattersOnlyToTheDistillUpdate) {
  auto run = [](const std::string& update, double aux_lr) {
    auto job =
        MakeJob(absl::StrCat("{name: auxnet, beta: 10.0, serial_loss_every: 2, aux_lr: ", aux_lr,
                             ", aux_update: ", update, "}"),
                3);
    EXPECT_NE(job, nullptr);
    if (job != nullptr) RunAll(*job);
    return job;
  };
  auto direct_a = run("direct", 0.01), direct_b = run("direct", 5.0);
  auto distill_a = run("distill", 0.01), distill_b = run("distill", 5.0);
  ASSERT_TRUE(direct_a && direct_b && distill_a && distill_b);
  EXPECT_EQ(MaxRelativeDiff(direct_a->Parameters(), direct_b->Parameters()), 0.0);
  EXPECT_GT(MaxRelativeDiff(distill_a->Parameters(), distill_b->Parameters()), 0.0);
  for (FakeJob* job : {direct_a.get(), distill_a.get()}) {
    for (int k = 1; k < 3; ++k) {
      EXPECT_GT(SummaryValue(job->stage(k), "relative_violation_end"), 0.0) << k;
      EXPECT_GT(SummaryValue(job->stage(k), "serial_gap_end"), 0.0) << k;
    }
    EXPECT_EQ(SummaryValue(job->stage(0), "serial_gap_end"), -1.0);
  }
}

struct ResumeCase {
  std::string name;
  std::string algorithm;
  int stages = 3;
  int steps = 8;
  int every = 3;                   // checkpoint every this many steps
  std::vector<int64_t> resume_at;  // checkpoints to resume from
  std::string eval = "{every_epochs: 0, at_end: true}";
  bool rebuild = false;  // block modes: reversible blocks rebuild (ModalPass)
};

// Block modes as the planner may assign them: every reversible block
// rebuilds its input in the backward, the others store.
void SetRebuildModes(FakeJob& job) {
  for (int j = 0; j < job.num_stages(); ++j) {
    std::vector<models::BlockMode> modes;
    for (const auto& block : job.stage(j).model().blocks()) {
      modes.push_back(block->reversible() ? models::BlockMode::kRebuild
                                          : models::BlockMode::kStore);
    }
    job.stage(j).set_block_modes(std::move(modes));
  }
}

std::string ResumeCaseName(const ::testing::TestParamInfo<ResumeCase>& info) {
  return info.param.name;
}

void PrintTo(const ResumeCase& c, std::ostream* os) { *os << c.name << " " << c.algorithm; }

// Run A: uninterrupted, checkpoints every k steps. Run B: a fresh job with
// the same checkpoint schedule resumed from A's checkpoint after s steps.
// B ends with bitwise the parameters and BatchNorm buffers of A.
class ResumeTest : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeTest, ContinuesOnTheSameTrajectory) {
  const ResumeCase& c = GetParam();
  const std::string yaml = JobYaml(c.algorithm, c.stages, c.steps, c.eval);
  auto a = FakeJob::FromYaml(yaml);
  ASSERT_TRUE(a.ok()) << a.status();
  (*a)->set_checkpoint_every(c.every);
  if (c.rebuild) SetRebuildModes(**a);
  RunAll(**a);
  const auto checkpoints = (*a)->checkpoints();
  std::vector<int64_t> taken, want;
  for (const auto& [step, shards] : checkpoints) {
    taken.push_back(step);
    ASSERT_EQ(shards.size(), static_cast<size_t>(c.stages)) << step;
    for (int j = 0; j < c.stages; ++j) EXPECT_FALSE(shards[j].empty()) << step << " " << j;
  }
  for (int64_t s = c.every; s < c.steps; s += c.every) want.push_back(s);
  ASSERT_EQ(taken, want);
  for (int64_t s : c.resume_at) {
    SCOPED_TRACE(absl::StrCat("resume at ", s));
    auto b = FakeJob::FromYaml(yaml);
    ASSERT_TRUE(b.ok()) << b.status();
    (*b)->set_checkpoint_every(c.every);
    if (c.rebuild) SetRebuildModes(**b);
    ASSERT_TRUE((*b)->Resume(checkpoints.at(s), s).ok());
    RunAll(**b);
    ExpectIdentical(**b, **a);
    // B trains steps s+1 .. T only.
    const auto reported = (*b)->stage(c.stages - 1).steps();
    ASSERT_EQ(reported.size(), static_cast<size_t>(c.steps - s));
    EXPECT_EQ(reported.front().steps_done, s + 1);
    EXPECT_EQ(reported.back().steps_done, c.steps);
    // And it takes A's later checkpoints again.
    std::vector<int64_t> again;
    for (const auto& [step, shards] : (*b)->checkpoints()) again.push_back(step);
    std::vector<int64_t> later;
    for (int64_t t : want) {
      if (t > s) later.push_back(t);
    }
    EXPECT_EQ(again, later);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, ResumeTest,
    ::testing::Values(
        ResumeCase{"backprop_gpipe", "{name: backprop, micro_batches: 3}", 3, 6, 2, {2, 4}},
        ResumeCase{
            "backprop_1f1b", "{name: backprop, micro_batches: 4, schedule: 1f1b}", 3, 6, 2, {4}},
        ResumeCase{"backprop_1f1b_recompute",
                   "{name: backprop, micro_batches: 3, schedule: 1f1b, recompute: true}",
                   3,
                   6,
                   2,
                   {2}},
        ResumeCase{"backprop_block_modes",
                   "{name: backprop, micro_batches: 2}",
                   3,
                   6,
                   2,
                   {2},
                   "{every_epochs: 0, at_end: true}",
                   /*rebuild=*/true},
        // The checkpoint drains where an evaluation is also due.
        ResumeCase{"delayed_stash",
                   "{name: delayed}",
                   3,
                   8,
                   3,
                   {3, 6},
                   "{every_steps: 3, every_epochs: 0, at_end: true}"},
        ResumeCase{"delayed_current", "{name: delayed, weights: current}", 3, 8, 3, {3}},
        ResumeCase{"petra", "{name: petra}", 3, 8, 3, {3}},
        // Cuts after 3 (inside an accumulation window) and 6 steps.
        ResumeCase{"petra_accumulation2", "{name: petra, accumulation: 2}", 3, 8, 3, {3, 6}},
        // The look-ahead's w_prev is state: the first forward after the cut
        // predicts as the uninterrupted run's.
        ResumeCase{"petra_predict",
                   "{name: petra, predict_weights: true, lr_by_delay: inverse_sqrt}",
                   3,
                   8,
                   3,
                   {3, 6}},
        ResumeCase{"delayed_predict", "{name: delayed, predict_weights: true}", 3, 8, 3, {3, 6}},
        ResumeCase{"delayed_accumulation2",
                   "{name: delayed, weights: current, accumulation: 2}",
                   3,
                   8,
                   3,
                   {3, 6}},
        // Every step: cuts in the warm-up (stage 0 holds no gradient at 1)
        // and after it.
        ResumeCase{"features_replay_every_step", "{name: features_replay}", 3, 8, 1, {1, 2, 5}},
        ResumeCase{"features_replay",
                   "{name: features_replay}",
                   3,
                   8,
                   3,
                   {3, 6},
                   "{every_steps: 2, every_epochs: 0, at_end: true}"},
        // Aux head on stage 1 only; on stages 0 and 1 with mix_local.
        ResumeCase{
            "nwise", "{name: nwise, n: 2, micro_batches: 2, aux_head: 'conv:8'}", 3, 8, 3, {3}},
        ResumeCase{"nwise_mix_local",
                   "{name: nwise, n: 2, mix_local: true, aux_head: linear}",
                   3,
                   8,
                   3,
                   {3, 6}},
        ResumeCase{"auxnet",
                   "{name: auxnet, beta: 1.0, aux_lr: 0.01, serial_loss_every: 2, noise_std: 0.1}",
                   3,
                   8,
                   3,
                   {3, 6}}),
    ResumeCaseName);

// Resumed with its algorithm state zeroed (tensors only: the counters still
// check out), each of these algorithms leaves A's trajectory: ResumeTest's
// equality depends on the state they save.
class ResumeWithoutStateTest : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeWithoutStateTest, ZeroedStateLeavesTheTrajectory) {
  const ResumeCase& c = GetParam();
  const std::string yaml = JobYaml(c.algorithm, c.stages, c.steps, c.eval);
  auto a = FakeJob::FromYaml(yaml);
  ASSERT_TRUE(a.ok()) << a.status();
  (*a)->set_checkpoint_every(c.every);
  RunAll(**a);
  const int64_t s = c.resume_at.at(0);
  const FakeCheckpoint checkpoint = (*a)->checkpoints().at(s);
  auto b = FakeJob::FromYaml(yaml);
  ASSERT_TRUE(b.ok()) << b.status();
  (*b)->set_checkpoint_every(c.every);
  ASSERT_TRUE((*b)->Resume(checkpoint, s, FakeJob::AlgorithmState::kZeroed).ok());
  RunAll(**b);
  EXPECT_GT(MaxRelativeDiff((*b)->Parameters(), (*a)->Parameters()), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, ResumeWithoutStateTest,
    ::testing::Values(
        ResumeCase{"petra_accumulation2", "{name: petra, accumulation: 2}", 3, 8, 3, {3}},
        ResumeCase{"delayed_accumulation2", "{name: delayed, accumulation: 2}", 3, 8, 3, {3}},
        ResumeCase{"petra_predict", "{name: petra, predict_weights: true}", 3, 8, 3, {3}},
        ResumeCase{"delayed_predict", "{name: delayed, predict_weights: true}", 3, 8, 3, {3}},
        ResumeCase{"features_replay", "{name: features_replay}", 3, 8, 3, {3}},
        ResumeCase{
            "nwise", "{name: nwise, n: 2, micro_batches: 2, aux_head: 'conv:8'}", 3, 8, 3, {3}},
        ResumeCase{"auxnet", "{name: auxnet, beta: 1.0, aux_lr: 0.01}", 3, 8, 3, {3}}),
    ResumeCaseName);

// Resumed inside the phase with no algorithm state at all, an algorithm that
// saves state fails at once (FAILED_PRECONDITION) instead of blocking on a
// gradient nobody sends or training from a fresh state; backprop needs none.
TEST(ResumeMissingStateTest, IsFailedPreconditionExceptForBackprop) {
  for (const std::string algorithm : {"{name: delayed}", "{name: petra}", "{name: features_replay}",
                                      "{name: nwise, n: 2}", "{name: auxnet}"}) {
    SCOPED_TRACE(algorithm);
    const std::string yaml = JobYaml(algorithm, 3, 6);
    auto a = FakeJob::FromYaml(yaml);
    ASSERT_TRUE(a.ok()) << a.status();
    (*a)->set_checkpoint_every(2);
    RunAll(**a);
    auto b = FakeJob::FromYaml(yaml);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE((*b)->Resume((*a)->checkpoints().at(2), 2, FakeJob::AlgorithmState::kNone).ok());
    for (const absl::Status& status : (*b)->Run()) {
      EXPECT_TRUE(status.code() == absl::StatusCode::kFailedPrecondition ||
                  status.code() == absl::StatusCode::kCancelled)
          << status;
    }
    EXPECT_EQ((*b)->stage(0).steps().size(), 0u);
  }
  auto a = MakeJob("{name: backprop}", 2, 6);
  ASSERT_NE(a, nullptr);
  a->set_checkpoint_every(2);
  RunAll(*a);
  auto b = MakeJob("{name: backprop}", 2, 6);
  ASSERT_NE(b, nullptr);
  b->set_checkpoint_every(2);
  ASSERT_TRUE(b->Resume(a->checkpoints().at(4), 4, FakeJob::AlgorithmState::kNone).ok());
  RunAll(*b);
  ExpectIdentical(*b, *a);
}

// The pipeline timeline as the algorithms record it (the runtime adds the
// waits): only while a stage's step count is inside the window, never
// overlapping on a stage, and a mini-batch's forward on stage j starts after
// it ended on stage j-1 (except under auxnet, whose stages forward their
// auxiliary inputs in parallel).
class TraceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TraceTest, SpansStayInTheWindowDoNotOverlapAndFollowTheData) {
  const std::string algorithm = GetParam();
  auto job = FakeJob::FromYaml(JobYaml(algorithm, 3, 6) + "trace: {steps: [1, 4]}\n");
  ASSERT_TRUE(job.ok()) << job.status();
  RunAll(**job);
  // (step, micro-batch) -> the forward span, per stage.
  std::vector<std::map<std::pair<int64_t, int>, v1::Span>> forwards(3);
  for (int j = 0; j < 3; ++j) {
    worker::Tracer* tracer = (*job)->stage(j).tracer();
    ASSERT_NE(tracer, nullptr);
    const v1::TraceChunk chunk = tracer->TakeChunk();
    ASSERT_GT(chunk.spans_size(), 0) << j;
    EXPECT_EQ(chunk.dropped(), 0);
    std::map<v1::SpanKind, int> kinds;
    for (int i = 0; i < chunk.spans_size(); ++i) {
      const v1::Span& s = chunk.spans(i);
      ++kinds[s.kind()];
      EXPECT_GE(s.duration_us(), 0);
      if (i > 0) {
        const v1::Span& p = chunk.spans(i - 1);
        EXPECT_LE(p.start_us() + p.duration_us(), s.start_us())
            << algorithm << " stage " << j << ": " << p.ShortDebugString() << " overlaps "
            << s.ShortDebugString();
      }
      if (s.kind() == v1::SPAN_FORWARD) {
        EXPECT_TRUE(forwards[j].emplace(std::make_pair(s.step(), s.micro_batch()), s).second)
            << algorithm << " stage " << j << ": two forwards of " << s.ShortDebugString();
      }
    }
    for (const v1::SpanKind k : {v1::SPAN_FORWARD, v1::SPAN_BACKWARD, v1::SPAN_STEP}) {
      EXPECT_GT(kinds[k], 0) << algorithm << " stage " << j << " has no " << v1::SpanKind_Name(k);
    }
    // Steps 2, 3 and 4 end inside the window (features_replay's first
    // stages skip their first steps: no gradient yet).
    EXPECT_LE(kinds[v1::SPAN_STEP], 3) << algorithm << " stage " << j;
    if (j < 2) {
      EXPECT_GT(kinds[v1::SPAN_SEND], 0) << algorithm << " stage " << j;
    }
  }
  if (algorithm == "{name: auxnet}") return;
  for (int j = 1; j < 3; ++j) {
    int checked = 0;
    for (const auto& [key, s] : forwards[j]) {
      auto below = forwards[j - 1].find(key);
      if (below == forwards[j - 1].end()) continue;  // stage j-1 did it before its window
      ++checked;
      EXPECT_LE(below->second.start_us() + below->second.duration_us(), s.start_us())
          << algorithm << ": stage " << j << " forwards " << s.ShortDebugString()
          << " before stage " << j - 1 << " finished " << below->second.ShortDebugString();
    }
    EXPECT_GT(checked, 0) << algorithm << ": no mini-batch forwarded by stages " << j - 1 << " and "
                          << j << " inside the window";
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAlgorithm, TraceTest,
                         ::testing::Values("{name: backprop, micro_batches: 2}",
                                           "{name: backprop, micro_batches: 3, schedule: 1f1b}",
                                           "{name: petra}", "{name: delayed}",
                                           "{name: features_replay}", "{name: nwise, n: 1}",
                                           "{name: auxnet}"));

TEST(TraceOffTest, AJobWithoutATraceSectionRecordsNothing) {
  auto job = MakeJob("{name: petra}", 2);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->stage(0).tracer(), nullptr);
}

}  // namespace
}  // namespace stagewise
