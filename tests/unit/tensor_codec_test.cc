#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/tensor/codec.h"

namespace stagewise {
namespace {

using ::testing::HasSubstr;

struct DTypeCase {
  c10::ScalarType torch;
  v1::DType wire;
  const char* name;
};

const DTypeCase kDTypeCases[] = {
    {torch::kFloat32, v1::DTYPE_FLOAT32, "float32"},
    {torch::kFloat64, v1::DTYPE_FLOAT64, "float64"},
    {torch::kFloat16, v1::DTYPE_FLOAT16, "float16"},
    {torch::kBFloat16, v1::DTYPE_BFLOAT16, "bfloat16"},
    {torch::kInt64, v1::DTYPE_INT64, "int64"},
    {torch::kInt32, v1::DTYPE_INT32, "int32"},
    {torch::kUInt8, v1::DTYPE_UINT8, "uint8"},
    {torch::kBool, v1::DTYPE_BOOL, "bool"},
};

struct ShapeCase {
  std::vector<int64_t> shape;
  const char* name;
};

// Names for ctest instead of gtest's byte dumps (which hold pointers).
void PrintTo(const DTypeCase& c, std::ostream* os) { *os << c.name; }
void PrintTo(const ShapeCase& c, std::ostream* os) { *os << c.name; }

const ShapeCase kShapeCases[] = {
    {{}, "scalar"}, {{0}, "empty"},     {{3, 0, 2}, "zero_dim_in_middle"},
    {{1}, "one"},   {{7, 5}, "matrix"}, {{2, 1, 3, 1, 2, 2, 1, 3}, "rank8"},
};

// Random values of `dtype`, with the float specials (NaN, +-inf, -0) and
// integer extremes planted at the front so round trips must preserve them.
torch::Tensor MakeRandom(c10::ScalarType dtype, const std::vector<int64_t>& shape) {
  torch::Tensor t;
  if (c10::isFloatingType(dtype)) {
    t = torch::randn(shape, torch::kFloat64).mul_(100).to(dtype);
    auto flat = t.view({-1});
    const double specials[] = {std::nan(""), std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(), -0.0};
    for (int64_t i = 0; i < std::min<int64_t>(flat.numel(), 4); ++i) {
      flat[i] = specials[i];
    }
  } else if (dtype == torch::kBool) {
    t = torch::randint(0, 2, shape, torch::kInt64).to(torch::kBool);
  } else if (dtype == torch::kUInt8) {
    t = torch::randint(0, 256, shape, torch::kInt64).to(torch::kUInt8);
  } else {
    t = torch::randint(-1000000, 1000000, shape, torch::kInt64).to(dtype);
    auto flat = t.view({-1});
    if (flat.numel() >= 2) {
      if (dtype == torch::kInt64) {
        flat[0] = std::numeric_limits<int64_t>::min();
        flat[1] = std::numeric_limits<int64_t>::max();
      } else {
        flat[0] = std::numeric_limits<int32_t>::min();
        flat[1] = std::numeric_limits<int32_t>::max();
      }
    }
  }
  return t;
}

// Bit-exact comparison: unlike torch::equal this treats identical NaNs as
// equal and tells -0.0 from +0.0.
void ExpectSameBytes(const torch::Tensor& actual, const torch::Tensor& expected) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  const torch::Tensor a = actual.contiguous();
  const torch::Tensor e = expected.contiguous();
  const size_t nbytes = static_cast<size_t>(e.numel()) * e.element_size();
  ASSERT_EQ(static_cast<size_t>(a.numel()) * a.element_size(), nbytes);
  if (nbytes > 0) {
    EXPECT_EQ(std::memcmp(a.data_ptr(), e.data_ptr(), nbytes), 0);
  }
}

torch::Tensor RoundTrip(const torch::Tensor& t, const EncodeOptions& opts = {},
                        v1::TensorProto* proto_out = nullptr) {
  v1::TensorProto proto;
  const absl::Status enc = EncodeTensor(t, &proto, opts);
  EXPECT_TRUE(enc.ok()) << enc;
  absl::StatusOr<torch::Tensor> dec = DecodeTensor(proto);
  EXPECT_TRUE(dec.ok()) << dec.status();
  if (proto_out != nullptr) *proto_out = proto;
  return dec.ok() ? *dec : torch::Tensor();
}

// ---------------------------------------------------------------------------
// Round trips across dtype x shape.

class RoundTripTest : public ::testing::TestWithParam<std::tuple<DTypeCase, ShapeCase>> {};

TEST_P(RoundTripTest, BitExact) {
  const auto& [dtype, shape] = GetParam();
  torch::manual_seed(1234);
  const torch::Tensor original = MakeRandom(dtype.torch, shape.shape);

  v1::TensorProto proto;
  ASSERT_TRUE(EncodeTensor(original, &proto).ok());
  EXPECT_EQ(proto.dtype(), dtype.wire);
  EXPECT_EQ(proto.compression(), v1::COMPRESSION_NONE);
  EXPECT_EQ(std::vector<int64_t>(proto.shape().begin(), proto.shape().end()), shape.shape);
  EXPECT_EQ(static_cast<int64_t>(proto.data().size()), original.numel() * original.element_size());
  EXPECT_TRUE(ValidateTensorProto(proto).ok());

  absl::StatusOr<torch::Tensor> decoded = DecodeTensor(proto);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->device().is_cpu());
  EXPECT_TRUE(decoded->is_contiguous());
  EXPECT_FALSE(decoded->requires_grad());
  ExpectSameBytes(*decoded, original);
  if (!c10::isFloatingType(dtype.torch)) {
    EXPECT_TRUE(torch::equal(*decoded, original));
  } else {
    EXPECT_TRUE(decoded->isnan().equal(original.isnan()));
  }

