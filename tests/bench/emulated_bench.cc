// Pipeline efficiency on emulated accelerators: every algorithm at J stages
// on the `emulated` model (docs/models.md, "Emulated accelerators"), whose
// blocks wait a configured time per mini-batch instead of computing, so J
// in-process workers on a small machine behave like J devices. Real tensors,
// real autograd, real gRPC on loopback. For each algorithm and J it prints the
// ideal time per mini-batch of the algorithm's schedule, the measured one in
// steady state, and efficiency = ideal / measured. With --replicas, every
// configuration also runs as R replicated pipelines (stages.replicas,
// docs/replicas.md; J x R workers, gradients averaged over real gloo between
// the in-process workers): each replica keeps --batch samples per step (the
// global batch is R x --batch), and the table adds samples/s and the scaling
// efficiency against R x the R = 1 figure. Never a test.
//
//   build/bin/stagewise_emulated_bench [options]
//     --stages 2,4,8,16      pipeline depths J
//     --replicas 1           replicas R of every stage (e.g. 1,2,4)
//     --algorithms LIST      from: backprop (M=1), gpipe, 1f1b, 1f1b1 (1F1B with
//                            lookahead 1), zb-h1 (zero bubble), interleaved
//                            (1F1B over 2 chunks per worker, M = 2J), delayed
//                            (forward: once), delayed-auto (delayed with
//                            max_in_flight: auto: as deep as the plan says
//                            covers --link-delay-ms), delayed-recompute (forward:
//                            recompute), petra, features_replay, nwise, auxnet
//                            (default: all)
//     --speeds 1,1,0.5,1     worker i's emulated speed (stagewise-worker
//                            --emulated-speed; 1 where not given): with
//                            --algorithms planned,planned-blind, 1F1B on a
//                            partition the planner cuts from every worker's
//                            profile, or from one (placement.per_worker_profiles),
//                            its ideal the plan's prediction
//     --rounds 3             repetitions; every round runs every configuration
//                            once, interleaved; medians and spread count
//     --forward-ms 5         per block and mini-batch
//     --backward-ms 10       per block and mini-batch
//     --weight-share 0.5     the part of the backward that is weight gradients
//                            (W, which zb-h1 defers; model.backward_weight_share)
//     --blocks-per-stage 2   K: stage j holds blocks [jK, (j+1)K) (+ the head)
//     --stage-ms F0/B0,F1/B1,...
//                            stage j's forward and backward ms per mini-batch
//                            instead of K x --forward-ms and K x --backward-ms,
//                            split evenly over its K blocks (model.
//                            block_forward_ms): e.g. a real job's profiled
//                            stage times (tests/bench/emulate_job.py prints
//                            them); one entry per stage, so --stages is one J;
//                            the ideal takes the slowest stage's F and B
//     --batch 32             samples per mini-batch (per replica)
//     --shape 2,16,16        per-sample activation [C, H, W] (C even)
//     --steps 40             steady-state steps measured per run, after a
//                            warm-up of 2J + 2 steps (pipeline fill)
//     --link-delay-ms 0      emulated one-way latency of every link, in ms
//                            (stagewise-worker --emulate-link-delay-ms; a list
//                            gives a row per value, each on workers of its own,
//                            interleaved with the others in every round); the
//                            job says placement.link_rtt_ms = twice it, so the
//                            plan's prediction ("planned ms") counts it
//     --predict              every job is profiled and planned on its fixed cut
//                            (the jobs say transport.compression auto on links
//                            of placement.link_gbps 1000, where it picks none
//                            and the bytes cost microseconds), so that
//                            "planned ms" shows the planner's prediction for
//                            every row, link latency included
//     --compression none     the wire format of activations and gradients
//                            (transport.compression), a row per entry of the
//                            list: none, fp16, bf16 (e.g. none,bf16)
//     --no-shared-memory     every payload inline on the gRPC stream (the workers'
//                            --shared-memory-dir ''; by default neighbours, all
//                            on this host, pass large tensors through shared
//                            rings: docs/performance.md, "Neighbours on one host")
//     --no-place-outputs     the stages' outputs copied into the rings when sent
//                            (the workers' --place-outputs false; by default
//                            made there: docs/performance.md, "Outputs made in
//                            the ring")
//     --verbose              per run, each stage's idle time (waiting for a
//                            message) per mini-batch, and how many payloads went
//                            through shared rings or inline because one was full,
//                            and how many large host tensors reused a cached
//                            block (docs/performance.md, "Host memory reuse")
//     --peer                 also run tests/bench/gloo_pipeline_peer.py (a plain
//                            PyTorch pipeline over gloo, one process per stage,
//                            the same emulated blocks, 1F1B, M = 2J; needs
//                            /usr/bin/python3 with python3-torch) at every J with
//                            R = 1, interleaved with the other configurations;
//                            the "vs peer" column is that row's median over the
//                            peer's at the same J
//
// Ideal time per mini-batch, with F = K * forward_ms and B = K * backward_ms
// the work of one stage on one mini-batch:
//   backprop, M = 2J micro-batches (GPipe or 1F1B):  (M + J - 1) / M * (F + B)
//   zb-h1, M = 2J: the schedule's own orders played out with the costs
//     (services/planner/pipeline_schedule.h); with a weight share of 1/3 of
//     F + B it is (3M + J - 1) / 3M * (F + B). The table's last column,
//     "bubble cut", is (1F1B's measured time - this one's) over (1F1B's ideal
//     - this one's): the share of the predicted saving that was measured.
//   interleaved, v = 2 chunks of K/2 blocks per worker, M = 2J: the worker's
//     order simulated likewise, (M + (J - 1) / v) / M * (F + B) for equal
//     costs; its bubble cut as zb-h1's.
//   delayed (forward: once, the graph kept at the stashed weights):  F + B
//   delayed-recompute: its forward keeps no graph, so the backward
//     recomputes the forward from the stored input:            2F + B
//   petra (the rebuild is one more forward):                   2F + B
//   features_replay (forward, then replay + backward):         2F + B
//   nwise n, M: T(A=J, M, N=n) with a slot c(M) = (F + B) / (2M)
//   auxnet (each stage trains on its own):                     F + B
// nwise and auxnet add real CPU work that is not emulated (auxiliary heads,
// AuxNets), so their efficiency also shows what that costs on these cores.
// Measured: the coordinator's progress events give (step, time); the time per
// mini-batch is (t_last - t_warm) / (s_last - s_warm) over the steady steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/planner/pipeline_schedule.h"
#include "services/planner/timing_model.h"
#include "services/spec/job_spec.h"
#include "services/tensor/host_blocks.h"
#include "services/tensor/shared_ring.h"
#include "tests/bench/bench_util.h"
#include "tests/integration/cluster.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int> stages = {2, 4, 8, 16};
  std::vector<int> replicas = {1};
  std::vector<std::string> algorithms = {"backprop",        "gpipe",       "1f1b",    "1f1b1",
                                         "zb-h1",           "interleaved", "delayed", "petra",
                                         "features_replay", "nwise",       "auxnet"};
  int rounds = 3;
  std::vector<double> speeds;  // worker i's --emulated-speed (1 where not given)
  double forward_ms = 5;
  double backward_ms = 10;
  double weight_share = 0.5;
  int blocks_per_stage = 2;
  std::vector<std::pair<double, double>> stage_ms;  // --stage-ms: (F, B) per stage
  int batch = 32;
  std::vector<int64_t> shape = {2, 16, 16};
  int steps = 40;
  bool verbose = false;                              // per-stage idle time of every run
  bool peer = false;                                 // the gloo pipeline peer at every J (R = 1)
  bool shared_memory = true;                         // same-host payloads through shared rings
  bool place_outputs = true;                         // outputs made in the rings
  std::vector<std::string> compressions = {"none"};  // transport.compression per config
  std::vector<double> link_delays = {0};             // emulated one-way latency, ms
  bool predict = false;  // every job profiled and planned: the plan's prediction beside
};

