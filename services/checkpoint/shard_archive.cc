#include "services/checkpoint/shard_archive.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint.h"

namespace stagewise::checkpoint {
namespace {

torch::Tensor Scalar(int64_t v) { return torch::tensor(v, torch::kInt64); }

int64_t ReadScalar(torch::serialize::InputArchive& archive, const char* key) {
  torch::Tensor t;
  archive.read(key, t);
  return t.item<int64_t>();
}

}  // namespace

absl::StatusOr<std::string> SerializeShard(const ShardPosition& position, torch::nn::Module& model,
                                           torch::optim::Optimizer& optimizer,
                                           const ShardExtras& extras) {
  try {
    torch::serialize::OutputArchive archive;
    {
      torch::serialize::OutputArchive saved;
      model.save(saved);
      archive.write("model", saved);
    }
    {
      torch::serialize::OutputArchive saved;
      optimizer.save(saved);
      archive.write("optimizer", saved);
    }
    {
      torch::serialize::OutputArchive algorithm;
      if (extras.algorithm) {
        if (absl::Status s = extras.algorithm(algorithm); !s.ok()) return s;
      }
      archive.write("algorithm", algorithm);
    }
    if (torch::serialize::OutputArchive outer; extras.outer_sync && extras.outer_sync(outer)) {
      archive.write("outer_sync", outer);
    }
    if (torch::serialize::OutputArchive residuals;
        extras.wire_residuals && extras.wire_residuals(residuals)) {
      archive.write("wire_residuals", residuals);
    }
    if (extras.rng && extras.rng_state.defined()) {
      archive.write("rng", extras.rng_state);
    } else if (extras.rng) {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      archive.write("rng", gen.get_state());
    }
    archive.write("step", Scalar(position.step));
    archive.write("phase", Scalar(position.phase));
    archive.write("phase_step", Scalar(position.phase_step));
    archive.write("stage", Scalar(position.stage));
    archive.write("block_begin", Scalar(position.block_begin));
    archive.write("block_end", Scalar(position.block_end));
    if (const ShardPosition::Marks& m = position.marks; m.known()) {
      archive.write(
          "stream_marks",
          torch::tensor({m.sent_next, m.sent_prev, m.taken_prev, m.taken_next}, torch::kInt64));
    }
    std::ostringstream bytes;
    archive.save_to(bytes);
    return std::move(bytes).str();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("saving a checkpoint shard: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Parse(const std::string& bytes,
                                                                const torch::Device& device,
                                                                const std::string& what) {
  std::unique_ptr<ShardReader> reader(new ShardReader());
  reader->what_ = what;
  try {
    reader->archive_.load_from(bytes.data(), bytes.size(), device);
    ShardPosition& p = reader->position_;
    p.step = ReadScalar(reader->archive_, "step");
    p.phase = ReadScalar(reader->archive_, "phase");
    p.phase_step = ReadScalar(reader->archive_, "phase_step");
    p.stage = ReadScalar(reader->archive_, "stage");
    p.block_begin = ReadScalar(reader->archive_, "block_begin");
    p.block_end = ReadScalar(reader->archive_, "block_end");
    if (torch::Tensor marks; reader->archive_.try_read("stream_marks", marks)) {
      if (marks.numel() != 4 || marks.scalar_type() != torch::kInt64) {
        return absl::DataLossError(absl::StrCat(what, ": stream_marks is not int64 [4]"));
      }
      marks = marks.cpu();
      const int64_t* v = marks.data_ptr<int64_t>();
      if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0) {
        return absl::DataLossError(absl::StrCat(what, ": negative stream_marks"));
      }
      p.marks = {v[0], v[1], v[2], v[3]};
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(what, ": not a checkpoint shard: ", e.what()));
  }
  return reader;
}

absl::Status ShardReader::LoadModel(torch::nn::Module& model) {
  try {
    torch::serialize::InputArchive saved;
    archive_.read("model", saved);
    model.load(saved);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(what_, ": the model does not fit: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status ShardReader::LoadOptimizer(torch::optim::Optimizer& optimizer) {
  try {
    torch::serialize::InputArchive saved;
    archive_.read("optimizer", saved);
    optimizer.load(saved);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(what_, ": the optimizer does not fit: ", e.what()));
  }
  return absl::OkStatus();
}

std::unique_ptr<torch::serialize::InputArchive> ShardReader::Algorithm() {
  auto algorithm = std::make_unique<torch::serialize::InputArchive>();
  archive_.read("algorithm", *algorithm);
  return algorithm;
}

bool ShardReader::OuterSync(torch::serialize::InputArchive& out) {
  return archive_.try_read("outer_sync", out);
}

bool ShardReader::WireResiduals(torch::serialize::InputArchive& out) {
  return archive_.try_read("wire_residuals", out);
}

bool ShardReader::RestoreRng() {
  torch::Tensor rng;
  if (!archive_.try_read("rng", rng)) return false;
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
  return true;
}

absl::StatusOr<std::unique_ptr<ShardReader>> ReadShardFile(const std::string& path, int64_t bytes,
                                                           uint32_t crc32,
                                                           const torch::Device& device) {
  absl::StatusOr<std::string> read = ReadFile(path);
  if (!read.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint shard: ", read.status().message()));
  }
  if (absl::Status s = VerifyBytes(*read, bytes, crc32, path); !s.ok()) {
    return absl::DataLossError(s.message());
  }
  return ShardReader::Parse(*read, device, path);
}

}  // namespace stagewise::checkpoint
