#include "services/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagewise::metrics {
namespace {

using ::testing::HasSubstr;

// Asserts a sample exists and returns its value.
double Value(const std::string& text, const std::string& name,
             const std::map<std::string, std::string>& labels = {}) {
  absl::StatusOr<double> value = FindSample(text, name, labels);
  EXPECT_TRUE(value.ok()) << value.status() << "\n" << text;
  return value.ok() ? *value : std::nan("");
}

bool Has(const std::string& text, const std::string& name,
         const std::map<std::string, std::string>& labels = {}) {
  return FindSample(text, name, labels).ok();
}

std::unique_ptr<MetricsServer> StartServer() {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("127.0.0.1:0");
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

// One endpoint for most tests: stopping a civetweb server takes up to 2 s.
MetricsServer& SharedServer() {
  static MetricsServer* const server = StartServer().release();
  return *server;
}

// The stagewise_ sample lines of an exposition (the exposer adds its own).
std::vector<std::string> StagewiseSamples(const std::string& text) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "stagewise_")) lines.emplace_back(line);
  }
  return lines;
}

std::string ScrapeOrDie(const MetricsServer& server) {
  absl::StatusOr<std::string> text = Scrape("127.0.0.1", server.port());
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

// A TCP socket bound to 127.0.0.1 on a free port; listening if asked.
class LocalSocket {
 public:
  explicit LocalSocket(bool listen_on_it) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    if (listen_on_it) {
      EXPECT_EQ(listen(fd_, 4), 0);
    }
  }
  ~LocalSocket() { Close(); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// ------------------------------------------------------------ server -----

TEST(MetricsServerTest, StartsOnEphemeralPortAndServes) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  EXPECT_LT(server->port(), 65536);
  StageMetrics stage(server->registry(), "j", 0, "gpipe");
  stage.IncSteps();
  const std::string text = ScrapeOrDie(*server);
  EXPECT_THAT(text, HasSubstr("# TYPE stagewise_stage_steps_total counter"));
  EXPECT_EQ(StagewiseSamples(TextExposition(server->registry())), StagewiseSamples(text));
  EXPECT_EQ(Value(text, "stagewise_stage_steps_total", {{"job", "j"}}), 1);
}

TEST(MetricsServerTest, EmptyAddressHasRegistryButNoEndpoint) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->port(), 0);
  StageMetrics stage((*server)->registry(), "j", 1, "pipedream");
  stage.AddIdle(2.0);
  EXPECT_EQ(Value(TextExposition((*server)->registry()), "stagewise_stage_idle_seconds_total",
                  {{"job", "j"}, {"stage", "1"}}),
            2.0);
}

TEST(MetricsServerTest, AddressInUseIsUnavailable) {
  MetricsServer* first = &SharedServer();
  const std::string address = absl::StrCat("127.0.0.1:", first->port());
  absl::StatusOr<std::unique_ptr<MetricsServer>> second = MetricsServer::Start(address);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(address));
  // The first one still serves.
  EXPECT_TRUE(Scrape("127.0.0.1", first->port()).ok());
}

TEST(MetricsServerTest, BadAddressIsAnErrorNotAnException) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("256.1.2.3:80");
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("256.1.2.3:80"));
}

// ------------------------------------------------------------- stage -----

