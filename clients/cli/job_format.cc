#include "clients/cli/job_format.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "clients/cli/format.h"
#include "clients/cli/output.h"
#include "clients/client/coordinator_client.h"

namespace stagewise::cli {
namespace {

// Seconds from creation to the last update, when the coordinator filled both.
std::optional<double> JobSeconds(const v1::JobStatus& s) {
  if (s.created_unix_ms() <= 0 || s.updated_unix_ms() < s.created_unix_ms()) return std::nullopt;
  return (s.updated_unix_ms() - s.created_unix_ms()) / 1000.0;
}

// Evaluation fields are plain doubles on the wire: both 0 means "not evaluated yet".
bool HasEval(const v1::JobStatus& s) { return s.eval_loss() != 0 || s.eval_accuracy() != 0; }

std::string Loss(double v) { return std::isfinite(v) ? absl::StrFormat("%.4f", v) : "nan"; }

std::string StepOfTotal(const v1::JobStatus& s) {
  return s.total_steps() > 0 ? absl::StrCat(s.step(), "/", s.total_steps())
                             : absl::StrCat(s.step());
}

// Recovery details are worth showing once there was a recovery or a checkpoint.
bool ShowsRecovery(const v1::JobStatus& s) {
  return s.attempts_size() > 1 || s.attempt() > 0 || s.last_checkpoint_step() > 0 ||
         s.steps_redone() > 0 || (s.attempts_size() > 0 && s.attempts(0).replacements_size() > 0);
}

std::string LocalTime(int64_t unix_ms, absl::TimeZone tz) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms), tz);
}

std::map<std::string, std::string> SortedLabels(const v1::WorkerInfo& w) {
  return {w.labels().begin(), w.labels().end()};
}

}  // namespace

std::string HumanBytes(int64_t bytes) {
  if (bytes <= 0) return "-";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, "B") : absl::StrFormat("%.1f%s", v, units[u]);
}

std::string HumanAge(absl::Duration d) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  if (s < 2 * 86400) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], TerminalSafe(row[c]).size());
    }
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < cells.size() ? TerminalSafe(cells[c]) : "";
      if (c + 1 == width.size()) {
        absl::StrAppend(&text, cell);  // no trailing blanks
      } else {
        absl::StrAppend(&text, cell, std::string(width[c] - cell.size() + 2, ' '));
      }
    }
    absl::StrAppend(&out, text, "\n");
  };
  line(header);
  for (const auto& row : rows) line(row);
  return out;
}

namespace {

std::string JobProgressText(const v1::JobStatus& s, std::optional<double> eta_seconds) {
  std::string line = client::JobStateName(s.state());
  if (s.state() == v1::RECOVERING) {
    // Where the new attempt resumes: the last committed checkpoint, or the start.
    const int64_t from = std::max<int64_t>(0, s.last_checkpoint_step());
    absl::StrAppend(&line, "  attempt ", s.attempt(), "  resuming at step ", from,
                    s.total_steps() > 0 ? absl::StrCat("/", s.total_steps()) : "");
    if (s.num_phases() > 1) {
      absl::StrAppend(&line, "  phase ", s.phase() + 1, "/", s.num_phases(), " ", s.phase_name());
    }
    return line;
  }
  if (s.step() > 0 || s.state() == v1::RUNNING) {
    absl::StrAppend(&line, "  epoch ", s.epoch(), "  step ", StepOfTotal(s));
  }
  if (s.attempt() > 0) absl::StrAppend(&line, "  attempt ", s.attempt());
  if (s.num_phases() > 1) {
    absl::StrAppend(&line, "  phase ", s.phase() + 1, "/", s.num_phases(), " ", s.phase_name());
  }
  if (s.step() > 0) absl::StrAppend(&line, "  loss ", Loss(s.train_loss()));
  const bool text = s.tokens_per_sample() > 0;  // losses in nats per byte
  if (HasEval(s) && text) {
    absl::StrAppend(&line, absl::StrFormat("  eval %.3f bits/byte", s.eval_loss() / std::log(2.0)));
  } else if (HasEval(s)) {
    absl::StrAppend(&line, absl::StrFormat("  eval %.2f%%", 100.0 * s.eval_accuracy()));
  }
  if (s.samples_per_second() > 0 && text) {
    absl::StrAppend(
        &line, absl::StrFormat("  %.0f tokens/s", s.samples_per_second() * s.tokens_per_sample()));
  } else if (s.samples_per_second() > 0) {
    absl::StrAppend(&line, absl::StrFormat("  %.0f samples/s", s.samples_per_second()));
  }
  if (eta_seconds.has_value()) absl::StrAppend(&line, "  ETA ", HumanDuration(*eta_seconds));
  return line;
}

}  // namespace