// One configuration: an algorithm at J stages, with its ideal.
struct Config {
  std::string algorithm;             // the --algorithms name
  std::string label;                 // as printed
  std::string yaml;                  // the algorithm: line
  std::string compression = "none";  // transport.compression
  double link_delay_ms = 0;          // the workers' emulated one-way latency
  double planned_s = 0;              // the plan's prediction, when the job had one
  int J = 1;
  int R = 1;           // replicas of every stage
  double ideal_s = 0;  // per mini-batch
  int chunks = 1;      // interleaved: chunks per worker (J x chunks virtual stages)
  // planned, planned-blind: stages.partition auto, with or without
  // placement.per_worker_profiles; the ideal is the plan's prediction.
  bool planned = false;
  bool per_worker_profiles = false;
};

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "stagewise_emulated_bench: " << why
            << "\nsee the comment at the top of tests/bench/emulated_bench.cc for the options\n";
  std::exit(2);
}

template <typename T>
std::vector<T> ParseList(const std::string& flag, const std::string& text) {
  std::vector<T> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    T v{};
    if (!absl::SimpleAtoi(part, &v) || v < 1) Usage(absl::StrCat(flag, ": bad entry '", part, "'"));
    out.push_back(v);
  }
  if (out.empty()) Usage(absl::StrCat(flag, ": empty list"));
  return out;
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") Usage("help");
    if (flag == "--verbose") {
      o.verbose = true;
      continue;
    }
    if (flag == "--predict") {
      o.predict = true;
      continue;
    }
    if (flag == "--peer") {
      o.peer = true;
      continue;
    }
    if (flag == "--no-place-outputs") {
      o.place_outputs = false;
      continue;
    }
    if (flag == "--no-shared-memory") {
      o.shared_memory = false;
      continue;
    }
    if (i + 1 >= argc) Usage(absl::StrCat(flag, " needs a value"));
    const std::string value = argv[++i];
    auto number = [&](double* out) {
      if (!absl::SimpleAtod(value, out) || *out < 0)
        Usage(absl::StrCat(flag, ": bad '", value, "'"));
    };
    auto integer = [&](int* out) {
      if (!absl::SimpleAtoi(value, out) || *out < 1)
        Usage(absl::StrCat(flag, ": bad '", value, "'"));
    };
    if (flag == "--link-delay-ms") {
      o.link_delays.clear();
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        double v = 0;
        if (!absl::SimpleAtod(part, &v) || v < 0) Usage(absl::StrCat(flag, ": bad '", part, "'"));
        o.link_delays.push_back(v);
      }
      if (o.link_delays.empty()) Usage(absl::StrCat(flag, ": empty list"));
      continue;
    }
    if (flag == "--speeds") {
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        double v = 0;
        if (!absl::SimpleAtod(part, &v) || v <= 0) Usage(absl::StrCat(flag, ": bad '", part, "'"));
        o.speeds.push_back(v);
      }
    } else if (flag == "--stages") {
      o.stages = ParseList<int>(flag, value);
    } else if (flag == "--replicas") {
      o.replicas = ParseList<int>(flag, value);
    } else if (flag == "--algorithms") {
      o.algorithms = absl::StrSplit(value, ',', absl::SkipEmpty());
    } else if (flag == "--compression") {
      o.compressions = absl::StrSplit(value, ',', absl::SkipEmpty());
      for (const std::string& w : o.compressions) {
        if (w != "none" && w != "fp16" && w != "bf16") {
          Usage(absl::StrCat("--compression: '", w, "' is not none, fp16 or bf16"));
        }
      }
      if (o.compressions.empty()) Usage("--compression: empty list");
    } else if (flag == "--rounds") {
      integer(&o.rounds);
    } else if (flag == "--forward-ms") {
      number(&o.forward_ms);
    } else if (flag == "--backward-ms") {
      number(&o.backward_ms);
    } else if (flag == "--weight-share") {
      number(&o.weight_share);
      if (o.weight_share > 1) Usage("--weight-share: at most 1");
    } else if (flag == "--blocks-per-stage") {
      integer(&o.blocks_per_stage);
    } else if (flag == "--stage-ms") {
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        std::pair<std::string, std::string> fb = absl::StrSplit(part, '/');
        double f = -1, b = -1;
        if (!absl::SimpleAtod(fb.first, &f) || !absl::SimpleAtod(fb.second, &b) || f < 0 || b < 0) {
          Usage(absl::StrCat(flag, ": bad '", part, "' (expected FORWARD/BACKWARD in ms)"));
        }
        o.stage_ms.emplace_back(f, b);
      }
      if (o.stage_ms.empty()) Usage(absl::StrCat(flag, ": empty list"));
    } else if (flag == "--batch") {
      integer(&o.batch);
    } else if (flag == "--shape") {
      o.shape = ParseList<int64_t>(flag, value);
      if (o.shape.size() != 3) Usage("--shape: three entries C,H,W");
    } else if (flag == "--steps") {
      integer(&o.steps);
    } else {
      Usage(absl::StrCat("unknown option ", flag));
    }
  }
  if (!o.stage_ms.empty() &&
      (o.stages.size() != 1 || o.stages[0] != static_cast<int>(o.stage_ms.size()))) {
    Usage(absl::StrCat("--stage-ms: ", o.stage_ms.size(),
                       " stages given; --stages must be that one J"));
  }
  return o;
}

