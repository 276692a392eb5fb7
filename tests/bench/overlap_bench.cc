// What overlapping the replicas' all-reduce with the backward buys
// (sync.overlap, docs/replicas.md): R replicas as threads of this process,
// each a stack of linear layers training on its own micro-batches, averaging
// their gradients over real gloo on loopback (worker/collective.h) either
// after the step's backward (`after`) or bucket by bucket while the last
// backward runs (`overlap`, worker/overlap.h). `alone` is the same step
// without averaging (compute only). Every round runs the three modes once,
// interleaved; the table prints medians, spread, and the communication each
// mode leaves exposed (step - alone). Never a test.
//
// On a CPU the backward's arithmetic and gloo's copies share the cores, so
// overlap can only help where the compute runs elsewhere: --backward-ms
// emulates an accelerator (as the `emulated` model does, docs/models.md),
// every layer's backward waiting that long instead of computing (use a small
// --batch so that the real arithmetic stays small).
//
//   build/bin/stagewise_overlap_bench [options]
//     --replicas 2        R threads
//     --layers 8          linear layers (width x width, ReLU between)
//     --width 1024
//     --batch 64          samples per micro-batch
//     --micro-batches 2   backwards per step; the last one runs armed
//     --bucket-mb 4       bucket size
//     --steps 10          measured steps per mode and round (after 2 warm-up)
//     --rounds 5
//     --backward-ms 0     per layer and micro-batch: the emulated backward
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/bench_util.h"
#include "worker/collective.h"
#include "worker/overlap.h"

namespace {

using Clock = std::chrono::steady_clock;
using stagewise::worker::OverlappedAverage;
using stagewise::worker::ReplicaGroup;
using stagewise::worker::ReplicaGroupOptions;

struct Options {
  int replicas = 2;
  int layers = 8;
  int width = 1024;
  int batch = 64;
  int micro_batches = 2;
  double bucket_mb = 4;
  int steps = 10;
  int rounds = 5;
  double backward_ms = 0;
};

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "stagewise_overlap_bench: " << why
            << "\nsee the comment at the top of tests/bench/overlap_bench.cc for the options\n";
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") Usage("help");
    if (i + 1 >= argc) Usage(absl::StrCat(flag, " needs a value"));
    const std::string value = argv[++i];
    auto integer = [&](int* out) {
      if (!absl::SimpleAtoi(value, out) || *out < 1) {
        Usage(absl::StrCat(flag, ": bad '", value, "'"));
      }
    };
    if (flag == "--replicas") {
      integer(&o.replicas);
    } else if (flag == "--layers") {
      integer(&o.layers);
    } else if (flag == "--width") {
      integer(&o.width);
    } else if (flag == "--batch") {
      integer(&o.batch);
    } else if (flag == "--micro-batches") {
      integer(&o.micro_batches);
    } else if (flag == "--steps") {
      integer(&o.steps);
    } else if (flag == "--rounds") {
      integer(&o.rounds);
    } else if (flag == "--backward-ms") {
      if (!absl::SimpleAtod(value, &o.backward_ms) || o.backward_ms < 0) {
        Usage(absl::StrCat(flag, ": bad '", value, "'"));
      }
    } else if (flag == "--bucket-mb") {
      if (!absl::SimpleAtod(value, &o.bucket_mb) || o.bucket_mb <= 0) {
        Usage(absl::StrCat(flag, ": bad '", value, "'"));
      }
    } else {
      Usage(absl::StrCat("unknown option ", flag));
    }
  }
  return o;
}

enum class Mode { kAlone, kAfter, kOverlap };
constexpr const char* kModeNames[] = {"alone", "after", "overlap"};

// One replica: its model, its group, its overlap hooks.
struct Replica {
  torch::nn::Sequential net;
  std::unique_ptr<ReplicaGroup> group;
  std::unique_ptr<OverlappedAverage> overlap;
  torch::Tensor x, y;
};

// The layers in turn; with --backward-ms, a hook on every layer's output
// waits that long in the backward (an emulated device: the core stays free).
torch::Tensor Forward(const Options& o, Replica& r, torch::Tensor h) {
  for (auto& layer : *r.net) {
    h = layer.forward(h);
    if (o.backward_ms > 0 && layer.ptr()->as<torch::nn::LinearImpl>() != nullptr &&
        h.requires_grad()) {
      const auto wait = std::chrono::microseconds(static_cast<int64_t>(o.backward_ms * 1e3));
      h.register_hook([wait](torch::Tensor grad) {
        std::this_thread::sleep_for(wait);
        return grad;
      });
    }
  }
  return h;
}