std::string JobProgressLine(const v1::JobStatus& s, std::optional<double> eta_seconds) {
  return TerminalSafe(JobProgressText(s, eta_seconds));
}

std::string AttemptsTable(const v1::JobStatus& s, absl::TimeZone tz) {
  std::vector<std::vector<std::string>> rows;
  for (int i = 0; i < s.attempts_size(); ++i) {
    const v1::JobAttempt& a = s.attempts(i);
    const bool last = i + 1 == s.attempts_size();
    const int64_t until = a.ended_unix_ms() > 0 ? a.ended_unix_ms() : s.updated_unix_ms();
    std::string duration = "-";
    if (a.started_unix_ms() > 0 && until >= a.started_unix_ms()) {
      duration = HumanDuration((until - a.started_unix_ms()) / 1000.0);
    }
    std::string end;
    if (!a.end_reason().empty()) {
      end = a.end_reason();
    } else if (last && client::IsTerminal(s.state())) {
      end = client::JobStateName(s.state());
    } else {
      end = a.ended_unix_ms() > 0 ? "ended" : "running";
    }
    rows.push_back({absl::StrCat(a.attempt()), absl::StrCat(a.from_step()),
                    absl::StrCat(a.reached_step()), LocalTime(a.started_unix_ms(), tz), duration,
                    end, a.workers().empty() ? "-" : absl::StrJoin(a.workers(), ",")});
  }
  return RenderTable({"ATTEMPT", "FROM", "REACHED", "STARTED", "DURATION", "END", "WORKERS"}, rows);
}

std::string JobTable(const v1::JobStatus& s, absl::TimeZone tz) {
  std::string out;
  auto row = [&](const std::string& k, const std::string& v) {
    absl::StrAppend(&out, absl::StrFormat("%-15s %s\n", k, TerminalSafe(v)));
  };
  row("job", s.name().empty() ? s.job_id() : absl::StrCat(s.name(), " (", s.job_id(), ")"));
  row("state", client::JobStateName(s.state()));
  if (!s.reason().empty()) row("reason", s.reason());
  if (!s.algorithm().empty()) {
    row("algorithm",
        absl::StrCat(
            s.algorithm(), " on ", s.num_stages(), " stage(s)",
            s.chunks_per_worker() > 1
                ? absl::StrCat(" (", s.num_stages() / s.chunks_per_worker(), " workers x ",
                               s.chunks_per_worker(), " chunks)")
                : "",
            s.num_replicas() > 1 ? absl::StrCat(" x ", s.num_replicas(), " replicas") : ""));
  }
  if (s.num_phases() > 1) {
    row("phase", absl::StrCat(s.phase() + 1, "/", s.num_phases(), " (", s.phase_name(), ")"));
  }
  row("steps", absl::StrCat(StepOfTotal(s), " (epoch ", s.epoch(), ")"));
  row("train loss", s.step() > 0 ? Loss(s.train_loss()) : "-");
  row("eval loss", HasEval(s) ? Loss(s.eval_loss()) : "-");
  const bool text = s.tokens_per_sample() > 0;
  if (text) {
    row("bits per byte", HasEval(s) ? absl::StrFormat("%.4f", s.eval_loss() / std::log(2.0)) : "-");
  }
  row(text ? "byte accuracy" : "eval accuracy",
      HasEval(s) ? absl::StrFormat("%.2f%%", 100.0 * s.eval_accuracy()) : "-");
  std::string throughput = "-";
  if (s.samples_per_second() > 0) {
    throughput = absl::StrFormat("%.0f samples/s", s.samples_per_second());
    if (text) {
      absl::StrAppend(&throughput, absl::StrFormat(", %.0f tokens/s",
                                                   s.samples_per_second() * s.tokens_per_sample()));
    }
  }
  row("throughput", throughput);
  if (s.replica_samples_per_second_size() > 1) {
    std::vector<std::string> rates;
    for (double r : s.replica_samples_per_second()) rates.push_back(absl::StrFormat("%.0f", r));
    row("per replica", absl::StrCat(absl::StrJoin(rates, ", "), " samples/s"));
  }
  const std::optional<double> seconds = JobSeconds(s);
  row("time", seconds.has_value() ? HumanDuration(*seconds) : "-");
  // Per-stage results ("stage<j>.<name>"), one line per stage, names sorted.
  std::map<std::string, std::vector<std::string>> stages;
  const std::map<std::string, double> sorted(s.summary().begin(), s.summary().end());
  for (const auto& [key, value] : sorted) {
    const size_t dot = key.find('.');
    if (dot == std::string::npos) continue;
    const std::string name = key.substr(dot + 1);
    const bool bytes = absl::EndsWith(name, "bytes") || absl::StartsWith(name, "bytes");
    stages[key.substr(0, dot)].push_back(absl::StrCat(
        name, "=", bytes ? HumanBytes(static_cast<int64_t>(value)) : absl::StrFormat("%g", value)));
  }
  for (const auto& [stage, values] : stages) row(stage, absl::StrJoin(values, " "));
  if (ShowsRecovery(s)) {
    row("last checkpoint", s.last_checkpoint_step() >= 0
                               ? absl::StrCat("step ", s.last_checkpoint_step())
                               : std::string("none"));
    row("recoveries", absl::StrCat(std::max(s.attempt(), s.attempts_size() - 1)));
    row("steps redone", absl::StrCat(s.steps_redone()));
    if (s.attempts_size() > 0) absl::StrAppend(&out, "\n", AttemptsTable(s, tz));
    // recovery.replay: the stages replaced inside an attempt.
    for (const v1::JobAttempt& a : s.attempts()) {
      for (const v1::StageReplacement& r : a.replacements()) {
        // A lost replica copied a surviving one; a lost stage loaded a shard.
        const bool copied = r.copied_bytes() > 0;
        const std::string what =
            copied ? absl::StrFormat("stage %d of replica %d", r.stage(), r.replica())
                   : absl::StrFormat("stage %d", r.stage());
        const std::string from =
            copied ? absl::StrFormat(
                         "copied replica %d's state at step %d (%s in %.1f s), "
                         "replayed to step %d",
                         r.copied_from_replica(), r.from_step(), HumanBytes(r.copied_bytes()),
                         r.copy_seconds(), r.replayed_to_step())
                   : absl::StrFormat("replayed from step %d to %d", r.from_step(),
                                     r.replayed_to_step());
        absl::StrAppend(
            &out, absl::StrFormat("attempt %d: %s moved from %s to %s at step %d, %s "
                                  "(%d steps, %s) in %.1f s; full speed after %.1f s\n",
                                  a.attempt(), what, r.lost_worker(), r.worker(), r.job_step(),
                                  from, r.steps_redone(), HumanBytes(r.bytes()), r.replay_seconds(),
                                  r.full_speed_seconds()));
      }
    }
  }
  return out;
}