// The slowest stage's forward and backward seconds per mini-batch.
std::pair<double, double> StageWork(const Options& o) {
  if (o.stage_ms.empty()) {
    return {o.blocks_per_stage * o.forward_ms / 1e3, o.blocks_per_stage * o.backward_ms / 1e3};
  }
  double F = 0, B = 0;
  for (const auto& [f, b] : o.stage_ms) {
    F = std::max(F, f / 1e3);
    B = std::max(B, b / 1e3);
  }
  return {F, B};
}

// The model line: K blocks per stage at --forward-ms/--backward-ms, or each
// stage's --stage-ms split over its blocks; x R (see JobYaml).
std::string ModelYaml(const Options& o, int depth, int R) {
  if (o.stage_ms.empty()) {
    return absl::StrFormat(
        "model: {name: emulated, depth: %d, forward_ms: %g, backward_ms: %g, "
        "backward_weight_share: %g}\n",
        depth, o.forward_ms * R, o.backward_ms * R, o.weight_share);
  }
  std::vector<std::string> f, b;
  for (int i = 0; i < depth; ++i) {
    const auto& [sf, sb] = o.stage_ms[i / o.blocks_per_stage];
    f.push_back(absl::StrFormat("%g", sf * R / o.blocks_per_stage));
    b.push_back(absl::StrFormat("%g", sb * R / o.blocks_per_stage));
  }
  return absl::StrFormat(
      "model: {name: emulated, depth: %d, block_forward_ms: [%s], block_backward_ms: [%s], "
      "backward_weight_share: %g}\n",
      depth, absl::StrJoin(f, ", "), absl::StrJoin(b, ", "), o.weight_share);
}

