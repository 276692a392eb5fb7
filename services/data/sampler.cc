// Deterministic batches: the order of an epoch and the augmentation of a batch
// are pure functions of (seed, epoch, batch index), drawn with our own RNG code
// so that every worker, platform and LibTorch version sees the same batches.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/data/dataset.h"

namespace stagewise::data {
namespace {

// Separate streams so that, e.g., the crop offsets of batch 0 are unrelated to
// the permutation of epoch 0.
constexpr uint64_t kPermutationStream = 0x7065726d;  // "perm"
constexpr uint64_t kCropStream = 0x63726f70;         // "crop"
constexpr uint64_t kFlipStream = 0x666c6970;         // "flip"
constexpr uint64_t kTextStream = 0x74657874;         // "text"

// Workers may straddle an epoch boundary (prefetching, pipelining), so keep
// the current epoch's permutation and its neighbour.
constexpr size_t kCachedEpochs = 2;

// GCC and Clang extension; __extension__ keeps -Wpedantic quiet.
__extension__ using Uint128 = unsigned __int128;

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix, so
// nearby (epoch, index) pairs give unrelated seeds.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = SplitMix64(seed);
  h = SplitMix64(h ^ a);
  h = SplitMix64(h ^ b);
  return SplitMix64(h ^ c);
}

uint64_t UniformInt(std::mt19937_64& rng, uint64_t n) {
  // Lemire, "Fast Random Integer Generation in an Interval" (2019), alg. 5:
  // unbiased, and usually without a division.
  Uint128 m = static_cast<Uint128>(rng()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<Uint128>(rng()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

absl::Status ValidateSamplerOptions(const ImageSet& set, const SamplerOptions& options) {
  if (!set.images.defined() || set.images.scalar_type() != torch::kUInt8 || set.images.dim() != 4) {
    return absl::InvalidArgumentError("images: expected uint8 [N, C, H, W]");
  }
  if (!set.labels.defined() || set.labels.scalar_type() != torch::kInt64 || set.labels.dim() != 1 ||
      set.labels.size(0) != set.images.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("labels: expected int64 [", set.images.size(0), "]"));
  }
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: must be positive, got ", options.batch_size));
  }
  if (options.crop_padding < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("crop_padding: must be >= 0, got ", options.crop_padding));
  }
  const size_t channels = static_cast<size_t>(set.images.size(1));
  if (options.mean.size() != options.std.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mean/std: sizes differ (", options.mean.size(),
                                                   " vs ", options.std.size(), ")"));
  }
  if (!options.mean.empty() && options.mean.size() != 1 && options.mean.size() != channels) {
    return absl::InvalidArgumentError(
        absl::StrCat("mean: expected 1 or ", channels, " entries, got ", options.mean.size()));
  }
  for (size_t c = 0; c < options.std.size(); ++c) {
    if (!(options.std[c] > 0) || !std::isfinite(options.std[c]) ||
        !std::isfinite(options.mean[c])) {
      return absl::InvalidArgumentError(
          absl::StrCat("std: entry ", c, " must be finite and positive, got ", options.std[c]));
    }
  }
  return absl::OkStatus();
}

struct BatchSampler::PermutationCache {
  absl::Mutex mu;
  std::deque<std::pair<int64_t, std::shared_ptr<const std::vector<int64_t>>>> entries
      ABSL_GUARDED_BY(mu);
};

BatchSampler::BatchSampler(const ImageSet& set, SamplerOptions options)
    : set_(set),
      options_(std::move(options)),
      cache_(std::make_shared<PermutationCache>()),
      ahead_(std::make_shared<Ahead>()) {
  // Raw-pointer augmentation wants contiguous images; labels are returned as int64.
  if (set_.images.defined()) set_.images = set_.images.contiguous();
  if (set_.text.defined()) set_.text = set_.text.contiguous();
  if (set_.labels.defined()) set_.labels = set_.labels.to(torch::kInt64);
}

