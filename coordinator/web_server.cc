#include "coordinator/web_server.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coordinator/guarded_http.h"
#include "coordinator/status_page.h"
#include "services/common/log.h"
#include "services/rpc/openssl_ptr.h"

namespace stagewise::coordinator {
namespace {

constexpr char kCookie[] = "stagewise_token";

// Every page: nothing cached, nothing embedded elsewhere, no script allowed
// (the pages have none).
void SecurityHeaders(httplib::Response& res) {
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("X-Frame-Options", "DENY");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Content-Security-Policy",
                 "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                 "frame-ancestors 'none'");
}

void Html(httplib::Response& res, int status, const std::string& html) {
  res.status = status;
  res.set_content(html, "text/html; charset=utf-8");
}

// A message as JSON with the proto's field names (what `stagewise ... -o
// json` names them too), defaults included, so that absent means unknown.
void Json(httplib::Response& res, int status, const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) {
    res.status = 500;
    res.set_content("{\"error\":{\"code\":500,\"message\":\"cannot encode\"}}\n",
                    "application/json");
    return;
  }
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(json + "\n", "application/json");
}

// {"error": {"code": HTTP status, "message": ...}}.
void JsonError(httplib::Response& res, int status, const std::string& message) {
  google::protobuf::Struct body;
  google::protobuf::Struct* error = (*body.mutable_fields())["error"].mutable_struct_value();
  (*error->mutable_fields())["code"].set_number_value(status);
  (*error->mutable_fields())["message"].set_string_value(message);
  Json(res, status, body);
}

int HttpStatusOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    default:
      return 500;
  }
}

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// application/x-www-form-urlencoded (and cookie values we encoded that way).
std::string FormDecode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && Hex(s[i + 1]) >= 0 && Hex(s[i + 2]) >= 0) {
      out += static_cast<char>(Hex(s[i + 1]) * 16 + Hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string FormEncode(absl::string_view s) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kDigits[c >> 4];
      out += kDigits[c & 15];
    }
  }
  return out;
}

// The value of `name` in "a=1&name=2" (decoded), or "".
std::string FormValue(absl::string_view body, absl::string_view name) {
  for (absl::string_view pair : absl::StrSplit(body, '&')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(pair, absl::MaxSplits('=', 1));
    if (kv.first == name) return FormDecode(kv.second);
  }
  return "";
}

// The value of cookie `name` in a Cookie header, or "".
std::string CookieValue(absl::string_view header, absl::string_view name) {
  for (absl::string_view part : absl::StrSplit(header, ';')) {
    part = absl::StripAsciiWhitespace(part);
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.first == name) return FormDecode(kv.second);
  }
  return "";
}

// "host:port", "[v6]:port" -> host, port.
absl::Status SplitListen(const std::string& listen, std::string* host, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), port) ||
      *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--web-listen: '", listen, "' is not host:port (e.g. 127.0.0.1:8080)"));
  }
  *host = listen.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  if (host->empty()) *host = "0.0.0.0";
  return absl::OkStatus();
}

}  // namespace

// The certificate chain and key the pages serve, replaced when the files
// change: every handshake takes the pair in force (SSL_CTX_set_cert_cb), so a
// rotation needs no restart and a half-written one is never served.
class ServedCertificate {
 public:
  // Parses validated material (rpc::LoadTlsMaterial); the pair in force stays
  // when it does not parse.
  absl::Status Set(const rpc::TlsMaterial& material) ABSL_LOCKS_EXCLUDED(mu_) {
    rpc::openssl::BioPtr certs(BIO_new_mem_buf(material.cert_chain_pem.data(),
                                               static_cast<int>(material.cert_chain_pem.size())));
    rpc::openssl::BioPtr key_bio(BIO_new_mem_buf(
        material.private_key_pem.data(), static_cast<int>(material.private_key_pem.size())));
    rpc::openssl::X509Ptr leaf(PEM_read_bio_X509(certs.get(), nullptr, nullptr, nullptr));
    rpc::openssl::PkeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
    if (!leaf || !key) {
      ERR_clear_error();
      return absl::InvalidArgumentError("--tls-cert/--tls-key: no certificate or key in the files");
    }
    std::shared_ptr<STACK_OF(X509)> chain(
        sk_X509_new_null(), [](STACK_OF(X509) * s) { sk_X509_pop_free(s, X509_free); });
    while (X509* next = PEM_read_bio_X509(certs.get(), nullptr, nullptr, nullptr)) {
      sk_X509_push(chain.get(), next);
    }
    ERR_clear_error();  // the end of the chain reads as an error
    absl::MutexLock lock(&mu_);
    leaf_ = std::move(leaf);
    key_ = std::move(key);
    chain_ = std::move(chain);
    cert_pem_ = material.cert_chain_pem;
    key_pem_ = material.private_key_pem;
    return absl::OkStatus();
  }

