// Hostile input against the real binaries (docs/security.md): a client that
// speaks the coordinator's worker protocol without being a well-behaved
// worker, oversized or absurd job specs, and garbled frames. Each case is a
// regression test of a defect a black-box probe of the running processes
// found; each checks that the coordinator stays up, the victim job's record
// stays consistent, and the real worker keeps training.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clients/cli/process.h"
#include "clients/client/coordinator_client.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/metrics/metrics.h"
#include "services/rpc/pki.h"
#include "services/rpc/server.h"
#include "services/rpc/tls.h"
#include "stagewise/v1/coordinator.grpc.pb.h"
#include "stagewise/v1/stage.grpc.pb.h"
#include "tests/integration/fake_worker.h"
#include "tests/integration/free_port.h"
#include "tests/oracle/process_cluster.h"

namespace stagewise {
namespace {

using testing::FakeWorker;
using testing::FreePort;
using testing::ProcessCluster;
using Options = ProcessCluster::Options;

constexpr char kJob[] = R"(name: victim
model: {name: mlp, hidden: [32, 32]}
data: {dataset: synthetic, train_size: 256, test_size: 32, shape: [1, 8, 8], classes: 4}
batch_size: 16
recovery: {max_restarts: 0}
)";

std::string Scrape(int port);

std::string LongJob(int stages) {
  return absl::StrCat(kJob, "stages: ", stages, "\nsteps: 100000000\n");
}

absl::StatusOr<v1::JobStatus> WaitRunning(ProcessCluster& cluster, const std::string& id) {
  return cluster.WaitFor(
      id, [](const v1::JobStatus& s) { return s.state() == v1::RUNNING && s.step() > 0; },
      absl::Seconds(60));
}

// The job record is still the one the coordinator made: phase 0 of its own
// algorithm, no step below 0, finite losses.
void ExpectConsistent(const v1::JobStatus& st) {
  EXPECT_EQ(st.phase(), 0);
  EXPECT_FALSE(st.algorithm().empty());
  EXPECT_GE(st.step(), 0);
  EXPECT_TRUE(std::isfinite(st.train_loss()));
  EXPECT_TRUE(std::isfinite(st.eval_accuracy()));
}

// The job is RUNNING and its real worker takes it on by more than 5 steps.
void ExpectStillTraining(ProcessCluster& cluster, const std::string& id, int64_t from = -1) {
  if (from < 0) {
    auto now = cluster.client().GetJob(id);
    ASSERT_TRUE(now.ok()) << now.status();
    from = now->step();
  }
  auto later = cluster.WaitFor(
      id, [&](const v1::JobStatus& st) { return st.step() > from + 5; }, absl::Seconds(60));
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->state(), v1::RUNNING) << later->reason();
}

TEST(Hostile, OutOfRangePhaseDoneLeavesTheCoordinatorAndThePendingJobIntact) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  // Three stages with one real worker (and the fake): the job stays PENDING.
  auto id = cluster.client().Submit(LongJob(3));
  ASSERT_TRUE(id.ok()) << id.status();
  FakeWorker fake(cluster, "zz-fake");
  ASSERT_TRUE(fake.Join().ok());
  for (int phase :
       {std::numeric_limits<int>::max(), std::numeric_limits<int>::min(), -1, -2, -1000, 1, 7}) {
    for (int stage : {0, 1, 2, -1, 1 << 30}) {
      v1::WorkerEvent e;
      e.set_job_id(*id);
      e.set_stage(stage);
      e.mutable_phase_done()->set_phase(phase);
      fake.Send(e);
    }
  }
  fake.Heartbeat();
  absl::SleepFor(absl::Milliseconds(500));
  auto st = cluster.client().GetJob(*id);
  ASSERT_TRUE(st.ok()) << st.status() << "\n" << cluster.CoordinatorLog();
  EXPECT_EQ(st->state(), v1::PENDING);
  ExpectConsistent(*st);
  fake.Close();
  // The coordinator still serves: the real worker runs a small job.
  cluster.ExpectRunsToSuccess(absl::StrCat(kJob, "steps: 3\n"), absl::Seconds(120));
}

TEST(Hostile, EvalAccuracyWithoutEvalLossKeepsTheStreamReading) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto id = cluster.client().Submit(LongJob(3));
  ASSERT_TRUE(id.ok()) << id.status();
  FakeWorker fake(cluster, "zz-fake");
  ASSERT_TRUE(fake.Join().ok());
  v1::WorkerEvent e;
  e.set_job_id(*id);
  e.set_stage(2);
  e.mutable_metrics()->set_step(3);
  (*e.mutable_metrics()->mutable_values())["eval_accuracy"] = 0.5;
  fake.Send(e);
  // Twice the heartbeat timeout of heartbeats: the stream must still be read.
  for (int i = 0; i < 24; ++i) {
    ASSERT_TRUE(fake.Heartbeat());
    absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_FALSE(fake.done());
  auto workers = cluster.client().ListWorkers();
  ASSERT_TRUE(workers.ok());
  bool listed = false;
  for (const auto& w : *workers) listed |= w.worker_id() == "zz-fake";
  EXPECT_TRUE(listed) << "the fake worker was dropped: its stream stopped being read";
  auto st = cluster.client().GetJob(*id);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->eval_accuracy(), 0.0) << "an unassigned worker's report was taken";
}

TEST(Hostile, ReportsFromWorkersNotAssignedToTheJobAreIgnored) {
  constexpr double kForged = 0.123456;  // no real evaluation of 32 samples gives this
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto pending = cluster.client().Submit(LongJob(3));
  ASSERT_TRUE(pending.ok());
  auto running = cluster.client().Submit(LongJob(1));
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(WaitRunning(cluster, *running).ok());
  FakeWorker fake(cluster, "zz-fake");
  ASSERT_TRUE(fake.Join().ok());
  for (const std::string& job : {*pending, *running}) {
    for (int stage : {0, 1, 2}) {
      v1::WorkerEvent m;
      m.set_job_id(job);
      m.set_stage(stage);
      m.mutable_metrics()->set_step(-5);
      (*m.mutable_metrics()->mutable_values())["train_loss"] =
          std::numeric_limits<double>::quiet_NaN();
      (*m.mutable_metrics()->mutable_values())["eval_accuracy"] = kForged;
      fake.Send(m);
      v1::WorkerEvent r;
      r.set_job_id(job);
      r.set_stage(stage);
      (*r.mutable_result()->mutable_values())["eval_accuracy"] = kForged;
      fake.Send(r);
      v1::WorkerEvent err;
      err.set_job_id(job);
      err.set_stage(stage);
      err.mutable_error()->set_code(13);
      err.mutable_error()->set_message("forged");
      fake.Send(err);
    }
  }
  fake.Heartbeat();
  absl::SleepFor(absl::Milliseconds(500));
  auto p = cluster.client().GetJob(*pending);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->state(), v1::PENDING);
  EXPECT_EQ(p->step(), 0);
  ExpectConsistent(*p);
  auto r = cluster.client().GetJob(*running);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state(), v1::RUNNING) << r->reason();
  ExpectConsistent(*r);
  EXPECT_NE(r->eval_accuracy(), kForged);
  EXPECT_EQ(r->summary().count("stage0.eval_accuracy"), 0u);
  // The real worker keeps training it.
  ExpectStillTraining(cluster, *running, r->step());
}