std::vector<Config> Configs(const Options& o, int J, int R) {
  const auto [F, B] = StageWork(o);
  const int M = 2 * J;
  std::vector<Config> out;
  for (const std::string& a : o.algorithms) {
    if (a == "interleaved" && R > 1) continue;  // one pipeline only (docs/algorithms.md)
    Config c;
    c.algorithm = a;
    c.J = J;
    c.R = R;
    if (a == "backprop") {
      c.label = "backprop M=1";
      c.yaml = "{name: backprop}";
      c.ideal_s = J * (F + B);
    } else if (a == "zb-h1") {
      c.label = absl::StrCat("backprop ZB-H1 M=", M);
      c.yaml = absl::StrCat("{name: backprop, micro_batches: ", M, ", schedule: zb-h1}");
      namespace pl = stagewise::pipeline;
      pl::ScheduleOptions so{.stages = J, .micro_batches = M};
      const double per = 1.0 / M;  // a micro-batch's share of the stage's work
      so.costs.assign(
          J, pl::StageCosts{F * per, B * per * (1 - o.weight_share), B * per * o.weight_share});
      auto orders = pl::StageOrders(stagewise::PipelineSchedule::kZbH1, so);
      if (!orders.ok()) Usage(orders.status().ToString());
      auto sim = pl::Simulate(*orders, so);
      if (!sim.ok()) Usage(sim.status().ToString());
      c.ideal_s = sim->seconds;
    } else if (a == "interleaved") {
      // Two chunks per worker of K/2 blocks each: 2J virtual stages.
      c.chunks = 2;
      if (o.blocks_per_stage % c.chunks != 0) {
        Usage("--algorithms interleaved: --blocks-per-stage must be even (2 chunks per worker)");
      }
      c.label = absl::StrCat("backprop interleaved v=2 M=", M);
      c.yaml = absl::StrCat("{name: backprop, micro_batches: ", M, ", schedule: interleaved}");
      namespace pl = stagewise::pipeline;
      pl::ScheduleOptions so{.stages = J, .micro_batches = M, .chunks = c.chunks};
      const double per = 1.0 / M;  // a micro-batch's share of the worker's work (all chunks)
      so.costs.assign(
          J, pl::StageCosts{F * per, B * per * (1 - o.weight_share), B * per * o.weight_share});
      auto orders = pl::StageOrders(stagewise::PipelineSchedule::kInterleaved, so);
      if (!orders.ok()) Usage(orders.status().ToString());
      auto sim = pl::Simulate(*orders, so);
      if (!sim.ok()) Usage(sim.status().ToString());
      c.ideal_s = sim->seconds;
    } else if (a == "planned" || a == "planned-blind") {
      // The planner cuts the model (partition: auto) from every worker's
      // profile, or from one worker's; 1F1B. Ideal: the plan's prediction.
      c.planned = true;
      c.per_worker_profiles = a == "planned";
      c.label = absl::StrCat("1F1B M=", M,
                             c.per_worker_profiles ? " per-worker plan" : " one-profile plan");
      c.yaml = absl::StrCat("{name: backprop, micro_batches: ", M, ", schedule: 1f1b}");
      c.ideal_s = 0;  // from the plan, once it ran
    } else if (a == "gpipe" || a == "1f1b" || a == "1f1b1") {
      const bool gpipe = a == "gpipe";
      const int lookahead = a == "1f1b1" ? 1 : 0;
      c.label = absl::StrCat("backprop ", gpipe ? "GPipe" : "1F1B", " M=", M,
                             lookahead > 0 ? " la=1" : "");
      c.yaml =
          absl::StrCat("{name: backprop, micro_batches: ", M,
                       ", schedule: ", gpipe ? "gpipe" : "1f1b", ", lookahead: ", lookahead, "}");
      c.ideal_s = (M + J - 1.0) / M * (F + B);
    } else if (a == "delayed" || a == "delayed-auto") {
      // One forward keeping its graph, then the backward through it; auto:
      // each stage as deep as the plan says covers the links' round trip.
      c.label = a;
      c.yaml = a == "delayed" ? "{name: delayed, forward: once}"
                              : "{name: delayed, forward: once, max_in_flight: auto}";
      c.ideal_s = F + B;
    } else if (a == "delayed-recompute" || a == "petra" || a == "features_replay") {
      // One forward that keeps no graph, then a recomputation, rebuild or
      // replay (one more forward) and the backward, per stage and step.
      c.label = a;
      c.yaml = a == "delayed-recompute" ? "{name: delayed, forward: recompute}"
                                        : absl::StrCat("{name: ", a, "}");
      c.ideal_s = 2 * F + B;
    } else if (a == "nwise") {
      c.label = "nwise n=2 M=2";
      c.yaml = "{name: nwise, n: 2, micro_batches: 2, aux_head: linear}";
      stagewise::timing::MicroBatchCost cost;
      cost.c1 = (F + B) / 2;
      auto t = stagewise::timing::InterlockTimePerBatch(J, 2, std::min(2, J), cost);
      if (!t.ok()) Usage(t.status().ToString());
      c.ideal_s = *t;
    } else if (a == "auxnet") {
      c.label = "auxnet K=J";
      c.yaml = "{name: auxnet, auxnet: conv, serial_loss_every: 0, beta: 1.0}";
      c.ideal_s = F + B;
    } else {
      Usage(absl::StrCat("--algorithms: unknown '", a, "'"));
    }
    out.push_back(c);
  }
  if (o.peer && R == 1) {
    Config c;
    c.algorithm = "peer";
    c.label = absl::StrCat("gloo peer 1F1B M=", M);
    c.J = J;
    c.ideal_s = (M + J - 1.0) / M * (F + B);
    out.push_back(c);
  }
  return out;
}

