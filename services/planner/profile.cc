#include "services/planner/profile.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace stagewise::planner {
namespace {

// 2: blocks timed after untimed whole-model passes (services/profiler). A
// cached profile of another version is not read, so it is profiled again.
constexpr char kMagic[] = "stagewise-profile 2";
constexpr char kColumns[] =
    "block index kind reversible forward_s forward_nograd_s backward_s rebuild_backward_s "
    "inverse_s step_s message_s aux_head_s input_bytes output_bytes graph_bytes "
    "forward_transient_bytes backward_transient_bytes rebuild_transient_bytes parameter_bytes "
    "buffer_bytes optimizer_bytes";

std::string D(double v) { return absl::StrCat(v); }

}  // namespace

std::string SerializeProfile(const ModelProfile& p) {
  std::string out = absl::StrCat(kMagic, "\n");
  absl::StrAppend(&out, "key ", p.key, "\n", "model ", p.model, "\n", "batch_size ", p.batch_size,
                  "\n", "device ", p.device, "\n", "threads ", p.threads, "\n", "repeats ",
                  p.repeats, "\n", "label_bytes ", p.label_bytes, "\n", "aux_head ",
                  p.aux_head.empty() ? "-" : p.aux_head, "\n", "# ", kColumns, "\n");
  for (const BlockProfile& b : p.blocks) {
    absl::StrAppend(&out, "block ", b.index, " ", b.kind, " ", b.reversible ? 1 : 0, " ",
                    D(b.forward_s), " ", D(b.forward_nograd_s), " ", D(b.backward_s), " ",
                    D(b.rebuild_backward_s), " ", D(b.inverse_s), " ", D(b.step_s), " ",
                    D(b.message_s), " ", D(b.aux_head_s), " ", b.input_bytes, " ", b.output_bytes,
                    " ", b.graph_bytes, " ", b.forward_transient_bytes, " ",
                    b.backward_transient_bytes, " ", b.rebuild_transient_bytes, " ",
                    b.parameter_bytes, " ", b.buffer_bytes, " ", b.optimizer_bytes, "\n");
  }
  return out;
}

absl::StatusOr<ModelProfile> ParseProfile(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kMagic) {
    return absl::InvalidArgumentError(absl::StrCat("not a profile: expected '", kMagic, "'"));
  }
  ModelProfile p;
  for (size_t n = 1; n < lines.size(); ++n) {
    const std::string& line = lines[n];
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("profile line ", n + 1, ": ", why));
    };
    if (absl::StartsWith(line, "#")) continue;
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    const std::string& key = kv.first;
    const std::string& value = kv.second;
    bool ok = true;
    if (key == "key") {
      p.key = value;
    } else if (key == "model") {
      p.model = value;
    } else if (key == "batch_size") {
      ok = absl::SimpleAtoi(value, &p.batch_size);
    } else if (key == "device") {
      p.device = value;
    } else if (key == "threads") {
      ok = absl::SimpleAtoi(value, &p.threads);
    } else if (key == "repeats") {
      ok = absl::SimpleAtoi(value, &p.repeats);
    } else if (key == "label_bytes") {
      ok = absl::SimpleAtoi(value, &p.label_bytes);
    } else if (key == "aux_head") {
      p.aux_head = value == "-" ? "" : value;
    } else if (key == "block") {
      std::vector<std::string> f = absl::StrSplit(value, ' ', absl::SkipEmpty());
      if (f.size() != 20) return bad(absl::StrCat("expected 20 fields, found ", f.size()));
      BlockProfile b;
      int rev = 0;
      b.kind = f[1];
      ok = absl::SimpleAtoi(f[0], &b.index) && absl::SimpleAtoi(f[2], &rev);
      b.reversible = rev != 0;
      double* doubles[] = {&b.forward_s, &b.forward_nograd_s, &b.backward_s, &b.rebuild_backward_s,
                           &b.inverse_s, &b.step_s,           &b.message_s,  &b.aux_head_s};
      for (int i = 0; i < 8 && ok; ++i) ok = absl::SimpleAtod(f[3 + i], doubles[i]);
      int64_t* ints[] = {&b.input_bytes,
                         &b.output_bytes,
                         &b.graph_bytes,
                         &b.forward_transient_bytes,
                         &b.backward_transient_bytes,
                         &b.rebuild_transient_bytes,
                         &b.parameter_bytes,
                         &b.buffer_bytes,
                         &b.optimizer_bytes};
      for (int i = 0; i < 9 && ok; ++i) ok = absl::SimpleAtoi(f[11 + i], ints[i]);
      if (ok && b.index != static_cast<int>(p.blocks.size())) {
        return bad(absl::StrCat("block ", b.index, " out of order"));
      }
      p.blocks.push_back(b);
    } else {
      return bad(absl::StrCat("unknown key '", key, "'"));
    }
    if (!ok) return bad(absl::StrCat("bad value for ", key, ": '", value, "'"));
  }
  if (p.blocks.empty()) return absl::InvalidArgumentError("profile has no blocks");
  return p;
}

}  // namespace stagewise::planner
