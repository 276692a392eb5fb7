#include "services/rpc/tokens.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "services/common/log.h"

namespace stagewise::rpc {
namespace {

constexpr size_t kMinSecretLength = 16;
constexpr size_t kMaxTokensFileBytes = 16 << 20;
constexpr absl::string_view kCoordinatorService = "stagewise.v1.Coordinator";

using Digest = std::array<unsigned char, 32>;

bool Sha256(absl::string_view data, Digest* digest) {
  unsigned int size = 0;
  return EVP_Digest(data.data(), data.size(), digest->data(), &size, EVP_sha256(), nullptr) == 1 &&
         size == digest->size();
}

std::optional<Role> ParseRole(absl::string_view text) {
  if (text == "read") return Role::kRead;
  if (text == "submit") return Role::kSubmit;
  if (text == "admin") return Role::kAdmin;
  return std::nullopt;
}

bool IsPrintableAscii(absl::string_view text) {
  for (const char c : text) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

bool IsValidName(absl::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '@' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

absl::Status Unauthenticated(absl::string_view message) {
  return absl::UnauthenticatedError(message);
}

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kRead:
      return "read";
    case Role::kSubmit:
      return "submit";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path, bool warn_permissions) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read: ", std::generic_category().message(errno)));
  }
  struct stat info;
  if (warn_permissions && fstat(fd, &info) == 0 && (info.st_mode & 077) != 0) {
    STAGEWISE_LOG(WARNING) << "tokens file " << path << " is readable by other users; chmod 600 it";
  }
  std::string text;
  char buffer[16384];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || text.size() + static_cast<size_t>(n) > kMaxTokensFileBytes) {
      const int error = n < 0 ? errno : EFBIG;
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": cannot read: ", std::generic_category().message(error)));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  absl::StatusOr<TokenTable> table = Parse(text, path);
  OPENSSL_cleanse(text.data(), text.size());
  return table;
}

bool TokenTable::SameAs(const TokenTable& other) const {
  if (entries_.size() != other.entries_.size()) return false;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& a = entries_[i];
    const Entry& b = other.entries_[i];
    if (a.digest != b.digest || a.principal.name != b.principal.name ||
        a.principal.role != b.principal.role) {
      return false;
    }
  }
  return true;
}

TokenFile::TokenFile(std::string path, TokenTable table)
    : path_(std::move(path)), table_(std::make_shared<const TokenTable>(std::move(table))) {}

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path) {
  absl::StatusOr<TokenTable> table = TokenTable::Load(path);
  if (!table.ok()) return table.status();
  return std::unique_ptr<TokenFile>(new TokenFile(path, *std::move(table)));
}

std::shared_ptr<const TokenTable> TokenFile::table() const {
  absl::MutexLock lock(&mu_);
  return table_;
}

absl::StatusOr<bool> TokenFile::Reload() {
  absl::StatusOr<TokenTable> loaded = TokenTable::Load(path_, /*warn_permissions=*/false);
  if (!loaded.ok()) return loaded.status();
  absl::MutexLock lock(&mu_);
  if (table_->SameAs(*loaded)) return false;
  table_ = std::make_shared<const TokenTable>(*std::move(loaded));
  return true;
}