// The gloo pipeline peer (tests/bench/gloo_pipeline_peer.py) at c.J: its
// median seconds per mini-batch, or a negative number on failure.
double MeasurePeer(const Options& o, const Config& c) {
  if (!o.stage_ms.empty()) {
    std::cerr << "--peer: not with --stage-ms (the peer's blocks take one time)\n";
    return -1;
  }
  const std::string command = absl::StrCat(
      "/usr/bin/python3 ", STAGEWISE_SOURCE_DIR, "/tests/bench/gloo_pipeline_peer.py --stages ",
      c.J, " --micro-batches ", 2 * c.J, " --forward-ms ", o.forward_ms, " --backward-ms ",
      o.backward_ms, " --blocks-per-stage ", o.blocks_per_stage, " --batch ", o.batch, " --shape ",
      absl::StrJoin(o.shape, ","), " --steps ", o.steps);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string text;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) text += buffer;
  const int rc = pclose(pipe);
  const std::string key = "\"seconds_per_batch\": ";
  const size_t at = text.find(key);
  double seconds = -1;
  if (rc != 0 || at == std::string::npos ||
      !absl::SimpleAtod(
          text.substr(at + key.size(), text.find_first_of(",}", at) - at - key.size()), &seconds)) {
    std::cerr << c.label << " J=" << c.J << ": the peer failed (" << command << ")\n";
    return -1;
  }
  return seconds;
}

