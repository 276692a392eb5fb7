// Writes the protobuf seeds of the fuzz corpora: well-formed messages of
// every dtype and compression, so libFuzzer starts from inputs that reach
// deep into the decoders. Usage: fuzz_make_seeds DIR (writes DIR/<target>/).
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "services/tensor/codec.h"
#include "stagewise/v1/coordinator.pb.h"
#include "stagewise/v1/stage.pb.h"

namespace {

namespace fs = std::filesystem;
using namespace stagewise;  // NOLINT: a tool

void Write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const fs::path root(argv[1]);
  torch::manual_seed(1);
  const std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"f32", torch::randn({2, 3})},
      {"f64", torch::randn({4}, torch::kFloat64)},
      {"i64", torch::arange(6).reshape({3, 2})},
      {"i32", torch::arange(4, torch::kInt32)},
      {"u8", torch::arange(5, torch::kUInt8)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(3.5f)},
      {"empty", torch::zeros({0, 4})},
      {"f16", torch::randn({3}).to(torch::kFloat16)},
      {"bf16", torch::randn({3}).to(torch::kBFloat16)},
  };
  for (const auto& [name, t] : tensors) {
    v1::TensorProto proto;
    if (!EncodeTensor(t, &proto).ok()) continue;
    Write(root / "tensor_codec", name, proto.SerializeAsString());
  }
  for (int c = 1; c <= 8; ++c) {
    if (!v1::Compression_IsValid(c)) continue;
    v1::TensorProto proto;
    EncodeOptions options;
    options.compression = static_cast<v1::Compression>(c);
    if (!EncodeTensor(torch::randn({4, 4}), &proto, options).ok()) continue;
    Write(root / "tensor_codec", "compressed-" + std::to_string(c), proto.SerializeAsString());
  }

  const auto message = [](v1::StageMessage::Kind kind) {
    v1::StageMessage m;
    m.set_job_id("job-1");
    m.set_kind(kind);
    m.set_step(3);
    m.set_attempt(1);
    (void)EncodeTensor(torch::randn({2, 4}), &(*m.mutable_tensors())["x"]);
    (void)EncodeTensor(torch::arange(2), &(*m.mutable_tensors())["labels"]);
    (*m.mutable_scalars())["loss"] = 0.5;
    return m;
  };
  // The first byte picks the direction: odd = from the previous stage.
  Write(root / "stage_message", "forward",
        "\x01" + message(v1::StageMessage::FORWARD).SerializeAsString());
  Write(root / "stage_message", "eval",
        "\x01" + message(v1::StageMessage::EVAL).SerializeAsString());
  Write(root / "stage_message", "backward",
        std::string(1, '\0') + message(v1::StageMessage::BACKWARD).SerializeAsString());
  Write(root / "stage_message", "aux",
        std::string(1, '\0') + message(v1::StageMessage::AUX).SerializeAsString());

  // Coordinator: op bytes (see coordinator_fuzz.cc). 0x03 acknowledges every
  // configure; 0x00/0x10/0x20 send an event shaped after w0/w1/w2's assignment.
  const std::string run_then_report = std::string("\x03", 1) +
                                      std::string("\x00\x00\x01\x00", 4) +  // w0 metrics
                                      std::string("\x10\x00\x01\x01", 4) +  // w1 phase_done
                                      std::string("\x20\x00\x01\x02", 4);   // w2 result
  Write(root / "coordinator", "run-then-report", run_then_report);
  Write(root / "coordinator", "cancel-and-rejoin", std::string("\x03\x05\x00\x00\x16", 5));
  v1::WorkerEvent phase;
  phase.mutable_phase_done()->set_phase(2147483647);
  Write(root / "coordinator", "raw-phase-done",
        "\x03\x02" + std::string(1, static_cast<char>(phase.ByteSizeLong())) +
            phase.SerializeAsString());
  return 0;
}
