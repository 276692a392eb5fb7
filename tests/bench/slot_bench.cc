// Slot: what one micro-batch "slot" costs at a stage boundary besides the
// compute, broken down into the pieces a message goes through, at the
// emulated bench's default message (tests/bench/emulated_bench.cc: a float32
// activation [B/M, C, H, W] = [2, 2, 16, 16] for B = 32, M = 16, plus the
// int64 labels of the micro-batch). Every component runs --iterations times
// per round, the components interleaved in an order that changes per round;
// each is timed per iteration and the table prints, in microseconds, the
// median over rounds of each round's median, the spread of those round
// medians (min - max) and the 90th percentile of every sample. Never a test.
//
//   encode        a FORWARD message built as SendForward builds it on stage 0
//                 (worker/algorithms/common.cc: NewMessage, PutTensor "x" and
//                 "labels" -> EncodeTensor), stamped with the job and attempt
//   serialize     StageMessage::SerializeToString of that message (what gRPC
//                 does on every write, into its own slices)
//   parse         StageMessage::ParseFromString (what gRPC does on every read)
//   validate      ValidateStageMessage, as StageRuntime's inbox sink checks
//                 every message on the reactor thread
//   decode        GetTensor "x" and "labels" (DecodeTensor(TensorProto*): the
//                 tensor takes the parsed buffer over), as ReceiveForward does
//                 on the last stage (earlier stages copy the labels' proto)
//   hand-off      BoundedQueue<StageMessage>::Push on one thread -> Pop on
//                 another that is blocked in it: a ping-pong of one message
//                 between two threads over two queues, one way = round trip / 2
//   wait X ms     overshoot of the emulated blocks' wait (services/models/
//                 blocks.cc, WaitUntil: timer slack 1 us, sleep_until) asked
//                 for X ms: measured - X
//   grpc stage    one way of a ping-pong over one Exchange stream on loopback,
//                 plaintext, through the worker's own classes: the compute
//                 thread Sends on a DownstreamStream (its outbox starts the
//                 gRPC write) -> UpstreamStream's reactor -> an inbox sink
//                 (validate, ForcePush) -> a BoundedQueue -> the peer's
//                 "compute thread" Pops, turns the message into a BACKWARD and
//                 Sends it back on the UpstreamStream -> the same way home.
//                 The message is prebuilt and moved on, so the row holds
//                 gRPC's serialize and parse and the inbox hand-off but
//                 neither encode nor decode. One way = round trip / 2.
//   grpc plain    the same message over a plain gRPC stream: a synchronous
//                 client Write + Read against a callback reactor that writes
//                 back what it read (gRPC alone, its serialize and parse
//                 included, no outbox, inbox or extra thread)
// The last lines sum one direction of one message: encode + serialize + parse
// + decode + 2 x hand-off (compute thread -> transport, transport -> compute
// thread) + grpc stage; and, since grpc stage already holds gRPC's serialize
// and parse, the validation and the inbox hand-off, encode + decode + grpc
// stage, which counts nothing twice. Each micro-batch slot costs one FORWARD
// and one BACKWARD message on every stage boundary.
//
//   build/bin/stagewise_slot_bench [options]
//     --batch 32             samples per mini-batch
//     --micro-batches 16     M: the activation carries batch / M samples (the
//                            first, largest micro-batch when M does not divide)
//     --shape 2,16,16        per-sample activation (the emulated bench's [C, H, W])
//     --iterations 2000      repetitions of every component per round
//     --rounds 3             rounds; every round runs every component once
//     --waits-ms 0.3125,0.625,1.25
//                            emulated waits to time (defaults: one block's
//                            forward and backward of one micro-batch at the
//                            emulated bench's 5 ms / 10 ms per mini-batch and
//                            M = 16, and a stage's backward of 2 blocks)
#include <grpcpp/grpcpp.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/common/bounded_queue.h"
#include "services/common/status_macros.h"
#include "services/rpc/server.h"
#include "services/tensor/stage_message.h"
#include "tests/bench/bench_util.h"
#include "worker/algorithms/common.h"
#include "worker/peer_stream.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = stagewise::v1;
using stagewise::BoundedQueue;
using stagewise::worker::DownstreamStream;
using stagewise::worker::MessageSink;
using stagewise::worker::UpstreamStream;
using Inbox = BoundedQueue<v1::StageMessage>;

constexpr char kJob[] = "slot-bench";
constexpr int kAttempt = 1;
// How long a ping-pong waits for its answer before it gives up.
constexpr absl::Duration kReplyTimeout = absl::Seconds(10);

