// Fashion-MNIST from four IDX files (gzip-compressed or plain).
#include <torch/torch.h>

#include <exception>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "services/data/dataset.h"

namespace stagewise::data {
namespace {

constexpr int kFashionMnistClasses = 10;

std::string InstallHint() {
  return "install the Debian package dataset-fashion-mnist "
         "(apt install dataset-fashion-mnist) or set data.path to a directory holding "
         "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]";
}

// The distributed files are gzip-compressed; unpacked copies are accepted too.
absl::StatusOr<std::string> FindFile(const std::string& dir, const std::string& stem) {
  std::error_code ec;
  for (const std::string& name : {stem + ".gz", stem}) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    if (std::filesystem::is_regular_file(path, ec)) return path;
  }
  return absl::NotFoundError(
      absl::StrCat(dir, ": no ", stem, " or ", stem, ".gz; ", InstallHint()));
}

absl::StatusOr<ImageSet> LoadSplit(const std::string& dir, const std::string& prefix) {
  absl::StatusOr<std::string> image_path = FindFile(dir, prefix + "-images-idx3-ubyte");
  if (!image_path.ok()) return image_path.status();
  absl::StatusOr<std::string> label_path = FindFile(dir, prefix + "-labels-idx1-ubyte");
  if (!label_path.ok()) return label_path.status();
  absl::StatusOr<torch::Tensor> images = ReadIdx(*image_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<torch::Tensor> labels = ReadIdx(*label_path);
  if (!labels.ok()) return labels.status();

  if (images->scalar_type() != torch::kUInt8 || images->dim() != 3) {
    return absl::DataLossError(absl::StrCat(*image_path, ": expected ubyte images [N, H, W], got ",
                                            images->dim(), "-d ", images->toString()));
  }
  if (labels->scalar_type() != torch::kUInt8 || labels->dim() != 1) {
    return absl::DataLossError(absl::StrCat(*label_path, ": expected ubyte labels [N], got ",
                                            labels->dim(), "-d ", labels->toString()));
  }
  if (images->size(0) != labels->size(0)) {
    return absl::DataLossError(absl::StrCat(*image_path, " holds ", images->size(0), " images but ",
                                            *label_path, " holds ", labels->size(0), " labels"));
  }
  if (labels->numel() > 0 && labels->max().item<int64_t>() >= kFashionMnistClasses) {
    return absl::DataLossError(absl::StrCat(*label_path, ": label ", labels->max().item<int64_t>(),
                                            " out of range [0, ", kFashionMnistClasses, ")"));
  }
  ImageSet set;
  set.images = images->unsqueeze(1).contiguous();  // [N, 1, H, W]
  set.labels = labels->to(torch::kInt64);
  return set;
}

absl::StatusOr<Datasets> LoadFashionMnistOrThrow(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("Fashion-MNIST directory ", dir, " does not exist; ", InstallHint()));
  }
  Datasets out;
  absl::StatusOr<ImageSet> train = LoadSplit(dir, "train");
  if (!train.ok()) return train.status();
  absl::StatusOr<ImageSet> test = LoadSplit(dir, "t10k");
  if (!test.ok()) return test.status();
  if (train->images.sizes().slice(1) != test->images.sizes().slice(1)) {
    return absl::DataLossError(absl::StrCat(dir, ": train and t10k images differ in shape"));
  }
  out.train = *std::move(train);
  out.test = *std::move(test);
  out.num_classes = kFashionMnistClasses;
  absl::Status stats = ComputeMeanStd(out.train.images, &out.mean, &out.std);
  if (!stats.ok()) return stats;
  return out;
}

}  // namespace

absl::StatusOr<Datasets> LoadFashionMnist(const std::string& dir) {
  try {
    return LoadFashionMnistOrThrow(dir);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading Fashion-MNIST from ", dir, ": ", e.what()));
  }
}

}  // namespace stagewise::data
