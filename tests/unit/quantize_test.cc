// Block-wise int8/int4 wire formats (services/tensor/quantize.h) through the
// codec: round trips within the format's bound, saturation, NaN/Inf, empty
// tensors, the rotation, error feedback and malformed payloads.
#include "services/tensor/quantize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/tensor/codec.h"

namespace stagewise {
namespace {

using ::testing::HasSubstr;

struct Format {
  v1::Compression compression;
  int64_t block;
  bool rotate;
};

std::string Name(const Format& f) {
  return absl::StrCat(v1::Compression_Name(f.compression), " block ", f.block,
                      f.rotate ? " rotated" : "");
}

EncodeOptions Options(const Format& f) {
  EncodeOptions o;
  o.compression = f.compression;
  o.block_size = f.block;
  o.rotate = f.rotate;
  return o;
}

const Format kFormats[] = {
    {v1::COMPRESSION_INT8, 64, false},  {v1::COMPRESSION_INT8, 16, true},
    {v1::COMPRESSION_INT4, 32, false},  {v1::COMPRESSION_INT4, 128, true},
    {v1::COMPRESSION_INT8, 4096, true},
};

torch::Tensor RoundTrip(const torch::Tensor& x, const EncodeOptions& options,
                        v1::TensorProto* proto_out = nullptr) {
  v1::TensorProto proto;
  const absl::Status encoded = EncodeTensor(x, &proto, options);
  EXPECT_TRUE(encoded.ok()) << encoded;
  if (proto_out != nullptr) *proto_out = proto;
  auto decoded = DecodeTensor(proto);
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  return decoded.ok() ? *decoded : torch::Tensor();
}

// Per block: every value within half a scale (unrotated), or the block's
// error norm within sqrt(block) half-scales (rotated: the rotation is
// orthonormal, so the error's norm is the rotated domain's).
void ExpectWithinBound(const torch::Tensor& x, const torch::Tensor& y, const Format& f) {
  const int bits = f.compression == v1::COMPRESSION_INT4 ? 4 : 8;
  const double max_code = static_cast<double>(QuantizedMaxCode(bits));
  const int64_t n = x.numel();
  const int64_t blocks = (n + f.block - 1) / f.block;
  const torch::Tensor xf =
      torch::constant_pad_nd(x.reshape(-1), {0, blocks * f.block - n}, 0).view({blocks, f.block});
  const torch::Tensor yf =
      torch::constant_pad_nd(y.reshape(-1), {0, blocks * f.block - n}, 0).view({blocks, f.block});
  const torch::Tensor err = (xf - yf).to(torch::kDouble);
  if (!f.rotate) {
    const torch::Tensor half_scale = std::get<0>(xf.abs().max(1)).to(torch::kDouble) / max_code / 2;
    EXPECT_TRUE((err.abs() <= half_scale.unsqueeze(1) * (1 + 1e-5) + 1e-30).all().item<bool>())
        << Name(f);
  } else {
    // The rotated block's largest magnitude is at most the block's norm.
    const torch::Tensor norm = xf.to(torch::kDouble).norm(2, 1);
    const torch::Tensor bound = norm / max_code / 2 * std::sqrt(static_cast<double>(f.block));
    EXPECT_TRUE((err.norm(2, 1) <= bound * (1 + 1e-4) + 1e-30).all().item<bool>()) << Name(f);
  }
}

TEST(QuantizedCodecTest, RoundTripsWithinTheFormatsBoundAndSendsFewerBytes) {
  torch::manual_seed(3);
  for (const Format& f : kFormats) {
    SCOPED_TRACE(Name(f));
    // Ragged sizes (a partial last block) and scales that differ per block.
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{7}, {3, 50}, {2, 3, 129}, {4096}}) {
      const torch::Tensor x =
          torch::randn(shape) * torch::logspace(-3, 3, shape.back()).expand(shape);
      v1::TensorProto proto;
      const torch::Tensor y = RoundTrip(x, Options(f), &proto);
      ASSERT_TRUE(y.defined());
      EXPECT_EQ(y.sizes(), x.sizes());
      EXPECT_EQ(y.scalar_type(), torch::kFloat);
      EXPECT_EQ(proto.compression(), f.compression);
      EXPECT_EQ(proto.quantized().block_size(), static_cast<uint32_t>(f.block));
      EXPECT_EQ(proto.quantized().rotated(), f.rotate);
      QuantizedFormat q;
      q.bits = f.compression == v1::COMPRESSION_INT4 ? 4 : 8;
      q.block_size = f.block;
      q.rotate = f.rotate;
      EXPECT_EQ(static_cast<int64_t>(proto.data().size()), QuantizedPayloadBytes(x.numel(), q));
      ExpectWithinBound(x, y, f);
      // Lossy, really.
      EXPECT_GT((x - y).abs().max().item<double>(), 0.0);
    }
    // Large tensors: int8 ~ 1/4 of float32's bytes, int4 ~ 1/8 (plus scales).
    const torch::Tensor big = torch::randn({64, 256});
    v1::TensorProto proto;
    RoundTrip(big, Options(f), &proto);
    const double ratio = static_cast<double>(proto.data().size()) / (big.numel() * 4.0);
    const double want = (f.compression == v1::COMPRESSION_INT4 ? 0.125 : 0.25) + 1.0 / f.block;
    EXPECT_NEAR(ratio, want, 1e-9);
  }
}