struct Options {
  int batch = 32;
  int micro_batches = 16;
  std::vector<int64_t> shape = {2, 16, 16};
  int iterations = 2000;
  int rounds = 3;
  std::vector<double> waits_ms = {0.3125, 0.625, 1.25};
};

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "stagewise_slot_bench: " << why
            << "\nusage: stagewise_slot_bench [--batch 32] [--micro-batches 16] [--shape 2,16,16]"
               " [--iterations 2000] [--rounds 3] [--waits-ms 0.3125,0.625,1.25]\n"
               "see the comment at the top of tests/bench/slot_bench.cc\n";
  std::exit(why == "help" ? 0 : 2);
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") Usage("help");
    if (i + 1 >= argc) Usage(absl::StrCat(flag, " needs a value"));
    const std::string value = argv[++i];
    auto integer = [&](int* out) {
      if (!absl::SimpleAtoi(value, out) || *out < 1) {
        Usage(absl::StrCat(flag, ": bad '", value, "'"));
      }
    };
    if (flag == "--batch") {
      integer(&o.batch);
    } else if (flag == "--micro-batches") {
      integer(&o.micro_batches);
    } else if (flag == "--iterations") {
      integer(&o.iterations);
    } else if (flag == "--rounds") {
      integer(&o.rounds);
    } else if (flag == "--shape") {
      o.shape.clear();
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        int64_t d = 0;
        if (!absl::SimpleAtoi(part, &d) || d < 1) Usage(absl::StrCat(flag, ": bad '", part, "'"));
        o.shape.push_back(d);
      }
      // The codec's rank limit is 8, the micro-batch dimension included.
      if (o.shape.empty() || o.shape.size() > 7) Usage("--shape: 1 to 7 entries");
    } else if (flag == "--waits-ms") {
      o.waits_ms.clear();
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        double ms = 0;
        if (!absl::SimpleAtod(part, &ms) || ms <= 0 || ms > 1000) {
          Usage(absl::StrCat(flag, ": bad '", part, "' (0 < ms <= 1000)"));
        }
        o.waits_ms.push_back(ms);
      }
    } else {
      Usage(absl::StrCat("unknown option ", flag));
    }
  }
  if (o.micro_batches > o.batch) Usage("--micro-batches: more than --batch");
  return o;
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

using stagewise::bench::Median;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// One component's samples (microseconds per iteration), over every round.
struct Component {
  explicit Component(std::string name) : label(std::move(name)) {}
  std::string label;
  std::vector<double> medians;  // one per round
  std::vector<double> all;      // every sample
  void Add(const std::vector<double>& samples) {
    medians.push_back(Median(samples));
    all.insert(all.end(), samples.begin(), samples.end());
  }
  double median() const { return Median(medians); }
};

// ---- encode, serialize, parse, validate, decode -----------------------------

// The FORWARD message of micro-batch `micro_batch`, as SendForward builds it
// on stage 0 and StageRuntime::SendStamped stamps it.
absl::StatusOr<v1::StageMessage> BuildForward(const torch::Tensor& x, const torch::Tensor& labels,
                                              int64_t step, int micro_batch) {
  v1::StageMessage m = stagewise::worker::NewMessage(v1::StageMessage::FORWARD, step, micro_batch);
  STAGEWISE_RETURN_IF_ERROR(stagewise::worker::PutTensor(&m, "x", x));
  STAGEWISE_RETURN_IF_ERROR(stagewise::worker::PutTensor(&m, "labels", labels));
  m.set_job_id(kJob);
  m.set_attempt(kAttempt);
  return m;
}

absl::StatusOr<std::vector<double>> TimeEncode(const torch::Tensor& x, const torch::Tensor& labels,
                                               int n) {
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    absl::StatusOr<v1::StageMessage> m = BuildForward(x, labels, i, i % 16);
    const auto t1 = Clock::now();
    if (!m.ok()) return m.status();
    us.push_back(Micros(t1 - t0));
  }  // the message is freed outside the timed part (a gRPC thread frees it in a worker)
  return us;
}

absl::StatusOr<std::vector<double>> TimeSerialize(const v1::StageMessage& m, int n) {
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n; ++i) {
    std::string wire;  // a fresh buffer every time, as gRPC's slices are
    const auto t0 = Clock::now();
    const bool ok = m.SerializeToString(&wire);
    const auto t1 = Clock::now();
    if (!ok) return absl::InternalError("SerializeToString failed");
    us.push_back(Micros(t1 - t0));
  }
  return us;
}