TEST(StageMetricsTest, EveryFamilyIsExposedWithLabels) {
  MetricsServer* server = &SharedServer();
  StageMetrics stage(server->registry(), "job-a", 2, "pipedream");
  stage.ObserveCompute("forward", 0.25);
  stage.ObserveCompute("forward", 0.5);
  stage.ObserveCompute("backward", 0.00005);  // below the first bucket (100 us)
  stage.ObserveCompute("backward", 100.0);    // above the last finite bucket
  stage.AddIdle(1.25);
  stage.AddIdle(0.25);
  stage.SetInboxDepth(9);
  stage.SetInboxDepth(7);
  stage.AddBytes(true, 100);
  stage.AddBytes(true, 100);
  stage.AddBytes(false, 50);
  stage.SetStaleness(3);
  stage.SetMemory("activations", 1 << 20);
  stage.SetMemory("parameters", 4096);
  stage.IncSteps();
  stage.IncSteps();
  EXPECT_EQ(stage.idle_seconds(), 1.5);
  EXPECT_EQ(stage.bytes(true), 200);
  EXPECT_EQ(stage.bytes(false), 50);

  const std::string text = ScrapeOrDie(*server);
  const std::map<std::string, std::string> base = {
      {"job", "job-a"}, {"stage", "2"}, {"algorithm", "pipedream"}};
  auto with = [&](const std::string& key, const std::string& value) {
    auto labels = base;
    labels[key] = value;
    return labels;
  };
  EXPECT_EQ(Value(text, "stagewise_stage_compute_seconds_count", with("phase", "forward")), 2);
  EXPECT_EQ(Value(text, "stagewise_stage_compute_seconds_sum", with("phase", "forward")), 0.75);
  EXPECT_EQ(Value(text, "stagewise_stage_compute_seconds_count", with("phase", "backward")), 2);
  auto backward_bucket = [&](const std::string& le) {
    auto labels = with("phase", "backward");
    labels["le"] = le;
    return Value(text, "stagewise_stage_compute_seconds_bucket", labels);
  };
  EXPECT_EQ(backward_bucket("0.0001"), 1);
  EXPECT_EQ(backward_bucket("1.6384"), 1);
  EXPECT_EQ(backward_bucket("26.2144"), 1);  // last finite bucket, ~30 s
  EXPECT_EQ(backward_bucket("+Inf"), 2);
  EXPECT_FALSE(Has(text, "stagewise_stage_compute_seconds_bucket", {{"le", "52.4288"}}));
  EXPECT_FALSE(Has(text, "stagewise_stage_compute_seconds_count", with("phase", "recompute")));
  EXPECT_EQ(Value(text, "stagewise_stage_idle_seconds_total", base), 1.5);
  EXPECT_EQ(Value(text, "stagewise_stage_inbox_depth", base), 7);
  EXPECT_EQ(Value(text, "stagewise_transport_bytes_total", with("direction", "sent")), 200);
  EXPECT_EQ(Value(text, "stagewise_transport_bytes_total", with("direction", "received")), 50);
  EXPECT_EQ(Value(text, "stagewise_transport_messages_total", with("direction", "sent")), 2);
  EXPECT_EQ(Value(text, "stagewise_transport_messages_total", with("direction", "received")), 1);
  EXPECT_EQ(Value(text, "stagewise_stage_staleness_steps", base), 3);
  EXPECT_EQ(Value(text, "stagewise_stage_memory_bytes", with("kind", "activations")), 1 << 20);
  EXPECT_EQ(Value(text, "stagewise_stage_memory_bytes", with("kind", "parameters")), 4096);
  EXPECT_EQ(Value(text, "stagewise_stage_steps_total", base), 2);
  // Types and help are exposed.
  EXPECT_THAT(text, HasSubstr("# TYPE stagewise_stage_compute_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("# TYPE stagewise_stage_idle_seconds_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE stagewise_stage_inbox_depth gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE stagewise_transport_bytes_total counter"));
  EXPECT_THAT(text, HasSubstr("# HELP stagewise_stage_staleness_steps "));
}

TEST(StageMetricsTest, TwoJobsShareRegistryAndDestroyRemovesSeries) {
  MetricsServer* server = &SharedServer();
  auto first = std::make_unique<StageMetrics>(server->registry(), "first", 0, "gpipe");
  StageMetrics second(server->registry(), "second", 0, "gpipe");
  first->AddBytes(true, 10);
  first->ObserveCompute("forward", 1.0);
  first->SetMemory("inputs", 5);
  second.AddBytes(true, 20);
  second.ObserveCompute("forward", 2.0);

  std::string text = ScrapeOrDie(*server);
  EXPECT_EQ(
      Value(text, "stagewise_transport_bytes_total", {{"job", "first"}, {"direction", "sent"}}),
      10);
  EXPECT_EQ(
      Value(text, "stagewise_transport_bytes_total", {{"job", "second"}, {"direction", "sent"}}),
      20);
  // One family, two series: HELP/TYPE appear once.
  EXPECT_EQ(text.find("# TYPE stagewise_transport_bytes_total"),
            text.rfind("# TYPE stagewise_transport_bytes_total"));

  first.reset();
  text = ScrapeOrDie(*server);
  for (const char* name : {"stagewise_transport_bytes_total", "stagewise_transport_messages_total",
                           "stagewise_stage_compute_seconds_count", "stagewise_stage_memory_bytes",
                           "stagewise_stage_idle_seconds_total", "stagewise_stage_inbox_depth",
                           "stagewise_stage_staleness_steps", "stagewise_stage_steps_total"}) {
    EXPECT_FALSE(Has(text, name, {{"job", "first"}})) << name;
    EXPECT_TRUE(Has(text, name, {{"job", "second"}}) ||
                std::string(name) == "stagewise_stage_memory_bytes")
        << name;
  }
  EXPECT_EQ(
      Value(text, "stagewise_stage_compute_seconds_sum", {{"job", "second"}, {"phase", "forward"}}),
      2.0);
  second.AddBytes(true, 1);
  EXPECT_EQ(second.bytes(true), 21);
}

TEST(StageMetricsTest, RegistryCanBeReusedAfterAllStagesGo) {
  // A registry that throws on duplicate families: sharing must not register
  // a family twice, and re-creating after everything is gone must work.
  prometheus::Registry registry(prometheus::Registry::InsertBehavior::Throw);
  for (int round = 0; round < 3; ++round) {
    StageMetrics a(registry, absl::StrCat("job", round), 0, "1f1b");
    StageMetrics b(registry, absl::StrCat("job", round), 1, "1f1b");
    CoordinatorMetrics c1(registry);
    CoordinatorMetrics c2(registry);
    a.IncSteps();
    b.IncSteps();
    c1.CountTransition("RUNNING");
    c2.CountTransition("RUNNING");
    const std::string text = TextExposition(registry);
    EXPECT_EQ(Value(text, "stagewise_stage_steps_total",
                    {{"job", absl::StrCat("job", round)}, {"stage", "1"}}),
              1);
    EXPECT_FALSE(
        Has(text, "stagewise_stage_steps_total", {{"job", absl::StrCat("job", round - 1)}}));
    EXPECT_EQ(Value(text, "stagewise_coordinator_job_transitions_total", {{"to", "RUNNING"}}), 2);
  }
  EXPECT_EQ(TextExposition(registry), "");
}

TEST(StageMetricsTest, SameLabelsShareSeriesUntilLastGoes) {
  prometheus::Registry registry;
  auto a = std::make_unique<StageMetrics>(registry, "j", 0, "gpipe");
  StageMetrics b(registry, "j", 0, "gpipe");
  a->ObserveCompute("forward", 1.0);
  b.ObserveCompute("forward", 1.0);
  b.SetMemory("gradients", 8);
  a.reset();
  b.ObserveCompute("forward", 1.0);
  b.SetMemory("gradients", 16);
  const std::string text = TextExposition(registry);
  EXPECT_EQ(Value(text, "stagewise_stage_compute_seconds_count", {{"phase", "forward"}}), 3);
  EXPECT_EQ(Value(text, "stagewise_stage_memory_bytes", {{"kind", "gradients"}}), 16);
}

TEST(StageMetricsTest, ConcurrentUpdatesGiveExactTotals) {
  MetricsServer* server = &SharedServer();
  StageMetrics stage(server->registry(), "j", 0, "pipedream");
  constexpr int kThreads = 4;
  constexpr int kIterations = 20000;
  const std::vector<std::string> phases = {"forward", "backward", "recompute", "step"};
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) EXPECT_TRUE(Scrape("127.0.0.1", server->port()).ok());
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        stage.AddBytes(t % 2 == 0, 3);
        stage.AddIdle(0.5);
        stage.IncSteps();
        stage.ObserveCompute(phases[(i + t) % phases.size()], 0.001);
        stage.SetMemory(absl::StrCat("kind", i % 3), i);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  done = true;
  scraper.join();

  EXPECT_EQ(stage.bytes(true), 3 * kIterations * kThreads / 2);
  EXPECT_EQ(stage.bytes(false), 3 * kIterations * kThreads / 2);
  EXPECT_EQ(stage.idle_seconds(), 0.5 * kIterations * kThreads);
  const std::string text = ScrapeOrDie(*server);
  EXPECT_EQ(Value(text, "stagewise_transport_messages_total", {{"direction", "sent"}}),
            kIterations * kThreads / 2);
  EXPECT_EQ(Value(text, "stagewise_stage_steps_total"), kIterations * kThreads);
  double count = 0;
  for (const std::string& phase : phases) {
    count += Value(text, "stagewise_stage_compute_seconds_count", {{"phase", phase}});
  }
  EXPECT_EQ(count, kIterations * kThreads);
}

TEST(StageMetricsTest, ConcurrentCreateAndDestroyOnOneRegistry) {
  MetricsServer* server = &SharedServer();
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) EXPECT_TRUE(Scrape("127.0.0.1", server->port()).ok());
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        StageMetrics stage(server->registry(), absl::StrCat("job", t, "-", i % 3), t % 2, "gpipe");
        CoordinatorMetrics coordinator(server->registry());
        stage.ObserveCompute("forward", 0.01);
        stage.SetMemory("inputs", i);
        stage.AddBytes(false, 1);
        coordinator.SetJobProgress(absl::StrCat("job", t), i, 1.0, 2.0);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  done = true;
  scraper.join();
  EXPECT_THAT(StagewiseSamples(ScrapeOrDie(*server)), ::testing::IsEmpty());
}

