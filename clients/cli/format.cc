#include "clients/cli/format.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clients/cli/job_format.h"
#include "clients/cli/output.h"

namespace stagewise::cli {

std::string HumanCount(int64_t n) {
  if (n >= 1000000000) return absl::StrFormat("%.2fG", n / 1e9);
  if (n >= 1000000) return absl::StrFormat("%.2fM", n / 1e6);
  if (n >= 1000) return absl::StrFormat("%.1fk", n / 1e3);
  return absl::StrCat(n);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string HumanDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

std::string TerminalSafeLines(absl::string_view s) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(s, '\n')) lines.push_back(TerminalSafe(line));
  return absl::StrJoin(lines, "\n");
}

std::string TerminalSafe(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\x%02x", c);
    } else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0x9f) {
      // U+0080..U+009F in UTF-8: the C1 controls (CSI among them).
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(s[i + 1]));
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string ProgressLine(const training::Progress& p) {
  return absl::StrFormat("epoch %.2f  step %d/%d  loss %.4f  lr %.4g  %.0f samples/s  ETA %s",
                         p.epoch, p.step, p.total_steps, p.loss, p.lr, p.samples_per_second,
                         HumanDuration(p.eta_seconds));
}

std::string ResultTable(const JobSpec& spec, const training::TrainResult& r) {
  std::string out;
  auto row = [&](const std::string& k, const std::string& v) {
    absl::StrAppend(&out, absl::StrFormat("%-16s %s\n", k, v));
  };
  row("job", spec.name);
  row("model",
      absl::StrCat(NameOf(spec.model.name), " (", HumanCount(r.num_parameters), " parameters)"));
  row("steps", absl::StrFormat("%d (%.2f epochs)", r.steps, r.epochs));
  row("train loss", absl::StrFormat("%.4f", r.train_loss));
  row("test loss", absl::StrFormat("%.4f", r.test.loss));
  if (IsText(spec.data.dataset)) {
    // A byte-level language model: loss in nats per byte.
    row("bits per byte", absl::StrFormat("%.4f (train %.4f)", r.test.loss / std::log(2.0),
                                         r.train_loss / std::log(2.0)));
    row("byte accuracy", absl::StrFormat("%.2f%%", 100.0 * r.test.accuracy));
  } else {
    row("test accuracy", absl::StrFormat("%.2f%%", 100.0 * r.test.accuracy));
  }
  row("train time", HumanDuration(r.seconds));
  row("throughput", r.tokens_per_second > 0
                        ? absl::StrFormat("%.0f samples/s, %.0f tokens/s", r.samples_per_second,
                                          r.tokens_per_second)
                        : absl::StrFormat("%.0f samples/s", r.samples_per_second));
  if (!r.last_checkpoint.empty()) row("checkpoint", r.last_checkpoint);
  return out;
}

std::string ResultJson(const JobSpec& spec, const training::TrainResult& r) {
  // The job schema a coordinator's job has (job_format.h), filled from one
  // process: no job id, one stage, no attempts.
  Json j = JobSkeleton();
  j["name"] = spec.name;
  j["state"] = "SUCCEEDED";
  j["algorithm"] = "backprop";
  j["model"] = std::string(NameOf(spec.model.name));
  j["parameters"] = r.num_parameters;
  j["stages"] = 1;
  j["replicas"] = 1;
  j["chunks_per_worker"] = 1;
  j["replica_samples_per_second"] = Json::array();
  j["phase"] = 0;
  j["num_phases"] = 1;
  j["step"] = r.steps;
  j["total_steps"] = r.steps;
  j["epoch"] = Number(r.epochs);
  if (r.steps > 0) j["train_loss"] = Number(r.train_loss);
  j["eval_loss"] = Number(r.test.loss);
  j["eval_accuracy"] = Number(r.test.accuracy);
  if (IsText(spec.data.dataset)) j["eval_bits_per_byte"] = Number(r.test.loss / std::log(2.0));
  if (r.samples_per_second > 0) j["samples_per_second"] = Number(r.samples_per_second);
  if (r.tokens_per_second > 0) j["tokens_per_second"] = Number(r.tokens_per_second);
  j["seconds"] = Number(r.seconds);
  j["attempt"] = 0;
  j["steps_redone"] = 0;
  j["attempts"] = Json::array();
  j["summary"] = Json::object();
  Json evals = Json::array();
  for (const auto& e : r.evals) {
    evals.push_back({{"step", e.step}, {"loss", Number(e.loss)}, {"accuracy", Number(e.accuracy)}});
  }
  j["evals"] = evals;
  j["checkpoint"] = NonEmpty(r.last_checkpoint);
  return JsonLine(j);
}

}  // namespace stagewise::cli
