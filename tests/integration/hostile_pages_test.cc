// Hostile requests against the coordinator's status pages (--web-listen),
// with mutual TLS and tokens on, from a stranger with no token: each case is
// a regression test of a defect found by probing the running coordinator
// (docs/security.md, "Status pages").
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/metrics/metrics.h"
#include "tests/integration/free_port.h"
#include "tests/oracle/process_cluster.h"

namespace stagewise {
namespace {

using testing::FreePort;
using testing::ProcessCluster;
using Options = ProcessCluster::Options;

constexpr char kToken[] = "reader-0123456789abcdef";

// A coordinator with tokens, /metrics and the pages on `port`; the head of
// a request must arrive within 3 s.
Options PagesOptions(int port) {
  Options o = Options::OneWorker();
  o.metrics = true;
  o.tokens = absl::StrCat("# secret role name\nadmin-0123456789abcdef admin root\n", kToken,
                          " read viewer\n");
  o.client_token = "admin-0123456789abcdef";
  o.coordinator_args = {"--web-listen", absl::StrCat("127.0.0.1:", port),
                        "--web-header-timeout-seconds", "3"};
  return o;
}

// The process's peak resident memory (VmHWM), in KiB.
int64_t PeakKib(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    int64_t kib = 0;
    std::string digits;
    for (char c : line) {
      if (c >= '0' && c <= '9') digits += c;
    }
    return absl::SimpleAtoi(digits, &kib) ? kib : -1;
  }
  return -1;
}

// One HTTPS connection that checks nothing of the server: an attacker's.
class Connection {
 public:
  explicit Connection(int port, bool tls = true) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval thirty{30, 0};  // a server that stops reading must not hang the test
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &thirty, sizeof(thirty));
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &thirty, sizeof(thirty));
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return;
    if (!tls) {
      ok_ = true;
      return;
    }
    ctx_ = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_NONE, nullptr);
    // TLS 1.2 without tickets: nothing arrives after the handshake that the
    // server did not send in answer (Answered).
    SSL_CTX_set_max_proto_version(ctx_, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx_, SSL_OP_NO_TICKET);
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    ok_ = SSL_connect(ssl_) == 1;
    ERR_clear_error();
  }
  ~Connection() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return ok_; }
  int fd() const { return fd_; }

  bool Send(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const int n =
          ssl_ != nullptr
              ? SSL_write(ssl_, bytes.data() + done, static_cast<int>(bytes.size() - done))
              : static_cast<int>(send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL));
      if (n <= 0) {
        ERR_clear_error();
        return false;
      }
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Everything until the server closes (or 30 s pass).
  std::string ReadAll() {
    std::string out;
    char buf[4096];
    for (;;) {
      const int n = ssl_ != nullptr ? SSL_read(ssl_, buf, sizeof(buf))
                                    : static_cast<int>(recv(fd_, buf, sizeof(buf), 0));
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    ERR_clear_error();
    return out;
  }
  // Whether the server has answered or closed, waiting up to `ms`.
  bool Answered(int ms) {
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, ms) > 0;
  }

 private:
  int fd_ = -1;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  bool ok_ = false;
};

// The status code of GET `path` (with `token`, if any), or -1.
int Get(int port, const std::string& path, const std::string& token = "") {
  Connection c(port);
  if (!c.ok()) return -1;
  std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  if (!token.empty()) absl::StrAppend(&request, "Authorization: Bearer ", token, "\r\n");
  absl::StrAppend(&request, "Connection: close\r\n\r\n");
  if (!c.Send(request)) return -1;
  const std::string response = c.ReadAll();
  int status = -1;
  if (response.size() < 12 || !absl::SimpleAtoi(response.substr(9, 3), &status)) return -1;
  return status;
}