// ------------------------------------------------------- coordinator -----

TEST(CoordinatorMetricsTest, EveryFamilyIsExposed) {
  MetricsServer* server = &SharedServer();
  CoordinatorMetrics coordinator(server->registry());
  coordinator.SetJobProgress("job-a", 120, 0.5, 2048.0);
  coordinator.SetJobEval("job-a", 0.75, 0.875);
  coordinator.SetJobProgress("job-b", 7, 2.25, 10.0);
  coordinator.SetJobsInState("RUNNING", 2);
  coordinator.SetJobsInState("QUEUED", 1);
  coordinator.SetJobsInState("RUNNING", 3);
  coordinator.SetWorkers(4, 6);
  coordinator.CountTransition("RUNNING");
  coordinator.CountTransition("RUNNING");
  coordinator.CountTransition("SUCCEEDED");

  std::string text = ScrapeOrDie(*server);
  EXPECT_EQ(Value(text, "stagewise_job_step", {{"job", "job-a"}}), 120);
  EXPECT_EQ(Value(text, "stagewise_job_train_loss", {{"job", "job-a"}}), 0.5);
  EXPECT_EQ(Value(text, "stagewise_job_samples_per_second", {{"job", "job-a"}}), 2048);
  EXPECT_EQ(Value(text, "stagewise_job_eval_loss", {{"job", "job-a"}}), 0.75);
  EXPECT_EQ(Value(text, "stagewise_job_eval_accuracy", {{"job", "job-a"}}), 0.875);
  EXPECT_EQ(Value(text, "stagewise_job_train_loss", {{"job", "job-b"}}), 2.25);
  EXPECT_FALSE(Has(text, "stagewise_job_eval_accuracy", {{"job", "job-b"}}));
  EXPECT_EQ(Value(text, "stagewise_coordinator_jobs", {{"state", "RUNNING"}}), 3);
  EXPECT_EQ(Value(text, "stagewise_coordinator_jobs", {{"state", "QUEUED"}}), 1);
  EXPECT_EQ(Value(text, "stagewise_coordinator_workers", {{"state", "idle"}}), 4);
  EXPECT_EQ(Value(text, "stagewise_coordinator_workers", {{"state", "busy"}}), 6);
  EXPECT_EQ(Value(text, "stagewise_coordinator_job_transitions_total", {{"to", "RUNNING"}}), 2);
  EXPECT_EQ(Value(text, "stagewise_coordinator_job_transitions_total", {{"to", "SUCCEEDED"}}), 1);
  EXPECT_THAT(text, HasSubstr("# TYPE stagewise_coordinator_job_transitions_total counter"));

  coordinator.RemoveJob("job-a");
  text = ScrapeOrDie(*server);
  for (const char* name :
       {"stagewise_job_step", "stagewise_job_train_loss", "stagewise_job_samples_per_second",
        "stagewise_job_eval_loss", "stagewise_job_eval_accuracy"}) {
    EXPECT_FALSE(Has(text, name, {{"job", "job-a"}})) << name;
  }
  EXPECT_EQ(Value(text, "stagewise_job_step", {{"job", "job-b"}}), 7);
  coordinator.SetJobProgress("job-a", 1, 1.0, 1.0);  // usable again after removal
  EXPECT_EQ(Value(TextExposition(server->registry()), "stagewise_job_step", {{"job", "job-a"}}), 1);
}