struct ReceiveTimes {
  std::vector<double> parse, validate, decode;
};

// Parse, validate and decode of the serialized FORWARD message, timed apart.
absl::StatusOr<ReceiveTimes> TimeReceive(const std::string& wire, int n) {
  ReceiveTimes r;
  r.parse.reserve(n);
  r.validate.reserve(n);
  r.decode.reserve(n);
  const stagewise::StageMessageExpectation expect{kJob, /*stage=*/1, /*from_prev=*/true};
  for (int i = 0; i < n; ++i) {
    v1::StageMessage m;
    const auto t0 = Clock::now();
    const bool parsed = m.ParseFromString(wire);
    const auto t1 = Clock::now();
    const absl::Status valid = stagewise::ValidateStageMessage(m, expect);
    const auto t2 = Clock::now();
    absl::StatusOr<torch::Tensor> x = stagewise::worker::GetTensor(m, "x", torch::kCPU);
    absl::StatusOr<torch::Tensor> labels = stagewise::worker::GetTensor(m, "labels", torch::kCPU);
    const auto t3 = Clock::now();
    if (!parsed) return absl::InternalError("ParseFromString failed");
    STAGEWISE_RETURN_IF_ERROR(valid);
    STAGEWISE_RETURN_IF_ERROR(x.status());
    STAGEWISE_RETURN_IF_ERROR(labels.status());
    r.parse.push_back(Micros(t1 - t0));
    r.validate.push_back(Micros(t2 - t1));
    r.decode.push_back(Micros(t3 - t2));
  }  // the tensors (and the buffers they took over) are freed outside the timed part
  return r;
}

// ---- hand-off ---------------------------------------------------------------

// One way of a ping-pong between this thread and a partner over two queues.
absl::StatusOr<std::vector<double>> TimeHandOff(const v1::StageMessage& prebuilt, int n) {
  Inbox there(64);
  Inbox back(64);
  std::thread partner([&there, &back]() {
    while (std::optional<v1::StageMessage> m = there.Pop()) {
      if (!back.Push(std::move(*m))) return;
    }
  });
  std::vector<double> us;
  us.reserve(n);
  absl::Status status;
  v1::StageMessage m = prebuilt;
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    if (!there.Push(std::move(m))) {
      status = absl::InternalError("hand-off: queue closed");
      break;
    }
    std::optional<v1::StageMessage> r = back.Pop();  // blocking, as a compute thread does
    const auto t1 = Clock::now();
    if (!r.has_value()) {
      status = absl::InternalError("hand-off: queue closed");
      break;
    }
    m = std::move(*r);
    us.push_back(Micros(t1 - t0) / 2);
  }
  there.Close();
  back.Close();
  partner.join();
  if (!status.ok()) return status;
  return us;
}

// ---- emulated wait ----------------------------------------------------------

// services/models/blocks.cc's WaitUntil (file-local there), line for line: the
// wait every emulated block's forward and backward ends with.
void EmulatedWaitUntil(Clock::time_point start, double seconds) {
  static thread_local const bool kFineSlack = prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) == 0;
  (void)kFineSlack;
  if (seconds <= 0) return;
  std::this_thread::sleep_until(
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

std::vector<double> TimeWaitOvershoot(double ms, int n) {
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n; ++i) {
    const auto start = Clock::now();
    EmulatedWaitUntil(start, ms / 1e3);
    const auto end = Clock::now();
    us.push_back(Micros(end - start) - ms * 1e3);
  }
  return us;
}

// ---- gRPC through the worker's stream classes -------------------------------

// StageRuntime's InboxSink without the metrics: validates, ForcePushes into
// the inbox and pauses reading while it is full.
class InboxSink : public MessageSink {
 public:
  InboxSink(Inbox* inbox, stagewise::StageMessageExpectation expect)
      : inbox_(inbox), expect_(std::move(expect)) {}

  absl::StatusOr<bool> Deliver(v1::StageMessage message, std::function<void()> resume) override {
    STAGEWISE_RETURN_IF_ERROR(stagewise::ValidateStageMessage(message, expect_));
    if (!inbox_->ForcePush(std::move(message))) return absl::CancelledError("inbox closed");
    if (inbox_->HasRoom()) return true;
    inbox_->NotifyWhenRoom(std::move(resume));
    return false;
  }
  void StreamClosed(const absl::Status&) override {}

 private:
  Inbox* const inbox_;
  const stagewise::StageMessageExpectation expect_;
};