TEST(Hostile, EventsNamingAnotherWorkerAreRefused) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto running = cluster.client().Submit(LongJob(1));
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(WaitRunning(cluster, *running).ok());
  FakeWorker fake(cluster, "zz-fake");
  ASSERT_TRUE(fake.Join().ok());
  // w0 runs the job; the fake claims to be w0 in its events.
  v1::WorkerEvent err;
  err.set_worker_id("w0");
  err.set_job_id(*running);
  err.set_stage(0);
  err.mutable_error()->set_code(13);
  err.mutable_error()->set_message("forged");
  fake.Send(err);
  grpc::Status closed = fake.WaitClosed();
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::PERMISSION_DENIED) << closed.error_message();
  auto r = cluster.client().GetJob(*running);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state(), v1::RUNNING) << r->reason();
}

TEST(Hostile, ControlStreamWithoutTheRegistrationSessionIsRefused) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto running = cluster.client().Submit(LongJob(1));
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(WaitRunning(cluster, *running).ok());
  // Takes over w0's command stream without registering.
  FakeWorker thief(cluster, "w0");
  thief.Open("");
  grpc::Status closed = thief.WaitClosed();
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::PERMISSION_DENIED) << closed.error_message();
  FakeWorker guesser(cluster, "w0");
  guesser.Open("0123456789abcdef0123456789abcdef");
  closed = guesser.WaitClosed();
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::PERMISSION_DENIED) << closed.error_message();
  EXPECT_EQ(thief.commands() + guesser.commands(), 0);
  ExpectStillTraining(cluster, *running);
}

TEST(Hostile, RegisteringUnderAConnectedWorkersIdIsRefused) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto running = cluster.client().Submit(LongJob(1));
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(WaitRunning(cluster, *running).ok());
  FakeWorker impostor(cluster, "w0");
  grpc::Status s = impostor.Register();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  absl::SleepFor(absl::Milliseconds(500));
  auto r = cluster.client().GetJob(*running);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state(), v1::RUNNING) << r->reason();
  EXPECT_EQ(r->attempt(), 0);
}

TEST(Hostile, AnAssignedWorkerThatNeverAcknowledgesTimesOut) {
  Options o = Options::OneWorker();
  o.coordinator_args = {"--configure-timeout", "2"};
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  FakeWorker fake(cluster, "a-fake");  // sorts before w0: stage 0
  ASSERT_TRUE(fake.Join().ok());
  ASSERT_TRUE(cluster.WaitForWorkers(2).ok());
  std::atomic<bool> beating{true};
  std::thread beat([&] {
    while (beating) {
      fake.Heartbeat();
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
  auto id = cluster.client().Submit(LongJob(2));
  ASSERT_TRUE(id.ok());
  auto end = cluster.WaitForEnd(*id, absl::Seconds(60));
  beating = false;
  beat.join();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::FAILED);
  EXPECT_NE(end->reason().find("acknowledge"), std::string::npos) << end->reason();
  EXPECT_EQ(fake.configured_job(), *id);
}

// Finding: a worker holding stage 0 set the job's evaluation accuracy with a
// metrics report of its own (0.999, or 1e308). Only the last stage evaluates,
// and an accuracy is a fraction.
TEST(Hostile, AStageThatIsNotTheLastCannotSetTheJobsAccuracy) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  FakeWorker fake(cluster, "a-fake");  // sorts before w0: stage 0
  ASSERT_TRUE(fake.Join().ok());
  fake.KeepAlive(absl::Milliseconds(200));
  ASSERT_TRUE(cluster.WaitForWorkers(2).ok());
  auto id = cluster.client().Submit(LongJob(2));
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (fake.configured_job() != *id && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(fake.configured_job(), *id) << "the fake was not given stage 0";
  ASSERT_EQ(fake.assignments().back().stage(), 0);
  for (double forged : {0.999, 1e308}) {
    v1::WorkerEvent m;
    m.set_job_id(*id);
    m.set_stage(0);
    m.set_attempt(fake.assignments().back().attempt());
    m.mutable_metrics()->set_step(0);
    (*m.mutable_metrics()->mutable_values())["eval_accuracy"] = forged;
    (*m.mutable_metrics()->mutable_values())["eval_loss"] = 0.001;
    ASSERT_TRUE(fake.Send(m));
  }
  absl::SleepFor(absl::Milliseconds(500));  // the stream is read in order; give it time
  auto st = cluster.client().GetJob(*id);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->eval_accuracy(), 0);
  EXPECT_EQ(st->eval_loss(), 0);
  ExpectConsistent(*st);
}

// Finding: cancelling one's own jobs with huge reasons (140 MiB in all) made
// ListJobs fail for every client, for good (the reasons are stored). A reason
// is at most 1 KiB now; the job can still be cancelled, and listing works.
TEST(Hostile, AHugeCancelReasonIsRefusedAndListingStillWorks) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto id = cluster.client().Submit(LongJob(1));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  const std::string huge(4 << 20, 'r');
  for (const std::string& id : ids) {
    auto refused = cluster.client().Cancel(id, huge);
    ASSERT_FALSE(refused.ok()) << id;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_LT(refused.status().message().size(), 200u);
    auto cancelled = cluster.client().Cancel(id, std::string(1024, 'k'));  // at the limit
    ASSERT_TRUE(cancelled.ok()) << cancelled.status();
    EXPECT_EQ(cancelled->state(), v1::CANCELLED);
    EXPECT_EQ(cancelled->reason().size(), 1024u);
  }
  auto listed = cluster.client().ListJobs(0);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 3u);
}

std::string Scrape(int port) {
  auto text = metrics::Scrape("127.0.0.1", port);
  return text.ok() ? *text : "";
}

