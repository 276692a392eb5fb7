#include "services/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/planner/plan_proto.h"
#include "services/spec/enums.h"

namespace stagewise::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr char kStepPrefix[] = "step-";

std::string Errno(const std::string& what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(errno));
}

// fsync of a directory, so a rename in it is durable.
absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(Errno("opening directory", dir));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(Errno("fsync of directory", dir));
  return absl::OkStatus();
}

// Keeps the first parse error for the message (instead of protobuf's log).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (text.empty()) text = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  std::string text;
};

// The step of a "step-0000000120" directory name, or -1.
int64_t StepOf(const std::string& name) {
  if (!absl::StartsWith(name, kStepPrefix)) return -1;
  int64_t step = -1;
  if (!absl::SimpleAtoi(name.substr(sizeof(kStepPrefix) - 1), &step) || step < 0) return -1;
  return step;
}

// Step directories of a job, highest step first.
std::vector<std::pair<int64_t, std::string>> StepDirs(const std::string& job_dir) {
  std::vector<std::pair<int64_t, std::string>> dirs;
  std::error_code ec;
  for (fs::directory_iterator it(job_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    const int64_t step = StepOf(it->path().filename().string());
    if (step >= 0) dirs.emplace_back(step, it->path().string());
  }
  std::sort(dirs.begin(), dirs.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  return dirs;
}

}  // namespace

std::string JobDir(const std::string& root, const std::string& job_id) {
  return (fs::path(root) / job_id).string();
}

std::string StepDir(const std::string& root, const std::string& job_id, int64_t step) {
  return (fs::path(root) / job_id / absl::StrFormat("%s%010d", kStepPrefix, step)).string();
}

std::string ShardFileName(int stage) { return absl::StrCat("stage-", stage, ".pt"); }

uint32_t Crc32(absl::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed large buffers in pieces.
  constexpr size_t kChunk = size_t{1} << 30;
  for (size_t at = 0; at < bytes.size(); at += kChunk) {
    const size_t n = std::min(kChunk, bytes.size() - at);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + at), static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(crc);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  static std::atomic<int64_t> counter{0};
  const fs::path target(path);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("creating ", dir, ": ", ec.message()));
  const std::string tmp =
      absl::StrCat(path, ".tmp-", ::getpid(), "-", counter.fetch_add(1, std::memory_order_relaxed));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::FailedPreconditionError(Errno("creating", tmp));
  auto fail = [&](const std::string& what) {
    const std::string text = Errno(what, tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return absl::InternalError(text);
  };
  for (size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("writing");
    }
    at += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("fsync of");
  if (::close(fd) != 0) {
    const std::string text = Errno("closing", tmp);
    ::unlink(tmp.c_str());
    return absl::InternalError(text);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string text = Errno(absl::StrCat("renaming ", tmp, " to"), path);
    ::unlink(tmp.c_str());
    return absl::InternalError(text);
  }
  return SyncDir(dir);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!fs::exists(path)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::PermissionDeniedError(Errno("opening", path));
  }
  std::ostringstream data;
  data << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("reading ", path, ": I/O error"));
  return std::move(data).str();
}

absl::Status VerifyBytes(absl::string_view data, int64_t bytes, uint32_t crc32,
                         const std::string& what) {
  if (static_cast<int64_t>(data.size()) != bytes) {
    return absl::DataLossError(absl::StrCat(
        what, ": ", static_cast<int64_t>(data.size()) < bytes ? "truncated" : "too long", ": ",
        data.size(), " bytes, the manifest says ", bytes));
  }
  const uint32_t got = Crc32(data);
  if (got != crc32) {
    return absl::DataLossError(absl::StrFormat(
        "%s: checksum mismatch: CRC-32 0x%08x, the manifest says 0x%08x", what, got, crc32));
  }
  return absl::OkStatus();
}

absl::Status VerifyFile(const std::string& path, int64_t bytes, uint32_t crc32) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) {
    if (!fs::exists(path)) return absl::NotFoundError(absl::StrCat(path, ": missing"));
    return absl::DataLossError(absl::StrCat(path, ": ", ec.message()));
  }
  if (static_cast<int64_t>(size) != bytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", static_cast<int64_t>(size) < bytes ? "truncated" : "too long",
                     ": ", size, " bytes, the manifest says ", bytes));
  }
  auto data = ReadFile(path);
  if (!data.ok()) return data.status();
  return VerifyBytes(*data, bytes, crc32, path);
}