// Stage j+1's StageService reduced to one stream: the OPEN message binds it,
// everything after goes through an InboxSink into `inbox`.
class StageEchoService : public v1::StageService::CallbackService {
 public:
  explicit StageEchoService(Inbox* inbox) : sink_(inbox, {kJob, /*stage=*/1, /*from_prev=*/true}) {}

  grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage>* Exchange(
      grpc::CallbackServerContext*) override {
    return UpstreamStream::Start(
        [this](const v1::StageMessage& first, std::shared_ptr<UpstreamStream> stream,
               MessageSink** sink) {
          if (first.kind() != v1::StageMessage::OPEN || first.job_id() != kJob) {
            return absl::PermissionDeniedError("slot bench: the first message must be OPEN");
          }
          absl::MutexLock lock(&mu_);
          upstream_ = std::move(stream);
          *sink = &sink_;
          return absl::OkStatus();
        },
        /*outbox_capacity=*/16);
  }

  std::shared_ptr<UpstreamStream> upstream() {
    absl::MutexLock lock(&mu_);
    return upstream_;
  }

 private:
  InboxSink sink_;
  absl::Mutex mu_;
  std::shared_ptr<UpstreamStream> upstream_ ABSL_GUARDED_BY(mu_);
};

// Plain gRPC: writes back every message it reads.
class PlainEchoReactor : public grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage> {
 public:
  PlainEchoReactor() { StartRead(&message_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    message_.set_kind(v1::StageMessage::BACKWARD);
    StartWrite(&message_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartRead(&message_);
  }
  void OnDone() override { delete this; }

 private:
  v1::StageMessage message_;
};

class PlainEchoService : public v1::StageService::CallbackService {
  grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage>* Exchange(
      grpc::CallbackServerContext*) override {
    return new PlainEchoReactor();
  }
};

absl::StatusOr<std::unique_ptr<grpc::Server>> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  stagewise::rpc::ConfigureServerBuilder(stagewise::rpc::RpcOptions{}, &builder);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port <= 0) {
    return absl::UnavailableError("cannot start a gRPC server on 127.0.0.1");
  }
  return server;
}

// Stage j (this thread, DownstreamStream) and stage j+1 (a server whose
// "compute thread" answers every FORWARD with a BACKWARD), over loopback.
class StageLink {
 public:
  StageLink() = default;
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;
  ~StageLink() { Stop(); }

  absl::Status Start() {
    int port = 0;
    STAGEWISE_ASSIGN_OR_RETURN(server_, Serve(&service_, &port));
    echo_ = std::thread([this]() { EchoLoop(); });
    stub_ =
        v1::StageService::NewStub(stagewise::rpc::MakeChannel(absl::StrCat("127.0.0.1:", port)));
    client_ = DownstreamStream::Open(stub_.get(), &client_sink_, /*outbox_capacity=*/16);
    v1::StageMessage open;
    open.set_job_id(kJob);
    open.set_kind(v1::StageMessage::OPEN);
    open.set_attempt(kAttempt);
    open.set_origin_stage(0);
    return client_->Send(std::move(open));
  }

  // One way of a ping-pong of `prebuilt` (FORWARD there, BACKWARD back).
  absl::StatusOr<std::vector<double>> PingPong(const v1::StageMessage& prebuilt, int n) {
    std::vector<double> us;
    us.reserve(n);
    v1::StageMessage m = prebuilt;
    for (int i = 0; i < n; ++i) {
      m.set_kind(v1::StageMessage::FORWARD);
      const auto t0 = Clock::now();
      STAGEWISE_RETURN_IF_ERROR(client_->Send(std::move(m)));
      std::optional<v1::StageMessage> r = client_inbox_.Pop(kReplyTimeout);
      const auto t1 = Clock::now();
      if (!r.has_value()) {
        return absl::DeadlineExceededError("grpc stage: no BACKWARD came back");
      }
      m = std::move(*r);
      us.push_back(Micros(t1 - t0) / 2);
    }
    return us;
  }