absl::StatusOr<TokenTable> TokenTable::Parse(const std::string& text, const std::string& origin) {
  TokenTable table;
  std::map<Digest, int> secret_lines;
  std::map<std::string, int, std::less<>> name_lines;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    std::vector<absl::string_view> fields;
    for (absl::string_view field :
         absl::StrSplit(line, absl::ByAnyChar(" \t\r\f\v"), absl::SkipEmpty())) {
      if (absl::StartsWith(field, "#")) break;
      fields.push_back(field);
    }
    if (fields.empty()) continue;
    const std::string where = absl::StrCat(origin, ":", line_number, ": ");
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected '<secret> <role> <name>', found ", fields.size(), " field(s)"));
    }
    const absl::string_view secret = fields[0];
    if (secret.size() < kMinSecretLength) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "token is shorter than ", kMinSecretLength, " characters"));
    }
    if (!IsPrintableAscii(secret)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "token has characters other than printable ASCII"));
    }
    const std::optional<Role> role = ParseRole(fields[1]);
    if (!role.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "unknown role (expected read, submit or admin)"));
    }
    const absl::string_view name = fields[2];
    if (!IsValidName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "name must be 1 to 128 of the characters A-Z a-z 0-9 . _ @ -"));
    }
    Entry entry;
    if (!Sha256(secret, &entry.digest)) {
      return absl::InternalError(absl::StrCat(where, "cannot hash the token"));
    }
    if (const auto it = secret_lines.find(entry.digest); it != secret_lines.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "duplicate token (also on line ", it->second, ")"));
    }
    if (const auto it = name_lines.find(name); it != name_lines.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "duplicate name (also on line ", it->second, ")"));
    }
    secret_lines.emplace(entry.digest, line_number);
    name_lines.emplace(std::string(name), line_number);
    entry.principal = Principal{std::string(name), *role};
    table.entries_.push_back(std::move(entry));
  }
  return table;
}

absl::StatusOr<Principal> TokenTable::Authenticate(std::string_view authorization_header) const {
  absl::string_view value = absl::StripAsciiWhitespace(
      absl::string_view(authorization_header.data(), authorization_header.size()));
  constexpr absl::string_view kScheme = "bearer";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme) ||
      (value[kScheme.size()] != ' ' && value[kScheme.size()] != '\t')) {
    return Unauthenticated("missing bearer token");
  }
  const absl::string_view secret = absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
  if (secret.empty()) return Unauthenticated("missing bearer token");
  Digest digest;
  if (!Sha256(secret, &digest)) return absl::InternalError("cannot hash the token");
  // Look at every entry, so the time taken does not tell where a match is.
  const Entry* match = nullptr;
  for (const Entry& entry : entries_) {
    const bool equal = CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0;
    if (equal && match == nullptr) match = &entry;
  }
  if (match == nullptr) return Unauthenticated("unknown token");
  return match->principal;
}

absl::StatusOr<Principal> TokenTable::Authenticate(const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) return Unauthenticated("missing bearer token");
  return Authenticate(std::string_view(it->second.data(), it->second.size()));
}

std::optional<Role> RequiredRole(std::string_view method) {
  absl::string_view name(method.data(), method.size());
  if (absl::StartsWith(name, "/")) {
    const size_t slash = name.rfind('/');
    if (name.substr(1, slash - 1) != kCoordinatorService) return std::nullopt;
    name.remove_prefix(slash + 1);
  }
  for (const absl::string_view read :
       {"GetJob", "ListJobs", "WatchJob", "ListWorkers", "ListCheckpoints", "GetJobMetrics",
        "GetJobTrace", "ListJobEvents", "GetGoodput"}) {
    if (name == read) return Role::kRead;
  }
  if (name == "SubmitJob" || name == "CancelJob" || name == "ResumeJob" ||
      name == "SetJobPriority") {
    return Role::kSubmit;
  }
  if (name == "BackupDatabase") return Role::kAdmin;
  return std::nullopt;
}

bool HasRole(const Principal& principal, Role needed) {
  return static_cast<int>(principal.role) >= static_cast<int>(needed);
}

bool CanCancel(const Principal& principal, std::string_view job_owner) {
  switch (principal.role) {
    case Role::kAdmin:
      return true;
    case Role::kSubmit:
      return principal.name == job_owner;
    case Role::kRead:
      return false;
  }
  return false;
}

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("cannot draw random bytes for a token (RAND_bytes failed)");
  }
  std::string token = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
  OPENSSL_cleanse(bytes, sizeof(bytes));
  return token;
}

void AddBearerToken(grpc::ClientContext* context, const std::string& token) {
  context->AddMetadata("authorization", "Bearer " + token);
}

}  // namespace stagewise::rpc
