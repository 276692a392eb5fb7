// The GPU side of a message (services/tensor/device_copy.h, host_pinning.h):
// page-locking is asked for only when device copies are on; on a GPU, copies
// on the copy stream wait for the kernels that made their source, a tensor
// copied up may be used on the compute stream at once (its memory is not
// handed to the next copy while the compute stream still reads it), and a
// message goes through a pinned ring and back unchanged, fp32 and bf16. The
// GPU cases are skipped where LibTorch sees no GPU (CI); docs/cuda.md says
// how to run them on one.
#include "services/tensor/device_copy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "services/tensor/codec.h"
#include "services/tensor/ring_leases.h"
#include "services/tensor/shared_ring.h"
#include "services/tensor/stage_message.h"

namespace stagewise {
namespace {

// Device copies on for one test, off again after it.
class DeviceCopiesOn {
 public:
  DeviceCopiesOn() { EnableDeviceCopies(true); }
  ~DeviceCopiesOn() { EnableDeviceCopies(false); }
  DeviceCopiesOn(const DeviceCopiesOn&) = delete;
  DeviceCopiesOn& operator=(const DeviceCopiesOn&) = delete;
};

TEST(HostPinning, NothingIsPinnedWhileDeviceCopiesAreOff) {
  EnableDeviceCopies(false);
  std::vector<char> buffer(1 << 16);
  const HostPinningStats before = GetHostPinningStats();
  EXPECT_FALSE(PinHostRange(buffer.data(), buffer.size()));
  const HostPinningStats after = GetHostPinningStats();
  EXPECT_EQ(after.pinned_ranges, before.pinned_ranges);
  EXPECT_EQ(after.pin_failures, before.pin_failures);
}

TEST(HostPinning, WithDeviceCopiesOnARangeIsPinnedWhereTheRuntimeIsLoaded) {
  const DeviceCopiesOn on;
  std::vector<char> buffer(1 << 16);
  const HostPinningStats before = GetHostPinningStats();
  const bool pinned = PinHostRange(buffer.data(), buffer.size());
  const HostPinningStats after = GetHostPinningStats();
  if (HostPinningAvailable()) {
    EXPECT_TRUE(pinned);
    EXPECT_EQ(after.pinned_ranges, before.pinned_ranges + 1);
    UnpinHostRange(buffer.data());
  } else {
    // A CPU LibTorch: no runtime, nothing pinned, the failure counted.
    EXPECT_FALSE(pinned);
    EXPECT_EQ(after.pin_failures, before.pin_failures + 1);
  }
  EXPECT_FALSE(PinHostRange(nullptr, 16));
}

bool HaveGpu() { return torch::cuda::is_available(); }

TEST(DeviceCopy, ToHostWaitsForTheKernelsThatMadeItsSource) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const torch::Device gpu("cuda:0");
  torch::manual_seed(1);
  const torch::Tensor a = torch::randn({2048, 2048}, torch::TensorOptions().device(gpu)) / 64;
  for (const bool transpose : {false, true}) {
    for (const c10::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
      SCOPED_TRACE(std::string(transpose ? "transposed " : "") + c10::toString(dtype));
      // Queued kernels the copy must wait for; `y` is not ready when it starts.
      torch::Tensor y = a;
      for (int i = 0; i < 8; ++i) y = torch::tanh(y.mm(a));
      y = (transpose ? y.t() : y).to(dtype);
      std::vector<char> host(static_cast<size_t>(y.nbytes()));
      CopyToHost(y, host.data());
      const torch::Tensor got =
          torch::from_blob(host.data(), y.sizes(), torch::TensorOptions().dtype(dtype));
      EXPECT_TRUE(torch::equal(got, y.cpu()));
    }
  }
}

TEST(DeviceCopy, ATensorCopiedUpIsNotOverwrittenWhileTheComputeStreamReadsIt) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const torch::Device gpu("cuda:0");
  const torch::Tensor big = torch::randn({4096, 4096}, torch::TensorOptions().device(gpu));
  std::vector<torch::Tensor> sums;
  std::vector<double> expected;
  for (int i = 0; i < 24; ++i) {
    const torch::Tensor host = torch::full({1 << 20}, static_cast<float>(i + 1));
    torch::Tensor up = CopyToDevice(host, gpu);
    // A long kernel first, so the compute stream reads `up` well after it is
    // dropped here and the next copy asks for a block of its size.
    torch::Tensor busy = big.mm(big);
    sums.push_back(up.sum() + busy.sum() * 0);
    expected.push_back(static_cast<double>(i + 1) * (1 << 20));
  }
  for (size_t i = 0; i < sums.size(); ++i) {
    EXPECT_DOUBLE_EQ(sums[i].item<double>(), expected[i]) << "copy " << i;
  }
}

TEST(DeviceCopy, AMessageGoesThroughAPinnedRingAndBackOnTheGpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const DeviceCopiesOn on;
  const std::string dir = (std::filesystem::path(::testing::TempDir()) /
                           ("stagewise-device-copy-" + std::to_string(::getpid())))
                              .string();
  std::filesystem::create_directories(dir);
  {
    const HostPinningStats pins = GetHostPinningStats();
    auto ring = SharedRing::Create(dir, 8 << 20);
    ASSERT_TRUE(ring.ok()) << ring.status();
    auto view = SharedRingView::Open(dir, (*ring)->name(), (*ring)->size(), (*ring)->token());
    ASSERT_TRUE(view.ok()) << view.status();
    if (HostPinningAvailable()) {
      EXPECT_EQ(GetHostPinningStats().pinned_ranges, pins.pinned_ranges + 2);
    }
    const torch::Device gpu("cuda:0");
    const torch::Tensor x = torch::randn({64, 64, 64}, torch::TensorOptions().device(gpu));
    const int owner = 0;
    int64_t seq = 0;
    for (const v1::Compression compression : {v1::COMPRESSION_NONE, v1::COMPRESSION_BF16}) {
      SCOPED_TRACE(v1::Compression_Name(compression));
      const DeviceCopyStats before = GetDeviceCopyStats();
      EncodeOptions encode;
      encode.ring = ring->get();
      encode.compression = compression;
      v1::StageMessage m;
      m.set_seq(++seq);
      ASSERT_TRUE(EncodeTensor(x, &(*m.mutable_tensors())["x"], encode).ok());
      ASSERT_TRUE(m.tensors().at("x").has_shared());
      ResolveOptions resolve;
      resolve.lend_owner = &owner;
      resolve.lend_narrowed = true;
      ASSERT_TRUE(ResolveSharedPayloads(&m, view->get(), resolve).ok());
      EXPECT_NE(m.tensors().at("x").shared().lease(), 0u) << "lent as it came";
      DecodeOptions decode;
      decode.device = gpu;
      auto got = DecodeTensor(&(*m.mutable_tensors())["x"], decode);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->is_cuda());
      const torch::Tensor want =
          compression == v1::COMPRESSION_NONE ? x : x.to(torch::kBFloat16).to(torch::kFloat);
      EXPECT_TRUE(torch::equal(*got, want));
      const DeviceCopyStats after = GetDeviceCopyStats();
      EXPECT_EQ(after.to_host, before.to_host + 1);
      EXPECT_EQ(after.to_device, before.to_device + 1);
    }
    EXPECT_EQ((*ring)->used(), 0u) << "every region given back";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stagewise
