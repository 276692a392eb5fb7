// Tests of the data library: IDX/CIFAR parsing, real Fashion-MNIST, synthetic
// data, the deterministic sampler and the augmentation primitives.
#include <stdlib.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/dataset.h"

namespace stagewise::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using Bytes = std::vector<uint8_t>;

// The directories MakeTempDir made, removed when the test process exits.
struct TempDirs {
  ~TempDirs() {
    for (const std::string& dir : dirs) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
  std::vector<std::string> dirs;
};

// A fresh directory per test, so tests may run in parallel under ctest.
std::string MakeTempDir() {
  static TempDirs created;
  std::string pattern = (std::filesystem::path(::testing::TempDir()) / "data_test_XXXXXX").string();
  const char* dir = mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr) << "mkdtemp failed";
  if (dir != nullptr) created.dirs.push_back(pattern);
  return pattern;
}

void WritePlain(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void WriteGzip(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

void WriteFile(const std::string& path, const Bytes& bytes, bool gzip) {
  if (gzip) {
    WriteGzip(path, bytes);
  } else {
    WritePlain(path, bytes);
  }
}

// Appends `value` big-endian, whatever the host's byte order: the bits are
// taken as an unsigned integer, whose shifts do not depend on memory layout.
template <typename T>
void AppendBigEndian(T value, Bytes* out) {
  using Bits = std::conditional_t<
      sizeof(T) == 1, uint8_t,
      std::conditional_t<sizeof(T) == 2, uint16_t,
                         std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
  static_assert(sizeof(Bits) == sizeof(T));
  Bits bits;
  std::memcpy(&bits, &value, sizeof(T));
  for (size_t i = sizeof(T); i-- > 0;) out->push_back(static_cast<uint8_t>(bits >> (8 * i)));
}

Bytes IdxHeader(uint8_t type, const std::vector<uint32_t>& dims) {
  Bytes out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) AppendBigEndian<uint32_t>(d, &out);
  return out;
}

template <typename T>
Bytes IdxFile(uint8_t type, const std::vector<uint32_t>& dims, const std::vector<T>& values) {
  Bytes out = IdxHeader(type, dims);
  for (T v : values) AppendBigEndian<T>(v, &out);
  return out;
}

template <typename T>
std::vector<T> Values(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  return std::vector<T>(c.data_ptr<T>(), c.data_ptr<T>() + c.numel());
}

// ----------------------------------------------------------------------------
// IDX

class IdxRoundTripTest : public ::testing::TestWithParam<bool> {
 protected:
  std::string Write(const std::string& name, const Bytes& bytes) {
    const std::string path = dir_ + "/" + name + (GetParam() ? ".gz" : "");
    WriteFile(path, bytes, GetParam());
    return path;
  }
  std::string dir_ = MakeTempDir();
};

TEST_P(IdxRoundTripTest, UnsignedBytes) {
  std::vector<uint8_t> values(24);
  for (int i = 0; i < 24; ++i) values[i] = static_cast<uint8_t>(i * 11);  // up to 253
  const std::string path = Write("ubyte", IdxFile<uint8_t>(0x08, {2, 3, 4}, values));
  absl::StatusOr<torch::Tensor> t = ReadIdx(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->scalar_type(), torch::kUInt8);
  EXPECT_EQ(t->sizes().vec(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(Values<uint8_t>(*t), values);
  EXPECT_EQ((*t)[1][2][3].item<int>(), 23 * 11);
}

TEST_P(IdxRoundTripTest, SignedBytes) {
  const std::vector<int8_t> values = {-128, -1, 0, 1, 127};
  absl::StatusOr<torch::Tensor> t = ReadIdx(Write("sbyte", IdxFile<int8_t>(0x09, {5}, values)));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->scalar_type(), torch::kInt8);
  EXPECT_EQ(Values<int8_t>(*t), values);
}

TEST_P(IdxRoundTripTest, Shorts) {
  const std::vector<int16_t> values = {-32768, -2, 300, 32767};
  absl::StatusOr<torch::Tensor> t = ReadIdx(Write("short", IdxFile<int16_t>(0x0B, {2, 2}, values)));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->scalar_type(), torch::kInt16);
  EXPECT_EQ(t->sizes().vec(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Values<int16_t>(*t), values);
}

TEST_P(IdxRoundTripTest, Ints) {
  const std::vector<int32_t> values = {std::numeric_limits<int32_t>::min(), -5, 70000, 0x01020304,
                                       std::numeric_limits<int32_t>::max(), 0};
  absl::StatusOr<torch::Tensor> t =
      ReadIdx(Write("int", IdxFile<int32_t>(0x0C, {3, 1, 2}, values)));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->scalar_type(), torch::kInt32);
  EXPECT_EQ(t->sizes().vec(), (std::vector<int64_t>{3, 1, 2}));
  EXPECT_EQ(Values<int32_t>(*t), values);
}

TEST_P(IdxRoundTripTest, Floats) {
  const std::vector<float> values = {-1.5f, 3.25e10f, 1e-20f, 0.0f};
  absl::StatusOr<torch::Tensor> t = ReadIdx(Write("float", IdxFile<float>(0x0D, {4}, values)));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->scalar_type(), torch::kFloat32);
  EXPECT_EQ(Values<float>(*t), values);
}