Json JobSkeleton() {
  Json j;
  j["schema_version"] = kSchemaVersion;
  for (const char* key : {"job_id",
                          "name",
                          "state",
                          "reason",
                          "suspended",
                          "algorithm",
                          "model",
                          "parameters",
                          "stages",
                          "replicas",
                          "chunks_per_worker",
                          "replica_samples_per_second",
                          "phase",
                          "num_phases",
                          "phase_name",
                          "step",
                          "total_steps",
                          "epoch",
                          "train_loss",
                          "eval_loss",
                          "eval_accuracy",
                          "eval_bits_per_byte",
                          "samples_per_second",
                          "tokens_per_second",
                          "seconds",
                          "created_unix_ms",
                          "updated_unix_ms",
                          "attempt",
                          "last_checkpoint_step",
                          "steps_redone",
                          "attempts",
                          "summary",
                          "evals",
                          "checkpoint"}) {
    j[key] = nullptr;
  }
  return j;
}

Json JobValue(const v1::JobStatus& s) {
  Json j = JobSkeleton();
  j["job_id"] = s.job_id();
  j["name"] = s.name();
  j["state"] = client::JobStateName(s.state());
  j["reason"] = NonEmpty(s.reason());
  j["suspended"] = s.suspended();
  j["algorithm"] = NonEmpty(s.algorithm());
  j["stages"] = s.num_stages();
  j["replicas"] = std::max(1, s.num_replicas());
  j["chunks_per_worker"] = std::max(1, s.chunks_per_worker());
  Json replica_rates = Json::array();
  for (double v : s.replica_samples_per_second()) replica_rates.push_back(Number(v));
  j["replica_samples_per_second"] = replica_rates;
  j["phase"] = s.phase();
  j["num_phases"] = std::max(1, s.num_phases());
  j["phase_name"] = NonEmpty(s.phase_name());
  j["step"] = s.step();
  if (s.total_steps() > 0) j["total_steps"] = s.total_steps();
  j["epoch"] = s.epoch();
  if (s.step() > 0) j["train_loss"] = Number(s.train_loss());
  if (HasEval(s)) {
    j["eval_loss"] = Number(s.eval_loss());
    j["eval_accuracy"] = Number(s.eval_accuracy());
    if (s.tokens_per_sample() > 0) j["eval_bits_per_byte"] = Number(s.eval_loss() / std::log(2.0));
  }
  if (s.samples_per_second() > 0) {
    j["samples_per_second"] = Number(s.samples_per_second());
    if (s.tokens_per_sample() > 0) {
      j["tokens_per_second"] = Number(s.samples_per_second() * s.tokens_per_sample());
    }
  }
  j["seconds"] = Optional(JobSeconds(s));
  if (s.created_unix_ms() > 0) j["created_unix_ms"] = s.created_unix_ms();
  if (s.updated_unix_ms() > 0) j["updated_unix_ms"] = s.updated_unix_ms();
  j["attempt"] = s.attempt();
  if (s.last_checkpoint_step() >= 0) j["last_checkpoint_step"] = s.last_checkpoint_step();
  j["steps_redone"] = s.steps_redone();
  Json attempts = Json::array();
  for (const v1::JobAttempt& a : s.attempts()) {
    Json workers = Json::array();
    for (const std::string& w : a.workers()) workers.push_back(w);
    Json replacements = Json::array();
    for (const v1::StageReplacement& r : a.replacements()) {
      const bool copied = r.copied_bytes() > 0;
      replacements.push_back(
          {{"stage", r.stage()},
           {"replica", r.replica()},
           {"copied_from_replica", copied ? Json(r.copied_from_replica()) : Json()},
           {"copied_bytes", copied ? Json(r.copied_bytes()) : Json()},
           {"copy_seconds", copied ? Number(r.copy_seconds()) : Json()},
           {"lost_worker", r.lost_worker()},
           {"worker", r.worker()},
           {"lost_unix_ms", r.lost_unix_ms()},
           {"from_step", r.from_step()},
           {"job_step", r.job_step()},
           {"replayed_to_step", r.replayed_to_step()},
           {"steps_redone", r.steps_redone()},
           {"bytes", r.bytes()},
           {"replay_seconds", Number(r.replay_seconds())},
           {"full_speed_seconds", Number(r.full_speed_seconds())}});
    }
    attempts.push_back({{"attempt", a.attempt()},
                        {"from_step", a.from_step()},
                        {"reached_step", a.reached_step()},
                        {"started_unix_ms", a.started_unix_ms()},
                        {"ended_unix_ms", a.ended_unix_ms() > 0 ? Json(a.ended_unix_ms()) : Json()},
                        {"end_reason", NonEmpty(a.end_reason())},
                        {"end_cause", NonEmpty(a.end_cause())},
                        {"workers", workers},
                        {"replacements", replacements}});
  }
  j["attempts"] = attempts;
  Json summary = Json::object();
  for (const auto& [key, value] :
       std::map<std::string, double>(s.summary().begin(), s.summary().end())) {
    summary[key] = Number(value);
  }
  j["summary"] = summary;
  return j;
}

