// Loading a dataset as a job's data section describes it, and the per-channel
// statistics every loader reports.
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/data/dataset.h"

namespace stagewise::data {
namespace {

// The first `limit` samples (0 = all). Cloned so the full set can be freed.
ImageSet Head(const ImageSet& set, int64_t limit) {
  if (limit <= 0 || limit >= set.size()) return set;
  ImageSet head;
  head.images = set.images.narrow(0, 0, limit).clone();
  head.labels = set.labels.narrow(0, 0, limit).clone();
  return head;
}

absl::Status ValidateSynthetic(const DataSpec& spec) {
  if (spec.shape.size() != 3 || spec.shape[0] <= 0 || spec.shape[1] <= 0 || spec.shape[2] <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.shape: expected [C, H, W] with positive entries, got [",
                     absl::StrJoin(spec.shape, ", "), "]"));
  }
  if (spec.classes < 1 || spec.classes > 256 * 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.classes: must be in [1, 65536], got ", spec.classes));
  }
  if (spec.train_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.train_size: must be positive, got ", spec.train_size));
  }
  if (spec.test_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.test_size: must be >= 0, got ", spec.test_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<Datasets> LoadDatasetsOrThrow(const DataSpec& spec, uint64_t seed) {
  if (spec.limit_train < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.limit_train: must be >= 0, got ", spec.limit_train));
  }
  if (spec.limit_test < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.limit_test: must be >= 0, got ", spec.limit_test));
  }
  absl::StatusOr<Datasets> loaded;
  switch (spec.dataset) {
    case DatasetKind::kFashionMnist:
      loaded = LoadFashionMnist(spec.path.empty() ? kDefaultFashionMnistDir : spec.path);
      break;
    case DatasetKind::kCifar10:
    case DatasetKind::kCifar100:
      if (spec.path.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.path: required for dataset ", NameOf(spec.dataset),
                         " (the directory of the CIFAR binary version, see "
                         "https://www.cs.toronto.edu/~kriz/cifar.html)"));
      }
      loaded = LoadCifar(spec.path, spec.dataset == DatasetKind::kCifar10 ? 10 : 100);
      break;
    case DatasetKind::kFortunes:
    case DatasetKind::kTextFile: {
      auto corpus = spec.dataset == DatasetKind::kFortunes
                        ? ReadFortunes(spec.path.empty() ? kDefaultFortunesDir : spec.path)
                        : ReadTextFile(spec.path);
      if (!corpus.ok()) return corpus.status();
      return MakeTextDatasets(*corpus, spec);  // applies the limits itself
    }
    case DatasetKind::kSynthetic: {
      absl::Status valid = ValidateSynthetic(spec);
      if (!valid.ok()) return valid;
      loaded = MakeSynthetic(spec.train_size, spec.test_size, spec.shape, spec.classes, seed);
      break;
    }
  }
  if (!loaded.ok()) return loaded.status();
  // The statistics stay those of the full training set: a smoke run on a few
  // samples should normalise like the real run it stands in for.
  loaded->train = Head(loaded->train, spec.limit_train);
  loaded->test = Head(loaded->test, spec.limit_test);
  return loaded;
}

}  // namespace

absl::Status ComputeMeanStd(const torch::Tensor& images, std::vector<double>* mean,
                            std::vector<double>* std) {
  if (!images.defined() || images.scalar_type() != torch::kUInt8 || images.dim() != 4) {
    return absl::InvalidArgumentError("images: expected uint8 [N, C, H, W]");
  }
  const int64_t n = images.size(0);
  const int64_t channels = images.size(1);
  const int64_t plane = images.size(2) * images.size(3);
  if (n == 0 || plane == 0) {
    return absl::InvalidArgumentError("images: no pixels to compute statistics from");
  }
  try {
    // A histogram per channel gives exact sums over tens of millions of pixels
    // without a float copy of the set.
    torch::Tensor contiguous = images.contiguous();
    const uint8_t* data = contiguous.data_ptr<uint8_t>();
    std::vector<std::array<uint64_t, 256>> histogram(channels);
    for (auto& h : histogram) h.fill(0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < channels; ++c) {
        const uint8_t* p = data + (i * channels + c) * plane;
        std::array<uint64_t, 256>& h = histogram[c];
        for (int64_t k = 0; k < plane; ++k) ++h[p[k]];
      }
    }
    const double count = static_cast<double>(n) * static_cast<double>(plane);
    mean->assign(channels, 0.0);
    std->assign(channels, 0.0);
    for (int64_t c = 0; c < channels; ++c) {
      double sum = 0;
      for (int v = 0; v < 256; ++v) sum += v / 255.0 * static_cast<double>(histogram[c][v]);
      const double m = sum / count;
      double squares = 0;
      for (int v = 0; v < 256; ++v) {
        const double d = v / 255.0 - m;
        squares += d * d * static_cast<double>(histogram[c][v]);
      }
      (*mean)[c] = m;
      (*std)[c] = std::sqrt(squares / count);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("computing image statistics: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Datasets> LoadDatasets(const DataSpec& spec, uint64_t seed) {
  try {
    return LoadDatasetsOrThrow(spec, seed);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("loading dataset ", NameOf(spec.dataset), ": ", e.what()));
  }
}

}  // namespace stagewise::data