TEST_P(IdxRoundTripTest, Doubles) {
  const std::vector<double> values = {1e-300, -2.5, 12345.678};
  absl::StatusOr<torch::Tensor> t = ReadIdx(Write("double", IdxFile<double>(0x0E, {3}, values)));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->scalar_type(), torch::kFloat64);
  EXPECT_EQ(Values<double>(*t), values);
}

TEST_P(IdxRoundTripTest, EmptyDimension) {
  absl::StatusOr<torch::Tensor> t =
      ReadIdx(Write("empty", IdxFile<uint8_t>(0x08, {0, 28, 28}, {})));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->sizes().vec(), (std::vector<int64_t>{0, 28, 28}));
}

// Every corruption is an error whose message names the file and the problem.
TEST_P(IdxRoundTripTest, CorruptFilesAreRejectedWithPathAndReason) {
  struct Case {
    const char* name;
    Bytes bytes;
    const char* reason;
  };
  Bytes good = IdxFile<int32_t>(0x0C, {2, 2}, {1, 2, 3, 4});
  Bytes bad_magic = good;
  bad_magic[0] = 0x1f;
  Bytes unknown_type = good;
  unknown_type[2] = 0x0A;
  Bytes truncated(good.begin(), good.end() - 3);
  Bytes trailing = good;
  trailing.push_back(0);
  Bytes short_header = {0, 0};
  Bytes short_dims(good.begin(), good.begin() + 9);
  Bytes zero_rank = {0, 0, 0x08, 0};
  const std::vector<Case> cases = {
      {"bad_magic", bad_magic, "magic"},
      {"unknown_type", unknown_type, "type"},
      {"truncated", truncated, "truncated payload"},
      {"trailing", trailing, "trailing bytes"},
      {"short_header", short_header, "truncated header"},
      {"short_dims", short_dims, "truncated header"},
      {"zero_rank", zero_rank, "rank"},
      {"empty", {}, "truncated header"},
  };
  for (const Case& c : cases) {
    const std::string path = Write(c.name, c.bytes);
    absl::StatusOr<torch::Tensor> t = ReadIdx(path);
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << c.name;
    EXPECT_THAT(std::string(t.status().message()), AllOf(HasSubstr(path), HasSubstr(c.reason)))
        << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(PlainAndGzip, IdxRoundTripTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Gzip" : "Plain";
                         });

TEST(IdxTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = MakeTempDir() + "/no-such-file-idx1-ubyte.gz";
  absl::StatusOr<torch::Tensor> t = ReadIdx(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(path));
}

TEST(IdxTest, GzipStreamCutShortIsTruncated) {
  const std::string dir = MakeTempDir();
  Bytes payload(5000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7919 % 251);
  Bytes file = IdxHeader(0x08, {5000});
  file.insert(file.end(), payload.begin(), payload.end());
  const std::string whole = dir + "/whole.gz";
  WriteGzip(whole, file);
  std::ifstream in(whole, std::ios::binary);
  Bytes compressed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(compressed.size(), 40u);
  const std::string cut = dir + "/cut.gz";
  WritePlain(cut, Bytes(compressed.begin(), compressed.begin() + compressed.size() / 2));
  absl::StatusOr<torch::Tensor> t = ReadIdx(cut);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(t.status().message()), AllOf(HasSubstr(cut), HasSubstr("truncated")));
}

// ----------------------------------------------------------------------------
// Fashion-MNIST (the real files from the Debian package)

class FashionMnistTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::is_directory(kDefaultFashionMnistDir)) return;
    absl::StatusOr<Datasets> loaded = LoadFashionMnist(kDefaultFashionMnistDir);
    status_ = new absl::Status(loaded.status());
    if (loaded.ok()) data_ = new Datasets(*std::move(loaded));
  }
  static void TearDownTestSuite() {
    delete data_;
    delete status_;
    data_ = nullptr;
    status_ = nullptr;
  }
  void SetUp() override {
    if (status_ == nullptr) {
      GTEST_SKIP() << kDefaultFashionMnistDir
                   << " is missing (Debian package dataset-fashion-mnist)";
    }
    ASSERT_TRUE(status_->ok()) << *status_;
  }
  static const Datasets& data() { return *data_; }

 private:
  static Datasets* data_;
  static absl::Status* status_;
};

Datasets* FashionMnistTest::data_ = nullptr;
absl::Status* FashionMnistTest::status_ = nullptr;