  bool Same(const rpc::TlsMaterial& material) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return material.cert_chain_pem == cert_pem_ && material.private_key_pem == key_pem_;
  }

  // SSL_CTX_set_cert_cb: the pair in force for this handshake (1: done).
  static int Apply(SSL* ssl, void* self) {
    auto* served = static_cast<ServedCertificate*>(self);
    absl::MutexLock lock(&served->mu_);
    if (!served->leaf_) return 1;  // the context's own
    const int ok = SSL_use_cert_and_key(ssl, served->leaf_.get(), served->key_.get(),
                                        served->chain_.get(), /*override=*/1);
    ERR_clear_error();
    return ok == 1 ? 1 : 0;
  }

 private:
  mutable absl::Mutex mu_;
  rpc::openssl::X509Ptr leaf_ ABSL_GUARDED_BY(mu_);
  rpc::openssl::PkeyPtr key_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<STACK_OF(X509)> chain_ ABSL_GUARDED_BY(mu_);
  std::string cert_pem_ ABSL_GUARDED_BY(mu_);
  std::string key_pem_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<WebServer>> WebServer::Start(const JobManager* manager,
                                                            WebOptions options) {
  if (absl::Status s = rpc::CheckListenPolicy(options.listen, options.tls); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--web-listen: ", s.message()));
  }
  std::string host;
  int port = 0;
  if (absl::Status s = SplitListen(options.listen, &host, &port); !s.ok()) return s;
  std::unique_ptr<WebServer> web(new WebServer(manager, std::move(options)));
  const WebOptions& o = web->options_;
  if (o.tls.enabled()) {
    absl::StatusOr<rpc::TlsMaterial> material = rpc::LoadTlsMaterial(o.tls);
    if (!material.ok()) return material.status();
    web->cert_ = std::make_unique<ServedCertificate>();
    if (absl::Status s = web->cert_->Set(*material); !s.ok()) return s;
    // The context is the server's own (GuardedServer accepts TLS itself):
    // the files as they are now, then per handshake the pair in force.
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    web->tls_ctx_.reset(ctx);
    const bool ok =
        ctx != nullptr && SSL_CTX_use_certificate_chain_file(ctx, o.tls.cert_file.c_str()) == 1 &&
        SSL_CTX_use_PrivateKey_file(ctx, o.tls.key_file.c_str(), SSL_FILETYPE_PEM) == 1 &&
        SSL_CTX_check_private_key(ctx) == 1 &&
        SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) == 1;
    ERR_clear_error();
    if (ctx != nullptr) {
      SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-cert: the status page cannot serve HTTPS with ", o.tls.cert_file,
                       " and ", o.tls.key_file));
    }
    SSL_CTX_set_cert_cb(ctx, &ServedCertificate::Apply, web->cert_.get());
  }
  metrics::CoordinatorMetrics* counter = o.metrics;
  web->server_ =
      std::make_unique<GuardedServer>(web->tls_ctx_.get(), o.limits, [counter](const char* reason) {
        if (counter != nullptr) {
          counter->CountRefused(reason);
        }
      });
  const int threads = std::max(1, o.threads);
  web->server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  web->server_->set_payload_max_length(o.limits.max_body_bytes);
  WebServer* self = web.get();
  auto handler = [self](const httplib::Request& req, httplib::Response& res) {
    self->Serve(req, res);
  };
  web->server_->Get(".*", handler);
  web->server_->Post(".*", handler);
  web->port_ = port == 0 ? web->server_->bind_to_any_port(host)
                         : (web->server_->bind_to_port(host, port) ? port : -1);
  if (web->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("--web-listen: cannot listen on ", o.listen, " (in use?)"));
  }
  httplib::Server* server = web->server_.get();
  web->thread_ = std::thread([server] { server->listen_after_bind(); });
  if (o.tls.enabled() && o.tls.reload_seconds > 0) {
    web->watcher_ = std::thread([self] { self->WatchCertificate(); });
  }
  return web;
}

