// A CPU stage's outputs made in its same-host rings (worker/output_placement.h).
// Its own binary: the host block cache becomes the process's CPU allocator.
#include "worker/output_placement.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "services/tensor/host_blocks.h"
#include "services/tensor/shared_ring.h"

namespace stagewise::worker {
namespace {

class OutputPlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InstallHostBlockCache(HostBlockOptions{});
    char tmpl[] = "/tmp/output_placement_test_XXXXXX";
    const char* dir = mkdtemp(tmpl);
    ASSERT_NE(dir, nullptr);
    dir_ = dir;
    for (std::shared_ptr<SharedRing>* ring : {&prev_, &next_}) {
      auto made = SharedRing::Create(dir_, 16 << 20);
      ASSERT_TRUE(made.ok()) << made.status();
      *ring = std::move(*made);
    }
  }
  void TearDown() override {
    prev_.reset();
    next_.reset();
    std::filesystem::remove_all(dir_);
  }

  // How tensors go to j+1 (`to_next`) or j-1: through the rings, with
  // `next_compression` towards j+1.
  EncodeOptions Wire(bool to_next) const {
    EncodeOptions options;
    options.ring = (to_next ? next_ : prev_).get();
    options.round_in_ring = true;
    options.compression = to_next ? next_compression_ : prev_compression_;
    return options;
  }
  OutputPlacement Placement(bool first, bool last) {
    return OutputPlacement(first, last, [this](bool to_next) { return Wire(to_next); });
  }
  std::vector<OutgoingTensor> Outgoing(const torch::Tensor& t, bool to_next) const {
    return {{"x", t, Wire(to_next)}};
  }
  // Where a fresh tensor of `sizes` is made now: "next", "prev" or "heap".
  std::string MadeIn(std::vector<int64_t> sizes) const {
    const torch::Tensor t = torch::empty(sizes);
    if (next_->Contains(t.data_ptr())) return "next";
    if (prev_->Contains(t.data_ptr())) return "prev";
    return "heap";
  }

  std::string dir_;
  std::shared_ptr<SharedRing> prev_, next_;
  v1::Compression next_compression_ = v1::COMPRESSION_NONE;
  v1::Compression prev_compression_ = v1::COMPRESSION_NONE;
};

TEST_F(OutputPlacementTest, AMiddleStageMakesTensorsOfTheOutputsSizeInTheRingItWillSendTo) {
  std::optional<OutputPlacement> placement;
  placement.emplace(false, false, [this](bool to_next) { return Wire(to_next); });
  EXPECT_EQ(MadeIn({256, 256}), "heap");  // no output sent yet: its size is not known
  std::vector<OutgoingTensor> forward = Outgoing(torch::ones({256, 256}), true);
  placement->Sending(Side::kNext, &forward);
  EXPECT_EQ(MadeIn({256, 256}), "next");  // the next forward's output
  EXPECT_EQ(MadeIn({256, 255}), "heap");  // another size
  placement->Received(Side::kNext);       // a gradient: a backward follows
  EXPECT_EQ(MadeIn({128, 256}), "heap");  // nothing sent to j-1 yet
  std::vector<OutgoingTensor> backward = Outgoing(torch::ones({128, 256}), false);
  placement->Sending(Side::kPrev, &backward);
  EXPECT_EQ(MadeIn({128, 256}), "prev");
  EXPECT_EQ(MadeIn({256, 256}), "heap");
  placement->Received(Side::kPrev);  // an activation: a forward follows
  EXPECT_EQ(MadeIn({256, 256}), "next");
  EXPECT_EQ(MadeIn({128, 256}), "heap");
  placement.reset();  // the thread places nothing any more
  EXPECT_EQ(MadeIn({256, 256}), "heap");
}

TEST_F(OutputPlacementTest, TheFirstAndLastStagesAimAtTheirOneNeighbour) {
  {
    OutputPlacement first = Placement(true, false);
    std::vector<OutgoingTensor> forward = Outgoing(torch::ones({256, 256}), true);
    first.Sending(Side::kNext, &forward);
    first.Received(Side::kNext);  // its backward sends nothing: the next forward's output
    EXPECT_EQ(MadeIn({256, 256}), "next");
  }
  {
    OutputPlacement last = Placement(false, true);
    std::vector<OutgoingTensor> backward = Outgoing(torch::ones({256, 256}), false);
    last.Sending(Side::kPrev, &backward);
    last.Received(Side::kPrev);  // forward, loss and backward: the gradient goes back
    EXPECT_EQ(MadeIn({256, 256}), "prev");
  }
  {
    OutputPlacement alone = Placement(true, true);  // one stage: no neighbour
    alone.Received(Side::kPrev);
    EXPECT_EQ(MadeIn({256, 256}), "heap");
  }
}

TEST_F(OutputPlacementTest, ANarrowedSendIsRoundedIntoTheRingAndItsOutputIsNotPlaced) {
  next_compression_ = v1::COMPRESSION_BF16;
  OutputPlacement placement = Placement(false, false);
  const torch::Tensor x = torch::randn({256, 256});
  std::vector<OutgoingTensor> forward = Outgoing(x, true);
  placement.Sending(Side::kNext, &forward);
  EXPECT_TRUE(next_->Contains(forward[0].tensor.data_ptr()));
  EXPECT_EQ(forward[0].wire.compression, v1::COMPRESSION_NONE);  // goes as it is, rounded
  EXPECT_TRUE(torch::equal(forward[0].tensor, x.to(torch::kBFloat16).to(torch::kFloat)));
  placement.Received(Side::kPrev);
  EXPECT_EQ(MadeIn({256, 256}), "heap");  // the output is narrowed anew: not made in the ring
}

TEST_F(OutputPlacementTest, ANarrowedGradientIsMadeInTheRingAndRoundedWhereItLies) {
  prev_compression_ = v1::COMPRESSION_BF16;
  OutputPlacement placement = Placement(false, false);
  std::vector<OutgoingTensor> first = Outgoing(torch::randn({256, 256}), false);
  placement.Sending(Side::kPrev, &first);  // learns the gradient's size
  placement.Received(Side::kNext);         // a backward follows
  const torch::Tensor value = torch::randn({256, 256});
  const torch::Tensor grad = value * 1;  // made in the ring, as the backward's would be
  ASSERT_TRUE(prev_->Contains(grad.data_ptr()));
  const torch::Tensor sent = placement.Prepare(Side::kPrev, grad);
  EXPECT_EQ(sent.data_ptr(), grad.data_ptr());
  EXPECT_TRUE(torch::equal(sent, value.to(torch::kBFloat16).to(torch::kFloat)));
  std::vector<OutgoingTensor> backward = Outgoing(sent, false);
  EXPECT_EQ(backward[0].wire.compression, v1::COMPRESSION_BF16);
  placement.Sending(Side::kPrev, &backward);
  EXPECT_EQ(backward[0].wire.compression, v1::COMPRESSION_NONE);  // as it is
  EXPECT_EQ(backward[0].tensor.data_ptr(), grad.data_ptr());
}

}  // namespace
}  // namespace stagewise::worker
