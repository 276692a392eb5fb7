// Datasets held in memory, and the deterministic batches drawn from them.
#ifndef STAGEWISE_SERVICES_DATA_DATASET_H_
#define STAGEWISE_SERVICES_DATA_DATASET_H_

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/data/sizes.h"
#include "services/spec/job_spec.h"

namespace stagewise::data {

// A labelled image set: images uint8 [N, C, H, W], labels int64 [N].
// Or one split of a byte-level text corpus (docs/text.md): `text` holds its
// bytes, uint8 [L], images and labels stay undefined; a sample is a window of
// T + 1 bytes, x = its first T, y = its last T (the next byte of each).
struct ImageSet {
  torch::Tensor images;
  torch::Tensor labels;
  torch::Tensor text;
  // Text training split: sequences per epoch (data.train_size), each at a
  // random offset. 0 for a held-out split, which is read in order.
  int64_t epoch_sequences = 0;
  bool is_text() const { return text.defined(); }
  // Samples: images, or text sequences (an epoch's, or the held-out split's
  // windows at the sampler's sequence length, see TextWindows).
  int64_t size() const {
    if (is_text()) return epoch_sequences;
    return labels.defined() ? labels.size(0) : 0;
  }
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
// Requires shape [C, H, W] with positive entries, num_classes >= 1 and sizes
// >= 0, else throws c10::Error (LoadDatasets checks these and returns a status).
Datasets MakeSynthetic(int64_t train_size, int64_t test_size, const std::vector<int64_t>& shape,
                       int num_classes, uint64_t seed);

// Byte-level text (docs/text.md). The fortunes corpus: every English fortune
// file of Debian's `fortunes` and `fortunes-min` in `dir` (a fixed list, in
// order), with the "%" separator lines removed; its size and CRC-32 are checked
// against the recorded ones, so every machine trains on the same bytes.
inline constexpr const char* kDefaultFortunesDir = "/usr/share/games/fortunes";
absl::StatusOr<std::string> ReadFortunes(const std::string& dir);
// A user's text file, read as it is (bytes; UTF-8 is not required).
absl::StatusOr<std::string> ReadTextFile(const std::string& path);
// Splits `corpus` 90/5/5 into train, validation and test (contiguous, in
// order); `test` of the result is spec.eval_split's part. Checks that every
// part holds a sequence of data.sequence_length (errors name the key).
absl::StatusOr<Datasets> MakeTextDatasets(const std::string& corpus, const DataSpec& spec);

// Dispatches on spec.dataset, applies limit_train/limit_test.
absl::StatusOr<Datasets> LoadDatasets(const DataSpec& spec, uint64_t seed);

struct Batch {
  torch::Tensor x;  // float32 [B, C, H, W], augmented and normalised; text: int64 [B, T]
  torch::Tensor y;  // int64 [B]; text: int64 [B, T], the next byte of each
  int64_t epoch = 0;
  int64_t index = 0;
};

struct SamplerOptions {
  int64_t batch_size = 128;
  bool shuffle = true;
  bool drop_last = true;
  uint64_t seed = 0;
  bool augment = false;  // random crop with padding + optional flip
  int crop_padding = 4;
  bool horizontal_flip = true;
  std::vector<double> mean;  // empty = no normalisation
  std::vector<double> std;
  // Text: bytes per sequence, and (when > 0) the shortest length a training
  // mini-batch may draw (each draws its own in [min, sequence_length]).
  int64_t sequence_length = 0;
  int64_t min_sequence_length = 0;
  // Get(e, i) starts assembling the batch after it (i + 1, or the next
  // epoch's first) on a background thread, and a Get of that batch takes it:
  // the next input is ready while the current one is computed on. The batches
  // are the same either way.
  bool prefetch = false;
};

// The samplers a job asks for (the one home of that mapping: every stage,
// the reference trainer and the test fakes build theirs with these).
// Training: batches of batch_size, shuffled from `seed`, the last partial
// batch dropped, augmented and normalised as data says. Test: batches of
// eval_batch_size (or batch_size), in order, every sample, not augmented.
SamplerOptions TrainSamplerOptions(const JobSpec& spec, const Datasets& data);
SamplerOptions TestSamplerOptions(const JobSpec& spec, const Datasets& data);

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
  Batch Make(int64_t epoch, int64_t index) const;
  std::vector<int64_t> Permutation(int64_t epoch) const;
  Batch GetText(int64_t epoch, int64_t index) const;
  // Shuffling 60k indices costs more than assembling a batch, so the
  // permutations of recent epochs are kept; shared by copies of the sampler,
  // which draw identical permutations anyway.
  struct PermutationCache;
  std::shared_ptr<const std::vector<int64_t>> CachedPermutation(int64_t epoch) const;
  ImageSet set_;
  SamplerOptions options_;
  std::shared_ptr<PermutationCache> cache_;
  // The batch being assembled ahead (options.prefetch).
  struct Ahead;
  std::shared_ptr<Ahead> ahead_;
};

// Augmentation primitives, exposed for tests. `images` is float [B, C, H, W].
// RandomCrop and RandomHorizontalFlip also accept any integer dtype (the sampler
// applies them to uint8 before conversion) and return the input's dtype.
// RandomCrop shifts each sample by its own offsets in [-padding, padding],
// filling with zeros (torchvision's pad-then-crop). RandomHorizontalFlip
// mirrors each sample with probability 0.5.
torch::Tensor RandomCrop(const torch::Tensor& images, int padding, uint64_t seed);
torch::Tensor RandomHorizontalFlip(const torch::Tensor& images, uint64_t seed);
// `images` holds pixel values in [0, 255]; returns float32
// (images / 255 - mean[c]) / std[c]. Empty mean/std only rescale to [0, 1];
// a single entry applies to every channel. Other sizes throw c10::Error.
torch::Tensor Normalize(const torch::Tensor& images, const std::vector<double>& mean,
                        const std::vector<double>& std);

// Checks what BatchSampler assumes of its options: batch_size > 0,
// crop_padding >= 0, mean/std both empty or of size 1 or C with std > 0, and a
// set of uint8 images [N, C, H, W] with int64 labels [N]. Errors name the field.
absl::Status ValidateSamplerOptions(const ImageSet& set, const SamplerOptions& options);

// Exact per-channel mean and (population) std, in [0, 1] units, of uint8
// images [N, C, H, W].
absl::Status ComputeMeanStd(const torch::Tensor& images, std::vector<double>* mean,
                            std::vector<double>* std);

// Platform-independent randomness: std::mt19937_64 is fully specified by the
// standard, the std:: distributions are not, so draws go through these.
// MixSeed hashes a seed with up to three stream/epoch/index values.
uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);
// Uniform in [0, n), unbiased; n > 0.
uint64_t UniformInt(std::mt19937_64& rng, uint64_t n);

}  // namespace stagewise::data

#endif  // STAGEWISE_SERVICES_DATA_DATASET_H_