TEST_F(FashionMnistTest, SizesShapesAndTypes) {
  EXPECT_EQ(data().num_classes, 10);
  EXPECT_EQ(data().train.size(), 60000);
  EXPECT_EQ(data().test.size(), 10000);
  EXPECT_EQ(data().train.images.sizes().vec(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(data().test.images.sizes().vec(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(data().train.images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(data().train.labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(data().test.labels.scalar_type(), torch::kInt64);
}

TEST_F(FashionMnistTest, LabelsAreBalancedAndInRange) {
  for (const ImageSet* set : {&data().train, &data().test}) {
    EXPECT_GE(set->labels.min().item<int64_t>(), 0);
    EXPECT_LT(set->labels.max().item<int64_t>(), 10);
  }
  torch::Tensor counts = torch::bincount(data().train.labels, {}, 10);
  EXPECT_EQ(Values<int64_t>(counts), std::vector<int64_t>(10, 6000));
  counts = torch::bincount(data().test.labels, {}, 10);
  EXPECT_EQ(Values<int64_t>(counts), std::vector<int64_t>(10, 1000));
}

TEST_F(FashionMnistTest, MeanAndStdMatchTheKnownValues) {
  ASSERT_EQ(data().mean.size(), 1u);
  ASSERT_EQ(data().std.size(), 1u);
  EXPECT_NEAR(data().mean[0], 0.2860, 0.0005);
  EXPECT_NEAR(data().std[0], 0.3530, 0.0005);
  // Cross-check against LibTorch on the same pixels.
  torch::Tensor x = data().train.images.to(torch::kFloat64) / 255.0;
  EXPECT_NEAR(data().mean[0], x.mean().item<double>(), 1e-9);
  EXPECT_NEAR(data().std[0], x.std(/*unbiased=*/false).item<double>(), 1e-9);
}

TEST_F(FashionMnistTest, LoadDatasetsAppliesLimits) {
  DataSpec spec;
  spec.dataset = DatasetKind::kFashionMnist;
  spec.limit_train = 1000;
  spec.limit_test = 300;
  absl::StatusOr<Datasets> loaded = LoadDatasets(spec, 0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->train.size(), 1000);
  EXPECT_EQ(loaded->test.size(), 300);
  EXPECT_TRUE(torch::equal(loaded->train.images, data().train.images.narrow(0, 0, 1000)));
  EXPECT_TRUE(torch::equal(loaded->test.labels, data().test.labels.narrow(0, 0, 300)));
  EXPECT_EQ(loaded->mean, data().mean);
}

TEST(FashionMnistMissingTest, MissingDirectoryExplainsTheFix) {
  const std::string dir = MakeTempDir() + "/nowhere";
  absl::StatusOr<Datasets> loaded = LoadFashionMnist(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()),
              AllOf(HasSubstr(dir), HasSubstr("dataset-fashion-mnist"), HasSubstr("data.path")));
}

TEST(FashionMnistMissingTest, MismatchedCountsAreRejected) {
  const std::string dir = MakeTempDir();
  for (const char* split : {"train", "t10k"}) {
    WriteGzip(dir + "/" + split + "-images-idx3-ubyte.gz",
              IdxFile<uint8_t>(0x08, {3, 2, 2}, std::vector<uint8_t>(12, 1)));
    WriteGzip(dir + "/" + split + "-labels-idx1-ubyte.gz",
              IdxFile<uint8_t>(0x08, {2}, std::vector<uint8_t>{0, 1}));
  }
  absl::StatusOr<Datasets> loaded = LoadFashionMnist(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()),
              AllOf(HasSubstr("3 images"), HasSubstr("2 labels")));
}

TEST(FashionMnistMissingTest, SmallPlainFilesLoad) {
  const std::string dir = MakeTempDir();
  std::vector<uint8_t> pixels(3 * 4 * 5);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i);
  for (const char* split : {"train", "t10k"}) {
    WritePlain(dir + "/" + split + "-images-idx3-ubyte", IdxFile<uint8_t>(0x08, {3, 4, 5}, pixels));
    WritePlain(dir + "/" + split + "-labels-idx1-ubyte",
               IdxFile<uint8_t>(0x08, {3}, std::vector<uint8_t>{9, 0, 4}));
  }
  absl::StatusOr<Datasets> loaded = LoadFashionMnist(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->train.images.sizes().vec(), (std::vector<int64_t>{3, 1, 4, 5}));
  EXPECT_EQ(loaded->train.images[2][0][3][4].item<int>(), 59);
  EXPECT_EQ(Values<int64_t>(loaded->test.labels), (std::vector<int64_t>{9, 0, 4}));
}

// ----------------------------------------------------------------------------
// CIFAR

// Distinct, position-dependent pixel values so misplaced bytes are caught.
uint8_t CifarPixel(int record, int c, int y, int x) {
  return static_cast<uint8_t>((record * 37 + c * 101 + y * 7 + x * 3) % 256);
}

Bytes CifarFile(int first_record, int count, const std::function<Bytes(int)>& label_bytes) {
  Bytes out;
  for (int r = first_record; r < first_record + count; ++r) {
    Bytes labels = label_bytes(r);
    out.insert(out.end(), labels.begin(), labels.end());
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 32; ++y) {
        for (int x = 0; x < 32; ++x) out.push_back(CifarPixel(r, c, y, x));
      }
    }
  }
  return out;
}

void ExpectCifarPixels(const ImageSet& set, int first_record) {
  ASSERT_EQ(set.images.dim(), 4);
  EXPECT_EQ(set.images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(set.labels.scalar_type(), torch::kInt64);
  for (int i = 0; i < set.size(); ++i) {
    for (auto [c, y, x] : {std::tuple{0, 0, 0}, std::tuple{1, 5, 9}, std::tuple{2, 31, 31},
                           std::tuple{2, 0, 31}, std::tuple{0, 31, 0}}) {
      EXPECT_EQ(set.images[i][c][y][x].item<int>(), CifarPixel(first_record + i, c, y, x))
          << "sample " << i << " at " << c << "," << y << "," << x;
    }
  }
}

TEST(CifarTest, Cifar10RecordsLandInPlace) {
  const std::string dir = MakeTempDir();
  auto label = [](int r) { return Bytes{static_cast<uint8_t>(r % 10)}; };
  for (int b = 1; b <= 5; ++b) {
    WritePlain(dir + "/data_batch_" + std::to_string(b) + ".bin", CifarFile((b - 1) * 3, 3, label));
  }
  WritePlain(dir + "/test_batch.bin", CifarFile(100, 2, label));
  absl::StatusOr<Datasets> loaded = LoadCifar(dir, 10);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->num_classes, 10);
  EXPECT_EQ(loaded->train.images.sizes().vec(), (std::vector<int64_t>{15, 3, 32, 32}));
  EXPECT_EQ(loaded->test.images.sizes().vec(), (std::vector<int64_t>{2, 3, 32, 32}));
  ExpectCifarPixels(loaded->train, 0);
  ExpectCifarPixels(loaded->test, 100);
  std::vector<int64_t> expected(15);
  for (int r = 0; r < 15; ++r) expected[r] = r % 10;
  EXPECT_EQ(Values<int64_t>(loaded->train.labels), expected);
  EXPECT_EQ(Values<int64_t>(loaded->test.labels), (std::vector<int64_t>{0, 1}));
  // Statistics per channel, from the training set only.
  ASSERT_EQ(loaded->mean.size(), 3u);
  torch::Tensor x = loaded->train.images.to(torch::kFloat64) / 255.0;
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(loaded->mean[c], x.select(1, c).mean().item<double>(), 1e-9);
    EXPECT_NEAR(loaded->std[c], x.select(1, c).std(false).item<double>(), 1e-9);
  }
}