// Finding: holding 64 idle Exchange streams per worker (topped up every
// 20 ms) with any cluster certificate made the next job fail after 4
// attempts: idle streams kept their slot forever. Streams that have not sent
// their first message are bounded now (--max-pending-streams, and a newcomer
// closes the oldest of the busiest peer) and time out
// (--stream-first-message-timeout); a stage opens its stream with an OPEN
// message at once.
TEST(Hostile, IdleStreamsCannotTakeTheSlotsOfAStage) {
  Options o;
  o.workers = 2;
  o.metrics = true;
  o.worker_args = {"--stream-first-message-timeout", "3"};
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  struct Idle {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StageMessage, v1::StageMessage>> stream;
  };
  std::vector<std::unique_ptr<v1::StageService::Stub>> stubs;
  for (int w = 0; w < cluster.num_workers(); ++w) {
    stubs.push_back(v1::StageService::NewStub(rpc::MakeChannel(
        // A worker certificate that holds no stage: a client's is refused at once.
        absl::StrCat("127.0.0.1:", cluster.worker_port(w)), cluster.RpcOptionsFor("worker"))));
  }
  std::atomic<bool> stop{false};
  std::atomic<int> opened{0};
  std::thread idler([&] {
    std::vector<std::deque<Idle>> held(stubs.size());
    while (!stop) {
      for (size_t w = 0; w < stubs.size(); ++w) {
        Idle idle;
        idle.ctx = std::make_unique<grpc::ClientContext>();
        idle.stream = stubs[w]->Exchange(idle.ctx.get());
        held[w].push_back(std::move(idle));
        ++opened;
        while (held[w].size() > 80) {  // more than the worker's 64 slots
          held[w].front().ctx->TryCancel();
          (void)held[w].front().stream->Finish();
          held[w].pop_front();
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    for (auto& streams : held) {
      for (Idle& idle : streams) {
        idle.ctx->TryCancel();
        (void)idle.stream->Finish();
      }
    }
  });
  while (opened < 160 && !stop) absl::SleepFor(absl::Milliseconds(20));  // 80 per worker
  auto id = cluster.client().Submit(absl::StrCat(kJob, "stages: 2\nsteps: 30\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto end = cluster.WaitForEnd(*id, absl::Seconds(120));
  stop = true;
  idler.join();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
  EXPECT_EQ(end->attempt(), 0) << "the job needed a recovery";
  // The workers closed the idle streams, and said why.
  double closed = 0;
  for (int w = 0; w < cluster.num_workers(); ++w) {
    const std::string text = Scrape(cluster.worker_metrics_port(w));
    for (const char* reason : {"evicted", "no_first_message"}) {
      auto n =
          metrics::FindSample(text, "stagewise_worker_streams_refused_total", {{"reason", reason}});
      if (n.ok()) closed += *n;
    }
  }
  EXPECT_GT(closed, 100);
}

// Finding: a worker took any cluster certificate on StageService.Exchange,
// and a stream bound on its first message whatever that was. Watching a
// worker's /metrics for a new job and sending {job, FORWARD, attempt 0} with
// a client certificate bound as stage 1's upstream 0.35 s after the submit
// and failed the job. Exchange takes worker certificates only, a stream
// binds on an OPEN from the identity the coordinator assigned to stage j-1,
// and everything else is PERMISSION_DENIED at once.
TEST(Hostile, OnlyTheAssignedNeighbourCanFeedAStage) {
  Options o;
  o.workers = 2;
  o.metrics = true;
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  std::map<std::string, std::unique_ptr<v1::StageService::Stub>> stubs;
  for (const char* identity : {"client", "worker"}) {  // "worker" holds no stage
    stubs[identity] = v1::StageService::NewStub(rpc::MakeChannel(
        absl::StrCat("127.0.0.1:", cluster.worker_port(1)), cluster.RpcOptionsFor(identity)));
  }
  absl::Mutex mu;
  std::string job;
  std::map<std::string, std::map<grpc::StatusCode, int>> codes;  // identity -> code -> count
  std::atomic<bool> stop{false};
  std::thread attacker([&] {
    while (!stop) {
      std::string target;
      {
        absl::MutexLock lock(&mu);
        target = job;
      }
      if (target.empty()) continue;
      for (auto& [identity, stub] : stubs) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        auto stream = stub->Exchange(&ctx);
        v1::StageMessage open;
        open.set_job_id(target);
        open.set_kind(v1::StageMessage::OPEN);
        open.set_origin_stage(0);
        v1::StageMessage forward;
        forward.set_job_id(target);
        forward.set_kind(v1::StageMessage::FORWARD);
        forward.set_origin_stage(0);
        (void)stream->Write(open);
        (void)stream->Write(forward);
        stream->WritesDone();
        const grpc::Status s = stream->Finish();
        absl::MutexLock lock(&mu);
        ++codes[identity][s.error_code()];
      }
    }
  });
  auto id = cluster.client().Submit(absl::StrCat(kJob, "stages: 2\nsteps: 60\n"));
  if (id.ok()) {
    absl::MutexLock lock(&mu);
    job = *id;
  }
  auto end = id.ok() ? cluster.WaitForEnd(*id, absl::Seconds(120)) : id.status();
  stop = true;
  attacker.join();
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
  EXPECT_EQ(end->attempt(), 0) << "the job needed a recovery";
  absl::MutexLock lock(&mu);
  for (const char* identity : {"client", "worker"}) {
    SCOPED_TRACE(identity);
    EXPECT_GT(codes[identity][grpc::StatusCode::PERMISSION_DENIED], 0);
    EXPECT_EQ(codes[identity].size(), 1u) << "some stream was not refused with PERMISSION_DENIED";
  }
  const std::string text = Scrape(cluster.worker_metrics_port(1));
  for (const char* reason : {"not_a_worker", "not_assigned"}) {
    auto n =
        metrics::FindSample(text, "stagewise_worker_streams_refused_total", {{"reason", reason}});
    ASSERT_TRUE(n.ok()) << reason << ": " << n.status();
    EXPECT_GT(*n, 0) << reason;
  }
}

// Finding: a worker certificate could register two free ids and take both
// stages of a job (and then report SUCCEEDED for it). By default no two
// stages of a job go to one certificate identity (placement.distinct_identities).
TEST(Hostile, OneCertificateCannotHoldTwoStagesOfAJob) {
  ProcessCluster cluster(Options::OneWorker());  // w0, certificate worker-0
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  FakeWorker a(cluster, "a-fake"), b(cluster, "b-fake");  // both certificate "worker"
  for (FakeWorker* f : {&a, &b}) {
    ASSERT_TRUE(f->Join().ok());
    f->KeepAlive(absl::Milliseconds(200));
  }
  ASSERT_TRUE(cluster.WaitForWorkers(3).ok());
  // Three stages need three identities: there are two.
  auto three = cluster.client().Submit(LongJob(3));
  ASSERT_TRUE(three.ok()) << three.status();
  auto waiting = cluster.WaitFor(
      *three,
      [](const v1::JobStatus& s) {
        return absl::StrContains(s.reason(), "distinct certificate identities");
      },
      absl::Seconds(30));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_EQ(waiting->state(), v1::PENDING) << waiting->reason();
  EXPECT_EQ(a.commands() + b.commands(), 0);
  ASSERT_TRUE(cluster.client().Cancel(*three, "test").ok());
  // Two stages: one of the fakes and w0, never both fakes.
  auto two = cluster.client().Submit(LongJob(2));
  ASSERT_TRUE(two.ok()) << two.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (a.configured_job() != *two && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(a.configured_job(), *two);
  EXPECT_EQ(a.assignments().back().stage(), 0);
  EXPECT_EQ(a.assignments().back().next_identity(), "worker-0");
  EXPECT_TRUE(b.assignments().empty()) << "one certificate holds two stages";
  ASSERT_TRUE(cluster.client().Cancel(*two, "test").ok());
  // An operator who issued one certificate to several workers opts out.
  auto shared = cluster.client().Submit(
      absl::StrCat(LongJob(2), "placement: {distinct_identities: false}\n"));
  ASSERT_TRUE(shared.ok()) << shared.status();
  const absl::Time later = absl::Now() + absl::Seconds(30);
  while (b.configured_job() != *shared && absl::Now() < later) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(b.configured_job(), *shared);
  (void)cluster.client().Cancel(*shared, "test");
}

// A 2-stage job the stall watchdog watches closely.
std::string StallJob(int max_restarts, int stall_seconds) {
  return absl::StrCat(
      "name: stalled\nmodel: {name: mlp, hidden: [32, 32]}\n"
      "data: {dataset: synthetic, train_size: 256, test_size: 32, shape: [1, 8, 8], classes: 4}\n"
      "batch_size: 16\nstages: 2\nsteps: 1000\nrecovery: {max_restarts: ",
      max_restarts, ", stall_seconds: ", stall_seconds, "}\n");
}

// Registers `fake`, which acknowledges the stage it is given and heartbeats,
// and sends nothing else unless the test does; waits until the cluster's
// worker and the fake are both registered.
void TakeStageAndKeepQuiet(ProcessCluster& cluster, FakeWorker& fake) {
  ASSERT_TRUE(fake.Register().ok());
  fake.Open("-", /*ack_configures=*/true);
  fake.KeepAlive(absl::Milliseconds(200));
  ASSERT_TRUE(cluster.WaitForWorkers(2).ok());
}

// Finding: a stage holder that sends nothing stalled its job forever. A
// running job whose step does not advance for recovery.stall_seconds is
// recovered as if a stage were lost (cause "stalled"), and fails when its
// restarts are spent.
TEST(Hostile, ASilentStageIsCaughtByTheStallWatchdog) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  FakeWorker fake(cluster, "a-fake");  // sorts before w0: stage 0
  ASSERT_NO_FATAL_FAILURE(TakeStageAndKeepQuiet(cluster, fake));
  auto id = cluster.client().Submit(StallJob(/*max_restarts=*/1, /*stall_seconds=*/2));
  ASSERT_TRUE(id.ok()) << id.status();
  auto end = cluster.WaitForEnd(*id, absl::Seconds(120));
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(end->state(), v1::FAILED);
  EXPECT_TRUE(absl::StrContains(end->reason(), "stalled")) << end->reason();
  ASSERT_EQ(end->attempts_size(), 2) << end->DebugString();
  for (const v1::JobAttempt& a : end->attempts()) {
    EXPECT_EQ(a.cause(), v1::END_CAUSE_STALLED) << a.DebugString();
    EXPECT_EQ(a.workers(0), "a-fake");
  }
}

// Finding: a stage holder that sent no data but a PhaseDone for phase 0
// every second kept its job RUNNING at step 0 forever: every PhaseDone reset
// the stall clock. A stage's PhaseDone counts once per phase (repeats are
// refused as "repeated"), and only the end of a phase is progress.
TEST(Hostile, RepeatedPhaseDonesDoNotKeepTheStallWatchdogQuiet) {
  Options o = Options::OneWorker();
  o.metrics = true;
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  FakeWorker fake(cluster, "a-fake");  // sorts before w0: stage 0
  ASSERT_NO_FATAL_FAILURE(TakeStageAndKeepQuiet(cluster, fake));
  auto id = cluster.client().Submit(StallJob(/*max_restarts=*/0, /*stall_seconds=*/4));
  ASSERT_TRUE(id.ok()) << id.status();
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread chatter([&] {
    while (!stop) {
      for (const v1::StageAssignment& a : fake.assignments()) {
        if (a.job_id() != *id) continue;
        v1::WorkerEvent e;
        e.set_job_id(a.job_id());
        e.set_stage(a.stage());
        e.set_attempt(a.attempt());
        e.mutable_phase_done()->set_phase(0);
        if (fake.Send(e)) ++sent;
      }
      absl::SleepFor(absl::Seconds(1));
    }
  });
  auto end = cluster.WaitForEnd(*id, absl::Seconds(60));
  stop = true;
  chatter.join();
  ASSERT_TRUE(end.ok()) << end.status() << "\n" << cluster.CoordinatorLog();
  EXPECT_EQ(end->state(), v1::FAILED);
  EXPECT_TRUE(absl::StrContains(end->reason(), "stalled")) << end->reason();
  ASSERT_EQ(end->attempts_size(), 1) << end->DebugString();
  EXPECT_EQ(end->attempts(0).cause(), v1::END_CAUSE_STALLED);
  EXPECT_EQ(end->step(), 0);
  // Caught while the fake kept chatting (it sent until the job ended).
  EXPECT_GE(sent.load(), 3) << "the fake sent too few PhaseDones to test anything";
  // The repeats were refused and counted.
  const std::string text = Scrape(cluster.coordinator_metrics_port());
  auto repeated =
      metrics::FindSample(text, "stagewise_coordinator_refused_total", {{"reason", "repeated"}});
  ASSERT_TRUE(repeated.ok()) << repeated.status() << "\n" << text;
  EXPECT_GE(*repeated, 1);
}

// Finding: /metrics announced live job ids to anyone who could reach it.
// With --metrics-job-ids hashed, the coordinator and the workers label job
// series with a keyed hash of the id (the same on both), never the id.
TEST(Hostile, MetricsCanKeepJobIdsToThemselves) {
  const std::string key_file = ::testing::TempDir() + "/stagewise_hostile_metrics_key";
  std::ofstream(key_file) << "0123456789abcdef0123456789abcdef\n";
  Options o = Options::OneWorker();
  o.metrics = true;
  o.coordinator_args = {"--metrics-job-ids", "hashed", "--metrics-job-key-file", key_file};
  o.worker_args = o.coordinator_args;
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto id = cluster.client().Submit(LongJob(1));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(WaitRunning(cluster, *id).ok());
  auto labels = metrics::MakeJobLabels("hashed", key_file);
  ASSERT_TRUE(labels.ok()) << labels.status();
  const std::string label = labels->Of(*id);
  ASSERT_EQ(label.size(), 17u);
  // The coordinator's per-job series appear once the progress is flushed.
  std::string coordinator, worker;
  for (int i = 0; i < 100 && !absl::StrContains(coordinator, label); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    coordinator = Scrape(cluster.coordinator_metrics_port());
  }
  worker = Scrape(cluster.worker_metrics_port(0));
  for (const std::string* text : {&coordinator, &worker}) {
    EXPECT_FALSE(absl::StrContains(*text, *id)) << *text;
    EXPECT_TRUE(absl::StrContains(*text, absl::StrCat("job=\"", label, "\""))) << *text;
  }
  ASSERT_TRUE(cluster.client().Cancel(*id, "test").ok());
  std::remove(key_file.c_str());
}

TEST(Hostile, OversizedAndAbsurdSpecsAreRefusedCheaply) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  // An unknown key of 4 MB: refused, and the error does not echo it.
  std::string key(4 << 20, 'k');
  auto big_key = cluster.client().Submit(absl::StrCat(kJob, "steps: 3\n", key, ": 1\n"));
  ASSERT_FALSE(big_key.ok());
  EXPECT_EQ(big_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(big_key.status().message().size(), 2000u) << big_key.status().message().substr(0, 200);
  // An unknown key just under the size limit: refused with a bounded message.
  std::string medium(200 << 10, 'q');
  auto medium_key = cluster.client().Submit(absl::StrCat(kJob, "steps: 3\n", medium, ": 1\n"));
  ASSERT_FALSE(medium_key.ok());
  EXPECT_EQ(medium_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(medium_key.status().message().size(), 2000u)
      << medium_key.status().message().substr(0, 300);
  // An unknown key of ordinary length still gets its suggestion.
  auto typo = cluster.client().Submit(absl::StrCat(kJob, "steps: 3\nbatchsize: 4\n"));
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("did you mean batch_size"), std::string::npos)
      << typo.status();
  // A model of 1.6e12 parameters and 9e18 steps.
  auto huge_model = cluster.client().Submit(R"(name: huge
model: {name: mlp, hidden: [1265000, 1265000]}
data: {dataset: synthetic, train_size: 256, test_size: 32, shape: [1, 8, 8], classes: 4}
batch_size: 16
steps: 3
)");
  ASSERT_FALSE(huge_model.ok());
  EXPECT_NE(huge_model.status().message().find("parameters"), std::string::npos)
      << huge_model.status();
  // Finding: a synthetic dataset of 5e7 samples was accepted (0.75 GiB on the
  // stage-0 worker; 2e9 would ask for about 30 GiB).
  for (const char* size : {"50000000", "2000000000"}) {
    auto huge_data = cluster.client().Submit(absl::StrCat(
        "name: huge-data\nmodel: {name: mlp}\ndata: {dataset: synthetic, train_size: ", size,
        ", test_size: 32, shape: [1, 8, 8], classes: 4}\nbatch_size: 16\nsteps: 3\n"));
    ASSERT_FALSE(huge_data.ok()) << size;
    EXPECT_EQ(huge_data.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(huge_data.status().message().find("data.train_size: must be <= 10000000"),
              std::string::npos)
        << huge_data.status();
  }
  auto many_steps = cluster.client().Submit(absl::StrCat(kJob, "steps: 9000000000000000000\n"));
  ASSERT_FALSE(many_steps.ok());
  EXPECT_NE(many_steps.status().message().find("steps"), std::string::npos) << many_steps.status();
  // Still serving.
  cluster.ExpectRunsToSuccess(absl::StrCat(kJob, "steps: 3\n"), absl::Seconds(120));
}

TEST(Hostile, GarbledFramesAreAnsweredWithAnError) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto channel_to = [&](const std::string& target) {
    return rpc::MakeChannel(target, cluster.RpcOptionsFor("worker"));
  };
  const std::string garbage("\xff\xff\xff\xff\x0f\x80", 6);
  auto garble = [&](const std::string& target, const std::string& method) {
    grpc::GenericStub stub(channel_to(target));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::CompletionQueue cq;
    auto call = stub.PrepareCall(&ctx, method, &cq);
    void* tag = nullptr;
    bool ok = false;
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    grpc::Slice slice(garbage);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(4)) {
    }
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return status;
  };
  grpc::Status control = garble(cluster.coordinator_address(), "/stagewise.v1.Coordinator/Control");
  EXPECT_EQ(control.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << control.error_message();
  grpc::Status exchange = garble(absl::StrCat("127.0.0.1:", cluster.worker_port(0)),
                                 "/stagewise.v1.StageService/Exchange");
  EXPECT_EQ(exchange.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << exchange.error_message();
  auto workers = cluster.client().ListWorkers();
  ASSERT_TRUE(workers.ok());
  EXPECT_EQ(workers->size(), 1u);
}

TEST(Hostile, TheCliEscapesControlCharactersFromTheCoordinator) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto id = cluster.client().Submit(LongJob(3));
  ASSERT_TRUE(id.ok());
  auto cancelled = cluster.client().Cancel(*id, "\x1b]0;pwned\x07\x1b[2J done\r");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"status", *id}, {"list"}}) {
    const rpc::TlsConfig tls = rpc::TlsConfigFor(cluster.pki_dir(), "client");
    std::vector<std::string> argv = {std::string(STAGEWISE_BINARY_DIR) + "/bin/stagewise",
                                     "--coordinator",
                                     cluster.coordinator_address(),
                                     "--tls-cert",
                                     tls.cert_file,
                                     "--tls-key",
                                     tls.key_file,
                                     "--tls-ca",
                                     tls.ca_file};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = cluster.dir() + "/cli.out";
    auto child = cli::Child::Spawn(argv, log);
    ASSERT_TRUE(child.ok());
    for (int i = 0; i < 1500 && (*child)->IsRunning(); ++i) absl::SleepFor(absl::Milliseconds(20));
    ASSERT_FALSE((*child)->IsRunning());
    const std::string out = cli::TailFile(log, 100);
    EXPECT_NE(out.find("pwned"), std::string::npos) << out;
    EXPECT_EQ(out.find('\x1b'), std::string::npos) << "raw ESC printed";
    EXPECT_EQ(out.find('\x07'), std::string::npos) << "raw BEL printed";
    EXPECT_NE(out.find("\\x1b"), std::string::npos) << out;
  }
}

TEST(Hostile, FinishedJobsLeaveTheMetricsEndpoints) {
  Options o = Options::OneWorker();
  o.metrics = true;
  o.coordinator_args = {"--finished-job-metrics-ttl", "1"};
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto id = cluster.client().Submit(absl::StrCat(kJob, "steps: 3\n"));
    ASSERT_TRUE(id.ok());
    auto end = cluster.WaitForEnd(*id, absl::Seconds(120));
    ASSERT_TRUE(end.ok());
    ASSERT_EQ(end->state(), v1::SUCCEEDED) << end->reason();
    ids.push_back(*id);
  }
  // The worker drops a stage's series when the stage ends.
  auto scraped = metrics::Scrape("127.0.0.1", cluster.worker_metrics_port(0));
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  const std::string worker = *scraped;
  for (const std::string& id : ids) {
    EXPECT_EQ(worker.find(absl::StrCat("job=\"", id, "\"")), std::string::npos) << id;
  }
  // The coordinator drops a finished job's series after the TTL.
  std::string coordinator;
  for (int i = 0; i < 100; ++i) {
    coordinator = Scrape(cluster.coordinator_metrics_port());
    bool any = false;
    for (const std::string& id : ids) any |= coordinator.find(id) != std::string::npos;
    if (!any) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_NE(coordinator.find("stagewise_coordinator_"), std::string::npos);
  for (const std::string& id : ids) EXPECT_EQ(coordinator.find(id), std::string::npos) << id;
}

// --- Transport security and tokens ------------------------------------------

grpc::Status ListWorkersWith(const std::string& target,
                             std::shared_ptr<grpc::ChannelCredentials> creds,
                             const std::string& token = "") {
  grpc::ChannelArguments args;
  auto stub = v1::Coordinator::NewStub(grpc::CreateCustomChannel(target, creds, args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  v1::ListWorkersRequest req;
  v1::ListWorkersResponse resp;
  return stub->ListWorkers(&ctx, req, &resp);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Tls, ClientsWithoutAGoodCertificateAreRefusedAndTheJobTrainsOn) {
  ProcessCluster cluster(Options::OneWorker());
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto running = cluster.client().Submit(LongJob(1));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(WaitRunning(cluster, *running).ok());
  const std::string target = cluster.coordinator_address();
  const std::string ca = ReadFile(cluster.pki_dir() + "/ca.pem");

  // The cluster's own client certificate works.
  grpc::SslCredentialsOptions good;
  good.pem_root_certs = ca;
  good.pem_cert_chain = ReadFile(cluster.pki_dir() + "/client.pem");
  good.pem_private_key = ReadFile(cluster.pki_dir() + "/client.key");
  EXPECT_TRUE(ListWorkersWith(target, grpc::SslCredentials(good)).ok());

  // Plaintext, and TLS without a client certificate.
  EXPECT_EQ(ListWorkersWith(target, grpc::InsecureChannelCredentials()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ca;
  EXPECT_EQ(ListWorkersWith(target, grpc::SslCredentials(no_cert)).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // A certificate of another CA.
  const std::string other = cluster.dir() + "/other-ca";
  ASSERT_TRUE(rpc::CreateLocalPki(other).ok());
  grpc::SslCredentialsOptions foreign = good;
  foreign.pem_cert_chain = ReadFile(other + "/client.pem");
  foreign.pem_private_key = ReadFile(other + "/client.key");
  EXPECT_EQ(ListWorkersWith(target, grpc::SslCredentials(foreign)).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // An expired certificate of the right CA.
  rpc::CertSpec expired;
  expired.common_name = "client";
  expired.hosts = {"localhost", "127.0.0.1"};
  expired.not_before = absl::Now() - absl::Hours(48);
  expired.not_after = absl::Now() - absl::Hours(24);
  ASSERT_TRUE(rpc::IssueCert(cluster.pki_dir(), "ca", cluster.dir(), "expired", expired).ok());
  grpc::SslCredentialsOptions stale = good;
  stale.pem_cert_chain = ReadFile(cluster.dir() + "/expired.pem");
  stale.pem_private_key = ReadFile(cluster.dir() + "/expired.key");
  EXPECT_EQ(ListWorkersWith(target, grpc::SslCredentials(stale)).error_code(),
            grpc::StatusCode::UNAVAILABLE);

  // A member with a client certificate cannot act as a worker.
  auto stub = v1::Coordinator::NewStub(rpc::MakeChannel(target, cluster.RpcOptionsFor("client")));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::RegisterWorkerRequest req;
  req.mutable_worker()->set_worker_id("spy");
  req.mutable_worker()->set_address("127.0.0.1:1");
  v1::RegisterWorkerResponse resp;
  EXPECT_EQ(stub->RegisterWorker(&ctx, req, &resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // The job never noticed.
  ExpectStillTraining(cluster, *running);
}

TEST(Tls, TokensDecideWhatAClientMayDo) {
  Options o = Options::OneWorker();
  o.tokens =
      "# secret role name\n"
      "admin-0123456789abcdef admin root\n"
      "reader-0123456789abcdef read viewer\n"
      "alice-0123456789abcdef submit alice\n"
      "bob-0123456789abcdefgh submit bob\n";
  o.client_token = "admin-0123456789abcdef";
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto as = [&](const std::string& token) {
    rpc::RpcOptions options = cluster.RpcOptionsFor("client");
    options.bearer_token = token;
    return std::make_unique<client::CoordinatorClient>(cluster.coordinator_address(),
                                                       absl::Seconds(10), options);
  };
  auto alice = as("alice-0123456789abcdef");
  auto bob = as("bob-0123456789abcdefgh");
  auto reader = as("reader-0123456789abcdef");
  auto nobody = as("");
  auto forged = as("root-0123456789abcdef0");

  auto id = alice->Submit(LongJob(1));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(WaitRunning(cluster, *id).ok());
  EXPECT_EQ(nobody->GetJob(*id).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(forged->GetJob(*id).status().code(), absl::StatusCode::kUnauthenticated);
  auto seen = reader->GetJob(*id);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->owner(), "alice");
  EXPECT_EQ(reader->Cancel(*id, "no").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reader->Submit(LongJob(1)).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(bob->Cancel(*id, "mine now").status().code(), absl::StatusCode::kPermissionDenied);
  // Releasing a suspended job follows the same rule as cancelling one.
  auto held = alice->Submit(LongJob(1), /*suspended=*/true);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(reader->Resume(*held).status().code(), absl::StatusCode::kPermissionDenied);
  auto theirs = bob->Resume(*held);
  EXPECT_EQ(theirs.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(theirs.status().message().find("may resume only its own jobs"), std::string::npos)
      << theirs.status();
  auto released = alice->Resume(*held);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_FALSE(released->suspended());
  ASSERT_TRUE(alice->Cancel(*held, "not needed").ok());
  auto still = cluster.client().GetJob(*id);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->state(), v1::RUNNING) << still->reason();
  auto cancelled = alice->Cancel(*id, "done with it");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  auto end = cluster.WaitForEnd(*id, absl::Seconds(60));
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(end->state(), v1::CANCELLED);
}

grpc::Status HealthCheck(const std::string& target, grpc::health::v1::HealthCheckResponse* out) {
  auto stub = grpc::health::v1::Health::NewStub(rpc::MakeChannel(target, rpc::RpcOptions{}));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), out);
}

// Kubernetes' gRPC probes speak no TLS: --health-listen serves them in
// plaintext while the main ports still demand a certificate.
TEST(Tls, TheHealthPortAnswersPlaintextProbesWhileTheMainPortsRequireACertificate) {
  const int coordinator_health = FreePort(), worker_health = FreePort();
  Options o = Options::OneWorker();
  o.coordinator_args = {"--health-listen", absl::StrCat("127.0.0.1:", coordinator_health)};
  o.worker_args = {"--health-listen", absl::StrCat("127.0.0.1:", worker_health)};
  ProcessCluster cluster(o);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  for (int port : {coordinator_health, worker_health}) {
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status s = HealthCheck(absl::StrCat("127.0.0.1:", port), &response);
    ASSERT_TRUE(s.ok()) << port << ": " << s.error_message();
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  for (const std::string& main_port :
       {cluster.coordinator_address(), absl::StrCat("127.0.0.1:", cluster.worker_port(0))}) {
    grpc::health::v1::HealthCheckResponse response;
    EXPECT_EQ(HealthCheck(main_port, &response).error_code(), grpc::StatusCode::UNAVAILABLE)
        << main_port << " answered a plaintext client";
  }
}

// Random bytes for a field: mostly short printable, sometimes long or binary.
std::string RandomText(std::mt19937& rng) {
  const int kind = rng() % 8;
  const size_t n = kind == 0 ? 2000 + rng() % 4000 : rng() % 24;
  std::string out(n, ' ');
  for (char& c : out) c = static_cast<char>(kind == 1 ? rng() % 256 : 'a' + rng() % 26);
  return out;
}

int64_t RandomNumber(std::mt19937& rng) {
  static constexpr int64_t kEdges[] = {0,
                                       1,
                                       -1,
                                       2,
                                       3,
                                       5,
                                       100,
                                       2147483647,
                                       -2147483648LL,
                                       std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min()};
  if (rng() % 2) return kEdges[rng() % std::size(kEdges)];
  return static_cast<int64_t>((uint64_t{rng()} << 32) | rng());
}

double RandomValue(std::mt19937& rng) {
  static constexpr double kEdges[] = {0.0,
                                      0.5,
                                      -1.0,
                                      1e308,
                                      std::numeric_limits<double>::quiet_NaN(),
                                      std::numeric_limits<double>::infinity()};
  return kEdges[rng() % std::size(kEdges)];
}

// A worker event of a random kind with random numbers, about `job`.
v1::WorkerEvent RandomEvent(std::mt19937& rng, const std::string& job) {
  v1::WorkerEvent e;
  const std::string j = rng() % 3 ? job : RandomText(rng);
  const auto i32 = [&] { return static_cast<int32_t>(RandomNumber(rng)); };
  switch (rng() % 8) {
    case 0: {
      auto* m = e.mutable_metrics();
      e.set_job_id(j);
      e.set_stage(i32());
      e.set_attempt(i32());
      m->set_step(RandomNumber(rng));
      for (int k = rng() % 4; k > 0; --k) {
        (*m->mutable_values())[rng() % 2 ? "train_loss" : RandomText(rng)] = RandomValue(rng);
      }
      break;
    }
    case 1: {
      auto* p = e.mutable_phase_done();
      e.set_job_id(j);
      e.set_stage(i32());
      p->set_phase(i32());
      e.set_attempt(i32());
      break;
    }
    case 2: {
      auto* r = e.mutable_result();
      e.set_job_id(j);
      e.set_stage(i32());
      e.set_attempt(i32());
      (*r->mutable_values())["eval_accuracy"] = RandomValue(rng);
      break;
    }
    case 3: {
      auto* err = e.mutable_error();
      e.set_job_id(j);
      e.set_stage(i32());
      e.set_attempt(i32());
      err->set_code(i32());
      err->set_message(RandomText(rng));
      break;
    }
    case 4: {
      auto* c = e.mutable_checkpoint_saved();
      e.set_job_id(j);
      e.set_stage(i32());
      e.set_attempt(i32());
      c->set_step(RandomNumber(rng));
      c->set_phase(i32());
      c->set_path(RandomText(rng));
      break;
    }
    case 5:
      e.set_job_id(j);
      e.mutable_profile()->mutable_profile()->set_model(RandomText(rng));
      e.mutable_profile()->mutable_profile()->set_batch_size(RandomNumber(rng));
      e.mutable_profile()->mutable_profile()->add_blocks()->set_forward_s(-1.0 * i32());
      break;
    case 6:
      e.mutable_ack()->set_command_id(RandomNumber(rng));
      break;
    default:
      e.mutable_heartbeat()->set_unix_ms(RandomNumber(rng));
      break;
  }
  return e;
}

// A stage message of a random kind about `job`, random tensors included.
v1::StageMessage RandomStageMessage(std::mt19937& rng, const std::string& job) {
  v1::StageMessage m;
  m.set_job_id(rng() % 2 ? job : RandomText(rng));
  m.set_kind(static_cast<v1::StageMessage::Kind>(rng() % 6));
  m.set_step(RandomNumber(rng));
  m.set_micro_batch(static_cast<int32_t>(RandomNumber(rng)));
  m.set_attempt(rng() % 2 ? 1 : static_cast<int32_t>(RandomNumber(rng)));
  for (int k = rng() % 3; k > 0; --k) {
    v1::TensorProto& t = (*m.mutable_tensors())[rng() % 2 ? "x" : RandomText(rng)];
    t.set_dtype(static_cast<v1::DType>(rng() % 12));
    for (int d = rng() % 4; d > 0; --d) t.add_shape(rng() % 2 ? rng() % 8 : RandomNumber(rng));
    t.set_data(RandomText(rng));
  }
  return m;
}

// A job spec: the victim's, with random lines changed, added or dropped.
std::string RandomSpec(std::mt19937& rng) {
  std::vector<std::string> lines = absl::StrSplit(LongJob(1), '\n');
  for (int k = 1 + rng() % 3; k > 0; --k) {
    const size_t at = rng() % lines.size();
    switch (rng() % 4) {
      case 0:
        lines.erase(lines.begin() + at);
        break;
      case 1:
        lines.insert(lines.begin() + at, absl::StrCat(RandomText(rng), ": ", RandomNumber(rng)));
        break;
      case 2:
        if (!lines[at].empty())
          lines[at][rng() % lines[at].size()] = static_cast<char>(rng() % 128);
        break;
      default:
        lines[at] = absl::StrCat("steps: ", RandomNumber(rng));
        break;
    }
    if (lines.empty()) lines.push_back("");
  }
  return absl::StrJoin(lines, "\n");
}

// Bounded random traffic from a rogue cluster member and a client: worker
// events, stage streams and coordinator RPCs with random (often extreme)
// fields, while a real job trains. Every process stays up, the job keeps
// training, and every job record stays consistent. Seeded: a failure
// reproduces (STAGEWISE_FUZZ_SEED picks another seed).
// The identity of the certificate the random stage streams present: a
// client's, or a worker's that holds no stage of the owner's jobs.
class RandomTraffic : public ::testing::TestWithParam<const char*> {};

TEST_P(RandomTraffic, LeavesEveryProcessAliveAndEveryOwnersJobSucceeds) {
  uint32_t seed = 20261123;
  if (const char* env = std::getenv("STAGEWISE_FUZZ_SEED")) seed = std::strtoul(env, nullptr, 10);
  std::mt19937 rng(seed);
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", stage streams as ", GetParam()));
  Options two = Options::OneWorker();
  two.workers = 2;
  ProcessCluster cluster(two);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  // The real owner's jobs, queued ahead of anything the traffic submits: they
  // run one after another on w0 and w1 while the traffic goes on.
  std::vector<std::string> owned;
  for (int i = 0; i < 4; ++i) {
    auto id = cluster.client().Submit(absl::StrCat(kJob, "stages: 2\nsteps: 120\n"));
    ASSERT_TRUE(id.ok()) << id.status();
    owned.push_back(*id);
  }
  ASSERT_TRUE(WaitRunning(cluster, owned[0]).ok());
  FakeWorker rogue(cluster, "zz-rogue");  // sorts after w0 and w1: never placed first
  ASSERT_TRUE(rogue.Join().ok());
  auto exchange = v1::StageService::NewStub(rpc::MakeChannel(
      // w1 runs stage 1 of the owner's jobs.
      absl::StrCat("127.0.0.1:", cluster.worker_port(1)), cluster.RpcOptionsFor(GetParam())));
  auto is_owned = [&](const std::string& id) {
    return std::find(owned.begin(), owned.end(), id) != owned.end();
  };
  std::vector<std::string> jobs = owned;
  int events = 0, streams = 0, rpcs = 0;
  for (int i = 0; i < 600; ++i) {
    const std::string& job = jobs[rng() % jobs.size()];
    switch (rng() % 4) {
      case 0:
      case 1: {  // worker events (the stream may be closed by a refusal: reopen)
        if (rogue.done()) break;
        rogue.Send(RandomEvent(rng, job));
        ++events;
        break;
      }
      case 2: {  // a stage stream with a few random messages
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        auto stream = exchange->Exchange(&ctx);
        const std::string& target = owned[rng() % owned.size()];
        for (int k = 1 + rng() % 3; k > 0; --k) {
          if (!stream->Write(RandomStageMessage(rng, target))) break;
        }
        stream->WritesDone();
        (void)stream->Finish();
        ++streams;
        break;
      }
      default: {  // client RPCs
        switch (rng() % 4) {
          case 0: {
            auto id = cluster.client().Submit(RandomSpec(rng));
            if (id.ok()) jobs.push_back(*id);
            break;
          }
          case 1:
            if (!is_owned(job)) (void)cluster.client().Cancel(job, RandomText(rng));
            break;
          case 2:
            (void)cluster.client().GetJob(rng() % 2 ? job : RandomText(rng));
            break;
          default:
            (void)cluster.client().ListJobs(static_cast<int>(RandomNumber(rng) % 1000));
            break;
        }
        ++rpcs;
        break;
      }
    }
  }
  std::cout << "[ random  ] " << events << " worker events, " << streams << " stage streams, "
            << rpcs << " client calls, " << jobs.size() - owned.size() << " jobs accepted\n";
  rogue.Close();
  // Everyone is alive ...
  auto workers = cluster.client().ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status() << "\n" << cluster.CoordinatorLog();
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(::kill(cluster.worker_pid(i), 0), 0) << cluster.WorkerLog(i);
  // ... every job record is consistent ...
  auto all = cluster.client().ListJobs(1000);
  ASSERT_TRUE(all.ok()) << all.status();
  for (const v1::JobStatus& st : *all) {
    SCOPED_TRACE(st.job_id());
    EXPECT_TRUE(v1::JobState_IsValid(st.state()));
    EXPECT_GE(st.step(), 0);
    EXPECT_LE(st.step(), st.total_steps());
    EXPECT_GE(st.phase(), 0);
    EXPECT_LT(st.phase(), std::max(1, st.num_phases()));
    EXPECT_FALSE(st.algorithm().empty());
    EXPECT_TRUE(std::isfinite(st.train_loss()));
  }
  // ... and every job of the real owner succeeds, in its first attempt.
  for (const std::string& id : jobs) {
    if (!is_owned(id)) (void)cluster.client().Cancel(id, "the traffic is over");
  }
  for (const std::string& id : owned) {
    auto end = cluster.WaitForEnd(id, absl::Seconds(120));
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(end->state(), v1::SUCCEEDED) << id << ": " << end->reason();
    EXPECT_EQ(end->attempt(), 0) << id;
  }
}

INSTANTIATE_TEST_SUITE_P(Hostile, RandomTraffic, ::testing::Values("client", "worker"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace stagewise
