#include "services/rpc/pki.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/common/status_macros.h"
#include "services/rpc/openssl_ptr.h"

namespace stagewise::rpc {
namespace {

using openssl::BignumPtr;
using openssl::BioPtr;
using openssl::ExtensionPtr;
using openssl::GeneralNamePtr;
using openssl::GeneralNamesPtr;
using openssl::PkeyPtr;
using openssl::X509Ptr;

constexpr size_t kMaxPemBytes = 1 << 20;

std::string ErrnoMessage(int error) { return std::generic_category().message(error); }

// The most recent OpenSSL error as text (and clears the queue).
std::string OpenSslError() {
  const unsigned long error = ERR_peek_last_error();
  std::string text = "unknown OpenSSL error";
  if (error != 0) {
    char buffer[256];
    ERR_error_string_n(error, buffer, sizeof(buffer));
    text = buffer;
  }
  ERR_clear_error();
  return text;
}

int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*userdata*/) { return -1; }

std::string JoinPath(const std::string& dir, const std::string& file) {
  return (std::filesystem::path(dir) / file).string();
}

absl::Status CheckName(const char* what, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", name, "' must be a non-empty file name without '/'"));
  }
  return absl::OkStatus();
}

// mkdir -p, creating missing directories with mode 0700.
absl::Status EnsureDirectory(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("certificate directory: empty path");
  std::string prefix;
  if (dir[0] == '/') prefix = "/";
  for (absl::string_view part : absl::StrSplit(dir, '/', absl::SkipEmpty())) {
    absl::StrAppend(&prefix, part, "/");
    if (mkdir(prefix.c_str(), 0700) == 0) {
      chmod(prefix.c_str(), 0700);  // in case the umask took bits away
      continue;
    }
    const int error = errno;
    struct stat info;
    if (error == EEXIST && stat(prefix.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) continue;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", prefix, ": ", ErrnoMessage(error)));
  }
  return absl::OkStatus();
}

// Writes `data` to `path` with `mode` through a temporary file in the same
// directory and rename(2). The temporary file is created 0600, so a key is
// never readable by others, not even briefly.
absl::Status WriteFileAtomically(const std::string& path, const std::string& data, mode_t mode) {
  const std::filesystem::path target(path);
  std::string temp =
      (target.parent_path() / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": ", ErrnoMessage(errno)));
  }
  const auto fail = [&](int error) {
    close(fd);
    unlink(temp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": ", ErrnoMessage(error)));
  };
  if (fchmod(fd, mode) != 0) return fail(errno);
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = write(fd, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(errno);
    written += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return fail(errno);
  if (close(fd) != 0) {
    const int error = errno;
    unlink(temp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": ", ErrnoMessage(error)));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot rename ", temp, " to ", path, ": ", ErrnoMessage(error)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, ": ", ErrnoMessage(errno)));
  }
  std::string contents;
  char buffer[16384];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || contents.size() + static_cast<size_t>(n) > kMaxPemBytes) {
      const int error = n < 0 ? errno : EFBIG;
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot read ", path, ": ", ErrnoMessage(error)));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return contents;
}

absl::StatusOr<PkeyPtr> NewKey() {
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (key == nullptr) return absl::InternalError("cannot generate a P-256 key: " + OpenSslError());
  return key;
}

// PEM texts of `key` (PKCS#8, unencrypted) and `cert`.
absl::StatusOr<std::string> KeyToPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return absl::InternalError("cannot encode a private key: " + OpenSslError());
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  std::string pem(data, static_cast<size_t>(size));
  OPENSSL_cleanse(data, static_cast<size_t>(size));
  return pem;
}