absl::Status WriteManifest(const std::string& step_dir, const v1::CheckpointManifest& manifest) {
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(manifest, &text)) {
    return absl::InternalError("formatting the checkpoint manifest");
  }
  // The shards written since replace a corrupt checkpoint of the same step:
  // its marks go first (a crash in between leaves an uncommitted directory).
  for (const char* mark : {"CORRUPT", "MANIFEST.corrupt"}) {
    std::error_code ec;
    fs::remove(fs::path(step_dir) / mark, ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat("removing ", step_dir, "/", mark, ": ", ec.message()));
  }
  return WriteFileAtomically((fs::path(step_dir) / kManifestName).string(),
                             absl::StrCat("# stagewise checkpoint manifest\n", text));
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / kManifestName).string();
  auto text = ReadFile(path);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(
          absl::StrCat(step_dir, ": no ", kManifestName, " (not committed)"));
    }
    return text.status();
  }
  v1::CheckpointManifest manifest;
  google::protobuf::TextFormat::Parser parser;
  FirstError error;
  parser.RecordErrorsTo(&error);
  parser.AllowPartialMessage(false);
  if (!parser.ParseFromString(*text, &manifest)) {
    return absl::DataLossError(absl::StrCat(path, ": does not parse: ", error.text));
  }
  if (manifest.format() != kFormat) {
    return absl::DataLossError(
        absl::StrCat(path, ": format ", manifest.format(), ", this version reads ", kFormat));
  }
  if (manifest.shards_size() == 0) return absl::DataLossError(absl::StrCat(path, ": no shards"));
  for (int j = 0; j < manifest.shards_size(); ++j) {
    const v1::CheckpointShard& shard = manifest.shards(j);
    if (shard.stage() != j) {
      return absl::DataLossError(
          absl::StrCat(path, ": shards[", j, "] is stage ", shard.stage(), ", expected ", j));
    }
    if (shard.file().empty() || shard.file().find('/') != std::string::npos ||
        shard.file() == "..") {
      return absl::DataLossError(
          absl::StrCat(path, ": shards[", j, "].file '", shard.file(), "' is not a file name"));
    }
    if (shard.bytes() <= 0) {
      return absl::DataLossError(absl::StrCat(path, ": shards[", j, "].bytes is ", shard.bytes()));
    }
    if (absl::StatusOr<std::vector<BlockMode>> modes = ShardModes(shard); !modes.ok()) {
      return absl::DataLossError(absl::StrCat(path, ": shards[", j, "]", modes.status().message()));
    }
  }
  return manifest;
}

absl::StatusOr<std::vector<BlockMode>> ShardModes(const v1::CheckpointShard& shard) {
  const int blocks = shard.block_end() - shard.block_begin();
  std::vector<BlockMode> modes;
  if (shard.modes_size() > 0) {
    absl::StatusOr<std::vector<BlockMode>> typed = planner::ModesFromProto(shard.modes(), ".modes");
    if (!typed.ok()) return absl::DataLossError(typed.status().message());
    modes = *std::move(typed);
  } else {
    for (const std::string& name : shard.block_modes()) {
      const std::optional<BlockMode> mode = EnumFromName<BlockMode>(name);
      if (!mode.has_value()) {
        return absl::DataLossError(absl::StrCat(" has block mode '", name, "'"));
      }
      modes.push_back(*mode);
    }
  }
  if (!modes.empty() && static_cast<int>(modes.size()) != blocks) {
    return absl::DataLossError(
        absl::StrCat(" has ", modes.size(), " block modes for ", blocks, " blocks"));
  }
  return modes;
}

void SetShardModes(const std::vector<BlockMode>& modes, v1::CheckpointShard* shard) {
  shard->clear_modes();
  shard->clear_block_modes();
  for (BlockMode mode : modes) shard->add_modes(planner::ToProto(mode));
}