  void Stop() {
    if (client_ != nullptr) {
      client_->Close(absl::OkStatus());
      client_->WaitDone();
    }
    if (std::shared_ptr<UpstreamStream> up = service_.upstream()) up->WaitDone();
    server_inbox_.Close();
    client_inbox_.Close();
    if (echo_.joinable()) echo_.join();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    }
    client_.reset();
    stub_.reset();
    server_.reset();
  }

 private:
  // Stage j+1's compute thread: Pop, answer on the stream it came from.
  void EchoLoop() {
    std::shared_ptr<UpstreamStream> up;
    while (std::optional<v1::StageMessage> m = server_inbox_.Pop()) {
      if (up == nullptr) up = service_.upstream();  // bound by the OPEN before any delivery
      if (up == nullptr) return;
      m->set_kind(v1::StageMessage::BACKWARD);
      if (!up->Send(std::move(*m)).ok()) return;
    }
  }

  Inbox server_inbox_{64};  // StageRuntime's default inbox_capacity
  Inbox client_inbox_{64};
  StageEchoService service_{&server_inbox_};
  InboxSink client_sink_{&client_inbox_, {kJob, /*stage=*/0, /*from_prev=*/false}};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::StageService::Stub> stub_;
  std::shared_ptr<DownstreamStream> client_;
  std::thread echo_;
};

// Plain gRPC: a synchronous client stream against PlainEchoService.
class PlainLink {
 public:
  PlainLink() = default;
  PlainLink(const PlainLink&) = delete;
  PlainLink& operator=(const PlainLink&) = delete;
  ~PlainLink() {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    }
  }

  absl::Status Start() {
    int port = 0;
    STAGEWISE_ASSIGN_OR_RETURN(server_, Serve(&service_, &port));
    stub_ =
        v1::StageService::NewStub(stagewise::rpc::MakeChannel(absl::StrCat("127.0.0.1:", port)));
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<double>> PingPong(const v1::StageMessage& prebuilt, int n) {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StageMessage, v1::StageMessage>> stream =
        stub_->Exchange(&ctx);
    std::vector<double> us;
    us.reserve(n);
    v1::StageMessage reply;
    absl::Status status;
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      if (!stream->Write(prebuilt) || !stream->Read(&reply)) {
        status = absl::UnavailableError("grpc plain: the stream broke");
        break;
      }
      us.push_back(Micros(Clock::now() - t0) / 2);
    }
    stream->WritesDone();
    const grpc::Status finished = stream->Finish();
    if (!status.ok()) return status;
    if (!finished.ok()) {
      return absl::UnavailableError(absl::StrCat("grpc plain: ", finished.error_message()));
    }
    return us;
  }

 private:
  PlainEchoService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::StageService::Stub> stub_;
};

// ---- the run ----------------------------------------------------------------

