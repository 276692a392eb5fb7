// IDX reader (the MNIST family's format): magic 0x00 0x00 <type> <rank>, then
// <rank> big-endian int32 dims, then the big-endian elements in row-major order.
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/data/dataset.h"

namespace stagewise::data {
namespace {

// IDX files are rank 1..3 in practice; the cap only guards against corrupt headers.
constexpr int kMaxRank = 8;
// Above this a header is corrupt rather than a real dataset (4 EiB).
constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 62;
// Read in bounded chunks so a header that claims more data than the file holds
// costs at most one chunk of memory beyond the real payload.
constexpr uint64_t kReadChunk = uint64_t{16} << 20;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

struct ElementType {
  torch::ScalarType dtype;
  int size;
  const char* name;
};

bool LookUpType(uint8_t code, ElementType* out) {
  switch (code) {
    case 0x08:
      *out = {torch::kUInt8, 1, "ubyte"};
      return true;
    case 0x09:
      *out = {torch::kInt8, 1, "sbyte"};
      return true;
    case 0x0B:
      *out = {torch::kInt16, 2, "short"};
      return true;
    case 0x0C:
      *out = {torch::kInt32, 4, "int"};
      return true;
    case 0x0D:
      *out = {torch::kFloat32, 4, "float"};
      return true;
    case 0x0E:
      *out = {torch::kFloat64, 8, "double"};
      return true;
    default:
      return false;
  }
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Decodes big-endian elements byte by byte, which is correct whatever the
// host's byte order; the compiler turns the loop body into a bswap.
template <typename UInt>
void DecodeBigEndian(const uint8_t* in, uint64_t count, void* out) {
  auto* dst = static_cast<uint8_t*>(out);
  for (uint64_t i = 0; i < count; ++i) {
    UInt v = 0;
    for (size_t b = 0; b < sizeof(UInt); ++b) v = static_cast<UInt>((v << 8) | in[b]);
    std::memcpy(dst, &v, sizeof(UInt));
    in += sizeof(UInt);
    dst += sizeof(UInt);
  }
}

std::string GzErrorMessage(gzFile_s* f) {
  int code = Z_OK;
  const char* msg = gzerror(f, &code);
  if (code == Z_ERRNO) return std::strerror(errno);
  return msg != nullptr && *msg != '\0' ? msg : "unknown zlib error";
}

// Reads exactly `n` bytes, or fewer if the file ends; a read error is a status.
absl::StatusOr<uint64_t> ReadUpTo(gzFile_s* f, const std::string& path, uint8_t* dst, uint64_t n) {
  uint64_t got = 0;
  while (got < n) {
    // gzread takes an unsigned and returns an int: stay below INT_MAX per call.
    const unsigned want = static_cast<unsigned>(std::min<uint64_t>(n - got, 1u << 30));
    const int r = gzread(f, dst + got, want);
    if (r < 0) return absl::DataLossError(absl::StrCat(path, ": read error: ", GzErrorMessage(f)));
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  return got;
}

absl::StatusOr<torch::Tensor> ReadIdxOrThrow(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st))
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  if (std::filesystem::is_directory(st)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, expected an IDX file"));
  }
  // gzopen/gzread read plain files transparently, so one path serves both.
  GzFile file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  gzbuffer(file.get(), 1 << 20);

  uint8_t magic[4];
  absl::StatusOr<uint64_t> got = ReadUpTo(file.get(), path, magic, sizeof(magic));
  if (!got.ok()) return got.status();
  if (*got < sizeof(magic)) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated header: ", *got, " of 4 magic bytes"));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::DataLossError(
        absl::StrFormat("%s: bad magic 0x%02x%02x%02x%02x (an IDX file starts with two zero bytes)",
                        path, magic[0], magic[1], magic[2], magic[3]));
  }
  ElementType type;
  if (!LookUpType(magic[2], &type)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: unknown element type code 0x%02x (expected 0x08, 0x09, 0x0b, 0x0c, 0x0d or 0x0e)",
        path, magic[2]));
  }
  const int rank = magic[3];
  if (rank < 1 || rank > kMaxRank) {
    return absl::DataLossError(
        absl::StrCat(path, ": unsupported rank ", rank, " (expected 1..", kMaxRank, ")"));
  }

  std::vector<uint8_t> dim_bytes(4 * rank);
  got = ReadUpTo(file.get(), path, dim_bytes.data(), dim_bytes.size());
  if (!got.ok()) return got.status();
  if (*got < dim_bytes.size()) {
    return absl::DataLossError(absl::StrCat(path, ": truncated header: ", *got, " of ",
                                            dim_bytes.size(), " dimension bytes"));
  }
  std::vector<int64_t> dims(rank);
  uint64_t numel = 1;
  for (int i = 0; i < rank; ++i) {
    const uint32_t d = BigEndian32(&dim_bytes[4 * i]);
    if (d > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return absl::DataLossError(absl::StrCat(path, ": dimension ", i, " is negative"));
    }
    dims[i] = d;
    if (d != 0 && numel > kMaxPayloadBytes / d) {
      return absl::DataLossError(absl::StrCat(path, ": implausible dimensions in header"));
    }
    numel *= d;
  }
  if (numel > kMaxPayloadBytes / type.size) {
    return absl::DataLossError(absl::StrCat(path, ": implausible dimensions in header"));
  }
  const uint64_t expected = numel * type.size;

  // Grow the buffer as data arrives rather than trusting the header's size.
  std::vector<uint8_t> payload;
  uint64_t have = 0;
  while (have < expected) {
    const uint64_t want = std::min(expected - have, kReadChunk);
    payload.resize(have + want);
    got = ReadUpTo(file.get(), path, payload.data() + have, want);
    if (!got.ok()) return got.status();
    have += *got;
    if (*got < want) {
      int code = Z_OK;
      gzerror(file.get(), &code);
      // Z_BUF_ERROR: the gzip stream itself stops early (a cut-off download).
      const char* why = code == Z_BUF_ERROR ? " (gzip stream ends early)" : "";
      return absl::DataLossError(absl::StrCat(path, ": truncated payload: header declares ",
                                              expected, " bytes of ", type.name,
                                              " data, file holds ", have, why));
    }
  }
  uint8_t extra = 0;
  got = ReadUpTo(file.get(), path, &extra, 1);
  if (!got.ok()) return got.status();
  if (*got != 0) {
    return absl::DataLossError(absl::StrCat(path, ": trailing bytes after the ", expected,
                                            "-byte payload the header declares"));
  }

  torch::Tensor out = torch::empty(dims, torch::TensorOptions().dtype(type.dtype));
  switch (type.size) {
    case 1:
      if (expected > 0) std::memcpy(out.data_ptr(), payload.data(), expected);
      break;
    case 2:
      DecodeBigEndian<uint16_t>(payload.data(), numel, out.data_ptr());
      break;
    case 4:
      DecodeBigEndian<uint32_t>(payload.data(), numel, out.data_ptr());
      break;
    case 8:
      DecodeBigEndian<uint64_t>(payload.data(), numel, out.data_ptr());
      break;
  }
  return out;
}

}  // namespace

absl::StatusOr<torch::Tensor> ReadIdx(const std::string& path) {
  try {
    return ReadIdxOrThrow(path);
  } catch (const std::exception& e) {
    // Allocation failures and LibTorch errors must not escape a StatusOr API.
    return absl::InternalError(absl::StrCat(path, ": ", e.what()));
  }
}

}  // namespace stagewise::data
