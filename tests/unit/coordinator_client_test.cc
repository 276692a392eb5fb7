// CoordinatorClient against a fake Coordinator service in this process, and
// the `stagewise` binary's coordinator commands (submit, status, list, watch,
// cancel, workers, local) against the same fake. `local` runs with stand-in
// shell scripts for stagewise-coordinator/-worker that point at the fake, so
// its process supervision is tested without the real services.
#include "clients/client/coordinator_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "services/common/retry_policy.h"
#include "services/rpc/server.h"

extern char** environ;

namespace stagewise {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// 2023-11-14 22:13:20 UTC: the fake's fixed times (the CLI runs with TZ=UTC).
constexpr int64_t kT0 = 1700000000000;

// ---------------------------------------------------------------------------
// The fake coordinator. A job's behaviour under WatchJob comes from a marker
// in its YAML: "# fake: fail", "# fake: forever" (runs until cancelled),
// "# fake: linger" (keeps the stream open after SUCCEEDED), "# fake: drop"
// (ends the stream while running), "# fake: drop-once" (the first watch ends
// early, later ones succeed), "# fake: recover" (a recovery: RECOVERING as
// attempt 1 from the checkpoint after step 20, then success), "# fake:
// chaos" (100 steps, 10 ms apart, a new attempt every 5 steps), "# fake:
// recovered" (GetJob: a running job in its second attempt); anything else
// succeeds after 40 steps. ListCheckpoints lists two committed checkpoints
// and a skipped one ("# fake: no-checkpoints": the job has no
// checkpoint.dir). A spec containing "momentum: 1.5" is rejected as the real
// one would be.
class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override {
    const std::string& yaml = req->job_spec_yaml();
    if (absl::StrContains(yaml, "momentum: 1.5")) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "optimizer.momentum: must be in [0, 1), got 1.5");
    }
    absl::MutexLock lock(&mu_);
    const std::string id = absl::StrCat("job-", ++next_id_);
    v1::JobStatus& job = jobs_[id];
    job.set_job_id(id);
    job.set_name("tiny");
    for (absl::string_view line : absl::StrSplit(yaml, '\n')) {
      if (absl::ConsumePrefix(&line, "name: ")) job.set_name(std::string(line));
    }
    job.set_state(v1::PENDING);
    job.set_algorithm("backprop");
    job.set_num_stages(2);
    job.set_total_steps(40);
    job.set_created_unix_ms(absl::ToUnixMillis(absl::Now()) - 65000);
    job.set_updated_unix_ms(job.created_unix_ms());
    mode_[id] = "succeed";
    // Later markers win: "drop-once" contains "drop".
    for (const char* m : {"fail", "forever", "linger", "drop", "drop-once", "recover", "chaos",
                          "recovered", "no-checkpoints"}) {
      if (absl::StrContains(yaml, absl::StrCat("# fake: ", m))) mode_[id] = m;
    }
    if (mode_[id] == "chaos") job.set_total_steps(100);
    if (mode_[id] == "recovered") {
      // Two attempts: the first lost a worker at step 57 and the second
      // resumed from the checkpoint after step 40.
      job.set_state(v1::RUNNING);
      job.set_step(120);
      job.set_total_steps(200);
      job.set_attempt(1);
      job.set_last_checkpoint_step(40);
      job.set_steps_redone(17);
      job.set_updated_unix_ms(kT0 + 100000);
      v1::JobAttempt* a = job.add_attempts();
      a->set_attempt(0);
      a->set_from_step(0);
      a->set_reached_step(57);
      a->set_started_unix_ms(kT0);
      a->set_ended_unix_ms(kT0 + 41000);
      a->set_end_reason("worker local-1 lost: control stream ended");
      a->add_workers("local-0");
      a->add_workers("local-1");
      a = job.add_attempts();
      a->set_attempt(1);
      a->set_from_step(40);
      a->set_reached_step(120);
      a->set_started_unix_ms(kT0 + 43000);
      a->add_workers("local-0");
      a->add_workers("local-2");
    }
    order_.push_back(id);
    submitted_yaml_ = yaml;
    resp->set_job_id(id);
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                      v1::JobStatus* resp) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(req->job_id());
    if (it == jobs_.end()) return NotFound(req->job_id());
    *resp = it->second;
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    absl::MutexLock lock(&mu_);
    last_limit_ = req->limit();
    // Pages of page_size after the job named by page_token (the job id).
    int size = req->page_size() > 0 ? req->page_size() : req->limit();
    if (max_page_ > 0 && (size <= 0 || size > max_page_)) size = max_page_;
    bool after = req->page_token().empty();
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (!after) {
        after = *it == req->page_token();
        continue;
      }
      if (size > 0 && resp->jobs_size() >= size) {
        resp->set_next_page_token(resp->jobs(resp->jobs_size() - 1).job_id());
        break;
      }
      *resp->add_jobs() = jobs_[*it];
    }
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req,
                         v1::JobStatus* resp) override {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(req->job_id());
    if (it == jobs_.end()) return NotFound(req->job_id());
    cancels_.emplace_back(req->job_id(), req->reason());
    it->second.set_state(v1::CANCELLED);
    it->second.set_reason(req->reason());
    *resp = it->second;
    return grpc::Status::OK;
  }

  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* resp) override {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < workers_; ++i) {
      v1::WorkerInfo* w = resp->add_workers();
      w->set_worker_id(absl::StrCat("w-", i));
      w->set_address(absl::StrCat("127.0.0.1:", 5000 + i));
      w->set_device("cpu");
      w->set_memory_bytes(int64_t{8} << 30);
      (*w->mutable_labels())["zone"] = "a";
      (*w->mutable_labels())["host"] = "h";
    }
    return grpc::Status::OK;
  }

  grpc::Status ListCheckpoints(grpc::ServerContext*, const v1::ListCheckpointsRequest* req,
                               v1::ListCheckpointsResponse* resp) override {
    absl::MutexLock lock(&mu_);
    if (!jobs_.count(req->job_id())) return NotFound(req->job_id());
    if (mode_[req->job_id()] == "no-checkpoints") return grpc::Status::OK;
    const std::string dir = absl::StrCat("/ckpt/", req->job_id());
    resp->set_dir(dir);
    for (int64_t step : {40, 20}) {
      v1::CheckpointInfo* c = resp->add_checkpoints();
      c->set_step(step);
      c->set_phase(0);
      c->set_created_unix_ms(kT0 + 2500 * step);  // step 40: 2023-11-14 22:15:00 UTC
      c->set_bytes(1536 * 1024);
      c->set_manifest_path(absl::StrCat(dir, "/step-00000000", step, "/MANIFEST"));
      c->set_num_shards(2);
    }
    resp->add_skipped("step-0000000060: no MANIFEST (not committed)");
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    std::string mode;
    int watches_of_job = 0;
    {
      absl::MutexLock lock(&mu_);
      if (!jobs_.count(req->job_id())) return NotFound(req->job_id());
      mode = mode_[req->job_id()];
      watches_of_job = ++watches_of_[req->job_id()];
      ++watches_started_;
    }
    if (!watch_marker_.empty()) std::ofstream(watch_marker_) << "watching\n";
    auto send = [&](v1::JobState state, int64_t step, const std::string& message) {
      v1::JobEvent event;
      {
        absl::MutexLock lock(&mu_);
        v1::JobStatus& job = jobs_[req->job_id()];
        job.set_state(state);
        job.set_step(step);
        job.set_epoch(1);
        job.set_train_loss(1.0 / static_cast<double>(step + 1));
        job.set_samples_per_second(step > 0 ? 1000 : 0);
        job.set_updated_unix_ms(job.created_unix_ms() + 12000);
        if (state == v1::SUCCEEDED) {
          job.set_eval_loss(0.25);
          job.set_eval_accuracy(0.9125);
        }
        if (state == v1::FAILED) job.set_reason("stage 1: loss is nan at step 6");
        *event.mutable_status() = job;
      }
      event.set_message(message);
      return writer->Write(event);
    };
    // Sets fields of the job that `send` leaves alone.
    auto set = [&](const std::function<void(v1::JobStatus&)>& change) {
      absl::MutexLock lock(&mu_);
      change(jobs_[req->job_id()]);
    };
    if (mode == "drop-once") {
      if (watches_of_job == 1) {
        send(v1::RUNNING, 3, "");
        return grpc::Status::OK;  // ends before the job: the client watches again
      }
      mode = "succeed";
    }
    if (mode == "recover") {
      send(v1::RUNNING, 20, "");
      set([](v1::JobStatus& j) {
        j.set_attempt(1);
        j.set_last_checkpoint_step(20);
      });
      send(v1::RECOVERING, 25, "worker local-1 lost; resuming from the checkpoint after step 20");
      send(v1::RUNNING, 30, "");
      send(v1::SUCCEEDED, 40, "done");
      return grpc::Status::OK;
    }
    if (mode == "chaos") {
      for (int64_t step = 1; step <= 100; ++step) {
        if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
        set([step](v1::JobStatus& j) { j.set_attempt(static_cast<int32_t>(step / 5)); });
        send(step < 100 ? v1::RUNNING : v1::SUCCEEDED, step, "");
        absl::SleepFor(absl::Milliseconds(10));
      }
      return grpc::Status::OK;
    }
    if (mode == "succeed") {
      send(v1::PENDING, 0, "waiting for 2 workers");
      send(v1::CONFIGURING, 0, "stage 0 on local-0");
      for (int step = 10; step <= 40; step += 10) send(v1::RUNNING, step, "");
      send(v1::SUCCEEDED, 40, "done");
      return grpc::Status::OK;
    }
    if (mode == "fail") {
      send(v1::RUNNING, 5, "");
      send(v1::FAILED, 6, "");
      return grpc::Status::OK;
    }
    if (mode == "linger") {
      send(v1::RUNNING, 1, "");
      send(v1::SUCCEEDED, 40, "");
      const absl::Time end = absl::Now() + absl::Seconds(30);
      while (!ctx->IsCancelled() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
      absl::MutexLock lock(&mu_);
      if (ctx->IsCancelled()) ++watches_cancelled_;
      return grpc::Status::OK;
    }
    if (mode == "drop") {
      send(v1::RUNNING, 3, "");
      return grpc::Status::OK;
    }
    // forever: one event every 20 ms until the job is cancelled or the client goes.
    for (int64_t step = 1;; ++step) {
      bool cancelled;
      {
        absl::MutexLock lock(&mu_);
        cancelled = jobs_[req->job_id()].state() == v1::CANCELLED;
      }
      if (cancelled) {
        v1::JobEvent event;
        {
          absl::MutexLock lock(&mu_);
          *event.mutable_status() = jobs_[req->job_id()];
        }
        writer->Write(event);
        return grpc::Status::OK;
      }
      if (ctx->IsCancelled() || !send(v1::RUNNING, step, "")) {
        absl::MutexLock lock(&mu_);
        ++watches_cancelled_;
        return grpc::Status::CANCELLED;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  void set_workers(int n) {
    absl::MutexLock lock(&mu_);
    workers_ = n;
  }
  int last_limit() {
    absl::MutexLock lock(&mu_);
    return last_limit_;
  }
  // ListJobs answers at most this many jobs per page (0: no cap).
  void set_max_page(int n) {
    absl::MutexLock lock(&mu_);
    max_page_ = n;
  }
  std::vector<std::pair<std::string, std::string>> cancels() {
    absl::MutexLock lock(&mu_);
    return cancels_;
  }
  std::string submitted_yaml() {
    absl::MutexLock lock(&mu_);
    return submitted_yaml_;
  }
  int watches_started() {
    absl::MutexLock lock(&mu_);
    return watches_started_;
  }
  // Waits up to `timeout` for a watch stream to see its client cancel.
  bool WaitForCancelledWatch(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto seen = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return watches_cancelled_ > 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
  }
  // A file created whenever a watch starts (read by the fake worker scripts).
  void set_watch_marker(const std::string& path) { watch_marker_ = path; }

 private:
  static grpc::Status NotFound(const std::string& id) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no job ", id));
  }

  absl::Mutex mu_;
  int next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, v1::JobStatus> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> mode_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> watches_of_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, std::string>> cancels_ ABSL_GUARDED_BY(mu_);
  std::string submitted_yaml_ ABSL_GUARDED_BY(mu_);
  int workers_ ABSL_GUARDED_BY(mu_) = 0;
  int last_limit_ ABSL_GUARDED_BY(mu_) = -1;
  int max_page_ ABSL_GUARDED_BY(mu_) = 0;
  int watches_started_ ABSL_GUARDED_BY(mu_) = 0;
  int watches_cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  std::string watch_marker_;
};

class FakeServer {
 public:
  // On `port` (0: one the OS picks), knowing `jobs` (specs, submitted before
  // it serves); a server restarted on the port it had, knowing the jobs, is
  // "the coordinator came back".
  explicit FakeServer(int port = 0, const std::vector<std::string>& jobs = {}) {
    for (const std::string& yaml : jobs) {
      v1::SubmitJobRequest req;
      req.set_job_spec_yaml(yaml);
      v1::SubmitJobResponse resp;
      fake_.SubmitJob(nullptr, &req, &resp);
    }
    grpc::ServerBuilder builder;
    rpc::ConfigureServerBuilder(rpc::RpcOptions{}, &builder);
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
  }
  ~FakeServer() {
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }
  bool ok() const { return server_ != nullptr && port_ > 0; }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  FakeCoordinator& fake() { return fake_; }

 private:
  FakeCoordinator fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

constexpr char kJob[] = R"(name: tiny
model: {name: mlp, hidden: [32, 32]}
data: {dataset: synthetic, train_size: 512, test_size: 128, shape: [1, 8, 8], classes: 4}
batch_size: 32
steps: 40
stages: 2
)";

// ---------------------------------------------------------------------------
// CoordinatorClient

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server_.ok()); }
  FakeServer server_;
  client::CoordinatorClient client_{server_.address(), absl::Seconds(10)};
};