  // The adopting decode gives the same tensor and empties the proto's data.
  absl::StatusOr<torch::Tensor> adopted = DecodeTensor(&proto);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_TRUE(adopted->is_contiguous());
  ExpectSameBytes(*adopted, original);
  EXPECT_TRUE(proto.data().empty());
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAndShapes, RoundTripTest,
                         ::testing::Combine(::testing::ValuesIn(kDTypeCases),
                                            ::testing::ValuesIn(kShapeCases)),
                         [](const ::testing::TestParamInfo<RoundTripTest::ParamType>& info) {
                           return absl::StrCat(std::get<0>(info.param).name, "_",
                                               std::get<1>(info.param).name);
                         });

TEST(TensorCodecTest, ScalarHasEmptyShapeAndOneElement) {
  v1::TensorProto proto;
  ASSERT_TRUE(EncodeTensor(torch::tensor(2.5, torch::kFloat64), &proto).ok());
  EXPECT_EQ(proto.shape_size(), 0);
  EXPECT_EQ(proto.data().size(), 8u);
  absl::StatusOr<torch::Tensor> decoded = DecodeTensor(proto);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->dim(), 0);
  EXPECT_EQ(decoded->item<double>(), 2.5);
}

TEST(TensorCodecTest, WireBytesAreLittleEndianRowMajor) {
  // Pins the wire format itself, not just encode/decode symmetry.
  v1::TensorProto proto;
  const auto t = torch::tensor({{1, 2}, {3, 0x01020304}}, torch::kInt32);
  ASSERT_TRUE(EncodeTensor(t, &proto).ok());
  const std::string expected("\x01\0\0\0\x02\0\0\0\x03\0\0\0\x04\x03\x02\x01", 16);
  EXPECT_EQ(proto.data(), expected);
}

TEST(TensorCodecTest, LargeTensorRoundTrip) {
  torch::manual_seed(7);
  const int64_t numel = 4200000;  // 16.8 MB of float32, past 16 MiB.
  const torch::Tensor original = torch::randn({numel / 100, 100});
  v1::TensorProto proto;
  const torch::Tensor decoded = RoundTrip(original, {}, &proto);
  EXPECT_EQ(static_cast<int64_t>(proto.data().size()), numel * 4);
  EXPECT_GE(proto.data().size(), size_t{16} << 20);
  EXPECT_TRUE(torch::equal(decoded, original));
}