TEST(CifarTest, Cifar100UsesFineLabels) {
  const std::string dir = MakeTempDir();
  // Coarse label r % 20 differs from fine label (r * 13) % 100 for most records.
  auto labels = [](int r) {
    return Bytes{static_cast<uint8_t>(r % 20), static_cast<uint8_t>(r * 13 % 100)};
  };
  WritePlain(dir + "/train.bin", CifarFile(0, 9, labels));
  WritePlain(dir + "/test.bin", CifarFile(50, 4, labels));
  absl::StatusOr<Datasets> loaded = LoadCifar(dir, 100);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->num_classes, 100);
  EXPECT_EQ(loaded->train.size(), 9);
  ExpectCifarPixels(loaded->train, 0);
  ExpectCifarPixels(loaded->test, 50);
  std::vector<int64_t> expected;
  for (int r = 50; r < 54; ++r) expected.push_back(r * 13 % 100);
  EXPECT_EQ(Values<int64_t>(loaded->test.labels), expected);
}

TEST(CifarTest, FindsTheUnpackedArchiveDirectory) {
  const std::string dir = MakeTempDir();
  std::filesystem::create_directory(dir + "/cifar-100-binary");
  auto labels = [](int r) { return Bytes{0, static_cast<uint8_t>(r)}; };
  WritePlain(dir + "/cifar-100-binary/train.bin", CifarFile(0, 2, labels));
  WritePlain(dir + "/cifar-100-binary/test.bin", CifarFile(0, 1, labels));
  absl::StatusOr<Datasets> loaded = LoadCifar(dir, 100);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->train.size(), 2);
}

TEST(CifarTest, WrongSizeIsRejected) {
  const std::string dir = MakeTempDir();
  auto labels = [](int r) { return Bytes{0, static_cast<uint8_t>(r)}; };
  Bytes train = CifarFile(0, 2, labels);
  train.pop_back();  // one byte short of two records
  WritePlain(dir + "/train.bin", train);
  WritePlain(dir + "/test.bin", CifarFile(0, 1, labels));
  absl::StatusOr<Datasets> loaded = LoadCifar(dir, 100);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(loaded.status().message()),
              AllOf(HasSubstr(dir + "/train.bin"), HasSubstr("3074")));
}

TEST(CifarTest, LabelOutOfRangeIsRejected) {
  const std::string dir = MakeTempDir();
  auto label = [](int r) { return Bytes{static_cast<uint8_t>(r == 1 ? 10 : 0)}; };
  for (int b = 1; b <= 5; ++b) {
    WritePlain(dir + "/data_batch_" + std::to_string(b) + ".bin", CifarFile(0, 2, label));
  }
  WritePlain(dir + "/test_batch.bin", CifarFile(0, 1, label));
  absl::StatusOr<Datasets> loaded = LoadCifar(dir, 10);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(std::string(loaded.status().message()),
              AllOf(HasSubstr("data_batch_1.bin"), HasSubstr("label 10")));
}

TEST(CifarTest, MissingFilesAndBadClassCount) {
  const std::string dir = MakeTempDir();
  absl::StatusOr<Datasets> loaded = LoadCifar(dir, 10);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("data_batch_1.bin"));
  EXPECT_EQ(LoadCifar(dir, 7).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadCifar(dir + "/nowhere", 10).status().code(), absl::StatusCode::kNotFound);
}

// ----------------------------------------------------------------------------
// Synthetic data and LoadDatasets