TEST_F(ClientTest, SubmitGetListCancelRoundTrip) {
  absl::StatusOr<std::string> a = client_.Submit(kJob);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, "job-1");
  EXPECT_EQ(server_.fake().submitted_yaml(), kJob);
  absl::StatusOr<std::string> b = client_.Submit(std::string(kJob) + "# second\n");
  ASSERT_TRUE(b.ok()) << b.status();

  absl::StatusOr<v1::JobStatus> job = client_.GetJob(*a);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->job_id(), *a);
  EXPECT_EQ(job->name(), "tiny");
  EXPECT_EQ(job->state(), v1::PENDING);

  absl::StatusOr<std::vector<v1::JobStatus>> jobs = client_.ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job_id(), *b);  // newest first, as the fake sends them
  jobs = client_.ListJobs(1);
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 1u);
  EXPECT_EQ(server_.fake().last_limit(), 1);
  // A coordinator that answers a page at a time: the client walks them all.
  server_.fake().set_max_page(1);
  jobs = client_.ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job_id(), *b);
  EXPECT_EQ((*jobs)[1].job_id(), *a);
  jobs = client_.ListJobs(1);
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 1u);
  server_.fake().set_max_page(0);

  absl::StatusOr<v1::JobStatus> cancelled = client_.Cancel(*a, "no longer needed");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  ASSERT_EQ(server_.fake().cancels().size(), 1u);
  EXPECT_EQ(server_.fake().cancels()[0], std::make_pair(*a, std::string("no longer needed")));
  EXPECT_EQ(client_.GetJob(*a)->state(), v1::CANCELLED);
}

TEST_F(ClientTest, ListWorkers) {
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = client_.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_TRUE(workers->empty());
  server_.fake().set_workers(3);
  workers = client_.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 3u);
  EXPECT_EQ((*workers)[2].address(), "127.0.0.1:5002");
  EXPECT_EQ((*workers)[2].labels().at("zone"), "a");
}

TEST_F(ClientTest, InvalidArgumentPassesThroughWithItsMessage) {
  absl::StatusOr<std::string> id = client_.Submit("optimizer: {momentum: 1.5}\n");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(id.status().message(), "optimizer.momentum: must be in [0, 1), got 1.5");
}