TEST(TensorCodecTest, DecodedTensorOwnsItsMemory) {
  const torch::Tensor original = torch::arange(16, torch::kFloat32);
  v1::TensorProto proto;
  ASSERT_TRUE(EncodeTensor(original, &proto).ok());
  absl::StatusOr<torch::Tensor> decoded = DecodeTensor(proto);
  ASSERT_TRUE(decoded.ok());
  const char* buf = proto.data().data();
  const char* ptr = static_cast<const char*>(decoded->data_ptr());
  EXPECT_TRUE(ptr + decoded->nbytes() <= buf || ptr >= buf + proto.data().size());
  // Scribbling over and then freeing the proto must not touch the tensor.
  std::memset(proto.mutable_data()->data(), 0xff, proto.data().size());
  proto.Clear();
  EXPECT_TRUE(torch::equal(*decoded, original));
}

TEST(TensorCodecTest, AdoptingDecodeTakesThePayloadWithoutACopy) {
  torch::manual_seed(3);
  const torch::Tensor original = torch::randn({64, 1000});
  auto proto = std::make_unique<v1::TensorProto>();
  ASSERT_TRUE(EncodeTensor(original, proto.get()).ok());
  const void* payload = proto->data().data();
  absl::StatusOr<torch::Tensor> adopted = DecodeTensor(proto.get());
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(adopted->data_ptr(), payload);  // the very buffer gRPC parsed into
  EXPECT_TRUE(proto->data().empty());
  proto.reset();  // the tensor owns the buffer now
  EXPECT_TRUE(torch::equal(*adopted, original));
  adopted->mul_(2);  // and may write to it
  EXPECT_TRUE(torch::equal(*adopted, original * 2));
}

TEST(TensorCodecTest, AdoptingDecodeChargesTheBufferUntilTheTensorFreesIt) {
  const torch::Tensor original = torch::arange(1000, torch::kFloat32);
  v1::TensorProto proto;
  ASSERT_TRUE(EncodeTensor(original, &proto).ok());
  int64_t charged = 0;
  DecodeOptions options;
  options.charge = [&charged](int64_t bytes) {
    charged += bytes;
    return std::function<void()>([&charged, bytes] { charged -= bytes; });
  };
  absl::StatusOr<torch::Tensor> adopted = DecodeTensor(&proto, options);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(charged, 4000);
  torch::Tensor view = adopted->slice(0, 10, 20);  // shares the buffer
  adopted = absl::StatusOr<torch::Tensor>(torch::Tensor());
  EXPECT_EQ(charged, 4000);
  view = torch::Tensor();
  EXPECT_EQ(charged, 0);
}

TEST(TensorCodecTest, AdoptingDecodeWidensCompressedPayloads) {
  torch::manual_seed(4);
  const torch::Tensor original = torch::randn({32, 33});
  for (v1::Compression c : {v1::COMPRESSION_FP16, v1::COMPRESSION_BF16}) {
    EncodeOptions opts;
    opts.compression = c;
    v1::TensorProto proto;
    ASSERT_TRUE(EncodeTensor(original, &proto, opts).ok());
    absl::StatusOr<torch::Tensor> copied = DecodeTensor(proto);
    absl::StatusOr<torch::Tensor> adopted = DecodeTensor(&proto);
    ASSERT_TRUE(copied.ok() && adopted.ok());
    EXPECT_EQ(adopted->scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(*adopted, *copied));
  }
}

TEST(TensorCodecTest, AdoptingDecodeLeavesABadProtoAlone) {
  v1::TensorProto proto;
  proto.set_dtype(v1::DTYPE_FLOAT32);
  proto.add_shape(3);
  proto.set_data(std::string(11, 'x'));  // 12 bytes expected
  absl::StatusOr<torch::Tensor> adopted = DecodeTensor(&proto);
  ASSERT_FALSE(adopted.ok());
  EXPECT_THAT(adopted.status().message(), HasSubstr("tensor.data"));
  EXPECT_EQ(proto.data().size(), 11u);
  EXPECT_FALSE(DecodeTensor(static_cast<v1::TensorProto*>(nullptr)).ok());
}

TEST(TensorCodecTest, EncodeOverwritesPreviousContents) {
  v1::TensorProto proto;
  proto.add_shape(99);
  proto.set_data("junk");
  proto.set_compression(v1::COMPRESSION_BF16);
  ASSERT_TRUE(EncodeTensor(torch::ones({2}, torch::kInt64), &proto).ok());
  EXPECT_EQ(proto.shape_size(), 1);
  EXPECT_EQ(proto.shape(0), 2);
  EXPECT_EQ(proto.data().size(), 16u);
  EXPECT_EQ(proto.compression(), v1::COMPRESSION_NONE);
}