TEST(SyntheticTest, DeterministicFromTheSeed) {
  Datasets a = MakeSynthetic(200, 50, {3, 8, 8}, 5, 42);
  Datasets b = MakeSynthetic(200, 50, {3, 8, 8}, 5, 42);
  Datasets c = MakeSynthetic(200, 50, {3, 8, 8}, 5, 43);
  EXPECT_EQ(a.train.images.sizes().vec(), (std::vector<int64_t>{200, 3, 8, 8}));
  EXPECT_EQ(a.test.images.sizes().vec(), (std::vector<int64_t>{50, 3, 8, 8}));
  EXPECT_EQ(a.train.images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(a.train.labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(a.num_classes, 5);
  EXPECT_TRUE(torch::equal(a.train.images, b.train.images));
  EXPECT_TRUE(torch::equal(a.train.labels, b.train.labels));
  EXPECT_TRUE(torch::equal(a.test.images, b.test.images));
  EXPECT_EQ(a.mean, b.mean);
  EXPECT_FALSE(torch::equal(a.train.images, c.train.images));
  EXPECT_FALSE(torch::equal(a.test.images, c.test.images));
  // Train and test are different draws, not the same samples.
  EXPECT_FALSE(torch::equal(a.train.images.narrow(0, 0, 50), a.test.images));
  // Balanced classes.
  EXPECT_EQ(Values<int64_t>(torch::bincount(a.train.labels, {}, 5)), std::vector<int64_t>(5, 40));
  ASSERT_EQ(a.mean.size(), 3u);
  EXPECT_NEAR(a.mean[0],
              (a.train.images.select(1, 0).to(torch::kFloat64) / 255).mean().item<double>(), 1e-9);
}

// Class prototypes + noise: the nearest class mean of the training set
// classifies the test set almost perfectly, so a model can learn it.
TEST(SyntheticTest, IsLearnable) {
  const int classes = 10;
  Datasets d = MakeSynthetic(1000, 500, {1, 8, 8}, classes, 7);
  torch::Tensor train = d.train.images.flatten(1).to(torch::kFloat32);
  torch::Tensor test = d.test.images.flatten(1).to(torch::kFloat32);
  std::vector<torch::Tensor> means;
  for (int k = 0; k < classes; ++k) means.push_back(train.index({d.train.labels == k}).mean(0));
  torch::Tensor distances = torch::cdist(test, torch::stack(means));
  const double accuracy =
      (distances.argmin(1) == d.test.labels).to(torch::kFloat64).mean().item<double>();
  EXPECT_GT(accuracy, 0.95);
  // ...but samples of one class are not identical.
  torch::Tensor same_class = train.index({d.train.labels == 0});
  EXPECT_GT((same_class[0] - same_class[1]).abs().sum().item<float>(), 0);
}

TEST(LoadDatasetsTest, SyntheticWithLimits) {
  DataSpec spec;
  spec.dataset = DatasetKind::kSynthetic;
  spec.train_size = 300;
  spec.test_size = 100;
  spec.shape = {2, 5, 6};
  spec.classes = 4;
  spec.limit_train = 120;
  absl::StatusOr<Datasets> loaded = LoadDatasets(spec, 9);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->train.size(), 120);
  EXPECT_EQ(loaded->test.size(), 100);
  EXPECT_EQ(loaded->num_classes, 4);
  Datasets direct = MakeSynthetic(300, 100, {2, 5, 6}, 4, 9);
  EXPECT_TRUE(torch::equal(loaded->train.images, direct.train.images.narrow(0, 0, 120)));
  EXPECT_TRUE(torch::equal(loaded->test.labels, direct.test.labels));
}

TEST(LoadDatasetsTest, ErrorsNameTheField) {
  DataSpec spec;
  spec.dataset = DatasetKind::kCifar10;
  absl::Status s = LoadDatasets(spec, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("data.path"));

  spec.dataset = DatasetKind::kSynthetic;
  spec.shape = {3, 32};
  s = LoadDatasets(spec, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("data.shape"));

  spec.shape = {3, 4, 4};
  spec.classes = 0;
  EXPECT_THAT(std::string(LoadDatasets(spec, 0).status().message()), HasSubstr("data.classes"));

  spec.classes = 3;
  spec.limit_train = -1;
  EXPECT_THAT(std::string(LoadDatasets(spec, 0).status().message()), HasSubstr("data.limit_train"));

  spec = DataSpec();
  spec.dataset = DatasetKind::kFashionMnist;
  spec.path = MakeTempDir() + "/nowhere";
  s = LoadDatasets(spec, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("dataset-fashion-mnist"));
}

// ----------------------------------------------------------------------------
// BatchSampler

// n images [1, 2, 2] whose pixels all equal the sample index; label = index, so
// batches reveal which samples they hold.
ImageSet IndexedSet(int64_t n) {
  ImageSet set;
  set.labels = torch::arange(n, torch::kInt64);
  set.images = set.labels.to(torch::kUInt8).view({n, 1, 1, 1}).expand({n, 1, 2, 2}).contiguous();
  return set;
}

std::vector<int64_t> EpochOrder(const BatchSampler& sampler, int64_t epoch) {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < sampler.batches_per_epoch(); ++i) {
    std::vector<int64_t> y = Values<int64_t>(sampler.Get(epoch, i).y);
    order.insert(order.end(), y.begin(), y.end());
  }
  return order;
}

TEST(BatchSamplerTest, EverySampleOncePerEpoch) {
  SamplerOptions options;
  options.batch_size = 16;
  options.drop_last = false;
  options.seed = 5;
  BatchSampler sampler(IndexedSet(100), options);
  ASSERT_EQ(sampler.batches_per_epoch(), 7);
  for (int64_t epoch : {0, 1, 7}) {
    std::vector<int64_t> order = EpochOrder(sampler, epoch);
    ASSERT_EQ(order.size(), 100u);
    EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 100u);
    EXPECT_EQ(*std::min_element(order.begin(), order.end()), 0);
    EXPECT_EQ(*std::max_element(order.begin(), order.end()), 99);
    std::vector<int64_t> identity(100);
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_NE(order, identity) << "epoch " << epoch << " was not shuffled";
  }
  EXPECT_NE(EpochOrder(sampler, 0), EpochOrder(sampler, 1));
  EXPECT_EQ(sampler.Get(0, 6).y.size(0), 4);  // 100 = 6 * 16 + 4
}