absl::StatusOr<std::string> CertToPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || PEM_write_bio_X509(bio.get(), cert) != 1) {
    return absl::InternalError("cannot encode a certificate: " + OpenSslError());
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

// Writes <dir>/<name>.key (0600) and then <dir>/<name>.pem (0644).
absl::Status WriteKeyAndCert(const std::string& dir, const std::string& name, EVP_PKEY* key,
                             X509* cert) {
  STAGEWISE_RETURN_IF_ERROR(EnsureDirectory(dir));
  STAGEWISE_ASSIGN_OR_RETURN(std::string key_pem, KeyToPem(key));
  STAGEWISE_ASSIGN_OR_RETURN(const std::string cert_pem, CertToPem(cert));
  const absl::Status wrote_key = WriteFileAtomically(JoinPath(dir, name + ".key"), key_pem, 0600);
  OPENSSL_cleanse(key_pem.data(), key_pem.size());
  STAGEWISE_RETURN_IF_ERROR(wrote_key);
  return WriteFileAtomically(JoinPath(dir, name + ".pem"), cert_pem, 0644);
}

absl::Status SetRandomSerial(X509* cert) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("cannot draw a serial number: " + OpenSslError());
  }
  bytes[sizeof(bytes) - 1] |= 1;  // never zero
  BignumPtr serial(BN_bin2bn(bytes, sizeof(bytes), nullptr));
  if (serial == nullptr ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert)) == nullptr) {
    return absl::InternalError("cannot set a serial number: " + OpenSslError());
  }
  return absl::OkStatus();
}

// A version 3 certificate for `key` with subject CN=`common_name`, the given
// validity and a random serial; no issuer, extensions or signature yet.
absl::StatusOr<X509Ptr> NewCertificate(const std::string& common_name, absl::Time not_before,
                                       absl::Time not_after, EVP_PKEY* key) {
  X509Ptr cert(X509_new());
  if (cert == nullptr) return absl::InternalError("cannot allocate a certificate");
  STAGEWISE_RETURN_IF_ERROR(SetRandomSerial(cert.get()));
  const bool ok =
      X509_set_version(cert.get(), X509_VERSION_3) == 1 &&
      ASN1_TIME_set(X509_getm_notBefore(cert.get()), absl::ToTimeT(not_before)) != nullptr &&
      ASN1_TIME_set(X509_getm_notAfter(cert.get()), absl::ToTimeT(not_after)) != nullptr &&
      X509_set_pubkey(cert.get(), key) == 1 &&
      X509_NAME_add_entry_by_txt(X509_get_subject_name(cert.get()), "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) == 1;
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot build a certificate for CN '", common_name, "': ", OpenSslError()));
  }
  return cert;
}

// Adds extension `nid` = `value` (OpenSSL configuration syntax) to `cert`,
// with `issuer` for the authority key identifier.
absl::Status AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  ExtensionPtr extension(X509V3_EXT_nconf_nid(nullptr, &ctx, nid, value));
  if (extension == nullptr || X509_add_ext(cert, extension.get(), -1) != 1) {
    return absl::InternalError(
        absl::StrCat("cannot add extension ", OBJ_nid2sn(nid), "=", value, ": ", OpenSslError()));
  }
  return absl::OkStatus();
}

bool IsDnsName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  for (const char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' &&
        c != '*') {
      return false;
    }
  }
  return true;
}