TEST_F(ClientTest, UnknownJobIsNotFound) {
  EXPECT_EQ(client_.GetJob("job-404").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_.Cancel("job-404", "").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<v1::JobStatus> watched = client_.Watch("job-404", nullptr);
  EXPECT_EQ(watched.status().code(), absl::StatusCode::kNotFound) << watched.status();
  // A server that answers is never "unreachable", whatever it says.
  EXPECT_THAT(std::string(watched.status().message()), HasSubstr("no job job-404"));
}

TEST(Client, UnreachableAddressIsUnavailableWithAHint) {
  client::CoordinatorClient client("127.0.0.1:1", absl::Seconds(3));  // nothing listens
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = client.ListJobs();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_FALSE(jobs.ok());
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(jobs.status().message()),
              HasSubstr("cannot reach the coordinator at 127.0.0.1:1 (is it running? set "
                        "--coordinator or STAGEWISE_COORDINATOR)"));
  EXPECT_EQ(client.Submit(kJob).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client.Watch("job-1", nullptr).status().code(), absl::StatusCode::kUnavailable);
}

TEST(Client, SilentAddressEndsAtTheDeadlineAsUnavailable) {
  // A port whose listener never accepts: TCP connects (the kernel completes
  // the handshake) but no HTTP/2 answer ever comes, so only the deadline ends
  // the call. It counts as unreachable, not as a slow coordinator.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));

  client::CoordinatorClient client(address, absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::JobStatus> job = client.GetJob("job-1");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable) << job.status();
  EXPECT_THAT(std::string(job.status().message()),
              HasSubstr("cannot reach the coordinator at " + address));
}

TEST_F(ClientTest, WatchReturnsTheTerminalStatus) {
  const std::string id = *client_.Submit(kJob);
  std::vector<v1::JobEvent> events;
  absl::StatusOr<v1::JobStatus> final_status = client_.Watch(id, [&](const v1::JobEvent& e) {
    events.push_back(e);
    return true;
  });
  ASSERT_TRUE(final_status.ok()) << final_status.status();
  EXPECT_EQ(final_status->state(), v1::SUCCEEDED);
  EXPECT_EQ(final_status->step(), 40);
  EXPECT_DOUBLE_EQ(final_status->eval_accuracy(), 0.9125);
  ASSERT_EQ(events.size(), 7u);
  EXPECT_EQ(events.front().message(), "waiting for 2 workers");
  EXPECT_EQ(events.back().status().state(), v1::SUCCEEDED);
}

TEST_F(ClientTest, WatchReturnsAFailedJobWithItsReason) {
  const std::string id = *client_.Submit(std::string(kJob) + "# fake: fail\n");
  absl::StatusOr<v1::JobStatus> final_status = client_.Watch(id, nullptr);
  ASSERT_TRUE(final_status.ok()) << final_status.status();
  EXPECT_EQ(final_status->state(), v1::FAILED);
  EXPECT_EQ(final_status->reason(), "stage 1: loss is nan at step 6");
}

TEST_F(ClientTest, WatchStopsEarlyWhenTheCallbackSaysSo) {
  const std::string id = *client_.Submit(std::string(kJob) + "# fake: forever\n");
  int seen = 0;
  absl::StatusOr<v1::JobStatus> last =
      client_.Watch(id, [&](const v1::JobEvent&) { return ++seen < 3; });
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(last->state(), v1::RUNNING);
  EXPECT_EQ(last->step(), 3);
  // The stream was cancelled, not left running on the server.
  EXPECT_TRUE(server_.fake().WaitForCancelledWatch(absl::Seconds(10)));
}

TEST_F(ClientTest, WatchReturnsAtTheTerminalEventEvenIfTheStreamStaysOpen) {
  const std::string id = *client_.Submit(std::string(kJob) + "# fake: linger\n");
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::JobStatus> last = client_.Watch(id, nullptr);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // the fake lingers 30 s
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->state(), v1::SUCCEEDED);
  EXPECT_TRUE(server_.fake().WaitForCancelledWatch(absl::Seconds(10)));
}

TEST_F(ClientTest, WatchThatEndsBeforeTheJobIsAnError) {
  const std::string id = *client_.Submit(std::string(kJob) + "# fake: drop\n");
  absl::StatusOr<v1::JobStatus> last = client_.Watch(id, nullptr);
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(last.status().message()), HasSubstr("before the job finished"));
}

TEST_F(ClientTest, StopWatchingEndsAWatchFromAnotherThread) {
  const std::string id = *client_.Submit(std::string(kJob) + "# fake: forever\n");
  std::atomic<int> seen{0};
  std::thread stopper([&] {
    while (seen.load() < 2) absl::SleepFor(absl::Milliseconds(5));
    client_.StopWatching();
  });
  absl::StatusOr<v1::JobStatus> last = client_.Watch(id, [&](const v1::JobEvent&) {
    ++seen;
    return true;
  });
  stopper.join();
  EXPECT_EQ(last.status().code(), absl::StatusCode::kCancelled) << last.status();
  EXPECT_TRUE(server_.fake().WaitForCancelledWatch(absl::Seconds(10)));
  // Sticky: a watch started after the stop ends at once.
  EXPECT_EQ(client_.Watch(id, nullptr).status().code(), absl::StatusCode::kCancelled);
}

