// Bearer tokens: how the coordinator tells users of the CLI apart. Workers and
// the coordinator authenticate each other with certificates (tls.h); people
// and scripts send "authorization: Bearer <secret>" on each call, and the
// coordinator maps the secret to a Principal with a Role.
//
// Tokens file (e.g. the coordinator's --tokens-file), one token per line:
//   # secret          role    name
//   <64 hex digits>   admin   alice
//   <64 hex digits>   submit  ci      # the nightly pipeline
// Fields are separated by spaces or tabs; a field starting with '#' starts a
// comment that runs to the end of the line (so secrets cannot start with '#');
// blank lines are ignored. Secrets are at least 16 printable ASCII characters;
// NewToken() (`stagewise certs`) makes 64 hex digits.
//
// Roles:
//   read    GetJob, ListJobs, WatchJob, ListWorkers, ListCheckpoints, GetJobMetrics,
//           GetJobTrace, ListJobEvents, GetGoodput
//   submit  read + SubmitJob, and CancelJob of the jobs submitted under its own name
//   admin   everything: cancel any job, BackupDatabase
// RegisterWorker and Control are for workers (certificates) and no role grants
// them.
//
// Secrets never appear in errors or logs, and the table keeps only their
// SHA-256 digests.
#ifndef STAGEWISE_SERVICES_RPC_TOKENS_H_
#define STAGEWISE_SERVICES_RPC_TOKENS_H_

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace stagewise::rpc {

// Ordered: each role can do everything the ones before it can.
enum class Role { kRead = 0, kSubmit = 1, kAdmin = 2 };

// "read" | "submit" | "admin".
std::string_view RoleName(Role role);

struct Principal {
  std::string name;
  Role role = Role::kRead;
};

class TokenTable {
 public:
  // An empty table (authenticates nobody).
  TokenTable() = default;

  // Reads and parses a tokens file. INVALID_ARGUMENT "<path>: cannot read: ..."
  // when it cannot be read, or as Parse. Logs a WARNING when the file is
  // readable by group or others.
  static absl::StatusOr<TokenTable> Load(const std::string& path, bool warn_permissions = true);

  // Parses tokens-file text; `origin` names it in errors. INVALID_ARGUMENT
  // "<origin>:<line>: ..." for a line without exactly three fields, a secret
  // shorter than 16 characters or with characters a header cannot carry, an
  // unknown role, a name outside [A-Za-z0-9._@-], or a secret or name already
  // defined on an earlier line. Errors never quote the line.
  static absl::StatusOr<TokenTable> Parse(const std::string& text, const std::string& origin);

  // The principal of an "authorization" metadata value "Bearer <secret>" (the
  // scheme is case-insensitive). UNAUTHENTICATED "missing bearer token" when
  // the value is empty, has another scheme or no secret; "unknown token" when
  // the secret is not in the table. The secret is compared in constant time
  // against every entry (CRYPTO_memcmp of SHA-256 digests, so neither its
  // content nor its length shows in the timing).
  absl::StatusOr<Principal> Authenticate(std::string_view authorization_header) const;

  // Authenticate() on the call's "authorization" metadata (the first, if sent
  // more than once); "missing bearer token" when there is none.
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& context) const;

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // The same secrets (by digest), roles and names, in the same order.
  bool SameAs(const TokenTable& other) const;

 private:
  struct Entry {
    std::array<unsigned char, 32> digest;  // SHA-256 of the secret
    Principal principal;
  };
  std::vector<Entry> entries_;
};

// A tokens file kept current while the coordinator runs: Reload() reads it
// again and takes the new table into use when it parses, for every call
// authenticated afterwards (calls in flight keep the table they started
// with). A file that no longer parses, or cannot be read, leaves the table in
// force and returns the error, so a half-edited file never locks everyone
// out. Thread-safe.
class TokenFile {
 public:
  // TokenTable::Load(path), kept.
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path);

  // The table in force.
  std::shared_ptr<const TokenTable> table() const ABSL_LOCKS_EXCLUDED(mu_);
  // Reads the file again: true when the table changed, false when it holds
  // the same tokens; errors as TokenTable::Load (the table is kept).
  absl::StatusOr<bool> Reload() ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& path() const { return path_; }

 private:
  TokenFile(std::string path, TokenTable table);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenTable> table_ ABSL_GUARDED_BY(mu_);
};

// The least role that may call Coordinator method `method` (the bare name,
// "GetJob", or the full path, "/stagewise.v1.Coordinator/GetJob"): kRead or
// kSubmit; nullopt for methods no token may call (RegisterWorker, Control,
// anything unknown). CancelJob and ResumeJob need CanCancel too.
std::optional<Role> RequiredRole(std::string_view method);

// `principal` has `needed` or a stronger role.
bool HasRole(const Principal& principal, Role needed);

// May `principal` cancel (or release) a job submitted under the name `job_owner`? admin:
// always; submit: only its own jobs; read: never.
bool CanCancel(const Principal& principal, std::string_view job_owner);

// A new random secret for a tokens file: 32 bytes from RAND_bytes as 64 hex
// digits. INTERNAL if the random generator fails.
absl::StatusOr<std::string> NewToken();

// Client side: adds "authorization: Bearer <token>" to a call. Call on every
// ClientContext before starting the call. A token on a plaintext channel can
// be read by anyone on the path: send tokens off-host only over TLS.
void AddBearerToken(grpc::ClientContext* context, const std::string& token);

}  // namespace stagewise::rpc

#endif  // STAGEWISE_SERVICES_RPC_TOKENS_H_