TEST(CoordinatorMetricsTest, CoexistsWithStagesOnOneRegistry) {
  prometheus::Registry registry;
  CoordinatorMetrics coordinator(registry);
  StageMetrics stage(registry, "j", 0, "gpipe");
  coordinator.SetWorkers(1, 0);
  stage.SetInboxDepth(2);
  const std::string text = TextExposition(registry);
  EXPECT_EQ(Value(text, "stagewise_coordinator_workers", {{"state", "idle"}}), 1);
  EXPECT_EQ(Value(text, "stagewise_stage_inbox_depth", {{"job", "j"}}), 2);
}

// -------------------------------------------------------- JobLabels -----

class JobLabelsTest : public ::testing::Test {
 protected:
  std::string KeyFile(const std::string& contents) {
    const std::string path = ::testing::TempDir() + "/stagewise_job_labels_key_" +
                             std::to_string(::getpid()) + "_" + std::to_string(files_.size());
    std::ofstream(path, std::ios::binary) << contents;
    files_.push_back(path);
    return path;
  }
  void TearDown() override {
    for (const std::string& f : files_) std::remove(f.c_str());
  }
  std::vector<std::string> files_;
};

TEST_F(JobLabelsTest, PlainHashedAndOmitted) {
  auto plain = MakeJobLabels("plain", "");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->Of("job-0001abcd"), "job-0001abcd");
  auto omitted = MakeJobLabels("omitted", "");
  ASSERT_TRUE(omitted.ok());
  EXPECT_EQ(omitted->Of("job-0001abcd"), "");
  auto a = MakeJobLabels("hashed", KeyFile("a key of sixteen+ bytes\n"));
  auto a_again = MakeJobLabels("hashed", KeyFile("a key of sixteen+ bytes"));  // no newline
  auto b = MakeJobLabels("hashed", KeyFile("another key of 16+ bytes"));
  ASSERT_TRUE(a.ok() && a_again.ok() && b.ok());
  const std::string label = a->Of("job-0001abcd");
  EXPECT_THAT(label, ::testing::MatchesRegex("h[0-9a-f]{16}"));
  EXPECT_EQ(a_again->Of("job-0001abcd"), label);  // the same key on every process
  EXPECT_NE(a->Of("job-0001abcf"), label);
  EXPECT_NE(b->Of("job-0001abcd"), label);
  EXPECT_THAT(label, ::testing::Not(HasSubstr("0001abcd")));
}