TEST(TensorCodecTest, RequiresGradInputIsEncoded) {
  const torch::Tensor w = torch::randn({3, 4}, torch::requires_grad());
  const torch::Tensor decoded = RoundTrip(w * 2);
  EXPECT_FALSE(decoded.requires_grad());
  EXPECT_TRUE(torch::equal(decoded, (w * 2).detach()));
}

// ---------------------------------------------------------------------------
// Non-contiguous inputs.

TEST(TensorCodecTest, TransposedInputRoundTrips) {
  const torch::Tensor base = torch::randn({5, 7});
  const torch::Tensor t = base.t();
  ASSERT_FALSE(t.is_contiguous());
  const torch::Tensor decoded = RoundTrip(t);
  EXPECT_EQ(decoded.sizes(), (std::vector<int64_t>{7, 5}));
  EXPECT_TRUE(torch::equal(decoded, t));
}

TEST(TensorCodecTest, SteppedSliceRoundTrips) {
  const torch::Tensor base = torch::arange(60, torch::kInt64).view({6, 10});
  const torch::Tensor t = base.slice(/*dim=*/1, /*start=*/1, /*end=*/10,
                                     /*step=*/3)
                              .slice(0, 0, 6, 2);
  ASSERT_FALSE(t.is_contiguous());
  const torch::Tensor decoded = RoundTrip(t);
  EXPECT_EQ(decoded.sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_TRUE(torch::equal(decoded, t));
  EXPECT_EQ(decoded[1][2].item<int64_t>(), 27);  // base[2][7].
}

TEST(TensorCodecTest, ExpandedAndPermutedInputsRoundTrip) {
  const torch::Tensor expanded = torch::randn({1, 4}).expand({3, 4});
  EXPECT_TRUE(torch::equal(RoundTrip(expanded), expanded));
  const torch::Tensor permuted = torch::randn({2, 3, 4}).permute({2, 0, 1}).to(torch::kBFloat16);
  ExpectSameBytes(RoundTrip(permuted), permuted);
  const torch::Tensor offset_scalar = torch::arange(10, torch::kInt32)[7];
  EXPECT_EQ(RoundTrip(offset_scalar).item<int32_t>(), 7);
}

TEST(TensorCodecTest, NegativeViewIsResolved) {
  const torch::Tensor base = torch::arange(1, 5, torch::kFloat32);
  const torch::Tensor neg = base._neg_view();
  const torch::Tensor decoded = RoundTrip(neg);
  EXPECT_TRUE(torch::equal(decoded, -base));
}

TEST(TensorCodecTest, CudaInputIsCopiedToCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const torch::Tensor cpu = torch::randn({4, 3});
  const torch::Tensor decoded = RoundTrip(cpu.to(torch::kCUDA).t());
  EXPECT_TRUE(decoded.device().is_cpu());
  EXPECT_TRUE(torch::equal(decoded, cpu.t()));
}

// Narrowing happens where the tensor is (on a GPU before the copy): the wire
// holds the same bytes as narrowing the CPU copy would.
TEST(TensorCodecTest, CudaInputIsNarrowedOnTheDeviceToTheSameBytes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(5);
  const torch::Tensor cpu = torch::randn({33, 17});
  for (v1::Compression c : {v1::COMPRESSION_FP16, v1::COMPRESSION_BF16}) {
    v1::TensorProto from_cpu, from_cuda;
    ASSERT_TRUE(EncodeTensor(cpu.t(), &from_cpu, EncodeOptions{c}).ok());
    ASSERT_TRUE(EncodeTensor(cpu.to(torch::kCUDA).t(), &from_cuda, EncodeOptions{c}).ok());
    EXPECT_EQ(from_cpu.data(), from_cuda.data()) << v1::Compression_Name(c);
  }
}

// ---------------------------------------------------------------------------
// Lossy compression.

// A view (transposed, negated) is narrowed value by value: the wire holds
// exactly the bytes of the contiguous narrowed tensor.
TEST(TensorCodecTest, CompressedViewsCarryTheNarrowedValuesInOrder) {
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({9, 5});
  const torch::Tensor view = x.t()._neg_view();
  for (v1::Compression c : {v1::COMPRESSION_FP16, v1::COMPRESSION_BF16}) {
    v1::TensorProto proto;
    ASSERT_TRUE(EncodeTensor(view, &proto, EncodeOptions{c}).ok());
    const torch::Tensor expected =
        (-x.t()).contiguous().to(c == v1::COMPRESSION_FP16 ? torch::kHalf : torch::kBFloat16);
    ASSERT_EQ(proto.data().size(), static_cast<size_t>(expected.numel() * 2));
    EXPECT_EQ(std::memcmp(proto.data().data(), expected.data_ptr(), proto.data().size()), 0)
        << v1::Compression_Name(c);
  }
}

TEST(TensorCodecTest, Fp16CompressionHalvesBytesWithinTolerance) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::rand({64, 33}) * 2 - 1;  // [-1, 1].
  v1::TensorProto proto;
  ASSERT_TRUE(EncodeTensor(x, &proto, EncodeOptions{v1::COMPRESSION_FP16}).ok());
  EXPECT_EQ(proto.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(proto.compression(), v1::COMPRESSION_FP16);
  EXPECT_EQ(static_cast<int64_t>(proto.data().size()), x.numel() * 2);

  absl::StatusOr<torch::Tensor> decoded = DecodeTensor(proto);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->scalar_type(), torch::kFloat32);
  EXPECT_EQ(decoded->sizes(), x.sizes());
  // fp16 keeps 11 significant bits: relative error <= 2^-11 for normals; the
  // absolute term covers fp16 subnormals near zero.
  EXPECT_TRUE(torch::allclose(*decoded, x, /*rtol=*/1e-3, /*atol=*/1e-7));
  EXPECT_TRUE(torch::equal(*decoded, x.to(torch::kHalf).to(torch::kFloat32)));
  EXPECT_FALSE(torch::equal(*decoded, x));  // It really was lossy.
}

