// Datasets held in memory, and the deterministic batches drawn from them.
#ifndef STAGEWISE_SERVICES_DATA_DATASET_H_
#define STAGEWISE_SERVICES_DATA_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "services/common/job_spec.h"

namespace stagewise::data {

// A labelled image set: images uint8 [N, C, H, W], labels int64 [N].
struct ImageSet {
  torch::Tensor images;
  torch::Tensor labels;
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

struct Datasets {
  ImageSet train;
  ImageSet test;
  int num_classes = 0;
  // Per-channel mean and std of the training images, in [0, 1] units.
  std::vector<double> mean;
  std::vector<double> std;
};

// Fashion-MNIST from the Debian package dataset-fashion-mnist.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Reads an IDX file (gzip-compressed or plain). Returns a CPU tensor with the
// file's element type and dims. A missing, truncated or malformed file is an
// error that names the path and the problem.
absl::StatusOr<torch::Tensor> ReadIdx(const std::string& path);

// {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] in `dir`.
absl::StatusOr<Datasets> LoadFashionMnist(const std::string& dir);

// CIFAR binary format in `dir`: CIFAR-10 data_batch_{1..5}.bin + test_batch.bin
// (1 label byte + 3072 pixel bytes per record); CIFAR-100 train.bin + test.bin
// (coarse + fine label bytes + 3072 pixel bytes; fine labels are used).
absl::StatusOr<Datasets> LoadCifar(const std::string& dir, int num_classes);

// Learnable random data for benchmarks and tests: every class has a fixed random
// prototype image; samples are prototype + noise, clamped to uint8.
Datasets MakeSynthetic(int64_t train_size, int64_t test_size,
                       const std::vector<int64_t>& shape, int num_classes, uint64_t seed);

// Dispatches on spec.dataset, applies limit_train/limit_test.
absl::StatusOr<Datasets> LoadDatasets(const DataSpec& spec, uint64_t seed);

struct Batch {
  torch::Tensor x;  // float32 [B, C, H, W], augmented and normalised
  torch::Tensor y;  // int64 [B]
  int64_t epoch = 0;
  int64_t index = 0;
};

struct SamplerOptions {
  int64_t batch_size = 128;
  bool shuffle = true;
  bool drop_last = true;
  uint64_t seed = 0;
  bool augment = false;        // random crop with padding + optional flip
  int crop_padding = 4;
  bool horizontal_flip = true;
  std::vector<double> mean;    // empty = no normalisation
  std::vector<double> std;
};

// Random access to the batches of an epoch: Get(epoch, i) depends only on the
// set, the options, epoch and i (never on call order or thread), so any process
// that holds the set draws exactly the same batch.
class BatchSampler {
 public:
  BatchSampler(const ImageSet& set, SamplerOptions options);
  int64_t batches_per_epoch() const;
  Batch Get(int64_t epoch, int64_t index) const;
  const SamplerOptions& options() const { return options_; }

 private:
  std::vector<int64_t> Permutation(int64_t epoch) const;
  ImageSet set_;
  SamplerOptions options_;
};

// Augmentation primitives, exposed for tests. `images` is float [B, C, H, W].
torch::Tensor RandomCrop(const torch::Tensor& images, int padding, uint64_t seed);
torch::Tensor RandomHorizontalFlip(const torch::Tensor& images, uint64_t seed);
torch::Tensor Normalize(const torch::Tensor& images, const std::vector<double>& mean,
                        const std::vector<double>& std);

}  // namespace stagewise::data

#endif  // STAGEWISE_SERVICES_DATA_DATASET_H_
