// CIFAR-10/100 "binary version" files: fixed-size records of label byte(s)
// followed by 3072 pixel bytes (1024 red, 1024 green, 1024 blue, row-major).
#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "services/data/dataset.h"

namespace stagewise::data {
namespace {

constexpr int64_t kChannels = 3;
constexpr int64_t kSide = 32;
constexpr int64_t kPixelBytes = kChannels * kSide * kSide;

struct Layout {
  std::vector<std::string> train_files;
  std::string test_file;
  int64_t label_bytes;      // bytes before the pixels
  int64_t label_offset;     // which of them is the label we use
  const char* archive_dir;  // where the official tarball unpacks
};

Layout LayoutFor(int num_classes) {
  if (num_classes == 10) {
    return {{"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
             "data_batch_5.bin"},
            "test_batch.bin",
            1,
            0,
            "cifar-10-batches-bin"};
  }
  // CIFAR-100: coarse label, then fine label; the fine one is the task.
  return {{"train.bin"}, "test.bin", 2, 1, "cifar-100-binary"};
}

absl::StatusOr<ImageSet> ReadCifarFile(const std::string& path, const Layout& layout,
                                       int num_classes) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(path, ": ", ec.message()));
  const int64_t record = layout.label_bytes + kPixelBytes;
  if (size == 0 || size % record != 0) {
    return absl::DataLossError(absl::StrCat(
        path, ": size ", size, " is not a positive multiple of the ", record, "-byte record"));
  }
  const int64_t n = static_cast<int64_t>(size) / record;
  torch::Tensor raw = torch::empty({n, record}, torch::kUInt8);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(raw.data_ptr<uint8_t>()),
               static_cast<std::streamsize>(size))) {
    return absl::DataLossError(absl::StrCat(path, ": short read"));
  }
  ImageSet set;
  set.labels = raw.select(1, layout.label_offset).to(torch::kInt64);
  const int64_t max_label = set.labels.max().item<int64_t>();
  if (max_label >= num_classes) {
    return absl::DataLossError(
        absl::StrCat(path, ": label ", max_label, " out of range [0, ", num_classes, ")"));
  }
  set.images = raw.narrow(1, layout.label_bytes, kPixelBytes)
                   .reshape({n, kChannels, kSide, kSide})
                   .contiguous();
  return set;
}

absl::StatusOr<Datasets> LoadCifarOrThrow(const std::string& dir, int num_classes) {
  if (num_classes != 10 && num_classes != 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_classes: CIFAR has 10 or 100 classes, got ", num_classes));
  }
  const Layout layout = LayoutFor(num_classes);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("CIFAR-", num_classes, " directory ", dir,
                     " does not exist; set data.path to the unpacked binary version from "
                     "https://www.cs.toronto.edu/~kriz/cifar.html"));
  }
  // Accept the directory the tarball unpacks into as well as the one above it.
  std::filesystem::path root(dir);
  if (!std::filesystem::exists(root / layout.test_file, ec) &&
      std::filesystem::exists(root / layout.archive_dir / layout.test_file, ec)) {
    root /= layout.archive_dir;
  }

  std::vector<torch::Tensor> images;
  std::vector<torch::Tensor> labels;
  for (const std::string& name : layout.train_files) {
    absl::StatusOr<ImageSet> part = ReadCifarFile((root / name).string(), layout, num_classes);
    if (!part.ok()) return part.status();
    images.push_back(part->images);
    labels.push_back(part->labels);
  }
  Datasets out;
  out.train.images = images.size() == 1 ? images[0] : torch::cat(images);
  out.train.labels = labels.size() == 1 ? labels[0] : torch::cat(labels);
  absl::StatusOr<ImageSet> test =
      ReadCifarFile((root / layout.test_file).string(), layout, num_classes);
  if (!test.ok()) return test.status();
  out.test = *std::move(test);
  out.num_classes = num_classes;
  absl::Status stats = ComputeMeanStd(out.train.images, &out.mean, &out.std);
  if (!stats.ok()) return stats;
  return out;
}

}  // namespace

absl::StatusOr<Datasets> LoadCifar(const std::string& dir, int num_classes) {
  try {
    return LoadCifarOrThrow(dir, num_classes);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading CIFAR from ", dir, ": ", e.what()));
  }
}

}  // namespace stagewise::data