int64_t BatchSampler::batches_per_epoch() const {
  if (set_.is_text() && set_.epoch_sequences == 0) {
    // Held out: the full windows in batches, then the shorter last one alone.
    const int64_t bytes = set_.text.numel(), t = options_.sequence_length;
    if (t <= 0 || bytes < 2 || options_.batch_size <= 0) return 0;
    const int64_t full = (bytes - 1) / t;
    return (full + options_.batch_size - 1) / options_.batch_size + ((bytes - 1) % t > 0 ? 1 : 0);
  }
  const int64_t n = set_.size();
  const int64_t b = options_.batch_size;
  if (b <= 0 || n <= 0) return 0;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

std::vector<int64_t> BatchSampler::Permutation(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(set_.size()));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!options_.shuffle) return order;
  std::mt19937_64 rng(MixSeed(options_.seed, kPermutationStream, static_cast<uint64_t>(epoch)));
  // Fisher-Yates (Knuth, TAOCP vol. 2, alg. 3.4.2 P), with our own draws.
  for (size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[UniformInt(rng, i)]);
  }
  return order;
}

std::shared_ptr<const std::vector<int64_t>> BatchSampler::CachedPermutation(int64_t epoch) const {
  {
    absl::MutexLock lock(&cache_->mu);
    for (const auto& [cached_epoch, order] : cache_->entries) {
      if (cached_epoch == epoch) return order;
    }
  }
  // Shuffle outside the lock; two threads racing on a new epoch compute the
  // same permutation, so either result may be kept.
  auto order = std::make_shared<const std::vector<int64_t>>(Permutation(epoch));
  absl::MutexLock lock(&cache_->mu);
  cache_->entries.emplace_back(epoch, order);
  while (cache_->entries.size() > kCachedEpochs) cache_->entries.pop_front();
  return order;
}

Batch BatchSampler::GetText(int64_t epoch, int64_t index) const {
  Batch batch;
  batch.epoch = epoch;
  batch.index = index;
  const int64_t bytes = set_.text.numel();
  const int64_t t = options_.sequence_length;
  std::vector<int64_t> offsets;
  int64_t length = t;
  if (index >= 0 && index < batches_per_epoch()) {
    if (set_.epoch_sequences > 0) {
      // Training: a length for the mini-batch, then every sequence at its own
      // random offset; all drawn from (seed, epoch, index) alone.
      std::mt19937_64 rng(MixSeed(options_.seed, kTextStream, static_cast<uint64_t>(epoch),
                                  static_cast<uint64_t>(index)));
      const int64_t min = options_.min_sequence_length;
      if (min > 0 && min < t) length = min + static_cast<int64_t>(UniformInt(rng, t - min + 1));
      const auto starts = static_cast<uint64_t>(bytes - length);
      for (int64_t k = 0; k < options_.batch_size; ++k) {
        offsets.push_back(static_cast<int64_t>(UniformInt(rng, starts)));
      }
    } else {
      const int64_t full = (bytes - 1) / t;
      const int64_t begin = index * options_.batch_size;
      if (begin < full) {
        for (int64_t k = begin; k < std::min(full, begin + options_.batch_size); ++k) {
          offsets.push_back(k * t);
        }
      } else {
        offsets.push_back(full * t);  // the shorter last window
        length = (bytes - 1) % t;
      }
    }
  }
  const int64_t n = static_cast<int64_t>(offsets.size());
  torch::Tensor windows = torch::empty({n, length + 1}, torch::kUInt8);
  const uint8_t* src = set_.text.data_ptr<uint8_t>();
  uint8_t* dst = windows.data_ptr<uint8_t>();
  for (int64_t k = 0; k < n; ++k) {
    std::copy(src + offsets[k], src + offsets[k] + length + 1, dst + k * (length + 1));
  }
  windows = windows.to(torch::kInt64);
  batch.x = windows.narrow(1, 0, length).contiguous();
  batch.y = windows.narrow(1, 1, length).contiguous();
  return batch;
}

struct BatchSampler::Ahead {
  absl::Mutex mu;
  int64_t epoch ABSL_GUARDED_BY(mu) = -1;
  int64_t index ABSL_GUARDED_BY(mu) = -1;
  std::future<Batch> batch ABSL_GUARDED_BY(mu);
};