// subjectAltName with an IP entry for each address in `hosts` and a DNS entry
// for each other name.
absl::Status AddSubjectAltNames(X509* cert, const std::vector<std::string>& hosts) {
  if (hosts.empty()) return absl::OkStatus();
  GeneralNamesPtr names(sk_GENERAL_NAME_new_null());
  if (names == nullptr) return absl::InternalError("cannot allocate subjectAltName");
  for (const std::string& given : hosts) {
    absl::string_view host = given;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    const std::string host_string(host);
    unsigned char address[16];
    int address_size = 0;
    if (inet_pton(AF_INET, host_string.c_str(), address) == 1) {
      address_size = 4;
    } else if (inet_pton(AF_INET6, host_string.c_str(), address) == 1) {
      address_size = 16;
    } else if (!IsDnsName(host)) {
      return absl::InvalidArgumentError(
          absl::StrCat("hosts: '", given, "' is neither an IP address nor a DNS name"));
    }
    GeneralNamePtr name(GENERAL_NAME_new());
    if (name == nullptr) return absl::InternalError("cannot allocate subjectAltName");
    if (address_size > 0) {
      ASN1_OCTET_STRING* ip = ASN1_OCTET_STRING_new();
      if (ip == nullptr || ASN1_OCTET_STRING_set(ip, address, address_size) != 1) {
        ASN1_OCTET_STRING_free(ip);
        return absl::InternalError("cannot allocate subjectAltName");
      }
      GENERAL_NAME_set0_value(name.get(), GEN_IPADD, ip);
    } else {
      ASN1_IA5STRING* dns = ASN1_IA5STRING_new();
      if (dns == nullptr ||
          ASN1_STRING_set(dns, host_string.data(), static_cast<int>(host_string.size())) != 1) {
        ASN1_IA5STRING_free(dns);
        return absl::InternalError("cannot allocate subjectAltName");
      }
      GENERAL_NAME_set0_value(name.get(), GEN_DNS, dns);
    }
    if (sk_GENERAL_NAME_push(names.get(), name.get()) <= 0) {
      return absl::InternalError("cannot allocate subjectAltName");
    }
    name.release();  // owned by `names` now
  }
  if (X509_add1_ext_i2d(cert, NID_subject_alt_name, names.get(), 0, X509V3_ADD_DEFAULT) != 1) {
    return absl::InternalError("cannot add subjectAltName: " + OpenSslError());
  }
  return absl::OkStatus();
}

absl::Status Sign(X509* cert, EVP_PKEY* issuer_key) {
  if (X509_sign(cert, issuer_key, EVP_sha256()) <= 0) {
    return absl::InternalError("cannot sign a certificate: " + OpenSslError());
  }
  return absl::OkStatus();
}

struct LoadedCa {
  X509Ptr cert;
  PkeyPtr key;
};

absl::StatusOr<LoadedCa> LoadCa(const std::string& ca_dir, const std::string& ca_name) {
  const std::string cert_path = JoinPath(ca_dir, ca_name + ".pem");
  const std::string key_path = JoinPath(ca_dir, ca_name + ".key");
  STAGEWISE_ASSIGN_OR_RETURN(const std::string cert_pem, ReadSmallFile(cert_path));
  STAGEWISE_ASSIGN_OR_RETURN(std::string key_pem, ReadSmallFile(key_path));
  LoadedCa ca;
  {
    BioPtr bio(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
    if (bio != nullptr) ca.cert.reset(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
  }
  {
    BioPtr bio(BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
    if (bio != nullptr) {
      ca.key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
    }
    OPENSSL_cleanse(key_pem.data(), key_pem.size());
  }
  ERR_clear_error();
  if (ca.cert == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(cert_path, ": no PEM certificate found"));
  }
  if (ca.key == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(key_path, ": no unencrypted PEM private key found"));
  }
  if (X509_check_ca(ca.cert.get()) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(cert_path, ": not a CA certificate (basicConstraints CA:FALSE)"));
  }
  const bool key_matches = X509_check_private_key(ca.cert.get(), ca.key.get()) == 1;
  ERR_clear_error();
  if (!key_matches) {
    return absl::FailedPreconditionError(
        absl::StrCat(key_path, ": does not match the CA certificate ", cert_path));
  }
  return ca;
}

}  // namespace

absl::Status CreateCa(const std::string& dir, const std::string& name,
                      const std::string& common_name, absl::Duration validity) {
  STAGEWISE_RETURN_IF_ERROR(CheckName("CA name", name));
  if (common_name.empty()) return absl::InvalidArgumentError("CA common name: empty");
  if (validity <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CA validity must be positive, got ", absl::FormatDuration(validity)));
  }
  const absl::Time now = absl::Now();
  STAGEWISE_ASSIGN_OR_RETURN(PkeyPtr key, NewKey());
  STAGEWISE_ASSIGN_OR_RETURN(
      X509Ptr cert, NewCertificate(common_name, now - absl::Hours(1), now + validity, key.get()));
  X509* c = cert.get();
  if (X509_set_issuer_name(c, X509_get_subject_name(c)) != 1) {
    return absl::InternalError("cannot set the CA issuer: " + OpenSslError());
  }
  STAGEWISE_RETURN_IF_ERROR(AddExtension(c, c, NID_basic_constraints, "critical,CA:TRUE"));
  STAGEWISE_RETURN_IF_ERROR(AddExtension(c, c, NID_key_usage, "critical,keyCertSign,cRLSign"));
  STAGEWISE_RETURN_IF_ERROR(AddExtension(c, c, NID_subject_key_identifier, "hash"));
  STAGEWISE_RETURN_IF_ERROR(Sign(c, key.get()));
  return WriteKeyAndCert(dir, name, key.get(), c);
}