void WebServer::FreeSslCtx::operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }

WebServer::WebServer(const JobManager* manager, WebOptions options)
    : manager_(manager), options_(std::move(options)) {}

WebServer::~WebServer() {
  stop_watching_.Notify();
  if (watcher_.joinable()) watcher_.join();
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void WebServer::WatchCertificate() {
  std::string last_error;
  while (
      !stop_watching_.WaitForNotificationWithTimeout(absl::Seconds(options_.tls.reload_seconds))) {
    absl::StatusOr<rpc::TlsMaterial> material = rpc::LoadTlsMaterial(options_.tls);
    absl::Status s = material.status();
    if (s.ok() && !cert_->Same(*material)) {
      s = cert_->Set(*material);
      if (s.ok()) {
        STAGEWISE_LOG(INFO) << "status pages: serving the certificate now in "
                            << options_.tls.cert_file;
      }
    }
    if (!s.ok() && std::string(s.message()) != last_error) {
      STAGEWISE_LOG(ERROR) << "status pages: certificate not reloaded, the one in force stays: "
                           << s.message();
    }
    last_error = s.ok() ? "" : std::string(s.message());
  }
}

void WebServer::Serve(const httplib::Request& req, httplib::Response& res) const {
  SecurityHeaders(res);
  const std::string& path = req.path;
  const bool https = options_.tls.enabled();
  std::shared_ptr<const rpc::TokenTable> tokens;
  if (options_.tokens != nullptr) tokens = options_.tokens->table();

  if (path == "/login") {
    if (tokens == nullptr) {
      res.set_redirect("/", 303);
      return;
    }
    if (req.method != "POST") return Html(res, 200, status_page::LoginPage(""));
    const std::string secret = FormValue(req.body, "token");
    if (!tokens->Authenticate("Bearer " + secret).ok()) {
      return Html(res, 401, status_page::LoginPage("unknown token"));
    }
    res.set_header("Set-Cookie",
                   absl::StrCat(kCookie, "=", FormEncode(secret),
                                "; Path=/; HttpOnly; SameSite=Strict", https ? "; Secure" : ""));
    res.set_redirect("/", 303);
    return;
  }
  if (req.method != "GET" && req.method != "HEAD") {
    res.set_header("Allow", "GET");
    return Html(res, 405, status_page::ErrorPage(405, "these pages only read"));
  }

  if (tokens != nullptr) {
    std::string header = req.get_header_value("Authorization");
    if (header.empty()) {
      const std::string secret = CookieValue(req.get_header_value("Cookie"), kCookie);
      if (!secret.empty()) header = "Bearer " + secret;
    }
    if (!tokens->Authenticate(header).ok()) {
      if (absl::StartsWith(path, "/api/")) {
        return JsonError(res, 401, header.empty() ? "a token is required" : "unknown token");
      }
      return Html(res, 401, status_page::LoginPage(header.empty() ? "" : "unknown token"));
    }
  }
  if (absl::StartsWith(path, "/api/")) return ServeApi(req, res);

  status_page::PageOptions page;
  page.refresh_seconds = options_.refresh_seconds;
  page.now = absl::Now();
  if (path == "/") {
    auto jobs = manager_->ListJobsPage(100, req.get_param_value("page"), size_t{8} << 20);
    if (!jobs.ok()) {
      const int status = HttpStatusOf(jobs.status());
      return Html(res, status,
                  status_page::ErrorPage(status, std::string(jobs.status().message())));
    }
    const v1::Goodput goodput = manager_->PublishedGoodput();
    return Html(res, 200,
                status_page::JobsPage(jobs->jobs, jobs->next_page_token, page,
                                      goodput.since_unix_ms() > 0 ? &goodput : nullptr));
  }
  if (path == "/workers") {
    std::vector<status_page::WorkerRow> rows;
    const std::map<std::string, absl::Time> seen = manager_->WorkersLastSeen();
    std::map<std::string, v1::JobStatus> jobs;  // of busy workers, for their stage's pace
    for (v1::WorkerInfo& info : manager_->ListWorkers()) {
      status_page::WorkerRow row;
      if (auto it = seen.find(info.worker_id()); it != seen.end()) row.last_seen = it->second;
      const auto& labels = info.labels();
      auto job = labels.find("job");
      auto stage = labels.find("stage");
      if (job != labels.end() && stage != labels.end()) {
        auto it = jobs.find(job->second);
        if (it == jobs.end()) {
          auto status = manager_->GetJob(job->second);
          it = jobs.emplace(job->second, status.ok() ? *status : v1::JobStatus()).first;
        }
        const auto& summary = it->second.summary();
        auto pace = summary.find(absl::StrCat("stage", stage->second, ".pace_over_plan"));
        if (pace != summary.end()) row.pace_over_plan = pace->second;
      }
      row.info = std::move(info);
      rows.push_back(std::move(row));
    }
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.info.worker_id() < b.info.worker_id(); });
    return Html(res, 200, status_page::WorkersPage(rows, page));
  }
  if (absl::StartsWith(path, "/jobs/")) {
    const std::string id = path.substr(6);
    auto job = manager_->GetJob(id);
    if (!job.ok()) {
      const int status = HttpStatusOf(job.status());
      return Html(res, status, status_page::ErrorPage(status, std::string(job.status().message())));
    }
    status_page::JobPageData data;
    data.job = *job;
    auto error = [](const absl::Status& s) { return std::string(s.message()); };
    if (auto m = manager_->JobMetrics(id, {}, 400); m.ok()) {
      data.metrics = *std::move(m);
    } else {
      data.metrics_error = error(m.status());
    }
    if (auto t = manager_->JobTrace(id); t.ok()) {
      data.trace = *std::move(t);
    } else {
      data.trace_error = error(t.status());
    }
    if (auto e = manager_->JobEvents(id); e.ok()) {
      data.events = *std::move(e);
    } else {
      data.events_error = error(e.status());
    }
    if (auto c = manager_->ListCheckpoints(id); c.ok()) {
      data.checkpoints = *std::move(c);
    } else {
      data.checkpoints_error = error(c.status());
    }
    return Html(res, 200, status_page::JobPage(data, page));
  }
  Html(res, 404, status_page::ErrorPage(404, absl::StrCat("no page ", path)));
}