TEST_F(ClientTest, WaitForWorkersTimesOutThenSucceeds) {
  server_.fake().set_workers(1);
  absl::Status s = client_.WaitForWorkers(2, absl::Milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("only 1 of 2 worker(s)"));

  std::thread joiner([&] {
    absl::SleepFor(absl::Milliseconds(200));
    server_.fake().set_workers(2);
  });
  s = client_.WaitForWorkers(2, absl::Seconds(30));
  joiner.join();
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(ClientTest, WaitForWorkersStopsWhenToldTo) {
  int polls = 0;
  absl::Status s = client_.WaitForWorkers(1, absl::Seconds(60), [&] {
    return ++polls == 3 ? absl::AbortedError("a worker died") : absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "a worker died");
  EXPECT_EQ(polls, 3);
}

TEST(Client, WaitForWorkersOnAnUnreachableCoordinatorReportsIt) {
  client::CoordinatorClient client("127.0.0.1:1", absl::Seconds(1));
  absl::Status s = client.WaitForWorkers(1, absl::Milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot reach the coordinator"));
}

TEST(Client, ResolveCoordinatorAddressPrecedence) {
  const char* old = std::getenv("STAGEWISE_COORDINATOR");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  absl::Cleanup restore = [&] {
    if (saved) {
      ::setenv("STAGEWISE_COORDINATOR", saved->c_str(), 1);
    } else {
      ::unsetenv("STAGEWISE_COORDINATOR");
    }
  };
  ::unsetenv("STAGEWISE_COORDINATOR");
  EXPECT_EQ(client::ResolveCoordinatorAddress(""), "127.0.0.1:7070");
  EXPECT_EQ(client::ResolveCoordinatorAddress("flag:1"), "flag:1");
  ::setenv("STAGEWISE_COORDINATOR", "env:2", 1);
  EXPECT_EQ(client::ResolveCoordinatorAddress(""), "env:2");
  EXPECT_EQ(client::ResolveCoordinatorAddress("flag:1"), "flag:1");
  ::setenv("STAGEWISE_COORDINATOR", "", 1);
  EXPECT_EQ(client::ResolveCoordinatorAddress(""), "127.0.0.1:7070");
}

TEST(Client, TerminalStates) {
  EXPECT_TRUE(client::IsTerminal(v1::SUCCEEDED));
  EXPECT_TRUE(client::IsTerminal(v1::FAILED));
  EXPECT_TRUE(client::IsTerminal(v1::CANCELLED));
  EXPECT_FALSE(client::IsTerminal(v1::RUNNING));
  EXPECT_FALSE(client::IsTerminal(v1::RECOVERING));
  EXPECT_EQ(client::JobStateName(v1::CHECKPOINTING), "CHECKPOINTING");
}

TEST_F(ClientTest, ListCheckpoints) {
  const std::string id = *client_.Submit(kJob);
  absl::StatusOr<v1::ListCheckpointsResponse> listing = client_.ListCheckpoints(id);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(listing->dir(), "/ckpt/job-1");
  ASSERT_EQ(listing->checkpoints_size(), 2);
  EXPECT_EQ(listing->checkpoints(0).step(), 40);
  EXPECT_EQ(listing->checkpoints(0).manifest_path(), "/ckpt/job-1/step-0000000040/MANIFEST");
  ASSERT_EQ(listing->skipped_size(), 1);
  EXPECT_EQ(client_.ListCheckpoints("job-404").status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// Watching through a coordinator restart.

TEST(Reconnect, BackoffDoublesUpToItsCapWithJitterAndResets) {
  // Each delay lies between half and all of 200 ms doubling up to 5 s, and
  // the delays are not all the same fraction of it (jitter, not a constant).
  const std::vector<absl::Duration> ceilings = {absl::Milliseconds(200),  absl::Milliseconds(400),
                                                absl::Milliseconds(800),  absl::Milliseconds(1600),
                                                absl::Milliseconds(3200), absl::Seconds(5),
                                                absl::Seconds(5)};
  std::set<int64_t> fractions;
  for (int round = 0; round < 20; ++round) {
    client::Backoff backoff(absl::Milliseconds(200), absl::Seconds(5));
    for (const absl::Duration ceiling : ceilings) {
      const absl::Duration d = backoff.Next();
      EXPECT_GE(d, ceiling / 2);
      EXPECT_LE(d, ceiling);
      fractions.insert(absl::ToInt64Microseconds(d) * 1000 / absl::ToInt64Microseconds(ceiling));
    }
    backoff.Reset();
    EXPECT_LE(backoff.Next(), absl::Milliseconds(200));
  }
  EXPECT_GT(fractions.size(), 10u);  // 140 draws in [500, 1000] per mille
}

TEST(Reconnect, JitteredStaysBetweenHalfAndAll) {
  absl::BitGen gen;
  for (int i = 0; i < 1000; ++i) {
    const absl::Duration d = Jittered(absl::Seconds(8), gen);
    ASSERT_GE(d, absl::Seconds(4));
    ASSERT_LE(d, absl::Seconds(8));
  }
}

TEST(Reconnect, OnlyOutagesAreReconnectable) {
  EXPECT_TRUE(client::IsReconnectable(absl::UnavailableError("socket closed")));
  EXPECT_TRUE(client::IsReconnectable(absl::AbortedError("ended the watch")));
  EXPECT_TRUE(client::IsReconnectable(absl::CancelledError("server shutting down")));
  EXPECT_TRUE(client::IsReconnectable(absl::UnknownError("stream removed")));
  EXPECT_FALSE(client::IsReconnectable(absl::NotFoundError("no job job-1")));
  EXPECT_FALSE(client::IsReconnectable(absl::InvalidArgumentError("bad")));
  EXPECT_FALSE(client::IsReconnectable(absl::OkStatus()));
}

client::ReconnectPolicy FastPolicy(absl::Duration give_up) {
  client::ReconnectPolicy policy;
  policy.initial_backoff = absl::Milliseconds(20);
  policy.max_backoff = absl::Milliseconds(200);
  policy.give_up_after = give_up;
  return policy;
}

TEST_F(ClientTest, WatchReconnectingRidesOutAStreamThatEndsEarly) {
  const std::string id = *client_.Submit(std::string(kJob) + "# fake: drop-once\n");
  std::vector<client::ConnectionChange> changes;
  absl::StatusOr<v1::JobStatus> last =
      client_.WatchReconnecting(id, nullptr, FastPolicy(absl::Seconds(60)),
                                [&](const client::ConnectionChange& c) { changes.push_back(c); });
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->state(), v1::SUCCEEDED);
  EXPECT_EQ(server_.fake().watches_started(), 2);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_TRUE(changes[0].lost);
  EXPECT_THAT(changes[0].reason, HasSubstr("before the job finished"));
  EXPECT_FALSE(changes[1].lost);
  // Without reconnecting, the same watch is an error.
  const std::string again = *client_.Submit(std::string(kJob) + "# fake: drop-once\n");
  last = client_.WatchReconnecting(again, nullptr, FastPolicy(absl::ZeroDuration()));
  EXPECT_EQ(last.status().code(), absl::StatusCode::kAborted) << last.status();
}

TEST(Reconnect, AWrongAddressIsNotRetried) {
  client::CoordinatorClient client("127.0.0.1:1", absl::Seconds(3));  // nothing listens
  int changes = 0;
  absl::StatusOr<v1::JobStatus> last =
      client.WatchReconnecting("job-1", nullptr, FastPolicy(absl::Minutes(10)),
                               [&](const client::ConnectionChange&) { ++changes; });
  EXPECT_EQ(last.status().code(), absl::StatusCode::kUnavailable) << last.status();
  EXPECT_EQ(changes, 0);
}

// A watch of a running job whose coordinator goes away after a few events.
class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<FakeServer>();
    ASSERT_TRUE(server_->ok());
    port_ = server_->port();
    client_ = std::make_unique<client::CoordinatorClient>(server_->address());
    ASSERT_EQ(*client_->Submit(std::string(kJob) + "# fake: forever\n"), "job-1");
  }

  // Watches job-1 with `policy`; after the third event, runs `on_third`
  // on another thread (stopping or restarting the server).
  absl::StatusOr<v1::JobStatus> WatchAndThen(const client::ReconnectPolicy& policy,
                                             std::function<void()> on_third) {
    std::thread actor;
    int events = 0;
    absl::StatusOr<v1::JobStatus> last = client_->WatchReconnecting(
        "job-1",
        [&](const v1::JobEvent&) {
          if (++events == 3) actor = std::thread(on_third);
          return true;
        },
        policy,
        [&](const client::ConnectionChange& c) {
          absl::MutexLock lock(&mu_);
          changes_.push_back(c);
        });
    if (actor.joinable()) actor.join();
    return last;
  }

  std::vector<client::ConnectionChange> changes() {
    absl::MutexLock lock(&mu_);
    return changes_;
  }

  std::unique_ptr<FakeServer> server_;
  int port_ = 0;
  std::unique_ptr<client::CoordinatorClient> client_;
  absl::Mutex mu_;
  std::vector<client::ConnectionChange> changes_ ABSL_GUARDED_BY(mu_);
};

TEST_F(RestartTest, WatchReconnectsToTheRestartedCoordinator) {
  absl::StatusOr<v1::JobStatus> last = WatchAndThen(FastPolicy(absl::Minutes(2)), [this] {
    server_.reset();  // the coordinator goes away...
    // ...and comes back where it was, knowing the job (from its database);
    // here the job then succeeds.
    server_ = std::make_unique<FakeServer>(port_, std::vector<std::string>{kJob});
    ASSERT_TRUE(server_->ok());
  });
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->state(), v1::SUCCEEDED);
  EXPECT_EQ(last->step(), 40);
  const std::vector<client::ConnectionChange> c = changes();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_TRUE(c[0].lost);
  EXPECT_FALSE(c[0].reason.empty());
  EXPECT_THAT(c[0].reason, Not(HasSubstr("is it running?")));  // the hint is for humans once
  EXPECT_FALSE(c[1].lost);
}

TEST_F(RestartTest, WatchGivesUpOnACoordinatorThatStaysAway) {
  absl::StatusOr<v1::JobStatus> last =
      WatchAndThen(FastPolicy(absl::Milliseconds(500)), [this] { server_.reset(); });
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.status().code(), absl::StatusCode::kUnavailable) << last.status();
  EXPECT_THAT(std::string(last.status().message()),
              HasSubstr(absl::StrCat("lost the coordinator at 127.0.0.1:", port_)));
  EXPECT_THAT(std::string(last.status().message()), HasSubstr("gave up watching job job-1"));
  const std::vector<client::ConnectionChange> c = changes();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].lost);
}