std::vector<Committed> ListCommitted(const std::string& root, const std::string& job_id,
                                     bool verify_checksums, std::vector<std::string>* skipped) {
  std::vector<Committed> out;
  auto skip = [&](const std::string& dir, const std::string& why) {
    if (skipped != nullptr) {
      skipped->push_back(absl::StrCat(fs::path(dir).filename().string(), ": ", why));
    }
  };
  for (const auto& [step, dir] : StepDirs(JobDir(root, job_id))) {
    auto manifest = ReadManifest(dir);
    if (!manifest.ok()) {
      if (absl::IsNotFound(manifest.status())) {
        std::error_code ec;
        skip(dir, fs::exists(fs::path(dir) / "CORRUPT", ec)
                      ? "marked corrupt (see its CORRUPT file)"
                      : absl::StrCat("no ", kManifestName, " (not committed)"));
      } else {
        skip(dir, std::string(manifest.status().message()));
      }
      continue;
    }
    if (manifest->step() != step) {
      skip(dir, absl::StrCat("the manifest says step ", manifest->step()));
      continue;
    }
    Committed c{dir, *manifest, 0};
    absl::Status bad;
    for (const v1::CheckpointShard& shard : manifest->shards()) {
      const std::string path = (fs::path(dir) / shard.file()).string();
      absl::Status s;
      if (verify_checksums) {
        s = VerifyFile(path, shard.bytes(), shard.crc32());
      } else {
        std::error_code ec;
        const auto size = fs::file_size(path, ec);
        if (ec) {
          s = absl::NotFoundError(absl::StrCat(path, ": missing"));
        } else if (static_cast<int64_t>(size) != shard.bytes()) {
          s = absl::DataLossError(
              absl::StrCat(path, ": ", size, " bytes, the manifest says ", shard.bytes()));
        }
      }
      if (!s.ok()) {
        bad = s;
        break;
      }
      c.bytes += shard.bytes();
    }
    if (!bad.ok()) {
      skip(dir, std::string(bad.message()));
      continue;
    }
    out.push_back(std::move(c));
  }
  return out;
}

absl::Status MarkCorrupt(const std::string& step_dir, const std::string& reason) {
  const fs::path dir(step_dir);
  absl::Status s = WriteFileAtomically((dir / "CORRUPT").string(), absl::StrCat(reason, "\n"));
  if (!s.ok()) return s;
  if (::rename((dir / kManifestName).c_str(), (dir / "MANIFEST.corrupt").c_str()) != 0 &&
      errno != ENOENT) {
    return absl::InternalError(Errno("renaming the manifest in", step_dir));
  }
  return SyncDir(step_dir);
}

absl::StatusOr<std::vector<std::string>> Prune(const std::string& root, const std::string& job_id,
                                               int keep) {
  std::vector<std::string> removed;
  const std::vector<Committed> committed = ListCommitted(root, job_id, false, nullptr);
  if (committed.empty()) return removed;
  std::set<std::string> kept;
  for (size_t i = 0; i < committed.size() && static_cast<int>(i) < std::max(keep, 1); ++i) {
    kept.insert(committed[i].dir);
  }
  const int64_t newest = committed.front().manifest.step();
  for (const auto& [step, dir] : StepDirs(JobDir(root, job_id))) {
    if (kept.count(dir) || step >= newest) continue;
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("removing ", dir, ": ", ec.message()));
    removed.push_back(dir);
  }
  // Inside a kept checkpoint, only its MANIFEST and the shards it lists
  // belong: shards of an earlier try with more stages, or temporary files of
  // a writer that died, go.
  for (const Committed& c : committed) {
    if (!kept.count(c.dir)) continue;
    std::set<std::string> listed = {kManifestName};
    for (const v1::CheckpointShard& shard : c.manifest.shards()) listed.insert(shard.file());
    std::error_code ec;
    std::vector<fs::path> strays;
    for (fs::directory_iterator it(c.dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (!listed.count(it->path().filename().string())) strays.push_back(it->path());
    }
    for (const fs::path& stray : strays) {
      fs::remove_all(stray, ec);
      if (ec)
        return absl::InternalError(absl::StrCat("removing ", stray.string(), ": ", ec.message()));
      removed.push_back(stray.string());
    }
  }
  // Shards directly in the job directory belong to no checkpoint.
  std::error_code ec;
  std::vector<fs::path> strays;
  for (fs::directory_iterator it(JobDir(root, job_id), ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec)) continue;
    if (absl::StartsWith(name, "stage-")) strays.push_back(it->path());
  }
  for (const fs::path& stray : strays) {
    fs::remove(stray, ec);
    if (ec)
      return absl::InternalError(absl::StrCat("removing ", stray.string(), ": ", ec.message()));
    removed.push_back(stray.string());
  }
  return removed;
}

absl::Status ProbeWritable(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir: cannot write ", dir, ": ", ec.message()));
  }
  const std::string probe = (fs::path(dir) / absl::StrCat(".probe-", ::getpid())).string();
  absl::Status s = WriteFileAtomically(probe, "stagewise");
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir: cannot write ", dir, ": ", s.message()));
  }
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

}  // namespace stagewise::checkpoint