std::string JobJson(const v1::JobStatus& s) { return JsonLine(JobValue(s)); }

std::string CheckpointDir(const v1::CheckpointInfo& c) {
  const std::string& m = c.manifest_path();
  const size_t slash = m.rfind('/');
  if (slash == std::string::npos) return m.empty() ? "-" : ".";
  return slash == 0 ? "/" : m.substr(0, slash);
}

std::string CheckpointsTable(const v1::ListCheckpointsResponse& r, absl::TimeZone tz) {
  std::string out;
  if (!r.checkpoints().empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const v1::CheckpointInfo& c : r.checkpoints()) {
      rows.push_back({absl::StrCat(c.step()), absl::StrCat(c.phase() + 1),
                      LocalTime(c.created_unix_ms(), tz), HumanBytes(c.bytes()),
                      absl::StrCat(c.num_shards()), CheckpointDir(c)});
    }
    out = RenderTable({"STEP", "PHASE", "CREATED", "SIZE", "SHARDS", "PATH"}, rows);
  }
  if (!r.skipped().empty()) {
    absl::StrAppend(&out, out.empty() ? "" : "\n", "skipped (not usable):\n");
    for (const std::string& why : r.skipped()) absl::StrAppend(&out, "  ", why, "\n");
  }
  return out;
}