// The CPU's one-pass loops and the tensor operations a GPU runs give the
// same bytes, and decode them to the same values, for every format, sizes
// that do and do not fill the last block, zeros, values near float32's
// largest, and a NaN or an infinity (both refuse: undefined).
TEST(QuantizedCodecTest, TheCpuLoopsAndTheTensorOperationsAgreeBitForBit) {
  torch::manual_seed(7);
  const float big = std::numeric_limits<float>::max();
  std::vector<torch::Tensor> inputs = {
      torch::randn({1000}) * 3,
      torch::randn({4096}),
      torch::randn({13}) * 1e-30,
      torch::zeros({100}),
      torch::tensor({big, -big, 1.0f, 0.0f, big / 3}),
      torch::randn({2, 3, 17}).exp() * 100,
  };
  for (const Format& f : kFormats) {
    for (size_t k = 0; k < inputs.size(); ++k) {
      QuantizedFormat q;
      q.bits = f.compression == v1::COMPRESSION_INT4 ? 4 : 8;
      q.block_size = f.block;
      q.rotate = f.rotate;
      q.rotation_seed = 12345 + k;
      const torch::Tensor fast = QuantizeBlocks(inputs[k], q);
      const torch::Tensor ops = QuantizeBlocksByTensorOps(inputs[k], q);
      ASSERT_EQ(fast.defined(), ops.defined()) << Name(f) << " input " << k;
      if (!fast.defined()) continue;  // the rotation overflowed float32: both refuse
      ASSERT_TRUE(torch::equal(fast, ops)) << Name(f) << " input " << k;
      const int64_t n = inputs[k].numel();
      const torch::Tensor back = DequantizeBlocks(fast, n, q);
      const torch::Tensor back_ops = DequantizeBlocksByTensorOps(fast, n, q);
      EXPECT_TRUE(torch::equal(back, back_ops)) << Name(f) << " input " << k;
    }
    QuantizedFormat q;
    q.bits = f.compression == v1::COMPRESSION_INT4 ? 4 : 8;
    q.block_size = f.block;
    q.rotate = f.rotate;
    for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
      torch::Tensor x = torch::randn({300});
      x[150] = bad;
      EXPECT_FALSE(QuantizeBlocks(x, q).defined()) << Name(f);
      EXPECT_FALSE(QuantizeBlocksByTensorOps(x, q).defined()) << Name(f);
    }
  }
}

TEST(QuantizedCodecTest, ExactValuesAndTheExtremesSurvive) {
  // A block whose values are multiples of its scale comes back exactly.
  for (v1::Compression c : {v1::COMPRESSION_INT8, v1::COMPRESSION_INT4}) {
    SCOPED_TRACE(v1::Compression_Name(c));
    const double max_code = c == v1::COMPRESSION_INT8 ? 127 : 7;
    const torch::Tensor codes = torch::arange(-max_code, max_code + 1);
    const torch::Tensor x = (codes * 0.5f).to(torch::kFloat);
    const torch::Tensor y = RoundTrip(x, Options({c, 256, false}));
    EXPECT_TRUE(torch::equal(x, y));
    // float32's extremes saturate nothing: the scale follows the block.
    const float big = std::numeric_limits<float>::max();
    const torch::Tensor extremes = torch::tensor({big, -big, 1.0f, 0.0f, -1e-38f});
    const torch::Tensor e = RoundTrip(extremes, Options({c, 16, false}));
    EXPECT_TRUE(torch::isfinite(e).all().item<bool>());
    EXPECT_NEAR(e[0].item<float>() / big, 1.0, 1e-6);
    EXPECT_NEAR(e[1].item<float>() / big, -1.0, 1e-6);
    // All-zero blocks (scale 0) stay zero.
    const torch::Tensor zeros = torch::zeros({100});
    EXPECT_TRUE(torch::equal(RoundTrip(zeros, Options({c, 32, true})), zeros));
  }
}