absl::Status IssueCert(const std::string& ca_dir, const std::string& ca_name,
                       const std::string& dir, const std::string& name, const CertSpec& spec) {
  STAGEWISE_RETURN_IF_ERROR(CheckName("CA name", ca_name));
  STAGEWISE_RETURN_IF_ERROR(CheckName("certificate name", name));
  if (spec.common_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("certificate ", name, ": empty common name"));
  }
  if (spec.not_after <= spec.not_before) {
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate ", name, ": not_after (",
        absl::FormatTime(spec.not_after, absl::UTCTimeZone()), ") is not after not_before (",
        absl::FormatTime(spec.not_before, absl::UTCTimeZone()), ")"));
  }
  STAGEWISE_ASSIGN_OR_RETURN(LoadedCa ca, LoadCa(ca_dir, ca_name));
  STAGEWISE_ASSIGN_OR_RETURN(PkeyPtr key, NewKey());
  STAGEWISE_ASSIGN_OR_RETURN(
      X509Ptr cert, NewCertificate(spec.common_name, spec.not_before, spec.not_after, key.get()));
  X509* c = cert.get();
  if (X509_set_issuer_name(c, X509_get_subject_name(ca.cert.get())) != 1) {
    return absl::InternalError("cannot set the issuer: " + OpenSslError());
  }
  STAGEWISE_RETURN_IF_ERROR(AddExtension(c, ca.cert.get(), NID_basic_constraints, "CA:FALSE"));
  STAGEWISE_RETURN_IF_ERROR(
      AddExtension(c, ca.cert.get(), NID_key_usage, "critical,digitalSignature,keyEncipherment"));
  STAGEWISE_RETURN_IF_ERROR(
      AddExtension(c, ca.cert.get(), NID_ext_key_usage, "serverAuth,clientAuth"));
  STAGEWISE_RETURN_IF_ERROR(AddExtension(c, ca.cert.get(), NID_subject_key_identifier, "hash"));
  STAGEWISE_RETURN_IF_ERROR(
      AddExtension(c, ca.cert.get(), NID_authority_key_identifier, "keyid:always"));
  STAGEWISE_RETURN_IF_ERROR(AddSubjectAltNames(c, spec.hosts));
  STAGEWISE_RETURN_IF_ERROR(Sign(c, ca.key.get()));
  return WriteKeyAndCert(dir, name, key.get(), c);
}

absl::Status CreateLocalPki(const std::string& dir) {
  STAGEWISE_RETURN_IF_ERROR(CreateCa(dir, "ca", "stagewise local CA", absl::Hours(24 * 3650)));
  for (const char* name : {"coordinator", "worker", "client"}) {
    STAGEWISE_RETURN_IF_ERROR(IssueLocalIdentity(dir, name));
  }
  return absl::OkStatus();
}

absl::Status IssueLocalIdentity(const std::string& dir, const std::string& name) {
  CertSpec spec;
  spec.common_name = name;
  return IssueCert(dir, "ca", dir, name, spec);
}

TlsConfig TlsConfigFor(const std::string& dir, const std::string& name) {
  TlsConfig config;
  config.cert_file = JoinPath(dir, name + ".pem");
  config.key_file = JoinPath(dir, name + ".key");
  config.ca_file = JoinPath(dir, "ca.pem");
  return config;
}

}  // namespace stagewise::rpc