TEST(BatchSamplerTest, ImagesFollowTheirLabels) {
  SamplerOptions options;
  options.batch_size = 8;
  BatchSampler sampler(IndexedSet(50), options);
  Batch batch = sampler.Get(3, 2);
  EXPECT_EQ(batch.epoch, 3);
  EXPECT_EQ(batch.index, 2);
  EXPECT_EQ(batch.x.scalar_type(), torch::kFloat32);
  EXPECT_EQ(batch.y.scalar_type(), torch::kInt64);
  EXPECT_EQ(batch.x.sizes().vec(), (std::vector<int64_t>{8, 1, 2, 2}));
  // No mean/std: pixels are only rescaled to [0, 1].
  torch::Tensor expected =
      (batch.y.to(torch::kFloat32) / 255).view({8, 1, 1, 1}).expand({8, 1, 2, 2});
  EXPECT_TRUE(torch::allclose(batch.x, expected));
}

TEST(BatchSamplerTest, DeterministicAcrossCallsOrderAndInstances) {
  Datasets d = MakeSynthetic(300, 0, {3, 8, 8}, 10, 1);
  SamplerOptions options;
  options.batch_size = 32;
  options.seed = 11;
  options.augment = true;
  options.crop_padding = 2;
  options.mean = d.mean;
  options.std = d.std;
  BatchSampler a(d.train, options);
  BatchSampler b(d.train, options);
  // Different call orders and epochs interleaved, which would disturb a
  // sampler with hidden state or a small cache.
  Batch a_late = a.Get(4, 5);
  Batch a_early = a.Get(0, 0);
  a.Get(1, 1);
  a.Get(2, 1);
  Batch b_early = b.Get(0, 0);
  Batch b_late = b.Get(4, 5);
  EXPECT_TRUE(torch::equal(a_early.x, b_early.x));
  EXPECT_TRUE(torch::equal(a_early.y, b_early.y));
  EXPECT_TRUE(torch::equal(a_late.x, b_late.x));
  EXPECT_TRUE(torch::equal(a_late.x, a.Get(4, 5).x));
  BatchSampler copy = a;
  EXPECT_TRUE(torch::equal(copy.Get(4, 5).x, a_late.x));
  // Another seed gives other batches.
  options.seed = 12;
  BatchSampler c(d.train, options);
  EXPECT_FALSE(torch::equal(c.Get(0, 0).y, a_early.y));
}