TEST(QuantizedCodecTest, NanAndInfGoUncompressedAndExact) {
  torch::Tensor x = torch::randn({300});
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[200] = -std::numeric_limits<float>::infinity();
  for (const Format& f : kFormats) {
    SCOPED_TRACE(Name(f));
    torch::Tensor residual = torch::ones({300});
    EncodeOptions o = Options(f);
    o.residual = &residual;
    v1::TensorProto proto;
    // The tensor goes as it is, and the residual is dropped.
    ASSERT_TRUE(EncodeTensor(x, &proto, o).ok());
    EXPECT_EQ(proto.compression(), v1::COMPRESSION_NONE);
    EXPECT_FALSE(proto.has_quantized());
    EXPECT_FALSE(residual.defined());
    auto y = DecodeTensor(proto);
    ASSERT_TRUE(y.ok());
    EXPECT_TRUE(torch::equal(y->isnan(), x.isnan()));
    EXPECT_TRUE(torch::allclose(y->nan_to_num(0, 7, -7), x.nan_to_num(0, 7, -7)));
  }
}

TEST(QuantizedCodecTest, EmptyTensorsAndOtherDtypes) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(Name(f));
    const torch::Tensor empty = torch::zeros({0, 5});
    const torch::Tensor y = RoundTrip(empty, Options(f));
    EXPECT_EQ(y.sizes(), empty.sizes());
    // Labels and other dtypes go as they are.
    v1::TensorProto proto;
    const torch::Tensor labels = torch::arange(10);
    const torch::Tensor got = RoundTrip(labels, Options(f), &proto);
    EXPECT_EQ(proto.compression(), v1::COMPRESSION_NONE);
    EXPECT_TRUE(torch::equal(got, labels));
  }
}

TEST(QuantizedCodecTest, TheRotationSpreadsAnOutlier) {
  // One outlier among normal values in each block: unrotated, the scale is
  // the outlier's and the others get few levels; rotated, the block's energy
  // is spread evenly and every value gets finer steps.
  torch::manual_seed(11);
  torch::Tensor x = torch::randn({4, 64});
  x.select(1, 7).fill_(100.0);
  auto error = [&](bool rotate) {
    const torch::Tensor y = RoundTrip(x, Options({v1::COMPRESSION_INT8, 64, rotate}));
    return (x - y).norm().item<double>();
  };
  EXPECT_LT(error(true), 0.5 * error(false));
  // The signs are SplitMix64's, the same on every device and run; another
  // seed draws others.
  const torch::Tensor a = RotationSigns(64, 1, torch::kCPU);
  EXPECT_TRUE(torch::equal(a, RotationSigns(64, 1, torch::kCPU)));
  EXPECT_FALSE(torch::equal(a, RotationSigns(64, 2, torch::kCPU)));
  EXPECT_TRUE(((a == 1) | (a == -1)).all().item<bool>());
  // The Walsh-Hadamard transform is its own inverse.
  const torch::Tensor v = torch::randn({3, 128});
  EXPECT_TRUE(torch::allclose(WalshHadamard(WalshHadamard(v)), v, 1e-5, 1e-5));
}