TEST(TensorCodecTest, Bf16CompressionHalvesBytesWithinTolerance) {
  torch::manual_seed(4);
  const torch::Tensor x = (torch::rand({1000}) * 2 - 1).t();
  v1::TensorProto proto;
  ASSERT_TRUE(EncodeTensor(x, &proto, EncodeOptions{v1::COMPRESSION_BF16}).ok());
  EXPECT_EQ(proto.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(proto.compression(), v1::COMPRESSION_BF16);
  EXPECT_EQ(proto.data().size(), 2000u);

  absl::StatusOr<torch::Tensor> decoded = DecodeTensor(proto);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->scalar_type(), torch::kFloat32);
  // bf16 keeps 8 significant bits: relative error <= 2^-8.
  EXPECT_TRUE(torch::allclose(*decoded, x, /*rtol=*/1e-2, /*atol=*/0));
  EXPECT_TRUE(torch::equal(*decoded, x.to(torch::kBFloat16).to(torch::kFloat32)));
  // bf16 is coarser than fp16: the error must exceed fp16's bound somewhere.
  EXPECT_FALSE(torch::allclose(*decoded, x, /*rtol=*/1e-3, /*atol=*/0));
}

TEST(TensorCodecTest, CompressionOfNonContiguousAndSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  const torch::Tensor base =
      torch::tensor({0.5f, inf, -inf, std::nanf(""), 1.0f, -0.25f}).view({2, 3}).t();
  for (v1::Compression c : {v1::COMPRESSION_FP16, v1::COMPRESSION_BF16}) {
    SCOPED_TRACE(v1::Compression_Name(c));
    v1::TensorProto proto;
    const torch::Tensor decoded = RoundTrip(base, EncodeOptions{c}, &proto);
    EXPECT_EQ(proto.data().size(), 12u);
    EXPECT_TRUE(torch::allclose(decoded, base, 0, 0, /*equal_nan=*/true));
  }
}

TEST(TensorCodecTest, CompressionIgnoredForNonFloat32) {
  torch::manual_seed(5);
  const torch::Tensor ints = MakeRandom(torch::kInt64, {4, 5});
  const torch::Tensor doubles = MakeRandom(torch::kFloat64, {9});
  const torch::Tensor halves = MakeRandom(torch::kFloat16, {9});
  for (v1::Compression c : {v1::COMPRESSION_FP16, v1::COMPRESSION_BF16}) {
    for (const torch::Tensor& t : {ints, doubles, halves}) {
      SCOPED_TRACE(c10::toString(t.scalar_type()));
      v1::TensorProto proto;
      const torch::Tensor decoded = RoundTrip(t, EncodeOptions{c}, &proto);
      EXPECT_EQ(proto.compression(), v1::COMPRESSION_NONE);
      EXPECT_EQ(static_cast<int64_t>(proto.data().size()), t.nbytes());
      ExpectSameBytes(decoded, t);
    }
  }
}