Batch BatchSampler::Get(int64_t epoch, int64_t index) const {
  if (!options_.prefetch) return Make(epoch, index);
  std::future<Batch> ready;
  std::future<Batch> stale;  // asked out of order: waited for below, unused
  {
    absl::MutexLock lock(&ahead_->mu);
    if (ahead_->batch.valid() && ahead_->epoch == epoch && ahead_->index == index) {
      ready = std::move(ahead_->batch);
    } else {
      stale = std::move(ahead_->batch);
    }
  }
  Batch batch = ready.valid() ? ready.get() : Make(epoch, index);
  int64_t next_epoch = epoch;
  int64_t next_index = index + 1;
  if (next_index >= batches_per_epoch()) {
    ++next_epoch;
    next_index = 0;
  }
  BatchSampler plain = *this;  // shares the set and the permutations, not `ahead_`
  plain.options_.prefetch = false;
  plain.ahead_.reset();
  absl::MutexLock lock(&ahead_->mu);
  ahead_->epoch = next_epoch;
  ahead_->index = next_index;
  ahead_->batch =
      std::async(std::launch::async, [plain = std::move(plain), next_epoch, next_index] {
        // Behind the compute threads when cores are short: it has a whole step.
        (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
        return plain.Make(next_epoch, next_index);
      });
  return batch;
}

Batch BatchSampler::Make(int64_t epoch, int64_t index) const {
  if (set_.is_text()) return GetText(epoch, index);
  Batch batch;
  batch.epoch = epoch;
  batch.index = index;
  int64_t begin = 0;
  int64_t count = 0;
  if (index >= 0 && index < batches_per_epoch()) {
    begin = index * options_.batch_size;
    count = std::min(options_.batch_size, set_.size() - begin);
  }
  if (!set_.images.defined()) {
    batch.x = torch::empty({0}, torch::kFloat32);
    batch.y = torch::empty({0}, torch::kInt64);
    return batch;
  }

  torch::Tensor x;
  if (options_.shuffle && count > 0) {
    std::shared_ptr<const std::vector<int64_t>> order = CachedPermutation(epoch);
    // index_select copies synchronously, so the view into `order` is safe.
    torch::Tensor idx =
        torch::from_blob(const_cast<int64_t*>(order->data() + begin), {count}, torch::kInt64);
    x = set_.images.index_select(0, idx);
    batch.y = set_.labels.index_select(0, idx);
  } else {
    x = set_.images.narrow(0, begin, count);
    batch.y = set_.labels.narrow(0, begin, count).clone();
  }
  // Crop and flip on uint8 (a quarter of the bytes of float); zero padding is
  // black either way, as in torchvision's pad-then-normalise order.
  if (options_.augment && count > 0) {
    const auto e = static_cast<uint64_t>(epoch);
    const auto i = static_cast<uint64_t>(index);
    if (options_.crop_padding > 0) {
      x = RandomCrop(x, options_.crop_padding, MixSeed(options_.seed, kCropStream, e, i));
    }
    if (options_.horizontal_flip) {
      x = RandomHorizontalFlip(x, MixSeed(options_.seed, kFlipStream, e, i));
    }
  }
  batch.x = Normalize(x, options_.mean, options_.std);
  return batch;
}

SamplerOptions TrainSamplerOptions(const JobSpec& spec, const Datasets& data) {
  SamplerOptions train;
  train.batch_size = spec.batch_size;
  train.shuffle = true;
  train.drop_last = true;
  train.prefetch = true;
  train.seed = static_cast<uint64_t>(spec.seed);
  train.augment = spec.data.augment;
  train.crop_padding = spec.data.crop_padding;
  train.horizontal_flip = spec.data.horizontal_flip;
  if (spec.data.normalize) {
    train.mean = data.mean;
    train.std = data.std;
  }
  if (IsText(spec.data.dataset)) {
    train.sequence_length = spec.data.sequence_length;
    train.min_sequence_length = spec.data.min_sequence_length;
  }
  return train;
}

SamplerOptions TestSamplerOptions(const JobSpec& spec, const Datasets& data) {
  SamplerOptions test = TrainSamplerOptions(spec, data);
  test.batch_size = spec.eval_batch_size > 0 ? spec.eval_batch_size : spec.batch_size;
  test.shuffle = false;
  test.drop_last = false;
  test.augment = false;
  return test;
}

}  // namespace stagewise::data