TEST_F(JobLabelsTest, BadFlagsAreNamed) {
  auto bad_mode = MakeJobLabels("sha1", "");
  EXPECT_THAT(bad_mode.status().message(), HasSubstr("--metrics-job-ids"));
  auto no_key = MakeJobLabels("hashed", "");
  EXPECT_THAT(no_key.status().message(), HasSubstr("--metrics-job-key-file: required"));
  auto missing = MakeJobLabels("hashed", "/nonexistent/stagewise/key");
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot read"));
  auto short_key = MakeJobLabels("hashed", KeyFile("short\n"));
  EXPECT_THAT(short_key.status().message(), HasSubstr("at least 16"));
}

TEST_F(JobLabelsTest, TheCoordinatorLabelsOrDropsItsPerJobSeries) {
  prometheus::Registry registry;
  auto hashed = MakeJobLabels("hashed", KeyFile("0123456789abcdef"));
  ASSERT_TRUE(hashed.ok());
  {
    CoordinatorMetrics coordinator(registry, *hashed);
    coordinator.SetJobProgress("job-1", 5, 0.5, 10);
    const std::string text = TextExposition(registry);
    EXPECT_THAT(text, ::testing::Not(HasSubstr("job-1")));
    EXPECT_EQ(Value(text, "stagewise_job_step", {{"job", hashed->Of("job-1")}}), 5);
    coordinator.RemoveJob("job-1");
    EXPECT_THAT(TextExposition(registry), ::testing::Not(HasSubstr("stagewise_job_step{")));
  }
  prometheus::Registry other;
  CoordinatorMetrics coordinator(other, *MakeJobLabels("omitted", ""));
  coordinator.SetJobProgress("job-1", 5, 0.5, 10);
  coordinator.SetJobEval("job-1", 0.5, 0.9);
  coordinator.SetWorkers(1, 0);
  const std::string text = TextExposition(other);
  EXPECT_THAT(text, ::testing::Not(HasSubstr("stagewise_job_step{")));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("job-1")));
  EXPECT_EQ(Value(text, "stagewise_coordinator_workers", {{"state", "idle"}}), 1);
}

// -------------------------------------------------------- FindSample -----

