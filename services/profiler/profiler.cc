#include "services/profiler/profiler.h"

#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/models/aux_head.h"
#include "services/models/batch_norm.h"
#include "services/models/blocks.h"
#include "services/models/loss.h"
#include "services/models/memory_meter.h"
#include "services/models/modal_pass.h"
#include "services/models/model.h"
#include "services/tensor/codec.h"
#include "services/training/optimizer.h"

namespace stagewise::planner {
namespace {

int64_t Bytes(const torch::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

std::string Shape(const std::vector<int64_t>& s) { return absl::StrJoin(s, "x"); }

std::string ModelName(const ModelSpec& m) {
  if (m.name == ModelKind::kTorchScript) {
    return absl::StrCat(
        "torchscript ",
        std::filesystem::path(m.script_file.empty() ? m.path : m.script_file).filename().string());
  }
  std::string name(NameOf(m.name));
  if (m.depth > 0) absl::StrAppend(&name, "-", m.depth);
  if (m.width > 0) absl::StrAppend(&name, " width ", m.width);
  return name;
}

// One timed figure of a profile: `setup` and `teardown` run untimed around
// every sample of `timed`; the median of the samples lands in `*out`.
struct Probe {
  Probe(double* out, std::function<void()> setup, std::function<void()> timed,
        std::function<void()> teardown = nullptr)
      : out(out), setup(std::move(setup)), timed(std::move(timed)), teardown(std::move(teardown)) {}
  double* out;
  std::function<void()> setup, timed, teardown;
  std::vector<double> samples;
};

// Runs every probe once per round, for warmup + repeats rounds, and keeps the
// median of each probe's timed rounds. Interleaving spreads each figure's
// samples over the whole profile: a disturbance of a few hundred milliseconds
// (another process, a page-cache flush, frequency changes) shifts every
// figure a little instead of the few figures measured back to back during it,
// which is what made repeated profiles disagree by 20% on single columns.
void RunInterleaved(std::vector<Probe>& probes, const ProfileOptions& o, bool cuda,
                    const std::function<void(int round)>& on_round) {
  const int rounds = o.warmup + o.repeats;
  for (int r = 0; r < rounds; ++r) {
    for (Probe& p : probes) {
      if (p.setup) p.setup();
      if (cuda) torch::cuda::synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      p.timed();
      if (cuda) torch::cuda::synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (p.teardown) p.teardown();
      if (r >= o.warmup) p.samples.push_back(s);
    }
    if (on_round) on_round(r);
  }
  for (Probe& p : probes) {
    std::sort(p.samples.begin(), p.samples.end());
    *p.out = p.samples.empty() ? 0.0 : p.samples[p.samples.size() / 4];
  }
}

std::string AuxHeadOf(const JobSpec& spec, const ProfileOptions& o) {
  if (!o.aux_head.empty()) return o.aux_head;
  for (const PhaseSpec& phase : Phases(spec)) {
    if (const auto* nwise = phase.algorithm.get_if<NwiseOptions>()) return nwise->aux_head;
  }
  return "";
}

}  // namespace

std::string DefaultProfileCacheDir() {
  if (const char* d = std::getenv("STAGEWISE_PROFILE_CACHE"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    return absl::StrCat(x, "/stagewise/profiles");
  }
  if (const char* h = std::getenv("HOME"); h && *h) {
    return absl::StrCat(h, "/.cache/stagewise/profiles");
  }
  return ".stagewise-profiles";
}

std::string ProfileKey(const JobSpec& spec, int64_t batch_size, const torch::Device& device,
                       int threads, const std::string& aux_head) {
  auto plan = models::PlanModel(spec.model);
  std::string blocks;
  if (plan.ok()) {
    for (const auto& b : *plan) {
      absl::StrAppend(&blocks, b.kind, ":", Shape(b.in_shape), ">", Shape(b.out_shape), ":",
                      b.in_channels, ",", b.out_channels, ",", b.mid_channels, ",", b.stride,
                      b.bottleneck ? "b" : "", b.imagenet_stem ? "i" : "", b.pair ? "p" : "", ";");
    }
  }
  std::string text =
      absl::StrCat(ModelName(spec.model), "|", blocks, "|", NameOf(spec.optimizer.name), "|",
                   spec.optimizer.momentum, "|", aux_head);
  // An emulated block waits what the spec says: other waits, other times; a
  // worker whose emulated device runs at another speed measures other times.
  if (spec.model.name == ModelKind::kEmulated) {
    absl::StrAppend(&text, "|emulated ", spec.model.forward_ms, "/", spec.model.backward_ms, "/",
                    spec.model.backward_weight_share, "|",
                    absl::StrJoin(spec.model.block_forward_ms, ","), "/",
                    absl::StrJoin(spec.model.block_backward_ms, ","));
    if (models::EmulatedSpeed() != 1.0) {
      absl::StrAppend(&text, "|emulated speed ", models::EmulatedSpeed());
    }
  }
  // A TorchScript model is its file: two files with the same shapes differ.
  if (spec.model.name == ModelKind::kTorchScript) {
    absl::StrAppend(&text, "|", spec.model.script_file, "|", spec.model.script_bytes);
    std::error_code ec;
    const auto mtime = std::filesystem::last_write_time(spec.model.script_file, ec);
    if (!ec) absl::StrAppend(&text, "|", mtime.time_since_epoch().count());
  }
  const uint64_t h = std::hash<std::string>{}(text);
  return absl::StrCat(NameOf(spec.model.name), "-b", batch_size, "-", device.str(), "-t", threads,
                      "-", absl::Hex(h, absl::kZeroPad16));
}

absl::StatusOr<ModelProfile> ProfileModel(const JobSpec& spec, int64_t batch,
                                          const torch::Device& device, const ProfileOptions& o) {
  if (batch < 1) return absl::InvalidArgumentError("batch_size: must be at least 1");
  auto account = std::make_shared<models::MemoryAccount>();
  models::ScopedMemoryAccount scope(account);
  const bool cuda = device.is_cuda();
  const std::string aux_spec = AuxHeadOf(spec, o);
  ModelProfile p;
  p.model = ModelName(spec.model);
  p.batch_size = batch;
  p.device = device.str();
  p.threads = at::get_num_threads();
  p.repeats = o.repeats;
  p.aux_head = aux_spec;
  p.key = ProfileKey(spec, batch, device, p.threads, aux_spec);
  // Text models read byte values [B, T] and predict one per position.
  const bool text = IsTextModel(spec.model.name);
  const int64_t classes = spec.model.num_classes > 0 ? spec.model.num_classes : 10;
  const int64_t targets_per_sample = text ? spec.model.input_shape.at(0) : 1;
  p.label_bytes = batch * targets_per_sample * static_cast<int64_t>(sizeof(int64_t));
  try {
    auto model = models::BuildModel(spec.model, static_cast<uint64_t>(spec.seed));
    if (!model.ok()) return model.status();
    (*model)->to(device);
    (*model)->train();
    const auto& blocks = (*model)->blocks();
    std::vector<int64_t> shape = blocks.front()->info().in_shape;
    shape.insert(shape.begin(), batch);
    torch::manual_seed(static_cast<uint64_t>(spec.seed));
    // Every block's input, from a random mini-batch (running statistics of
    // this throwaway model move; nothing else sees them).
    const auto on_device = torch::TensorOptions().device(device);
    std::vector<torch::Tensor> inputs{
        text ? torch::randint(classes, shape, on_device.dtype(torch::kLong))
             : torch::randn(shape, on_device)};
    {
      torch::NoGradGuard no_grad;
      for (const auto& b : blocks) inputs.push_back(b->forward(inputs.back()));
    }
    auto aux = aux_spec.empty() ? absl::StatusOr<AuxHeadSpec>(absl::NotFoundError(""))
                                : ParseAuxHeadSpec(aux_spec);
    if (!aux_spec.empty() && !aux.ok()) return aux.status();
    std::vector<int64_t> label_shape{batch};
    if (text) label_shape.push_back(targets_per_sample);
    torch::Tensor labels = torch::randint(classes, label_shape, on_device.dtype(torch::kLong));
    // Process warm-up, untimed: the first passes of a process grow the heap
    // to its working size and create LibTorch's kernels' primitives. Timed
    // from a cold process, the first blocks paid for that: three profiles of
    // the quickstart model disagreed by up to 2x on blocks 0-3 and by under
    // 8% on the later ones (tests/bench/profile_agreement.sh).
    for (int r = 0; r < std::max(2, o.warmup); ++r) {
      torch::Tensor h = inputs.front();
      for (const auto& b : blocks) h = b->forward(h);
      models::CrossEntropy(h, labels).backward();
      (*model)->zero_grad();
    }
    // Each block's figures, measured in interleaved rounds (RunInterleaved);
    // the state the probes work on lives until every round is done.
    struct BlockState {
      std::shared_ptr<models::Block> block;
      std::unique_ptr<models::Model> one;
      std::unique_ptr<torch::optim::Optimizer> optimizer;
      torch::Tensor x0, grad, x, out;
      bool input_grad = false;
      void Fresh() { x = input_grad ? x0.detach().requires_grad_(true) : x0.detach(); }
      void Release() {
        out = torch::Tensor();
        x = torch::Tensor();
      }
    };
    std::vector<std::unique_ptr<BlockState>> state;
    std::vector<Probe> probes;
    auto kept = std::make_shared<std::vector<torch::Tensor>>(3);  // see message_s below
    auto next = std::make_shared<size_t>(0);
    std::map<std::string, double> aux_cost;  // per output shape
    std::vector<std::unique_ptr<torch::optim::Optimizer>> aux_optimizers;
    p.blocks.resize(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto& block = blocks[i];
      BlockProfile& b = p.blocks[i];
      b.index = block->info().index;
      b.kind = block->info().kind;
      b.reversible = block->reversible();
      for (const auto& t : block->parameters()) {
        if (t.requires_grad()) b.parameter_bytes += Bytes(t);
      }
      for (const auto& t : block->buffers()) b.buffer_bytes += Bytes(t);
      b.input_bytes = Bytes(inputs[i]);
      b.output_bytes = Bytes(inputs[i + 1]);
      auto st = std::make_unique<BlockState>();
      BlockState* s = st.get();
      s->block = block;
      s->one = std::make_unique<models::Model>(std::vector<std::shared_ptr<models::Block>>{block});
      s->optimizer = training::MakeOptimizer(spec.optimizer, *s->one);
      s->x0 = inputs[i];
      s->grad = torch::randn_like(inputs[i + 1]);
      s->input_grad = i > 0;
      state.push_back(std::move(st));
      const auto release = [s] { s->Release(); };
      probes.push_back(
          {&b.forward_s, [s] { s->Fresh(); }, [s] { s->out = s->block->forward(s->x); }, release});
      probes.push_back({&b.backward_s,
                        [s] {
                          s->Fresh();
                          s->out = s->block->forward(s->x);
                        },
                        [s] { s->out.backward(s->grad); }, release});
      probes.push_back({&b.forward_nograd_s, nullptr, [s] {
                          torch::NoGradGuard no_grad;
                          s->block->forward(s->x0);
                        }});
      // The gradients the step applies come from the backward probe above.
      probes.push_back({&b.step_s, nullptr, [s] { s->optimizer->step(); }});
      if (b.reversible) {
        auto* rev = static_cast<models::ReversibleBlock*>(block.get());
        const torch::Tensor y = inputs[i + 1];
        const bool input_grad = s->input_grad;
        probes.push_back({&b.rebuild_backward_s, nullptr, [rev, y, s, input_grad] {
                            models::FreezeRunningStats freeze;
                            models::RebuildBackward(*rev, y, s->grad, input_grad);
                          }});
        probes.push_back({&b.inverse_s, nullptr, [rev, y] {
                            torch::NoGradGuard no_grad;
                            models::FreezeRunningStats freeze;
                            rev->inverse(y);
                          }});
      }
      const torch::Tensor y = inputs[i + 1];
      // A message copies the whole output once: a pass over memory whose speed
      // depends on where the buffer lands in physical memory, which differs
      // from process to process. The last few decoded buffers (of any block)
      // stay alive, so each sample writes a different one and the figure is
      // not one placement's luck (profiles disagreed by up to 27% on this
      // column when every sample reused the same buffer).
      probes.push_back({&b.message_s, nullptr, [y, kept, next] {
                          v1::TensorProto proto;
                          (void)EncodeTensor(y, &proto);
                          auto t = DecodeTensor(&proto);
                          if (t.ok()) (*kept)[(*next)++ % kept->size()] = std::move(*t);
                        }});
      if (aux.ok() && i + 1 < blocks.size()) {
        const std::string key = Shape(block->info().out_shape);
        if (aux_cost.find(key) == aux_cost.end()) {
          auto head =
              models::MakeAuxHead(*aux, block->info().out_shape,
                                  spec.model.num_classes > 0 ? spec.model.num_classes : 10, 1);
          if (!head.ok()) return head.status();
          (*head)->to(device);
          auto head_opt = training::MakeOptimizer(spec.optimizer, **head);
          auto h = *head;
          auto* opt = head_opt.get();
          aux_optimizers.push_back(std::move(head_opt));
          double* out = &aux_cost.emplace(key, 0.0).first->second;
          probes.push_back({out, nullptr, [h, opt, y, &labels]() mutable {
                              torch::Tensor loss = models::CrossEntropy(h->forward(y), labels);
                              loss.backward();
                              opt->step();
                            }});
        }
      }
    }
    RunInterleaved(probes, o, cuda, [&](int r) {
      if (o.progress) {
        o.progress(absl::StrCat("profiling: round ", r + 1, " of ", o.warmup + o.repeats, " done (",
                                probes.size(), " figures per round, ", o.warmup, " untimed)"));
      }
    });
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto& block = blocks[i];
      BlockProfile& b = p.blocks[i];
      BlockState& s = *state[i];
      if (aux.ok() && i + 1 < blocks.size()) {
        b.aux_head_s = aux_cost.at(Shape(block->info().out_shape));
      }
      // Memory, with gradients and optimizer state already allocated above.
      {
        int64_t opt_state = 0;
        for (const auto& [key, st] : s.optimizer->state()) {
          (void)key;
          if (auto* m = dynamic_cast<torch::optim::SGDParamState*>(st.get())) {
            opt_state += Bytes(m->momentum_buffer());
          } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(st.get())) {
            opt_state += Bytes(a->exp_avg()) + Bytes(a->exp_avg_sq()) + Bytes(a->max_exp_avg_sq());
          }
        }
        b.optimizer_bytes = opt_state;
      }
      if (!cuda) {
        s.Fresh();
        const int64_t l0 = account->current();
        account->ResetPeak();
        s.out = block->forward(s.x);
        const int64_t l1 = account->current();
        b.forward_transient_bytes = account->peak() - l1;
        b.graph_bytes = std::max<int64_t>(0, l1 - l0 - b.output_bytes);
        account->ResetPeak();
        s.out.backward(s.grad);
        b.backward_transient_bytes = account->peak() - l1;
        s.Release();
        if (b.reversible) {
          auto* rev = static_cast<models::ReversibleBlock*>(block.get());
          models::FreezeRunningStats freeze;
          const int64_t lr = account->current();
          account->ResetPeak();
          { auto rebuilt = models::RebuildBackward(*rev, inputs[i + 1], s.grad, s.input_grad); }
          b.rebuild_transient_bytes = account->peak() - lr;
        }
      }
      if (o.progress) {
        o.progress(absl::StrCat("profiled block ", b.index, " (", b.kind, "): forward ",
                                b.forward_s * 1e3, " ms, backward ", b.backward_s * 1e3, " ms"));
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("profiling ", p.model, ": ", e.what()));
  }
  return p;
}

absl::StatusOr<ModelProfile> CachedProfile(const JobSpec& spec, int64_t batch,
                                           const torch::Device& device, const ProfileOptions& o,
                                           bool* cached) {
  namespace fs = std::filesystem;
  if (cached) *cached = false;
  const std::string key =
      ProfileKey(spec, batch, device, at::get_num_threads(), AuxHeadOf(spec, o));
  fs::path path;
  if (!o.cache_dir.empty()) {
    path = fs::path(o.cache_dir) / (key + ".profile");
    if (!o.refresh && fs::exists(path)) {
      std::ifstream in(path);
      std::stringstream text;
      text << in.rdbuf();
      auto p = ParseProfile(text.str());
      if (p.ok() && p->key == key) {
        if (cached) *cached = true;
        return p;
      }
    }
  }
  auto p = ProfileModel(spec, batch, device, o);
  if (!p.ok() || path.empty()) return p;
  // The cache only saves the next profiling: a profile that cannot be kept
  // is still this one's answer. Several workers on one host may profile the
  // same key at once: each writes its own temporary file, and the last
  // rename wins (their profiles are equally good).
  auto not_kept = [&](const std::string& why) {
    if (o.progress) o.progress(absl::StrCat("profile not cached: ", why));
    return p;
  };
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return not_kept(absl::StrCat(o.cache_dir, ": ", ec.message()));
  static std::atomic<uint64_t> writes{0};
  const fs::path tmp = absl::StrCat(path.string(), ".tmp.", ::getpid(), ".", writes.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << SerializeProfile(*p);
    if (!out) {
      fs::remove(tmp, ec);
      return not_kept(absl::StrCat("writing ", tmp.string()));
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return not_kept(absl::StrCat("writing ", path.string(), ": ", ec.message()));
  }
  return p;
}

}  // namespace stagewise::planner
