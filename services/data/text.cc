// Byte-level text corpora (docs/text.md): the fortunes collection Debian
// ships, or a user's file, split 90/5/5 into train, validation and test.
#include <zlib.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/data/dataset.h"

namespace stagewise::data {
namespace {

// Debian's fortunes (1:1.99.1) and fortunes-min: the English files, sorted.
constexpr std::array<const char*, 43> kFortuneFiles = {
    "art",           "ascii-art",  "computers", "cookie",       "debian",   "definitions",
    "disclaimer",    "drugs",      "education", "ethnic",       "food",     "fortunes",
    "goedel",        "humorists",  "kids",      "knghtbrd",     "law",      "linux",
    "linuxcookie",   "literature", "love",      "magic",        "medicine", "men-women",
    "miscellaneous", "news",       "paradoxum", "people",       "perl",     "pets",
    "platitudes",    "politics",   "pratchett", "riddles",      "science",  "songs-poems",
    "sports",        "startrek",   "tao",       "translate-me", "wisdom",   "work",
    "zippy"};
// The corpus those files make, separators removed (scripts/fortunes-corpus
// prints the same numbers from the shell).
constexpr int64_t kFortunesBytes = 2546242;
constexpr uint32_t kFortunesCrc32 = 0x3ed97b82;
// A text corpus is held in memory whole: at most 1 GiB.
constexpr int64_t kMaxTextBytes = int64_t{1} << 30;

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) return absl::DataLossError(absl::StrCat(path, ": cannot read its size"));
  if (size > kMaxTextBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", size,
                                                   " bytes; text corpora are "
                                                   "limited to ",
                                                   kMaxTextBytes, " bytes"));
  }
  std::string data(static_cast<size_t>(size), '\0');
  in.seekg(0);
  in.read(data.data(), size);
  if (!in) return absl::DataLossError(absl::StrCat(path, ": short read"));
  return data;
}

uint32_t Crc32(const std::string& s) {
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t done = 0;
  while (done < s.size()) {
    const uInt n = static_cast<uInt>(std::min<size_t>(s.size() - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(s.data() + done), n);
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

torch::Tensor Bytes(const std::string& corpus, int64_t begin, int64_t end) {
  torch::Tensor t = torch::empty({end - begin}, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), corpus.data() + begin, static_cast<size_t>(end - begin));
  return t;
}

}  // namespace

absl::StatusOr<std::string> ReadFortunes(const std::string& dir) {
  std::string corpus;
  for (const char* name : kFortuneFiles) {
    const std::string path = absl::StrCat(dir, "/", name);
    auto data = ReadWhole(path);
    if (!data.ok()) {
      return absl::Status(data.status().code(),
                          absl::StrCat("fortunes: ", data.status().message(),
                                       " (install Debian's fortunes package: scripts/setup)"));
    }
    // Every line but the "%" that separates two fortunes, newline-terminated.
    std::istringstream lines(*data);
    for (std::string line; std::getline(lines, line);) {
      if (line == "%") continue;
      corpus.append(line);
      corpus.push_back('\n');
    }
  }
  const uint32_t crc = Crc32(corpus);
  if (static_cast<int64_t>(corpus.size()) != kFortunesBytes || crc != kFortunesCrc32) {
    return absl::DataLossError(absl::StrFormat(
        "fortunes in %s: the corpus has %d bytes with CRC-32 %08x, expected %d bytes with %08x "
        "(another version of Debian's fortunes package?)",
        dir, corpus.size(), crc, kFortunesBytes, kFortunesCrc32));
  }
  return corpus;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  auto data = ReadWhole(path);
  if (!data.ok()) {
    return absl::Status(data.status().code(), absl::StrCat("data.path: ", data.status().message()));
  }
  return data;
}

absl::StatusOr<Datasets> MakeTextDatasets(const std::string& corpus, const DataSpec& spec) {
  const auto total = static_cast<int64_t>(corpus.size());
  const int64_t train_end = total * 90 / 100;
  const int64_t validation_end = total * 95 / 100;
  const int64_t t = spec.sequence_length;
  struct Part {
    const char* name;
    int64_t begin, end;
  };
  const Part parts[] = {{"training", 0, train_end},
                        {"validation", train_end, validation_end},
                        {"test", validation_end, total}};
  for (const Part& p : parts) {
    if (p.end - p.begin < t + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.sequence_length: ", t, " needs ", t + 1, " bytes in every split, but the ", p.name,
          " split of this ", total, "-byte corpus has ", p.end - p.begin,
          " (use a shorter sequence or a larger text)"));
    }
  }
  Datasets out;
  out.num_classes = 256;
  out.train.text = Bytes(corpus, 0, train_end);
  out.train.epoch_sequences = spec.train_size;
  if (spec.limit_train > 0) out.train.epoch_sequences = std::min(spec.train_size, spec.limit_train);
  const Part& held = parts[spec.eval_split == TextSplit::kTest ? 2 : 1];
  int64_t held_end = held.end;
  // limit_test: the first N windows of the held-out split.
  if (spec.limit_test > 0) held_end = std::min(held.end, held.begin + spec.limit_test * t + 1);
  out.test.text = Bytes(corpus, held.begin, held_end);
  return out;
}

}  // namespace stagewise::data