// stagewise_coordinator_refused_total{reason}, waiting up to 5 s for it to
// reach `at_least`.
double Refused(const ProcessCluster& cluster, const std::string& reason, double at_least) {
  double value = 0;
  for (int i = 0; i < 50; ++i) {
    auto text = metrics::Scrape("127.0.0.1", cluster.coordinator_metrics_port());
    if (text.ok()) {
      auto v =
          metrics::FindSample(*text, "stagewise_coordinator_refused_total", {{"reason", reason}});
      if (v.ok()) value = *v;
    }
    if (value >= at_least) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return value;
}

class HostilePages : public ::testing::Test {
 protected:
  void SetUp() override { signal(SIGPIPE, SIG_IGN); }
};

// Finding: 96 MiB of header lines, each under the line limit, were read in
// full before the token check answered 401 (the coordinator grew by 147 MiB).
// The head of a request is bounded (32 KiB, 64 lines): the flood is cut off
// after a few KiB and the coordinator does not grow with it.
TEST_F(HostilePages, AHeaderFloodWithoutATokenIsCutOff) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  ProcessCluster cluster(PagesOptions(port));
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  ASSERT_EQ(Get(port, "/", kToken), 200);
  ASSERT_EQ(Get(port, "/"), 401);
  const int64_t before = PeakKib(cluster.coordinator_pid());
  ASSERT_GT(before, 0);

  constexpr size_t kFlood = size_t{100} << 20;
  std::string chunk;
  for (int i = 0; chunk.size() < (size_t{64} << 10); ++i) {
    absl::StrAppend(&chunk, "X-Flood-", i, ": ", std::string(1000, 'a'), "\r\n");
  }
  Connection flood(port);
  ASSERT_TRUE(flood.ok());
  size_t sent = 0;
  if (flood.Send("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")) {
    while (sent < kFlood && flood.Send(chunk)) sent += chunk.size();
  }
  EXPECT_LT(sent, kFlood) << "the server read a 100 MiB head to its end";
  const int64_t after = PeakKib(cluster.coordinator_pid());
  std::printf("flood: %zu bytes sent before the cut; coordinator peak memory %lld -> %lld KiB\n",
              sent, static_cast<long long>(before), static_cast<long long>(after));
  EXPECT_LT(after - before, 16 * 1024)
      << "peak resident memory grew from " << before << " KiB to " << after << " KiB";
  EXPECT_GE(Refused(cluster, "web_headers", 1), 1);
  {
    // /metrics (civetweb) holds the head of a request to 16 KiB as well.
    Connection scrape(cluster.coordinator_metrics_port(), /*tls=*/false);
    ASSERT_TRUE(scrape.ok());
    size_t scraped = 0;
    if (scrape.Send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")) {
      while (scraped < kFlood && scrape.Send(chunk)) scraped += chunk.size();
    }
    EXPECT_LT(scraped, kFlood) << "/metrics read a 100 MiB head to its end";
  }
  EXPECT_LT(PeakKib(cluster.coordinator_pid()) - before, 16 * 1024);

  // Many short lines are cut off by their number, a long request line by its
  // length, a large body before it is read.
  {
    Connection lines(port);
    ASSERT_TRUE(lines.ok());
    std::string many = "GET / HTTP/1.1\r\n";
    for (int i = 0; i < 200; ++i) absl::StrAppend(&many, "X", i, ": 1\r\n");
    lines.Send(absl::StrCat(many, "\r\n"));
    EXPECT_EQ(lines.ReadAll().substr(0, 12), "HTTP/1.1 400");
  }
  EXPECT_GE(Refused(cluster, "web_headers", 2), 2);
  {
    Connection line(port);
    ASSERT_TRUE(line.ok());
    line.Send(absl::StrCat("GET /", std::string(9000, 'p'), " HTTP/1.1\r\n\r\n"));
    line.ReadAll();
  }
  EXPECT_GE(Refused(cluster, "web_request_line", 1), 1);
  {
    Connection body(port);
    ASSERT_TRUE(body.ok());
    body.Send(
        absl::StrCat("POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     "application/x-www-form-urlencoded\r\nContent-Length: 104857600\r\n\r\ntoken=",
                     std::string(8192, 'a')));
    EXPECT_EQ(body.ReadAll().substr(0, 12), "HTTP/1.1 413");
  }
  EXPECT_GE(Refused(cluster, "web_body", 1), 1);
  EXPECT_EQ(Get(port, "/", kToken), 200);  // the pages keep answering
  EXPECT_EQ(Get(port, "/workers", kToken), 200);
}

// Finding: a client sending its headers a byte at a time kept a serving
// thread as long as it liked (the read timeout was per read). The whole head,
// TLS handshake included, must arrive within --web-header-timeout-seconds;
// meanwhile the pages answer others.
TEST_F(HostilePages, ASlowLorisIsCutOffWhileThePagesKeepAnswering) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  ProcessCluster cluster(PagesOptions(port));
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const int64_t before = PeakKib(cluster.coordinator_pid());

  std::atomic<bool> cut{false};
  std::atomic<int> trickled{0};
  std::thread loris([&] {
    Connection slow(port);
    if (!slow.ok() || !slow.Send("GET / HTTP/1.1\r\nX-Slow: ")) return;
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (absl::Now() < give_up) {
      if (!slow.Send("a")) break;
      ++trickled;
      if (slow.Answered(250)) break;  // answered or closed
    }
    cut = absl::Now() < give_up;
  });
  // A TLS handshake that never starts is held to the same limit.
  std::atomic<bool> silent_closed{false};
  std::thread silent([&] {
    Connection raw(port, /*tls=*/false);
    if (!raw.ok()) return;
    if (raw.Answered(60'000)) silent_closed = raw.ReadAll().empty();
  });
  // /metrics (civetweb) gives a whole request 10 s.
  std::atomic<bool> scrape_cut{false};
  std::thread slow_scrape([&] {
    Connection slow(cluster.coordinator_metrics_port(), /*tls=*/false);
    if (!slow.ok() || !slow.Send("GET /metrics HTTP/1.1\r\nX-Slow: ")) return;
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    while (absl::Now() < give_up && slow.Send("a") && !slow.Answered(250)) {
    }
    scrape_cut = absl::Now() < give_up;
  });
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(Get(port, "/", kToken), 200) << "the pages stopped answering during a slow loris";
  loris.join();
  silent.join();
  slow_scrape.join();
  EXPECT_TRUE(scrape_cut) << "a /metrics request trickling a byte every 250 ms was never cut off";
  EXPECT_TRUE(cut) << "a request trickling a byte every 250 ms was never cut off";
  EXPECT_GE(trickled.load(), 2);
  EXPECT_TRUE(silent_closed) << "a connection that never started TLS was not closed";
  EXPECT_GE(Refused(cluster, "web_slow", 2), 2);
  EXPECT_EQ(Get(port, "/", kToken), 200);
  EXPECT_LT(PeakKib(cluster.coordinator_pid()) - before, 16 * 1024);
}

}  // namespace
}  // namespace stagewise