constexpr char kText[] =
    "# HELP foo_total A counter.\n"
    "# TYPE foo_total counter\n"
    "foo_total{job=\"a\",stage=\"0\"} 3\n"
    "foo_total{job=\"b\",stage=\"0\"} 4 1700000000000\n"
    "foo 1.5\n"
    "foo_bucket{le=\"+Inf\"} 9\n"
    "escaped{path=\"a,b\\\"c\\\\d\",x=\"1\"} 42\r\n"
    "spaced { job = \"s\" , } -2.5e3\n"
    "inf_value{job=\"a\"} +Inf\n"
    "neg_inf -Inf\n"
    "nan_value NaN\n"
    "nan_cpp{q=\"0.5\"} Nan\n"
    "broken{job=\"unterminated} 5\n"
    "multi{note=\"a\\nb\"} 6\n";

TEST(FindSampleTest, MatchesNameExactlyNotByPrefix) {
  EXPECT_EQ(*FindSample(kText, "foo"), 1.5);
  EXPECT_EQ(*FindSample(kText, "foo_total"), 3);
  EXPECT_EQ(*FindSample(kText, "foo_bucket"), 9);
  EXPECT_EQ(FindSample(kText, "fo").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindSample(kText, "foo_tot").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindSample(kText, "HELP").status().code(), absl::StatusCode::kNotFound);
}

TEST(FindSampleTest, LabelSubsetMatch) {
  EXPECT_EQ(*FindSample(kText, "foo_total", {{"job", "b"}}), 4);  // timestamp ignored
  EXPECT_EQ(*FindSample(kText, "foo_total", {{"job", "b"}, {"stage", "0"}}), 4);
  EXPECT_EQ(*FindSample(kText, "foo_total", {{"stage", "0"}}), 3);  // first match
  EXPECT_EQ(FindSample(kText, "foo_total", {{"job", "c"}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(FindSample(kText, "foo_total", {{"job", "a"}, {"stage", "1"}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(FindSample(kText, "foo", {{"job", "a"}}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*FindSample(kText, "foo_bucket", {{"le", "+Inf"}}), 9);
  EXPECT_EQ(*FindSample(kText, "spaced", {{"job", "s"}}), -2500);
}

TEST(FindSampleTest, EscapedLabelValues) {
  EXPECT_EQ(*FindSample(kText, "escaped", {{"path", "a,b\"c\\d"}}), 42);
  EXPECT_EQ(*FindSample(kText, "escaped", {{"x", "1"}}), 42);
  EXPECT_EQ(*FindSample(kText, "escaped", {{"path", "a,b\"c\\d"}, {"x", "1"}}), 42);
  EXPECT_EQ(FindSample(kText, "escaped", {{"path", "a"}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(*FindSample(kText, "multi", {{"note", "a\nb"}}), 6);
  EXPECT_EQ(FindSample(kText, "broken").status().code(), absl::StatusCode::kNotFound);
}

TEST(FindSampleTest, SpecialValues) {
  EXPECT_EQ(*FindSample(kText, "inf_value", {{"job", "a"}}), INFINITY);
  EXPECT_EQ(*FindSample(kText, "neg_inf"), -INFINITY);
  EXPECT_TRUE(std::isnan(*FindSample(kText, "nan_value")));
  EXPECT_TRUE(std::isnan(*FindSample(kText, "nan_cpp")));  // prometheus-cpp spells it so
}

TEST(FindSampleTest, MissingIsNotFoundNamingTheSample) {
  absl::StatusOr<double> value = FindSample(kText, "absent_total", {{"job", "a"}});
  ASSERT_EQ(value.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("absent_total{job=\"a\"}"));
  EXPECT_EQ(FindSample("", "foo").status().code(), absl::StatusCode::kNotFound);
}

// ------------------------------------------------------------ Scrape -----

TEST(ScrapeTest, ClosedPortIsAnErrorNamingHostPort) {
  LocalSocket socket(/*listen_on_it=*/false);
  const int port = socket.port();
  socket.Close();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> text = Scrape("127.0.0.1", port);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kUnavailable) << text.status();
  EXPECT_THAT(std::string(text.status().message()), HasSubstr(absl::StrCat("127.0.0.1:", port)));
}

TEST(ScrapeTest, SilentServerTimesOut) {
  LocalSocket socket(/*listen_on_it=*/true);  // accepts in the kernel, never answers
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> text = Scrape("127.0.0.1", socket.port(), absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kDeadlineExceeded) << text.status();
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(ScrapeTest, BadPortAndHost) {
  EXPECT_EQ(Scrape("127.0.0.1", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Scrape("127.0.0.1", 70000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Scrape("no-such-host.invalid", 80, absl::Seconds(2)).ok());
}

}  // namespace
}  // namespace stagewise::metrics