std::string JobYaml(const Options& o, const Config& c, int total_steps) {
  const int depth = c.J * o.blocks_per_stage;
  // Interleaved: J x v virtual stages of K / v blocks (worker j holds j, j + J, ...).
  const int S = c.J * c.chunks, per = o.blocks_per_stage / c.chunks;
  std::vector<std::string> ranges;
  for (int s = 0; s < S; ++s) {
    const int end = s + 1 == S ? depth + 1 : (s + 1) * per;  // + head
    ranges.push_back(absl::StrCat("[", s * per, ", ", end, "]"));
  }
  return absl::StrCat(
      "name: emulated-bench\nseed: 0\n",
      // An emulated block waits its time per batch_size samples, scaled to the
      // samples it sees: R x the time per global batch of R x --batch keeps
      // each replica's share of --batch at forward_ms (weak scaling: every
      // replica is a device as fast as the R = 1 one).
      ModelYaml(o, depth, c.R), "data: {dataset: synthetic, train_size: ", 64 * o.batch * c.R,
      ", test_size: ", o.batch, ", shape: [", absl::StrJoin(o.shape, ", "), "], classes: 10}\n",
      "optimizer: {name: sgd, lr: 0.01}\n", "batch_size: ", o.batch * c.R, "\n",
      "steps: ", total_steps, "\n", "eval: {every_epochs: 0, at_end: false}\n",
      "stages: {count: ", c.J, ", replicas: ", c.R, ", chunks_per_worker: ", c.chunks,
      ", partition: ", c.planned ? "auto" : absl::StrCat("[", absl::StrJoin(ranges, ", "), "]"),
      "}\n",
      c.planned || c.link_delay_ms > 0 || o.predict
          ? absl::StrCat(
                "placement: {per_worker_profiles: ", c.per_worker_profiles ? "true" : "false",
                ", link_rtt_ms: ", 2 * c.link_delay_ms,
                o.predict && c.compression == "none" ? ", link_gbps: 1000" : "", "}\n")
          : "",
      "algorithm: ", c.yaml, "\n",
      "transport: {compression: ", o.predict && c.compression == "none" ? "auto" : c.compression,
      "}\n");
}

// Seconds per mini-batch in steady state, or a negative number on failure.
double Measure(stagewise::testing::Cluster& cluster, const Options& o, Config& c) {
  const int64_t payloads_before = stagewise::SharedRing::TotalPayloads();
  const int64_t full_before = stagewise::SharedRing::TotalFull();
  const int64_t in_place_before = stagewise::SharedRing::TotalPublishedInPlace();
  const stagewise::HostBlockStats blocks_before = stagewise::GetHostBlockStats();
  const int warm = 2 * c.J + 2;
  const int total = warm + o.steps;
  std::mutex mu;
  std::vector<std::pair<int64_t, Clock::time_point>> seen;  // first time each step is seen
  auto id = cluster.manager().Submit(JobYaml(o, c, total));
  if (!id.ok()) {
    std::cerr << c.label << " J=" << c.J << " R=" << c.R << ": " << id.status() << "\n";
    return -1;
  }
  auto sub = cluster.manager().Subscribe(*id, [&](const stagewise::v1::JobEvent& e) {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu);
    if (e.status().state() != stagewise::v1::RUNNING) return;
    if (seen.empty() || e.status().step() > seen.back().first) {
      seen.emplace_back(e.status().step(), now);
    }
  });
  auto st = cluster.WaitForJob(*id, absl::Minutes(30));
  if (sub.ok()) cluster.manager().Unsubscribe(*sub);
  if (!st.ok() || st->state() != stagewise::v1::SUCCEEDED) {
    std::cerr << c.label << " J=" << c.J << " R=" << c.R
              << " failed: " << (st.ok() ? st->reason() : st.status().ToString()) << "\n";
    return -1;
  }
  // The plan's prediction for this configuration's algorithm, when the job
  // had a plan (services/planner/planner.h, PlanSummary's keys).
  const int M = 2 * c.J;
  const std::map<std::string, std::string> predicted_key = {
      {"1f1b", absl::StrCat("backprop_1f1b_M", M)},
      {"1f1b1", absl::StrCat("backprop_1f1b_M", M)},
      {"gpipe", absl::StrCat("backprop_gpipe_M", M)},
      {"zb-h1", absl::StrCat("backprop_zb_h1_M", M)},
      {"delayed", "delayed"},
      {"delayed-auto", "delayed"},
      {"delayed-recompute", "delayed"},
      {"petra", "petra"},
      {"features_replay", "features_replay"}};
  if (const auto key = predicted_key.find(c.algorithm); key != predicted_key.end()) {
    const auto it = st->summary().find("plan.predicted." + key->second);
    if (it != st->summary().end()) c.planned_s = it->second;
  }
  if (o.verbose) {
    std::string keys;
    for (const auto& [k, v] : st->summary()) {
      if (absl::StartsWith(k, "plan.predicted."))
        absl::StrAppendFormat(&keys, " %s=%.2fms", k, 1e3 * v);
      if (absl::StartsWith(k, "plan.stage") && absl::EndsWith(k, ".in_flight"))
        absl::StrAppendFormat(&keys, " %s=%.0f", k, v);
    }
    std::cerr << c.label << " J=" << c.J << " predictions:" << keys << "\n";
  }
  if (c.planned) {
    // The plan's predicted time per mini-batch under the job's schedule, and its cut.
    const auto it = st->summary().find(absl::StrCat("plan.predicted.backprop_1f1b_M", 2 * c.J));
    if (it != st->summary().end()) c.ideal_s = it->second;
    std::string cut;
    for (int j = 0; j < c.J; ++j) {
      const auto b = st->summary().find(absl::StrCat("plan.stage", j, ".block_begin"));
      const auto e = st->summary().find(absl::StrCat("plan.stage", j, ".block_end"));
      if (b != st->summary().end() && e != st->summary().end()) {
        absl::StrAppend(&cut, j ? " " : "", "[", b->second, ",", e->second, ")");
      }
    }
    std::cerr << c.label << " J=" << c.J << ": planned " << cut << "\n";
  }
  if (o.verbose) {
    // Where a stage's time went: waiting for a message, per mini-batch.
    std::string line = absl::StrCat(c.label, " J=", c.J, " idle ms per mini-batch by stage:");
    for (int j = 0; j < c.J; ++j) {
      const auto it = st->summary().find(absl::StrCat("stage", j, ".idle_seconds"));
      if (it != st->summary().end()) {
        absl::StrAppendFormat(&line, " %.1f", 1e3 * it->second / total);
      }
    }
    absl::StrAppend(
        &line, "; payloads through shared rings: ",
        stagewise::SharedRing::TotalPayloads() - payloads_before,
        " (made there, no copy: ", stagewise::SharedRing::TotalPublishedInPlace() - in_place_before,
        "), inline because a ring was full: ", stagewise::SharedRing::TotalFull() - full_before);
    const stagewise::HostBlockStats blocks = stagewise::GetHostBlockStats();
    absl::StrAppend(&line, "; large host tensors reused: ", blocks.reused - blocks_before.reused,
                    ", fresh: ", blocks.fresh - blocks_before.fresh);
    std::cerr << line << "\n";
  }
  std::lock_guard<std::mutex> lock(mu);
  // The first report at or past the warm-up, and the last one.
  auto first =
      std::find_if(seen.begin(), seen.end(), [&](const auto& p) { return p.first >= warm; });
  if (first == seen.end() || seen.back().first <= first->first) {
    std::cerr << c.label << " J=" << c.J << ": too few progress reports\n";
    return -1;
  }
  const double seconds = std::chrono::duration<double>(seen.back().second - first->second).count();
  return seconds / static_cast<double>(seen.back().first - first->first);
}