// ---------------------------------------------------------------------------
// Encode errors.

TEST(TensorCodecTest, EncodeRejectsUnsupportedDtype) {
  v1::TensorProto proto;
  const absl::Status s = EncodeTensor(torch::zeros({2}, torch::kComplexFloat), &proto);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ComplexFloat"));
  const absl::Status s8 = EncodeTensor(torch::zeros({2}, torch::kInt8), &proto);
  EXPECT_EQ(s8.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s8.message(), HasSubstr("Char"));  // LibTorch's name for int8.
}

TEST(TensorCodecTest, EncodeRejectsUndefinedSparseAndRank9) {
  v1::TensorProto proto;
  EXPECT_EQ(EncodeTensor(torch::Tensor(), &proto).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status sparse = EncodeTensor(torch::eye(3).to_sparse(), &proto);
  EXPECT_EQ(sparse.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sparse.message(), HasSubstr("layout"));
  const absl::Status rank9 = EncodeTensor(torch::zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}), &proto);
  EXPECT_EQ(rank9.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rank9.message(), HasSubstr("rank 9"));
  EXPECT_EQ(EncodeTensor(torch::zeros({1}), nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Malformed protos.

v1::TensorProto ValidProto() {
  v1::TensorProto proto;
  proto.set_dtype(v1::DTYPE_FLOAT32);
  proto.add_shape(2);
  proto.add_shape(2);
  proto.set_data(std::string(16, '\0'));
  return proto;
}

// Both entry points must reject `proto` with INVALID_ARGUMENT mentioning
// every string in `words`.
void ExpectInvalid(const v1::TensorProto& proto, const std::vector<std::string>& words,
                   int64_t max_bytes = kDefaultMaxTensorBytes) {
  const absl::Status v = ValidateTensorProto(proto, max_bytes);
  EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << v;
  const absl::StatusOr<torch::Tensor> d = DecodeTensor(proto, max_bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status(), v);
  for (const std::string& word : words) {
    EXPECT_THAT(std::string(v.message()), HasSubstr(word));
  }
}

TEST(TensorCodecValidateTest, ValidProtoAccepted) {
  EXPECT_TRUE(ValidateTensorProto(ValidProto()).ok());
  absl::StatusOr<torch::Tensor> d = DecodeTensor(ValidProto());
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(torch::equal(*d, torch::zeros({2, 2})));
}

TEST(TensorCodecValidateTest, UnknownDtype) {
  v1::TensorProto p = ValidProto();
  p.set_dtype(static_cast<v1::DType>(99));
  ExpectInvalid(p, {"tensor.dtype", "99"});
  p.set_dtype(static_cast<v1::DType>(-1));
  ExpectInvalid(p, {"tensor.dtype", "-1"});
}

TEST(TensorCodecValidateTest, UnspecifiedDtype) {
  v1::TensorProto p = ValidProto();
  p.set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectInvalid(p, {"tensor.dtype", "UNSPECIFIED"});
}

TEST(TensorCodecValidateTest, RankNine) {
  v1::TensorProto p;
  p.set_dtype(v1::DTYPE_UINT8);
  for (int i = 0; i < 9; ++i) p.add_shape(1);
  p.set_data("x");
  ExpectInvalid(p, {"rank 9", "8"});
  p.mutable_shape()->RemoveLast();  // Rank 8 with the same data is fine.
  EXPECT_TRUE(ValidateTensorProto(p).ok());
}

TEST(TensorCodecValidateTest, NegativeDim) {
  v1::TensorProto p;
  p.set_dtype(v1::DTYPE_FLOAT32);
  p.add_shape(1);
  p.add_shape(2);
  p.add_shape(-3);
  ExpectInvalid(p, {"tensor.shape[2]: dimension -3 is negative"});
  // Two negatives make a positive numel; still rejected.
  p.set_shape(0, -2);
  p.set_shape(2, -2);
  p.set_data(std::string(32, '\0'));
  ExpectInvalid(p, {"tensor.shape[0]", "negative"});
}

TEST(TensorCodecValidateTest, TooFewBytes) {
  v1::TensorProto p = ValidProto();
  p.set_data(std::string(12, '\0'));
  ExpectInvalid(p, {"tensor.data: 12 bytes, expected 16 for shape [2, 2] float32"});
}

TEST(TensorCodecValidateTest, TooManyBytes) {
  v1::TensorProto p = ValidProto();
  p.set_data(std::string(17, '\0'));
  ExpectInvalid(p, {"tensor.data", "17 bytes", "expected 16"});
  p.clear_shape();  // Scalar needs exactly 4.
  ExpectInvalid(p, {"tensor.data", "expected 4", "[]"});
}

TEST(TensorCodecValidateTest, OverflowingDims) {
  v1::TensorProto p;
  p.set_dtype(v1::DTYPE_FLOAT32);
  p.add_shape(int64_t{1} << 62);  // numel fits, numel * 4 does not.
  ExpectInvalid(p, {"overflow"});
  p.add_shape(int64_t{1} << 62);  // numel itself overflows.
  ExpectInvalid(p, {"overflow"});
  p.add_shape(0);  // No elements, but torch's strides would still overflow.
  ExpectInvalid(p, {"overflow"});

  v1::TensorProto q;
  q.set_dtype(v1::DTYPE_UINT8);
  for (int i = 0; i < 3; ++i) q.add_shape(int64_t{1} << 21);  // 2^63.
  ExpectInvalid(q, {"overflow"});
  q.set_dtype(v1::DTYPE_BOOL);
  q.set_shape(2, std::numeric_limits<int64_t>::max());
  ExpectInvalid(q, {"overflow"});
}

TEST(TensorCodecValidateTest, HugeButNotOverflowingIsCapped) {
  v1::TensorProto p;
  p.set_dtype(v1::DTYPE_FLOAT64);
  p.add_shape(int64_t{1} << 40);
  ExpectInvalid(p, {"exceeds", "limit"});
}

TEST(TensorCodecValidateTest, OverMaxBytes) {
  const v1::TensorProto p = ValidProto();  // 16 bytes decoded.
  ExpectInvalid(p, {"exceeds", "limit of 15 bytes"}, /*max_bytes=*/15);
  EXPECT_TRUE(ValidateTensorProto(p, /*max_bytes=*/16).ok());

  // The cap applies to the decoded size, not the (halved) wire size.
  v1::TensorProto c = ValidProto();
  c.set_compression(v1::COMPRESSION_FP16);
  c.set_data(std::string(8, '\0'));
  EXPECT_TRUE(ValidateTensorProto(c, 16).ok());
  ExpectInvalid(c, {"exceeds"}, /*max_bytes=*/8);
}

TEST(TensorCodecValidateTest, CompressionOnInt64) {
  v1::TensorProto p;
  p.set_dtype(v1::DTYPE_INT64);
  p.add_shape(2);
  p.set_data(std::string(4, '\0'));
  p.set_compression(v1::COMPRESSION_FP16);
  ExpectInvalid(p, {"tensor.compression", "int64"});
  p.set_data(std::string(16, '\0'));
  ExpectInvalid(p, {"tensor.compression", "int64"});
  p.set_compression(v1::COMPRESSION_BF16);
  ExpectInvalid(p, {"tensor.compression", "COMPRESSION_BF16"});
}

TEST(TensorCodecValidateTest, UnknownCompression) {
  v1::TensorProto p = ValidProto();
  p.set_compression(static_cast<v1::Compression>(7));
  ExpectInvalid(p, {"tensor.compression", "unknown", "7"});
}

TEST(TensorCodecValidateTest, CompressedSizeMismatch) {
  v1::TensorProto p = ValidProto();  // 16 bytes = 4 elements * 4.
  p.set_compression(v1::COMPRESSION_BF16);
  ExpectInvalid(p, {"tensor.data", "expected 8", "COMPRESSION_BF16"});
}

TEST(TensorCodecValidateTest, BoolBytesMustBeZeroOrOne) {
  v1::TensorProto p;
  p.set_dtype(v1::DTYPE_BOOL);
  p.add_shape(3);
  p.set_data(std::string("\x01\x00\x02", 3));
  ExpectInvalid(p, {"tensor.data", "bool", "byte 2"});
}

// ---------------------------------------------------------------------------
// Randomized mutation: whatever a peer sends, decode either yields a tensor
// consistent with the proto or INVALID_ARGUMENT; never a crash or INTERNAL.

int64_t ItemSize(int dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_INT64:
      return 8;
    case v1::DTYPE_FLOAT32:
    case v1::DTYPE_INT32:
      return 4;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    default:
      return 1;
  }
}

TEST(TensorCodecFuzzTest, MutatedProtosDecodeOrAreRejected) {
  std::mt19937_64 rng(20240601);
  torch::manual_seed(11);
  std::vector<v1::TensorProto> seeds;
  for (const DTypeCase& d : kDTypeCases) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{}, {3}, {2, 3}, {2, 0, 2}, {1, 2, 1, 2}}) {
      v1::TensorProto p;
      ASSERT_TRUE(EncodeTensor(MakeRandom(d.torch, shape), &p).ok());
      seeds.push_back(p);
    }
  }
  const int64_t kDims[] = {0,
                           1,
                           2,
                           3,
                           4,
                           -1,
                           -7,
                           int64_t{1} << 31,
                           int64_t{1} << 40,
                           int64_t{1} << 62,
                           std::numeric_limits<int64_t>::max(),
                           std::numeric_limits<int64_t>::min()};
  constexpr int64_t kMaxBytes = 1 << 16;
  int accepted = 0;
  int rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    v1::TensorProto p = seeds[rng() % seeds.size()];
    const int mutations = 1 + rng() % 3;
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 8) {
        case 0:
          p.set_dtype(static_cast<v1::DType>(static_cast<int>(rng() % 12) - 2));
          break;
        case 1:
          p.set_compression(static_cast<v1::Compression>(static_cast<int>(rng() % 5) - 1));
          break;
        case 2:
          if (p.shape_size() < 10) p.add_shape(kDims[rng() % std::size(kDims)]);
          break;
        case 3:
          if (p.shape_size() > 0) p.mutable_shape()->RemoveLast();
          break;
        case 4:
          if (p.shape_size() > 0) {
            p.set_shape(rng() % p.shape_size(), kDims[rng() % std::size(kDims)]);
          }
          break;
        case 5:
          p.mutable_data()->resize(rng() % (p.data().size() + 9));
          break;
        case 6:
          p.mutable_data()->append(rng() % 9, static_cast<char>(rng()));
          break;
        case 7:
          if (!p.data().empty()) {
            (*p.mutable_data())[rng() % p.data().size()] = static_cast<char>(rng());
          }
          break;
      }
    }
    SCOPED_TRACE(absl::StrCat("iter ", iter, " dtype ", p.dtype(), " comp ", p.compression(),
                              " shape [", absl::StrJoin(p.shape(), ","), "] bytes ",
                              p.data().size()));
    const absl::StatusOr<torch::Tensor> d = DecodeTensor(p, kMaxBytes);
    if (!d.ok()) {
      ASSERT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
      ++rejected;
      continue;
    }
    ++accepted;
    ASSERT_TRUE(ValidateTensorProto(p, kMaxBytes).ok());
    int64_t numel = 1;
    for (int64_t dim : p.shape()) numel *= dim;
    ASSERT_EQ(d->sizes(),
              c10::IntArrayRef(std::vector<int64_t>(p.shape().begin(), p.shape().end())));
    ASSERT_EQ(static_cast<int64_t>(d->nbytes()), numel * ItemSize(p.dtype()));
    const int64_t wire_itemsize = p.compression() == v1::COMPRESSION_NONE ? ItemSize(p.dtype()) : 2;
    ASSERT_EQ(static_cast<int64_t>(p.data().size()), numel * wire_itemsize);
    ASSERT_TRUE(d->device().is_cpu());
    // Re-encoding an uncompressed decode reproduces the bytes exactly.
    if (p.compression() == v1::COMPRESSION_NONE) {
      v1::TensorProto again;
      ASSERT_TRUE(EncodeTensor(*d, &again).ok());
      ASSERT_EQ(again.data(), p.data());
    }
  }
  // The mutator must exercise both outcomes, or the loop proves nothing.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(rejected, 100);
}

}  // namespace
}  // namespace stagewise