std::string CheckpointsJson(const std::string& job_id, const v1::ListCheckpointsResponse& r) {
  Json checkpoints = Json::array();
  for (const v1::CheckpointInfo& c : r.checkpoints()) {
    checkpoints.push_back({{"step", c.step()},
                           {"phase", c.phase()},
                           {"created_unix_ms", c.created_unix_ms()},
                           {"bytes", c.bytes()},
                           {"num_shards", c.num_shards()},
                           {"path", CheckpointDir(c)},
                           {"manifest_path", c.manifest_path()}});
  }
  Json skipped = Json::array();
  for (const std::string& why : r.skipped()) skipped.push_back(why);
  return JsonLine(Json{{"job_id", job_id},
                       {"dir", NonEmpty(r.dir())},
                       {"checkpoints", checkpoints},
                       {"skipped", skipped}});
}

std::string EventsTable(const v1::ListJobEventsResponse& r, absl::TimeZone tz) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::JobLogEvent& e : r.events()) {
    std::string event;
    if (e.from_state() == e.to_state()) {
      event = absl::StrCat("(", client::JobStateName(e.to_state()), ")");
    } else if (e.from_state() == v1::JOB_STATE_UNSPECIFIED) {
      event = absl::StrCat("-> ", client::JobStateName(e.to_state()));
    } else {
      event = absl::StrCat(client::JobStateName(e.from_state()), " -> ",
                           client::JobStateName(e.to_state()));
    }
    rows.push_back({LocalTime(e.unix_ms(), tz), event, e.reason().empty() ? "-" : e.reason()});
  }
  return RenderTable({"TIME", "EVENT", "REASON"}, rows);
}

std::string EventsJson(const std::string& job_id, const v1::ListJobEventsResponse& r) {
  Json events = Json::array();
  for (const v1::JobLogEvent& e : r.events()) {
    events.push_back({{"unix_ms", e.unix_ms()},
                      {"from", e.from_state() == v1::JOB_STATE_UNSPECIFIED
                                   ? Json()
                                   : Json(client::JobStateName(e.from_state()))},
                      {"to", client::JobStateName(e.to_state())},
                      {"note", e.from_state() == e.to_state()},
                      {"reason", e.reason()}});
  }
  return JsonLine(Json{{"job_id", job_id}, {"events", events}});
}

std::string JobListTable(const std::vector<v1::JobStatus>& jobs, absl::Time now) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& s : jobs) {
    rows.push_back({s.job_id(), s.name(), client::JobStateName(s.state()),
                    s.algorithm().empty() ? "-" : s.algorithm(), absl::StrCat(s.num_stages()),
                    StepOfTotal(s), s.step() > 0 ? Loss(s.train_loss()) : "-",
                    HasEval(s) ? absl::StrFormat("%.2f%%", 100.0 * s.eval_accuracy()) : "-",
                    s.created_unix_ms() > 0
                        ? HumanAge(now - absl::FromUnixMillis(s.created_unix_ms()))
                        : "-"});
  }
  return RenderTable(
      {"ID", "NAME", "STATE", "ALGORITHM", "STAGES", "STEP", "LOSS", "ACCURACY", "AGE"}, rows);
}

std::string JobListJson(const std::vector<v1::JobStatus>& jobs) {
  Json list = Json::array();
  for (const auto& s : jobs) list.push_back(JobValue(s));
  return JsonLine(list);
}

std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& w : workers) {
    std::vector<std::string> labels;
    for (const auto& [k, v] : SortedLabels(w)) labels.push_back(absl::StrCat(k, "=", v));
    rows.push_back({w.worker_id(), w.address(), w.device().empty() ? "-" : w.device(),
                    HumanBytes(w.memory_bytes()),
                    labels.empty() ? "-" : absl::StrJoin(labels, ",")});
  }
  return RenderTable({"ID", "ADDRESS", "DEVICE", "MEMORY", "LABELS"}, rows);
}

std::string WorkersJson(const std::vector<v1::WorkerInfo>& workers) {
  Json list = Json::array();
  for (const auto& w : workers) {
    Json labels = Json::object();
    for (const auto& [k, v] : SortedLabels(w)) labels[k] = v;
    list.push_back({{"worker_id", w.worker_id()},
                    {"address", w.address()},
                    {"device", w.device()},
                    {"memory_bytes", w.memory_bytes() > 0 ? Json(w.memory_bytes()) : Json()},
                    {"version", NonEmpty(w.version())},
                    {"labels", labels}});
  }
  return JsonLine(list);
}

}  // namespace stagewise::cli