TEST(QuantizedCodecTest, ErrorFeedbackCarriesWhatASendLost) {
  // Sending the same tensor T times with error feedback: the decoded sum is
  // T x the tensor minus the last residual, so the mean error shrinks as 1/T
  // where plain sends keep theirs.
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({1000});
  for (v1::Compression c : {v1::COMPRESSION_INT4, v1::COMPRESSION_BF16}) {
    SCOPED_TRACE(v1::Compression_Name(c));
    torch::Tensor residual;
    EncodeOptions o = Options({c, 64, false});
    o.residual = &residual;
    torch::Tensor sum = torch::zeros_like(x);
    const int kSends = 16;
    for (int t = 0; t < kSends; ++t) {
      v1::TensorProto proto;
      ASSERT_TRUE(EncodeTensor(x, &proto, o).ok());
      auto y = DecodeTensor(proto);
      ASSERT_TRUE(y.ok());
      sum += *y;
      ASSERT_TRUE(residual.defined());
      EXPECT_TRUE(torch::allclose(sum + residual, x * (t + 1), 1e-4, 1e-4)) << t;
    }
    const torch::Tensor plain = RoundTrip(x, Options({c, 64, false}));
    const double plain_error = (plain - x).abs().mean().item<double>();
    const double fed_back_error = (sum / kSends - x).abs().mean().item<double>();
    EXPECT_LT(fed_back_error, plain_error / 4);
  }
}

TEST(QuantizedCodecTest, MalformedPayloadsAreRejected) {
  v1::TensorProto good;
  ASSERT_TRUE(
      EncodeTensor(torch::randn({10, 10}), &good, Options({v1::COMPRESSION_INT8, 32, true})).ok());
  ASSERT_TRUE(ValidateTensorProto(good).ok());

  v1::TensorProto p = good;
  p.mutable_data()->pop_back();
  EXPECT_THAT(std::string(ValidateTensorProto(p).message()),
              HasSubstr("143 bytes, expected 144 for shape [10, 10] float32 (COMPRESSION_INT8, "
                        "blocks of 32, rotated)"));
  p = good;
  p.clear_quantized();
  EXPECT_THAT(std::string(ValidateTensorProto(p).message()),
              HasSubstr("tensor.quantized: missing with COMPRESSION_INT8"));
  p = good;
  p.set_compression(v1::COMPRESSION_BF16);
  EXPECT_THAT(std::string(ValidateTensorProto(p).message()),
              HasSubstr("tensor.quantized: set with COMPRESSION_BF16"));
  for (uint32_t bad : {0u, 4u, 48u, 131072u}) {
    p = good;
    p.mutable_quantized()->set_block_size(bad);
    EXPECT_THAT(std::string(ValidateTensorProto(p).message()),
                HasSubstr(absl::StrCat("tensor.quantized.block_size: ", bad)));
  }
  p = good;
  p.set_dtype(v1::DTYPE_FLOAT64);
  EXPECT_THAT(std::string(ValidateTensorProto(p).message()), HasSubstr("requires dtype float32"));
  // The encoder refuses a block size the decoder would.
  v1::TensorProto out;
  EncodeOptions o = Options({v1::COMPRESSION_INT4, 48, false});
  EXPECT_THAT(std::string(EncodeTensor(torch::randn({4}), &out, o).message()),
              HasSubstr("options.block_size: 48"));
}

TEST(QuantizedCodecTest, AdoptingDecodeAgreesWithTheCopyingOne) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(Name(f));
    v1::TensorProto proto;
    ASSERT_TRUE(EncodeTensor(torch::randn({33, 17}), &proto, Options(f)).ok());
    auto copied = DecodeTensor(proto);
    ASSERT_TRUE(copied.ok());
    auto adopted = DecodeTensor(&proto, DecodeOptions{});
    ASSERT_TRUE(adopted.ok()) << adopted.status();
    EXPECT_TRUE(torch::equal(*copied, *adopted));
  }
}

TEST(QuantizedCodecTest, OnCudaTheSameBytesAndDecodedOnTheDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({9, 77});
  for (const Format& f : kFormats) {
    SCOPED_TRACE(Name(f));
    v1::TensorProto from_cpu, from_cuda;
    ASSERT_TRUE(EncodeTensor(x, &from_cpu, Options(f)).ok());
    ASSERT_TRUE(EncodeTensor(x.to(torch::kCUDA), &from_cuda, Options(f)).ok());
    EXPECT_EQ(from_cpu.data(), from_cuda.data());
    DecodeOptions on_device;
    on_device.device = torch::Device(torch::kCUDA, 0);
    auto y = DecodeTensor(&from_cuda, on_device);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(y->is_cuda());
    auto want = DecodeTensor(from_cpu);
    ASSERT_TRUE(want.ok());
    EXPECT_TRUE(torch::allclose(y->cpu(), *want, 1e-6, 1e-6));
  }
}

}  // namespace
}  // namespace stagewise