using stagewise::bench::Median;

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  at::set_num_threads(1);
  const int max_j = *std::max_element(o.stages.begin(), o.stages.end());
  const int max_r = *std::max_element(o.replicas.begin(), o.replicas.end());
  std::cout << absl::StrFormat(
      "emulated accelerators: %d blocks per stage, %.3g ms forward and %.3g ms backward per block "
      "and mini-batch of %d, activations [%s] per sample, %d steady steps per run, %d rounds "
      "interleaved\n",
      o.blocks_per_stage, o.forward_ms, o.backward_ms, o.batch, absl::StrJoin(o.shape, ","),
      o.steps, o.rounds);
  if (!o.stage_ms.empty()) {
    std::vector<std::string> per;
    for (const auto& [f, b] : o.stage_ms) per.push_back(absl::StrFormat("%g/%g", f, b));
    std::cout << "  instead, each stage's forward/backward ms (--stage-ms): "
              << absl::StrJoin(per, ", ") << "\n";
  }
  // Workers of their own for every emulated link latency.
  std::map<double, std::unique_ptr<stagewise::testing::Cluster>> clusters;
  for (const double delay : o.link_delays) {
    stagewise::testing::Cluster::Options co;
    co.workers = max_j * max_r;
    co.emulated_speeds = o.speeds;
    if (!o.shared_memory) co.shared_memory_dir.clear();
    co.place_outputs = o.place_outputs;
    co.link_delay_ms = delay;
    auto cluster = std::make_unique<stagewise::testing::Cluster>(co);
    if (!cluster->WaitForWorkers(co.workers, absl::Seconds(60))) {
      std::cerr << "workers did not come up\n";
      return 1;
    }
    clusters[delay] = std::move(cluster);
  }
  std::vector<Config> configs;
  for (int R : o.replicas) {
    for (int J : o.stages) {
      for (const Config& c : Configs(o, J, R)) {
        // The wire format of the activations and gradients, per row (the
        // peer has one).
        for (const std::string& w :
             c.algorithm == "peer" ? std::vector<std::string>{"none"} : o.compressions) {
          for (const double delay :
               c.algorithm == "peer" ? std::vector<double>{0} : o.link_delays) {
            Config with = c;
            with.compression = w;
            with.link_delay_ms = delay;
            if (w != "none") absl::StrAppend(&with.label, " ", w);
            if (delay > 0) absl::StrAppend(&with.label, absl::StrFormat(" +%gms", delay));
            configs.push_back(with);
          }
        }
      }
    }
  }
  std::map<size_t, std::vector<double>> measured;  // config index -> seconds per mini-batch
  bool failed = false;
  for (int r = 0; r < o.rounds; ++r) {
    for (size_t i = 0; i < configs.size(); ++i) {
      const double s = configs[i].algorithm == "peer"
                           ? MeasurePeer(o, configs[i])
                           : Measure(*clusters.at(configs[i].link_delay_ms), o, configs[i]);
      if (s < 0) {
        failed = true;
        continue;
      }
      measured[i].push_back(s);
      std::cerr << absl::StrFormat("round %d: %-28s J=%-2d R=%-2d %8.2f ms/batch (ideal %.2f)\n",
                                   r + 1, configs[i].label, configs[i].J, configs[i].R, 1e3 * s,
                                   1e3 * configs[i].ideal_s);
    }
  }
  // samples/s of the same algorithm and J at R = 1, for the scaling column.
  std::map<std::pair<std::string, int>, double> single;
  for (size_t i = 0; i < configs.size(); ++i) {
    const auto it = measured.find(i);
    if (it == measured.end() || configs[i].R != 1) continue;
    single[{configs[i].label, configs[i].J}] = o.batch / Median(it->second);
  }
  // 1F1B's ideal and median at the same J and R, for the bubble-cut column.
  std::map<std::tuple<int, int, double>, std::pair<double, double>> one_f_one_b;
  for (size_t i = 0; i < configs.size(); ++i) {
    const auto it = measured.find(i);
    if (it == measured.end() || configs[i].algorithm != "1f1b") continue;
    one_f_one_b[{configs[i].J, configs[i].R, configs[i].link_delay_ms}] = {configs[i].ideal_s,
                                                                           Median(it->second)};
  }
  std::map<int, double> peer;  // J -> the gloo peer's median
  for (size_t i = 0; i < configs.size(); ++i) {
    const auto it = measured.find(i);
    if (it != measured.end() && configs[i].algorithm == "peer") {
      peer[configs[i].J] = Median(it->second);
    }
  }
  std::cout << absl::StrFormat("%-28s %3s %3s %10s %10s %16s %11s %9s %10s %8s %11s %8s %11s\n",
                               "algorithm", "J", "R", "ideal ms", "median ms", "min-max ms",
                               "efficiency", "spread", "samples/s", "scaling", "bubble cut",
                               "vs peer", "planned ms");
  for (size_t i = 0; i < configs.size(); ++i) {
    const auto it = measured.find(i);
    if (it == measured.end()) continue;
    const std::vector<double>& v = it->second;
    const double med = Median(v);
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    // Spread of the efficiency ratio across rounds, relative to its median.
    const double spread = (*hi - *lo) / med;
    const double samples = o.batch * configs[i].R / med;
    // Weak scaling: samples/s over R x the R = 1 figure.
    const auto one = single.find({configs[i].label, configs[i].J});
    const std::string scaling =
        one == single.end()
            ? "-"
            : absl::StrFormat("%.1f%%", 100 * samples / (configs[i].R * one->second));
    // Measured saving against 1F1B over the saving its ideal predicts.
    std::string cut = "-";
    const auto base = one_f_one_b.find({configs[i].J, configs[i].R, configs[i].link_delay_ms});
    if ((configs[i].algorithm == "zb-h1" || configs[i].algorithm == "interleaved") &&
        base != one_f_one_b.end()) {
      const double predicted = base->second.first - configs[i].ideal_s;
      if (predicted > 0)
        cut = absl::StrFormat("%.0f%%", 100 * (base->second.second - med) / predicted);
    }
    // Time per mini-batch over the gloo peer's 1F1B at the same J (< 1: faster).
    std::string vs_peer = "-";
    const auto p = peer.find(configs[i].J);
    if (p != peer.end() && configs[i].R == 1) vs_peer = absl::StrFormat("%.2fx", med / p->second);
    // The plan's prediction (link latency included) and its error.
    const std::string planned = configs[i].planned_s > 0
                                    ? absl::StrFormat("%.1f (%+.0f%%)", 1e3 * configs[i].planned_s,
                                                      100 * (configs[i].planned_s - med) / med)
                                    : "-";
    std::cout << absl::StrFormat(
        "%-28s %3d %3d %10.2f %10.2f %7.2f-%-8.2f %10.1f%% %8.1f%% %10.0f %8s %11s %8s %11s\n",
        configs[i].label, configs[i].J, configs[i].R, 1e3 * configs[i].ideal_s, 1e3 * med,
        1e3 * *lo, 1e3 * *hi, 100 * configs[i].ideal_s / med, 100 * spread, samples, scaling, cut,
        vs_peer, planned);
  }
  return failed ? 1 : 0;
}