// Workers draw batches from several threads; the permutation cache must not
// make the result depend on which thread asked first.
TEST(BatchSamplerTest, ConcurrentGetMatchesSerial) {
  Datasets d = MakeSynthetic(512, 0, {1, 6, 6}, 4, 2);
  SamplerOptions options;
  options.batch_size = 32;
  options.augment = true;
  options.crop_padding = 1;
  BatchSampler sampler(d.train, options);
  const int64_t epochs = 5;
  const int64_t per_epoch = sampler.batches_per_epoch();
  std::vector<torch::Tensor> serial;
  for (int64_t e = 0; e < epochs; ++e) {
    for (int64_t i = 0; i < per_epoch; ++i) serial.push_back(sampler.Get(e, i).x);
  }
  BatchSampler fresh(d.train, options);
  std::vector<torch::Tensor> parallel(serial.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Each thread walks every epoch, so epochs are evicted and recomputed.
      for (size_t k = t; k < parallel.size(); k += 4) {
        parallel[k] =
            fresh.Get(static_cast<int64_t>(k) / per_epoch, static_cast<int64_t>(k) % per_epoch).x;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t k = 0; k < serial.size(); ++k) {
    ASSERT_TRUE(torch::equal(parallel[k], serial[k])) << "batch " << k;
  }
}

TEST(BatchSamplerTest, DropLastAndBatchCount) {
  SamplerOptions options;
  options.batch_size = 4;
  options.drop_last = true;
  BatchSampler dropping(IndexedSet(10), options);
  EXPECT_EQ(dropping.batches_per_epoch(), 2);
  EXPECT_EQ(EpochOrder(dropping, 0).size(), 8u);
  // Out-of-range indices give an empty batch rather than a crash.
  EXPECT_EQ(dropping.Get(0, 2).y.size(0), 0);
  EXPECT_EQ(dropping.Get(0, -1).x.size(0), 0);

  options.drop_last = false;
  BatchSampler keeping(IndexedSet(10), options);
  EXPECT_EQ(keeping.batches_per_epoch(), 3);
  EXPECT_EQ(keeping.Get(0, 2).y.size(0), 2);
  EXPECT_EQ(keeping.Get(0, 2).x.sizes().vec(), (std::vector<int64_t>{2, 1, 2, 2}));

  options.batch_size = 5;
  EXPECT_EQ(BatchSampler(IndexedSet(10), options).batches_per_epoch(), 2);
  options.batch_size = 11;
  options.drop_last = true;
  EXPECT_EQ(BatchSampler(IndexedSet(10), options).batches_per_epoch(), 0);
}

TEST(BatchSamplerTest, NoShuffleKeepsTheOrder) {
  SamplerOptions options;
  options.batch_size = 3;
  options.shuffle = false;
  options.drop_last = false;
  BatchSampler sampler(IndexedSet(7), options);
  EXPECT_EQ(EpochOrder(sampler, 0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(EpochOrder(sampler, 3), EpochOrder(sampler, 0));
}

TEST(BatchSamplerTest, AugmentationVariesByBatchAndIsNormalised) {
  Datasets d = MakeSynthetic(256, 0, {3, 16, 16}, 4, 3);
  SamplerOptions options;
  options.batch_size = 64;
  options.shuffle = false;
  options.augment = true;
  options.crop_padding = 4;
  options.mean = d.mean;
  options.std = d.std;
  BatchSampler augmented(d.train, options);
  options.augment = false;
  BatchSampler plain(d.train, options);
  Batch x = augmented.Get(0, 1);
  Batch p = plain.Get(0, 1);
  EXPECT_TRUE(torch::equal(x.y, p.y));
  EXPECT_FALSE(torch::equal(x.x, p.x));
  // Same batch, next epoch: other crops and flips.
  EXPECT_FALSE(torch::equal(augmented.Get(1, 1).x, x.x));
  // Without augmentation the batch is exactly the normalised images.
  torch::Tensor raw = d.train.images.narrow(0, 64, 64).to(torch::kFloat64) / 255.0;
  for (int c = 0; c < 3; ++c) {
    torch::Tensor want = (raw.select(1, c) - d.mean[c]) / d.std[c];
    EXPECT_TRUE(torch::allclose(p.x.select(1, c).to(torch::kFloat64), want, 1e-5, 1e-5));
  }
}

TEST(BatchSamplerTest, ValidateOptions) {
  ImageSet set = IndexedSet(10);
  SamplerOptions options;
  EXPECT_TRUE(ValidateSamplerOptions(set, options).ok());
  options.batch_size = 0;
  EXPECT_THAT(std::string(ValidateSamplerOptions(set, options).message()), HasSubstr("batch_size"));
  options.batch_size = 4;
  options.mean = {0.5, 0.5};
  options.std = {0.2, 0.2};
  EXPECT_THAT(std::string(ValidateSamplerOptions(set, options).message()), HasSubstr("mean"));
  options.mean = {0.5};
  options.std = {0.0};
  EXPECT_THAT(std::string(ValidateSamplerOptions(set, options).message()), HasSubstr("std"));
  options.std = {0.2};
  EXPECT_TRUE(ValidateSamplerOptions(set, options).ok());
  set.labels = set.labels.narrow(0, 0, 9);
  EXPECT_THAT(std::string(ValidateSamplerOptions(set, options).message()), HasSubstr("labels"));
}

// ----------------------------------------------------------------------------
// Augmentation primitives

TEST(RandomCropTest, ZeroPaddingIsIdentity) {
  torch::Tensor images = torch::rand({8, 3, 5, 7});
  EXPECT_TRUE(torch::equal(RandomCrop(images, 0, 123), images));
}

// One lit pixel per sample: after the crop it sits within `padding` of where it
// was, every sample gets its own offset, and all offsets in range occur.
TEST(RandomCropTest, ShiftsContentWithinThePadding) {
  const int64_t b = 400;
  const int padding = 2;
  torch::Tensor images = torch::zeros({b, 2, 9, 9});
  images.index_put_({torch::indexing::Slice(), torch::indexing::Slice(), 4, 4}, 1.0);
  torch::Tensor out = RandomCrop(images, padding, 99);
  ASSERT_EQ(out.sizes(), images.sizes());
  std::set<std::pair<int64_t, int64_t>> offsets;
  for (int64_t i = 0; i < b; ++i) {
    torch::Tensor lit = out[i][0].nonzero();
    ASSERT_EQ(lit.size(0), 1) << "sample " << i;
    const int64_t y = lit[0][0].item<int64_t>();
    const int64_t x = lit[0][1].item<int64_t>();
    EXPECT_LE(std::abs(y - 4), padding);
    EXPECT_LE(std::abs(x - 4), padding);
    // Both channels of a sample move together.
    EXPECT_EQ(out[i][1][y][x].item<float>(), 1.0f);
    offsets.insert({y - 4, x - 4});
  }
  EXPECT_EQ(offsets.size(), 25u);  // every shift in [-2, 2]^2 occurs
  EXPECT_TRUE(torch::equal(RandomCrop(images, padding, 99), out));
  EXPECT_FALSE(torch::equal(RandomCrop(images, padding, 100), out));
}

// A white image becomes a white rectangle bordered by zero padding.
TEST(RandomCropTest, FillsWithZeros) {
  const int padding = 3;
  torch::Tensor images = torch::full({64, 1, 8, 8}, 255, torch::kUInt8);
  torch::Tensor out = RandomCrop(images, padding, 5);
  EXPECT_EQ(out.scalar_type(), torch::kUInt8);
  int shifted = 0;
  for (int64_t i = 0; i < 64; ++i) {
    torch::Tensor lit = out[i][0] > 0;
    const int64_t rows = lit.any(1).sum().item<int64_t>();
    const int64_t cols = lit.any(0).sum().item<int64_t>();
    EXPECT_GE(rows, 8 - padding);
    EXPECT_GE(cols, 8 - padding);
    EXPECT_EQ(lit.sum().item<int64_t>(), rows * cols);
    if (rows * cols < 64) ++shifted;
  }
  EXPECT_GT(shifted, 50);  // P(no shift) = 1/49 per sample
}

TEST(RandomHorizontalFlipTest, FlipsAboutHalfTheSamplesExactly) {
  const int64_t b = 200;
  torch::Tensor images = torch::arange(b * 2 * 3 * 4, torch::kFloat32).view({b, 2, 3, 4});
  torch::Tensor out = RandomHorizontalFlip(images, 17);
  std::vector<bool> flipped(b);
  int count = 0;
  for (int64_t i = 0; i < b; ++i) {
    const bool same = torch::equal(out[i], images[i]);
    const bool mirrored = torch::equal(out[i], images[i].flip({2}));
    ASSERT_NE(same, mirrored) << "sample " << i << " is neither kept nor mirrored";
    flipped[i] = mirrored;
    count += mirrored;
  }
  EXPECT_GT(count, 70);
  EXPECT_LT(count, 130);
  // Deterministic, and the same seed flips the same samples for any dtype.
  EXPECT_TRUE(torch::equal(RandomHorizontalFlip(images, 17), out));
  torch::Tensor third = RandomHorizontalFlip(images.to(torch::kUInt8), 17);
  EXPECT_EQ(third.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(third, out.to(torch::kUInt8)));
  EXPECT_FALSE(torch::equal(RandomHorizontalFlip(images, 18), out));
}

TEST(NormalizeTest, ComputesPerChannelValues) {
  torch::Tensor images = torch::zeros({2, 2, 1, 2});
  images.index_put_({torch::indexing::Slice(), torch::indexing::Slice(), 0, 1}, 255.0);
  torch::Tensor out = Normalize(images, {0.5, 0.25}, {0.25, 0.5});
  EXPECT_EQ(out.scalar_type(), torch::kFloat32);
  for (int b = 0; b < 2; ++b) {
    EXPECT_FLOAT_EQ(out[b][0][0][0].item<float>(), -2.0f);  // (0 - 0.5) / 0.25
    EXPECT_FLOAT_EQ(out[b][0][0][1].item<float>(), 2.0f);   // (1 - 0.5) / 0.25
    EXPECT_FLOAT_EQ(out[b][1][0][0].item<float>(), -0.5f);  // (0 - 0.25) / 0.5
    EXPECT_FLOAT_EQ(out[b][1][0][1].item<float>(), 1.5f);   // (1 - 0.25) / 0.5
  }
  // uint8 input gives the same; the input itself is left alone.
  EXPECT_TRUE(torch::allclose(Normalize(images.to(torch::kUInt8), {0.5, 0.25}, {0.25, 0.5}), out));
  EXPECT_EQ(images[0][0][0][1].item<float>(), 255.0f);
  // One entry applies to every channel; none only rescales.
  torch::Tensor shared = Normalize(images, {0.5}, {0.25});
  EXPECT_FLOAT_EQ(shared[1][1][0][1].item<float>(), 2.0f);
  torch::Tensor rescaled = Normalize(images, {}, {});
  EXPECT_FLOAT_EQ(rescaled[0][1][0][1].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(rescaled[0][1][0][0].item<float>(), 0.0f);
}

TEST(SeedTest, UniformIntIsUnbiasedAndStable) {
  std::mt19937_64 rng(1);
  std::vector<int> counts(6, 0);
  for (int i = 0; i < 60000; ++i) {
    const uint64_t v = UniformInt(rng, 6);
    ASSERT_LT(v, 6u);
    ++counts[v];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 400);
  EXPECT_NE(MixSeed(0, 1, 2, 3), MixSeed(0, 1, 3, 2));
  EXPECT_NE(MixSeed(0, 1), MixSeed(1, 1));
}

// Golden values: every process, platform and LibTorch version must draw the
// same batches, so a change here is a breaking change to the data order.
TEST(SeedTest, PinnedValues) {
  EXPECT_EQ(MixSeed(0, 1, 2, 3), 1470200354583225620ULL);
  std::mt19937_64 rng(MixSeed(0, 1, 2, 3));
  EXPECT_EQ(UniformInt(rng, 1000), 671u);
  SamplerOptions options;
  options.batch_size = 10;
  options.seed = 0;
  EXPECT_EQ(Values<int64_t>(BatchSampler(IndexedSet(10), options).Get(0, 0).y),
            (std::vector<int64_t>{4, 2, 8, 7, 5, 0, 9, 6, 3, 1}));
}

// One step count for the coordinator, the stages and the reference trainer:
// each phase is rounded up on its own, and a job-level step budget wins.
TEST(TotalSteps, SumsPhasesRoundedUpEachAndHonoursAStepBudget) {
  JobSpec spec;
  PhaseSpec a, b;
  a.epochs = 0.5;
  b.epochs = 0.5;
  spec.phases = {a, b};
  spec.epochs = 1.0;
  EXPECT_EQ(PhaseSteps(a, 937), 469);
  EXPECT_EQ(TotalSteps(spec, 937), 938);  // not ceil(1.0 * 937) = 937
  spec.steps = 2;                         // e.g. train-local --steps 2
  EXPECT_EQ(TotalSteps(spec, 937), 2);
  JobSpec single;
  single.epochs = 1.5;
  EXPECT_EQ(TotalSteps(single, 10), 15);
  PhaseSpec by_steps;
  by_steps.steps = 7;
  EXPECT_EQ(PhaseSteps(by_steps, 10), 7);
}

}  // namespace
}  // namespace stagewise::data