TEST_F(RestartTest, StopWatchingEndsTheWaitForTheCoordinator) {
  absl::StatusOr<v1::JobStatus> last = WatchAndThen(FastPolicy(absl::Minutes(10)), [this] {
    server_.reset();
    // Once the loss is noticed, stop (Ctrl-C).
    const absl::Time end = absl::Now() + absl::Seconds(30);
    while (changes().empty() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
    client_->StopWatching();
  });
  EXPECT_EQ(last.status().code(), absl::StatusCode::kCancelled) << last.status();
}

// ---------------------------------------------------------------------------
// The `stagewise` binary against the fake.

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parses JSON text (protobuf's JSON parser, which takes any JSON value).
std::optional<google::protobuf::Value> ParseJson(const std::string& text) {
  google::protobuf::Value value;
  if (!google::protobuf::util::JsonStringToMessage(text, &value).ok()) return std::nullopt;
  return value;
}

struct CliResult {
  int code = -1;  // exit code, or 128 + signal
  std::string out;
  std::string err;
};

// A `stagewise` process with its own environment; no shell involved.
class CliProcess {
 public:
  CliProcess(const std::string& binary, const std::vector<std::string>& args,
             const std::map<std::string, std::string>& env, const fs::path& dir)
      : out_(dir / "stdout"), err_(dir / "stderr") {
    std::vector<std::string> argv = {binary};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> envs;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      if (key != "STAGEWISE_COORDINATOR" && !env.count(key)) envs.push_back(kv);
    }
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : envs) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    const int out_fd = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int err_fd = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int in_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in_fd, 0);
      ::dup2(out_fd, 1);
      ::dup2(err_fd, 2);
      ::execve(cargv[0], cargv.data(), cenv.data());
      ::_exit(127);
    }
    ::close(out_fd);
    ::close(err_fd);
    ::close(in_fd);
  }
  ~CliProcess() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  std::string err_so_far() const { return Slurp(err_); }

  // Waits for the exit; kills the process after `timeout` (a hang is a failure).
  CliResult Wait(absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time end = absl::Now() + timeout;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (absl::Now() > end) {
        ADD_FAILURE() << "stagewise did not exit within " << timeout << "; stderr:\n"
                      << Slurp(err_);
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    status_ = status;
    CliResult r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = Slurp(out_);
    r.err = Slurp(err_);
    return r;
  }

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.ok());
    ASSERT_TRUE(fs::exists(binary_)) << binary_ << " (built before this test)";
    dir_ = fs::temp_directory_path() /
           absl::StrCat("stagewise_client_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CliResult Run(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    return CliProcess(binary_, args, env, dir_).Wait();
  }
  // Runs with --coordinator pointing at the fake.
  CliResult RunAtFake(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    args.insert(args.begin(), {"--coordinator", server_.address()});
    return Run(args, env);
  }
  std::string WriteJob(const std::string& yaml, const std::string& name = "job.yaml") {
    const fs::path p = dir_ / name;
    std::ofstream(p) << yaml;
    return p.string();
  }

  FakeServer server_;
  std::string binary_ = std::string(STAGEWISE_BINARY_DIR) + "/bin/stagewise";
  fs::path dir_;
};

TEST_F(CliTest, SubmitFollowsTheJobAndPrintsTheResult) {
  CliResult r = RunAtFake({"submit", WriteJob(kJob)});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(r.out, HasSubstr("tiny (job-1)"));
  EXPECT_THAT(r.out, HasSubstr("91.25%"));  // eval accuracy
  EXPECT_THAT(r.out, HasSubstr("0.2500"));  // eval loss
  EXPECT_THAT(r.out, HasSubstr("40/40"));   // steps
  EXPECT_THAT(r.out, HasSubstr("12s"));     // time from created to updated
  EXPECT_THAT(r.err, HasSubstr("submitted job job-1"));
  // Not a terminal: a line per state change and the terminal line, with the
  // event messages; progress within a state is throttled (one per 10 s).
  EXPECT_THAT(r.err, HasSubstr("RUNNING  epoch 1  step 10/40  loss 0.0909  1000 samples/s"));
  EXPECT_THAT(r.err, Not(HasSubstr("step 20/40")));
  EXPECT_THAT(r.err, HasSubstr("SUCCEEDED  epoch 1  step 40/40"));
  EXPECT_THAT(r.err, HasSubstr("CONFIGURING: stage 0 on local-0"));
  EXPECT_EQ(r.err.find('\r'), std::string::npos);
  EXPECT_EQ(server_.fake().submitted_yaml(), kJob);
}

TEST_F(CliTest, SubmitJsonIsValidJson) {
  CliResult r = RunAtFake({"submit", "-q", "-o", "json", WriteJob(kJob)});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;  // -q
  std::optional<google::protobuf::Value> v = ParseJson(r.out);
  ASSERT_TRUE(v.has_value()) << r.out;
  const auto& f = v->struct_value().fields();
  EXPECT_EQ(f.at("state").string_value(), "SUCCEEDED");
  EXPECT_EQ(f.at("job_id").string_value(), "job-1");
  EXPECT_DOUBLE_EQ(f.at("eval_accuracy").number_value(), 0.9125);
  EXPECT_DOUBLE_EQ(f.at("step").number_value(), 40);
  EXPECT_DOUBLE_EQ(f.at("seconds").number_value(), 12);
}

TEST_F(CliTest, SubmitNoWaitPrintsTheJobId) {
  CliResult r = RunAtFake({"submit", "--no-wait", WriteJob(kJob)});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "job-1\n");
  EXPECT_EQ(server_.fake().watches_started(), 0);
  r = RunAtFake({"submit", "--no-wait", "-o", "json", WriteJob(kJob)});
  EXPECT_EQ(r.out, "{\"job_id\":\"job-2\"}\n");
}

TEST_F(CliTest, FailedJobExitsOneWithTheReason) {
  CliResult r = RunAtFake({"submit", WriteJob(std::string(kJob) + "# fake: fail\n")});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("FAILED"));
  EXPECT_THAT(r.err, HasSubstr("job job-1 FAILED: stage 1: loss is nan at step 6"));
}

TEST_F(CliTest, InvalidSpecExitsTwoNamingTheKey) {
  // Refused by the coordinator; reported with the key's place in the file.
  CliResult r = RunAtFake({"submit", WriteJob(std::string(kJob) + "optimizer: {momentum: 1.5}\n")});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err,
              HasSubstr("optimizer.momentum: must be in [0, 1), got 1.5 (line 7, column 13)"));
  r = RunAtFake({"submit", WriteJob("optimizer: {momentum: 1.5}\n")});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("name: required"));
}