absl::Status Run(const Options& o) {
  at::set_num_threads(1);
  const int64_t samples = o.batch / o.micro_batches + (o.batch % o.micro_batches > 0 ? 1 : 0);
  std::vector<int64_t> shape = {samples};
  shape.insert(shape.end(), o.shape.begin(), o.shape.end());
  const torch::Tensor x = torch::randn(shape);
  const std::vector<int64_t> label_shape = {samples};
  const torch::Tensor labels = torch::randint(/*low=*/0, /*high=*/10, label_shape,
                                              torch::TensorOptions().dtype(torch::kInt64));

  STAGEWISE_ASSIGN_OR_RETURN(const v1::StageMessage forward, BuildForward(x, labels, 0, 0));
  std::string wire;
  if (!forward.SerializeToString(&wire)) return absl::InternalError("SerializeToString failed");

  StageLink stage;
  STAGEWISE_RETURN_IF_ERROR(stage.Start());
  PlainLink plain;
  STAGEWISE_RETURN_IF_ERROR(plain.Start());

  std::cout << absl::StrFormat(
      "slot bench: activation float32 [%s] (%d bytes) + labels int64 [%d]; FORWARD message %d "
      "bytes on the wire\n%d iterations x %d rounds, %d cores, loopback, plaintext\n",
      absl::StrJoin(shape, ", "), x.nbytes(), samples, wire.size(), o.iterations, o.rounds,
      std::thread::hardware_concurrency());

  Component encode{"encode (NewMessage + PutTensor x, labels)"};
  Component serialize{"serialize (SerializeToString)"};
  Component parse{"parse (ParseFromString)"};
  Component validate{"validate (ValidateStageMessage)"};
  Component decode{"decode (GetTensor x, labels: adopt)"};
  Component hand_off{"hand-off (BoundedQueue Push -> Pop)"};
  Component grpc_stage{"grpc stage (PeerStream + inbox)"};
  Component grpc_plain{"grpc plain (sync client, echo)"};
  std::vector<Component> waits;
  for (double ms : o.waits_ms) waits.emplace_back(absl::StrFormat("wait %g ms: overshoot", ms));

  // Every step of a round, in the order of round 0.
  std::vector<std::function<absl::Status(int n, bool record)>> steps;
  steps.push_back([&](int n, bool record) -> absl::Status {
    STAGEWISE_ASSIGN_OR_RETURN(std::vector<double> us, TimeEncode(x, labels, n));
    if (record) encode.Add(us);
    return absl::OkStatus();
  });
  steps.push_back([&](int n, bool record) -> absl::Status {
    STAGEWISE_ASSIGN_OR_RETURN(std::vector<double> us, TimeSerialize(forward, n));
    if (record) serialize.Add(us);
    return absl::OkStatus();
  });
  steps.push_back([&](int n, bool record) -> absl::Status {
    STAGEWISE_ASSIGN_OR_RETURN(ReceiveTimes r, TimeReceive(wire, n));
    if (record) {
      parse.Add(r.parse);
      validate.Add(r.validate);
      decode.Add(r.decode);
    }
    return absl::OkStatus();
  });
  steps.push_back([&](int n, bool record) -> absl::Status {
    STAGEWISE_ASSIGN_OR_RETURN(std::vector<double> us, TimeHandOff(forward, n));
    if (record) hand_off.Add(us);
    return absl::OkStatus();
  });
  for (size_t w = 0; w < o.waits_ms.size(); ++w) {
    steps.push_back([&, w](int n, bool record) -> absl::Status {
      std::vector<double> us = TimeWaitOvershoot(o.waits_ms[w], n);
      if (record) waits[w].Add(us);
      return absl::OkStatus();
    });
  }
  steps.push_back([&](int n, bool record) -> absl::Status {
    STAGEWISE_ASSIGN_OR_RETURN(std::vector<double> us, stage.PingPong(forward, n));
    if (record) grpc_stage.Add(us);
    return absl::OkStatus();
  });
  steps.push_back([&](int n, bool record) -> absl::Status {
    STAGEWISE_ASSIGN_OR_RETURN(std::vector<double> us, plain.PingPong(forward, n));
    if (record) grpc_plain.Add(us);
    return absl::OkStatus();
  });

  // Warm-up: allocators, LibTorch's dispatcher, gRPC's connections and threads.
  for (auto& step : steps) STAGEWISE_RETURN_IF_ERROR(step(std::min(o.iterations, 200), false));
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t k = 0; k < steps.size(); ++k) {
      STAGEWISE_RETURN_IF_ERROR(
          steps[(k + static_cast<size_t>(round)) % steps.size()](o.iterations, true));
    }
    std::cerr << "round " << round + 1 << "/" << o.rounds << " done\n";
  }
  stage.Stop();

  std::cout << absl::StrFormat("\n%-44s %9s %21s %9s\n", "component (one message)", "median",
                               "spread (round min-max)", "p90");
  std::cout << absl::StrFormat("%-44s %9s %21s %9s\n", "", "us", "us", "us");
  auto row = [](const Component& c) {
    const auto [lo, hi] = std::minmax_element(c.medians.begin(), c.medians.end());
    std::cout << absl::StrFormat("%-44s %9.2f %10.2f - %8.2f %9.2f\n", c.label, c.median(), *lo,
                                 *hi, Percentile(c.all, 0.9));
  };
  for (const Component* c :
       {&encode, &serialize, &parse, &validate, &decode, &hand_off, &grpc_stage, &grpc_plain}) {
    row(*c);
  }
  for (const Component& c : waits) row(c);

  const double sum = encode.median() + serialize.median() + parse.median() + decode.median() +
                     2 * hand_off.median() + grpc_stage.median();
  std::cout << absl::StrFormat(
      "\nper message, one direction: encode + serialize + parse + decode + 2 x hand-off + grpc "
      "stage one-way = %.1f us\n",
      sum);
  std::cout << absl::StrFormat(
      "  (grpc stage already holds gRPC's own serialize and parse, the validation and one "
      "hand-off into the inbox;\n   without counting them twice: encode + decode + grpc stage = "
      "%.1f us)\n",
      encode.median() + decode.median() + grpc_stage.median());
  std::cout << "each micro-batch slot at a stage boundary costs one FORWARD and one BACKWARD "
               "message (each way once);\nevery emulated block of a stage adds its wait's "
               "overshoot to the forward and to the backward\n";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  absl::Status status;
  try {
    status = Run(o);
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("uncaught: ", e.what()));
  }
  if (!status.ok()) {
    std::cerr << "stagewise_slot_bench: " << status << "\n";
    return 1;
  }
  return 0;
}