// Seconds of `steps` steps of `mode` on this replica.
double RunSteps(const Options& o, Replica& r, Mode mode, int steps) {
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    for (auto& p : r.net->parameters()) p.mutable_grad() = torch::Tensor();
    for (int m = 0; m < o.micro_batches; ++m) {
      torch::Tensor loss = torch::mse_loss(Forward(o, r, r.x), r.y);
      if (mode == Mode::kOverlap && m + 1 == o.micro_batches) r.overlap->Arm();
      loss.backward();
    }
    absl::Status st;
    if (mode == Mode::kAfter) st = r.group->AverageGradients(r.net->parameters());
    if (mode == Mode::kOverlap) st = r.overlap->Finish();
    if (!st.ok()) {
      std::cerr << st << "\n";
      std::exit(1);
    }
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Every replica thread waits here until all have arrived (reusable).
class Rendezvous {
 public:
  explicit Rendezvous(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  int generation_ = 0;
};

using stagewise::bench::Median;

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  at::set_num_threads(1);
  const int64_t params = int64_t{o.layers} * (int64_t{o.width} * o.width + o.width);
  std::cout << absl::StrFormat(
      "%d replicas (threads) x %d linear layers of %d (%.1f MB of gradients), %d micro-batches of "
      "%d, buckets of %.3g MB, gloo on loopback, emulated backward %.3g ms per layer; %d steps "
      "per mode and round, %d rounds interleaved\n",
      o.replicas, o.layers, o.width, 4.0 * params / 1e6, o.micro_batches, o.batch, o.bucket_mb,
      o.backward_ms, o.steps, o.rounds);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<Replica> replicas(o.replicas);
  Rendezvous sync(o.replicas);
  // seconds per step: [mode] -> one per round (the slowest replica's).
  std::map<int, std::vector<double>> per_mode;
  std::vector<std::vector<double>> seconds(o.replicas, std::vector<double>(3));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < o.replicas; ++rank) {
    threads.emplace_back([&, rank] {
      Replica& r = replicas[rank];
      torch::manual_seed(1);
      for (int l = 0; l < o.layers; ++l) {
        r.net->push_back(torch::nn::Linear(o.width, o.width));
        if (l + 1 < o.layers) r.net->push_back(torch::nn::ReLU());
      }
      torch::manual_seed(100 + rank);
      r.x = torch::randn({o.batch, o.width});
      r.y = torch::randn({o.batch, o.width});
      ReplicaGroupOptions go;
      go.rank = rank;
      go.size = o.replicas;
      go.bucket_bytes = static_cast<int64_t>(o.bucket_mb * (1 << 20));
      go.timeout = absl::Seconds(120);
      auto group = ReplicaGroup::Create(store, go);
      if (!group.ok()) {
        std::cerr << group.status() << "\n";
        std::exit(1);
      }
      r.group = *std::move(group);
      r.overlap =
          std::make_unique<OverlappedAverage>(r.group.get(), r.net->parameters(), go.bucket_bytes);
      for (Mode m : {Mode::kAlone, Mode::kAfter, Mode::kOverlap}) RunSteps(o, r, m, 2);
      for (int round = 0; round < o.rounds; ++round) {
        for (Mode m : {Mode::kAlone, Mode::kAfter, Mode::kOverlap}) {
          sync.Wait();
          seconds[rank][static_cast<int>(m)] = RunSteps(o, r, m, o.steps) / o.steps;
          sync.Wait();
          if (rank == 0) {
            double slowest = 0;
            for (int q = 0; q < o.replicas; ++q) {
              slowest = std::max(slowest, seconds[q][static_cast<int>(m)]);
            }
            per_mode[static_cast<int>(m)].push_back(slowest);
            std::cerr << absl::StrFormat("round %d: %-8s %8.2f ms/step\n", round + 1,
                                         kModeNames[static_cast<int>(m)], 1e3 * slowest);
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const double alone = Median(per_mode[0]);
  std::cout << absl::StrFormat("%-8s %10s %16s %8s %14s %10s\n", "mode", "median ms", "min-max ms",
                               "spread", "exposed comm", "vs after");
  const double after = Median(per_mode[1]);
  for (int m = 0; m < 3; ++m) {
    const std::vector<double>& v = per_mode[m];
    const double med = Median(v);
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    std::cout << absl::StrFormat("%-8s %10.2f %7.2f-%-8.2f %7.1f%% %11.2f ms %9.3fx\n",
                                 kModeNames[m], 1e3 * med, 1e3 * *lo, 1e3 * *hi,
                                 100 * (*hi - *lo) / med, 1e3 * (med - alone), med / after);
  }
  return 0;
}
