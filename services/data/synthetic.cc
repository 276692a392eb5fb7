// Synthetic, learnable image data, identical on every platform for a seed.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "services/data/dataset.h"

namespace stagewise::data {
namespace {

// Independent random streams derived from the one seed.
constexpr uint64_t kPrototypeStream = 0x70726f746f;  // "proto"
constexpr uint64_t kTrainStream = 0x747261696e;      // "train"
constexpr uint64_t kTestStream = 0x74657374;         // "test"

ImageSet MakeSamples(int64_t n, const torch::Tensor& prototypes, int num_classes, uint64_t seed) {
  const int64_t pixels = prototypes.stride(0);
  std::vector<int64_t> sizes = prototypes.sizes().vec();
  sizes[0] = n;
  ImageSet set;
  set.images = torch::empty(sizes, torch::kUInt8);
  set.labels = torch::empty({n}, torch::kInt64);
  std::mt19937_64 rng(seed);

  // Balanced classes in a random order: every class is present even in small sets.
  int64_t* labels = set.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) labels[i] = i % num_classes;
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(labels[i], labels[UniformInt(rng, static_cast<uint64_t>(i) + 1)]);
  }

  const uint8_t* protos = prototypes.data_ptr<uint8_t>();
  uint8_t* out = set.images.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* proto = protos + labels[i] * pixels;
    uint8_t* dst = out + i * pixels;
    uint64_t bits = 0;
    for (int64_t p = 0; p < pixels; ++p) {
      if (p % 4 == 0) bits = rng();
      // Sum of two uniform bytes: triangular noise in about [-64, 64], small
      // next to the ~85 mean gap between two prototypes' pixels, so the classes
      // are easy to separate yet not trivially identical samples.
      const int noise =
          (static_cast<int>(bits & 0xff) + static_cast<int>((bits >> 8) & 0xff) - 255) / 4;
      bits >>= 16;
      dst[p] = static_cast<uint8_t>(std::clamp(proto[p] + noise, 0, 255));
    }
  }
  return set;
}

}  // namespace

Datasets MakeSynthetic(int64_t train_size, int64_t test_size, const std::vector<int64_t>& shape,
                       int num_classes, uint64_t seed) {
  TORCH_CHECK(shape.size() == 3 && shape[0] > 0 && shape[1] > 0 && shape[2] > 0,
              "synthetic shape must be [C, H, W] with positive entries");
  TORCH_CHECK(num_classes >= 1, "synthetic data needs at least one class");
  TORCH_CHECK(train_size >= 0 && test_size >= 0, "synthetic sizes must be non-negative");

  torch::Tensor prototypes =
      torch::empty({num_classes, shape[0], shape[1], shape[2]}, torch::kUInt8);
  {
    std::mt19937_64 rng(MixSeed(seed, kPrototypeStream));
    uint8_t* p = prototypes.data_ptr<uint8_t>();
    uint64_t bits = 0;
    for (int64_t i = 0; i < prototypes.numel(); ++i) {
      if (i % 8 == 0) bits = rng();
      p[i] = static_cast<uint8_t>(bits & 0xff);
      bits >>= 8;
    }
  }
  Datasets out;
  out.train = MakeSamples(train_size, prototypes, num_classes, MixSeed(seed, kTrainStream));
  out.test = MakeSamples(test_size, prototypes, num_classes, MixSeed(seed, kTestStream));
  out.num_classes = num_classes;
  // An empty training set has no statistics; leave normalisation off then.
  if (train_size > 0) {
    absl::Status stats = ComputeMeanStd(out.train.images, &out.mean, &out.std);
    TORCH_CHECK(stats.ok(), stats.ToString());
  }
  return out;
}

}  // namespace stagewise::data