void WebServer::ServeApi(const httplib::Request& req, httplib::Response& res) const {
  const std::string& path = req.path;
  if (path == "/api/v1/jobs") {
    auto jobs = manager_->ListJobsPage(100, req.get_param_value("page"), size_t{8} << 20);
    if (!jobs.ok()) {
      return JsonError(res, HttpStatusOf(jobs.status()), std::string(jobs.status().message()));
    }
    v1::ListJobsResponse out;
    for (v1::JobStatus& j : jobs->jobs) *out.add_jobs() = std::move(j);
    out.set_next_page_token(jobs->next_page_token);
    return Json(res, 200, out);
  }
  if (absl::StartsWith(path, "/api/v1/jobs/")) {
    auto job = manager_->GetJob(path.substr(std::string("/api/v1/jobs/").size()));
    if (!job.ok()) {
      return JsonError(res, HttpStatusOf(job.status()), std::string(job.status().message()));
    }
    return Json(res, 200, *job);
  }
  if (path == "/api/v1/workers") {
    v1::ListWorkersResponse out;
    for (v1::WorkerInfo& info : manager_->ListWorkers()) *out.add_workers() = std::move(info);
    std::sort(out.mutable_workers()->begin(), out.mutable_workers()->end(),
              [](const auto& a, const auto& b) { return a.worker_id() < b.worker_id(); });
    return Json(res, 200, out);
  }
  JsonError(res, 404,
            absl::StrCat("no such resource ", path,
                         " (there are /api/v1/jobs, /api/v1/jobs/ID, /api/v1/workers)"));
}

}  // namespace stagewise::coordinator