TEST_F(CliTest, UnreachableCoordinatorExitsThree) {
  // The address comes from the environment when there is no flag.
  CliResult r = Run({"submit", WriteJob(kJob)}, {{"STAGEWISE_COORDINATOR", "127.0.0.1:1"}});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("cannot reach the coordinator at 127.0.0.1:1"));
  r = Run({"list"}, {{"STAGEWISE_COORDINATOR", "127.0.0.1:1"}});
  EXPECT_EQ(r.code, 3);
  // The flag wins over the environment.
  r = Run({"list", "--coordinator", server_.address()}, {{"STAGEWISE_COORDINATOR", "127.0.0.1:1"}});
  EXPECT_EQ(r.code, 0) << r.err;
  r = Run({"workers"}, {{"STAGEWISE_COORDINATOR", server_.address()}});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(CliTest, StatusListCancelWatch) {
  ASSERT_EQ(RunAtFake({"submit", "--no-wait", WriteJob(kJob)}).code, 0);
  ASSERT_EQ(
      RunAtFake({"submit", "--no-wait", WriteJob("name: other\n# fake: forever\n", "b.yaml")}).code,
      0);

  CliResult r = RunAtFake({"status", "job-1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("PENDING"));
  r = RunAtFake({"status", "job-1", "-o", "json"});
  ASSERT_TRUE(ParseJson(r.out).has_value()) << r.out;
  r = RunAtFake({"status", "job-9"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("no job job-9"));

  r = RunAtFake({"list"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("ID     NAME   STATE    ALGORITHM  STAGES  STEP  LOSS  ACCURACY  AGE"));
  // The fake made the jobs 65 s old; a slow machine may add a few seconds.
  EXPECT_THAT(r.out,
              ::testing::ContainsRegex(
                  "job-2  other  PENDING  backprop   2       0/40  -     -         [67][0-9]s"));
  EXPECT_LT(r.out.find("job-2"), r.out.find("job-1"));
  r = RunAtFake({"list", "--limit", "1", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::optional<google::protobuf::Value> list = ParseJson(r.out);
  ASSERT_TRUE(list.has_value()) << r.out;
  ASSERT_EQ(list->list_value().values_size(), 1);
  EXPECT_EQ(list->list_value().values(0).struct_value().fields().at("name").string_value(),
            "other");
  EXPECT_EQ(server_.fake().last_limit(), 1);

  r = RunAtFake({"cancel", "job-2", "--reason", "no longer needed"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "job job-2: CANCELLED (no longer needed)\n");
  ASSERT_EQ(server_.fake().cancels().size(), 1u);
  EXPECT_EQ(server_.fake().cancels()[0].second, "no longer needed");

  // Watching a cancelled job: the result, and exit 1 as the job did not succeed.
  r = RunAtFake({"watch", "job-2", "-o", "json"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"state\":\"CANCELLED\""));
  r = RunAtFake({"watch", "job-1"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SUCCEEDED"));
}

TEST_F(CliTest, Workers) {
  CliResult r = RunAtFake({"workers"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("no workers"));
  server_.fake().set_workers(2);
  r = RunAtFake({"workers"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("ID   ADDRESS         DEVICE  MEMORY  LABELS"));
  EXPECT_THAT(r.out, HasSubstr("w-1  127.0.0.1:5001  cpu     8.0GiB  host=h,zone=a"));
  r = RunAtFake({"workers", "-o", "json"});
  std::optional<google::protobuf::Value> v = ParseJson(r.out);
  ASSERT_TRUE(v.has_value()) << r.out;
  ASSERT_EQ(v->list_value().values_size(), 2);
  const auto& w = v->list_value().values(1).struct_value().fields();
  EXPECT_DOUBLE_EQ(w.at("memory_bytes").number_value(), 8589934592.0);
  EXPECT_EQ(w.at("labels").struct_value().fields().at("zone").string_value(), "a");
}

TEST_F(CliTest, CtrlCWhileWatchingDetachesAndLeavesTheJob) {
  ASSERT_EQ(RunAtFake({"submit", "--no-wait", WriteJob("# fake: forever\n")}).code, 0);
  CliProcess p(binary_, {"--coordinator", server_.address(), "watch", "job-1"}, {}, dir_);
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (server_.fake().watches_started() == 0 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(server_.fake().watches_started(), 0);
  ::kill(p.pid(), SIGINT);
  CliResult r = p.Wait(absl::Seconds(30));
  EXPECT_EQ(r.code, 130) << r.err;
  EXPECT_THAT(r.err, HasSubstr("it keeps running"));
  EXPECT_TRUE(server_.fake().cancels().empty());  // a remote job is not cancelled
}

TEST_F(CliTest, StatusShowsTheAttemptsOfARecoveredJob) {
  ASSERT_EQ(RunAtFake({"submit", "--no-wait", WriteJob("name: r\n# fake: recovered\n")}).code, 0);
  CliResult r = RunAtFake({"status", "job-1"}, {{"TZ", "UTC"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("last checkpoint step 40\n"));
  EXPECT_THAT(r.out, HasSubstr("recoveries      1\n"));
  EXPECT_THAT(r.out, HasSubstr("steps redone    17\n"));
  EXPECT_THAT(r.out, HasSubstr("ATTEMPT  FROM  REACHED  STARTED              DURATION  END"));
  EXPECT_THAT(r.out, HasSubstr("0        0     57       2023-11-14 22:13:20  41s       worker "
                               "local-1 lost: control stream ended  local-0,local-1\n"));
  // The running attempt: its duration so far (to the last update), "running".
  EXPECT_THAT(r.out, HasSubstr("1        40    120      2023-11-14 22:14:03  57s       running"
                               "                                    local-0,local-2\n"));
  r = RunAtFake({"status", "job-1", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::optional<google::protobuf::Value> v = ParseJson(r.out);
  ASSERT_TRUE(v.has_value()) << r.out;
  const auto& f = v->struct_value().fields();
  EXPECT_DOUBLE_EQ(f.at("attempt").number_value(), 1);
  EXPECT_DOUBLE_EQ(f.at("last_checkpoint_step").number_value(), 40);
  EXPECT_DOUBLE_EQ(f.at("steps_redone").number_value(), 17);
  ASSERT_EQ(f.at("attempts").list_value().values_size(), 2);
  const auto& a0 = f.at("attempts").list_value().values(0).struct_value().fields();
  EXPECT_DOUBLE_EQ(a0.at("reached_step").number_value(), 57);
  EXPECT_EQ(a0.at("end_reason").string_value(), "worker local-1 lost: control stream ended");
  EXPECT_EQ(a0.at("workers").list_value().values(1).string_value(), "local-1");

  // A job that never recovered and has no checkpoint shows none of it.
  ASSERT_EQ(RunAtFake({"submit", "--no-wait", WriteJob(kJob)}).code, 0);
  r = RunAtFake({"status", "job-2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("ATTEMPT")));
  EXPECT_THAT(r.out, Not(HasSubstr("recoveries")));
}

TEST_F(CliTest, RecoveringShowsTheAttemptAndWhereItResumes) {
  CliResult r = RunAtFake({"submit", WriteJob(std::string(kJob) + "# fake: recover\n")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("RECOVERING: worker local-1 lost; resuming from the checkpoint "
                               "after step 20\n"));
  EXPECT_THAT(r.err, HasSubstr("RECOVERING  attempt 1  resuming at step 20/40\n"));
  EXPECT_THAT(r.err, HasSubstr("RUNNING  epoch 1  step 30/40  attempt 1  loss"));
  EXPECT_THAT(r.out, HasSubstr("recoveries      1\n"));
}

TEST_F(CliTest, WatchReconnectsWhenTheStreamBreaks) {
  ASSERT_EQ(
      RunAtFake({"submit", "--no-wait", WriteJob(std::string(kJob) + "# fake: drop-once\n")}).code,
      0);
  CliResult r = RunAtFake({"watch", "job-1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("coordinator unavailable (the coordinator at " + server_.address() +
                               " ended the watch of job job-1 before the "
                               "job finished); reconnecting\n"));
  EXPECT_THAT(r.err, HasSubstr("reconnected (after "));
  EXPECT_THAT(r.out, HasSubstr("SUCCEEDED"));
  EXPECT_EQ(server_.fake().watches_started(), 2);

  // --reconnect-timeout 0: the broken stream is the end of it.
  ASSERT_EQ(
      RunAtFake({"submit", "--no-wait", WriteJob(std::string(kJob) + "# fake: drop-once\n")}).code,
      0);
  r = RunAtFake({"watch", "job-2", "--reconnect-timeout", "0"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("before the job finished"));
  EXPECT_THAT(r.err, Not(HasSubstr("reconnecting")));

  r = RunAtFake({"watch", "job-1", "--reconnect-timeout", "soon"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--reconnect-timeout: expected a duration"));
  r = RunAtFake({"submit", "--reconnect-timeout", "-5s", WriteJob(kJob)});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(server_.fake().submitted_yaml(), HasSubstr("drop-once"));  // nothing new submitted
}

TEST_F(CliTest, CheckpointsListsCommittedThenSkipped) {
  ASSERT_EQ(RunAtFake({"submit", "--no-wait", WriteJob(kJob)}).code, 0);
  CliResult r = RunAtFake({"checkpoints", "job-1"}, {{"TZ", "UTC"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "STEP  PHASE  CREATED              SIZE    SHARDS  PATH\n"
            "40    1      2023-11-14 22:15:00  1.5MiB  2       /ckpt/job-1/step-0000000040\n"
            "20    1      2023-11-14 22:14:10  1.5MiB  2       /ckpt/job-1/step-0000000020\n"
            "\n"
            "skipped (not usable):\n"
            "  step-0000000060: no MANIFEST (not committed)\n");
  r = RunAtFake({"checkpoints", "job-1", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::optional<google::protobuf::Value> v = ParseJson(r.out);
  ASSERT_TRUE(v.has_value()) << r.out;
  const auto& f = v->struct_value().fields();
  EXPECT_EQ(f.at("dir").string_value(), "/ckpt/job-1");
  ASSERT_EQ(f.at("checkpoints").list_value().values_size(), 2);
  const auto& c = f.at("checkpoints").list_value().values(0).struct_value().fields();
  EXPECT_DOUBLE_EQ(c.at("step").number_value(), 40);
  EXPECT_DOUBLE_EQ(c.at("bytes").number_value(), 1536 * 1024);
  EXPECT_EQ(c.at("path").string_value(), "/ckpt/job-1/step-0000000040");
  EXPECT_EQ(f.at("skipped").list_value().values_size(), 1);

  r = RunAtFake({"checkpoints", "job-9"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("no job job-9"));
  ASSERT_EQ(
      RunAtFake({"submit", "--no-wait", WriteJob(std::string(kJob) + "# fake: no-checkpoints\n")})
          .code,
      0);
  r = RunAtFake({"checkpoints", "job-2"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("job job-2 keeps no checkpoints (its spec has no checkpoint.dir)"));
}

TEST_F(CliTest, ExportChecksItsArgumentsAndWhereTheFilesAre) {
  ASSERT_EQ(RunAtFake({"submit", "--no-wait", WriteJob(kJob)}).code, 0);
  const std::string out_dir = (dir_ / "exported").string();
  // The coordinator's paths (/ckpt/...) are not on this machine.
  // The old spelling -o DIR still works, with a note.
  CliResult r = RunAtFake({"export", "job-1", "-o", out_dir});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("'stagewise export -o DIR' is deprecated; use '--output-dir DIR'"));
  EXPECT_THAT(r.err, HasSubstr("/ckpt/job-1/step-0000000040 on the coordinator, which is not "
                               "readable here"));
  EXPECT_THAT(r.err, HasSubstr("where the job's checkpoint directory (/ckpt/job-1) is mounted"));
  r = RunAtFake({"export", "job-1", "--step", "30", "--output-dir", out_dir});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("no committed checkpoint after step 30 (committed: 40, 20)"));
  EXPECT_FALSE(fs::exists(out_dir));
  // Usage errors.
  r = RunAtFake({"export", "job-1"});
  EXPECT_EQ(r.code, 2) << r.err;
  r = RunAtFake({"export", "job-1", "--checkpoint", dir_.string(), "--output-dir", out_dir});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("not both"));
  r = Run({"export", "--checkpoint", (dir_ / "nothing").string(), "--output-dir", out_dir});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("no such directory"));
  fs::create_directories(dir_ / "step-0000000010");
  r = Run({"export", "--checkpoint", (dir_ / "step-0000000010").string(), "--output-dir", out_dir});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("is not a committed checkpoint (no MANIFEST)"));
}

// ---------------------------------------------------------------------------
// `stagewise local` with stand-in child binaries.

// True once `pid` no longer exists (reaped) or is a zombie of someone else.
bool Gone(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string content;
  if (!std::getline(stat, content)) return true;
  const size_t paren = content.rfind(')');
  return paren != std::string::npos && paren + 2 < content.size() && content[paren + 2] == 'Z';
}

class LocalTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    bin_ = dir_ / "bin";
    fs::create_directories(bin_);
    // A copy, so that stagewise finds the stand-ins next to itself (and not
    // the real binaries next to the original).
    fs::copy_file(binary_, bin_ / "stagewise");
    WriteScript("stagewise-coordinator",
                absl::StrCat(R"(#!/bin/sh
echo "coordinator args: $*"
echo $$ >> "$FAKE_PID_DIR/pids"
if [ -n "$FAKE_COORDINATOR_EXIT" ]; then
  echo "fatal: cannot open the database"
  exit "$FAKE_COORDINATOR_EXIT"
fi
while [ $# -gt 0 ]; do
  case "$1" in --port-file) pf="$2"; shift ;; esac
  shift
done
printf '%s 9999\n' )",
                             server_.port(), R"( > "$pf.tmp" && mv "$pf.tmp" "$pf"
exec sleep 300
)"));
    WriteScript("stagewise-worker", R"(#!/bin/sh
echo "worker args: $*"
echo $$ >> "$FAKE_PID_DIR/pids"
while [ $# -gt 0 ]; do
  case "$1" in --port-file) pf="$2"; shift ;; --name) name="$2"; shift ;; esac
  shift
done
printf '12345 12346\n' > "$pf.tmp" && mv "$pf.tmp" "$pf"
if [ "$name" = "$FAKE_WORKER_CRASH" ]; then
  while [ ! -e "$FAKE_PID_DIR/watching" ]; do sleep 0.05; done
  echo "worker $name: about to crash"
  kill -KILL $$
fi
exec sleep 300
)");
    server_.fake().set_watch_marker((dir_ / "watching").string());
  }

  void WriteScript(const std::string& name, const std::string& text) {
    const fs::path p = bin_ / name;
    std::ofstream(p) << text;
    fs::permissions(p, fs::perms::owner_all);
  }

  std::map<std::string, std::string> Env(std::map<std::string, std::string> extra = {}) {
    extra["FAKE_PID_DIR"] = dir_.string();
    return extra;
  }

  // --insecure: the stand-ins hand over to the plaintext fake coordinator
  // (TLS of `local` itself is covered by the integration tests).
  CliProcess Start(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    args.insert(args.begin(), {"local", "--insecure"});
    return CliProcess((bin_ / "stagewise").string(), args, Env(env), dir_);
  }

  std::vector<pid_t> ChildPids() {
    std::vector<pid_t> pids;
    std::ifstream in(dir_ / "pids");
    for (pid_t p; in >> p;) pids.push_back(p);
    return pids;
  }

  // Every stand-in child is gone once `stagewise local` has returned. Children
  // stopped early may not have recorded their pid yet: `exact` = false.
  void ExpectNoChildLeft(size_t expected, bool exact = true) {
    const std::vector<pid_t> pids = ChildPids();
    if (exact) {
      EXPECT_EQ(pids.size(), expected);
    } else {
      EXPECT_GE(pids.size(), expected);
    }
    for (pid_t p : pids) EXPECT_TRUE(Gone(p)) << "child " << p << " is still running";
  }

  // The DIR from "logs in DIR" on stderr.
  static std::string LogDir(const std::string& err) {
    const size_t at = err.find("logs in ");
    if (at == std::string::npos) return "";
    return err.substr(at + 8, err.find('\n', at) - at - 8);
  }

  fs::path bin_;
};

TEST_F(LocalTest, RunsTheJobOnLocalProcessesAndStopsThem) {
  server_.fake().set_workers(2);
  CliResult r = Start({WriteJob(kJob), "--threads", "3", "--keep-logs", "-o", "json"}).Wait();
  ASSERT_EQ(r.code, 0) << r.err;
  std::optional<google::protobuf::Value> v = ParseJson(r.out);
  ASSERT_TRUE(v.has_value()) << r.out;
  EXPECT_EQ(v->struct_value().fields().at("state").string_value(), "SUCCEEDED");
  EXPECT_EQ(server_.fake().submitted_yaml(), kJob);
  EXPECT_THAT(r.err, HasSubstr("step 40/40"));
  ExpectNoChildLeft(3);  // coordinator + 2 workers (stages: 2)

  // The children got exactly the documented flags.
  const std::string logs = LogDir(r.err);
  ASSERT_FALSE(logs.empty()) << r.err;
  EXPECT_THAT(r.err, HasSubstr("logs kept in " + logs));
  EXPECT_THAT(
      Slurp(fs::path(logs) / "coordinator.log"),
      HasSubstr(absl::StrCat("coordinator args: --listen 127.0.0.1:0 --metrics-listen "
                             "127.0.0.1:0 --db ",
                             logs, "/coordinator.db --port-file ", logs, "/coordinator.port")));
  for (int n = 0; n < 2; ++n) {
    EXPECT_THAT(
        Slurp(fs::path(logs) / absl::StrCat("worker-", n, ".log")),
        HasSubstr(absl::StrCat("worker args: --coordinator 127.0.0.1:", server_.port(),
                               " --listen 127.0.0.1:0 --advertise 127.0.0.1 --metrics-listen "
                               "127.0.0.1:0 --port-file ",
                               logs, "/worker-", n, ".port --name local-", n, " --threads 3")));
  }
  EXPECT_FALSE(fs::exists(fs::path(logs) / "worker-2.log"));
  fs::remove_all(logs);
}

TEST_F(LocalTest, WorkerCountFollowsExplicitRangesOrTheFlagAndLogsAreRemoved) {
  server_.fake().set_workers(3);
  const std::string job = WriteJob(absl::StrCat(
      "name: ranged\nmodel: {name: mlp, hidden: [32, 32]}\n",
      "data: {dataset: synthetic, train_size: 64, test_size: 32, shape: [1, 8, 8], classes: 4}\n",
      "batch_size: 32\nsteps: 4\nstages: {partition: [[0, 1], [1, 2], [2, 3]]}\n"));
  CliResult r = Start({job}).Wait();
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(r.err, HasSubstr("3 worker(s)"));
  ExpectNoChildLeft(4);
  const std::string logs = LogDir(r.err);
  ASSERT_FALSE(logs.empty()) << r.err;
  EXPECT_FALSE(fs::exists(logs));  // no --keep-logs

  fs::remove(dir_ / "pids");
  server_.fake().set_workers(1);
  r = Start({job, "-j", "1", "-q"}).Wait();
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectNoChildLeft(2);
}

TEST_F(LocalTest, AWorkerThatDiesFailsTheJobAndIsNamed) {
  server_.fake().set_workers(2);
  CliResult r =
      Start({WriteJob(std::string(kJob) + "# fake: forever\n")}, {{"FAKE_WORKER_CRASH", "local-1"}})
          .Wait();
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("worker local-1 (stagewise-worker, pid "));
  EXPECT_THAT(r.err, HasSubstr("died: killed by signal 9"));
  EXPECT_THAT(r.err, HasSubstr("worker local-1: about to crash"));  // its log's tail
  const auto cancels = server_.fake().cancels();
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_EQ(cancels[0].first, "job-1");
  EXPECT_THAT(cancels[0].second, HasSubstr("worker local-1"));
  ExpectNoChildLeft(3);
}

TEST_F(LocalTest, CtrlCCancelsTheJobAndStopsEveryChild) {
  server_.fake().set_workers(2);
  CliProcess p = Start({WriteJob(std::string(kJob) + "# fake: forever\n")});
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (server_.fake().watches_started() == 0 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(server_.fake().watches_started(), 0) << p.err_so_far();
  ::kill(p.pid(), SIGINT);
  CliResult r = p.Wait(absl::Seconds(30));
  EXPECT_EQ(r.code, 130) << r.err;
  EXPECT_THAT(r.err, HasSubstr("interrupted"));
  const auto cancels = server_.fake().cancels();
  ASSERT_EQ(cancels.size(), 1u);
  EXPECT_THAT(cancels[0].second, HasSubstr("interrupted"));
  ExpectNoChildLeft(3);
}

TEST_F(LocalTest, ACoordinatorThatExitsAtStartIsReportedWithItsLog) {
  CliResult r = Start({WriteJob(kJob)}, {{"FAKE_COORDINATOR_EXIT", "7"}}).Wait();
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("exited with code 7"));
  EXPECT_THAT(r.err, HasSubstr("fatal: cannot open the database"));
  ExpectNoChildLeft(1);
}

TEST_F(LocalTest, TooFewWorkersRegisteringIsReported) {
  // Stand-in workers start but the fake never lists them: after the timeout
  // local gives up, names the problem and stops everything. The timeout is
  // 30 s, so make a worker die instead to keep this fast: the death wins.
  server_.fake().set_workers(0);
  WriteScript("stagewise-worker",
              "#!/bin/sh\necho $$ >> \"$FAKE_PID_DIR/pids\"\n"
              "echo 'worker: no such device cuda:7'\nexit 4\n");
  CliResult r = Start({WriteJob(kJob)}).Wait();
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("exited with code 4"));
  EXPECT_THAT(r.err, HasSubstr("no such device cuda:7"));
  ExpectNoChildLeft(2, /*exact=*/false);
}

TEST_F(LocalTest, InvalidSpecExitsTwo) {
  CliResult r = Start({WriteJob(std::string(kJob) + "optimiser: {lr: 1}\n")}).Wait();
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("optimiser"));
  EXPECT_TRUE(ChildPids().empty());
}

TEST_F(LocalTest, ChaosNeedsACheckpointDir) {
  CliResult r = Start({WriteJob(kJob), "--chaos", "2"}).Wait();
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("has no checkpoint.dir; add for example"));
  EXPECT_THAT(r.err, HasSubstr("checkpoint: {dir: checkpoints, every_steps: 50}"));
  EXPECT_TRUE(ChildPids().empty());
}

TEST_F(LocalTest, ChaosKillsAndRestartsChildrenWithoutStoppingTheRun) {
  server_.fake().set_workers(2);
  const std::string job = WriteJob(absl::StrCat(
      kJob, "checkpoint: {dir: ", (dir_ / "ckpt").string(), ", every_steps: 10}\n# fake: chaos\n"));
  CliResult r =
      Start({job, "--chaos", "2", "--chaos-coordinator", "1", "--chaos-seed", "7", "--keep-logs"})
          .Wait();
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(r.err,
              HasSubstr("chaos: 2 worker and 1 coordinator kill(s) planned (--chaos-seed 7)"));
  // Every kill is reported as it happens, and counted at the end.
  int worker_kills = 0, coordinator_kills = 0;
  for (absl::string_view line : absl::StrSplit(r.err, '\n')) {
    if (!absl::StartsWith(line, "chaos: killed ")) continue;
    EXPECT_THAT(std::string(line),
                ::testing::ContainsRegex(R"(\(pid [0-9]+\) at step [0-9]+; restarting$)"));
    if (absl::StrContains(line, "killed worker local-")) ++worker_kills;
    if (absl::StrContains(line, "killed coordinator")) ++coordinator_kills;
  }
  EXPECT_GE(worker_kills + coordinator_kills, 1) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr(absl::StrCat("local: chaos: ", worker_kills, " of 2 worker kill(s) and ",
                                     coordinator_kills, " of 1 coordinator kill(s) made")));
  // Each killed child was started again (same flags, on the port it had).
  ExpectNoChildLeft(3 + worker_kills + coordinator_kills);
  const std::string logs = LogDir(r.err);
  ASSERT_FALSE(logs.empty()) << r.err;
  int restarted_workers = 0;
  for (int n = 0; n < 2; ++n) {
    const std::string log = Slurp(fs::path(logs) / absl::StrCat("worker-", n, ".log"));
    for (size_t at = log.find("killed with signal 9; restarting"); at != std::string::npos;
         at = log.find("killed with signal 9; restarting", at + 1)) {
      ++restarted_workers;
      EXPECT_THAT(log.substr(at), HasSubstr("--listen 127.0.0.1:12345 "));
    }
  }
  EXPECT_EQ(restarted_workers, worker_kills);
  if (coordinator_kills > 0) {
    EXPECT_THAT(Slurp(fs::path(logs) / "coordinator.log"),
                HasSubstr(absl::StrCat("--listen 127.0.0.1:", server_.port(), " ")));
  }
  fs::remove_all(logs);
}

TEST_F(LocalTest, MissingBinariesFailCleanly) {
  fs::remove(bin_ / "stagewise-coordinator");
  CliResult r = Start({WriteJob(kJob)}, {{"PATH", "/nonexistent"}}).Wait();
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("stagewise-coordinator not found next to ",
                                            (bin_ / "stagewise").string(), " or on PATH")));
  EXPECT_TRUE(ChildPids().empty());
}

}  // namespace
}  // namespace stagewise
