// common/curve_keys.cc: see curve_keys.h.
#include "common/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/atomic_file.h"

namespace dhs {
namespace {

bool IsZ85Key(std::string_view key) {
  if (key.size() != kCurveKeyChars) return false;
  uint8_t bytes[32];
  return zmq_z85_decode(bytes, std::string(key).c_str()) != nullptr;
}

absl::StatusOr<std::string> ReadKeyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return FileError(errno, absl::StrCat("open ", path));
  std::stringstream text;
  text << in.rdbuf();
  const std::string key(absl::StripAsciiWhitespace(text.str()));
  if (!IsZ85Key(key)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " does not hold one CURVE key (", kCurveKeyChars,
                                                   " Z85 characters)"));
  }
  return key;
}

}  // namespace

bool CurveAvailable() { return zmq_has("curve") != 0; }

absl::StatusOr<CurveKeyPair> LoadOrCreateServerKeys(std::string_view run_dir) {
  if (!CurveAvailable()) {
    return absl::FailedPreconditionError("this libzmq has no CURVE support (zmq_has(\"curve\") is false; it needs "
                                         "libsodium): a tcp:// serving socket cannot be secured");
  }
  const std::string secret_path = absl::StrCat(std::string(run_dir), "/", kCurveSecretFile);
  const std::string public_path = absl::StrCat(std::string(run_dir), "/", kCurvePublicFile);
  struct stat st {};
  if (::lstat(secret_path.c_str(), &st) != 0) {
    if (errno != ENOENT) return FileError(errno, absl::StrCat("stat ", secret_path));
    char public_key[41], secret_key[41];
    if (zmq_curve_keypair(public_key, secret_key) != 0) return absl::InternalError("zmq_curve_keypair failed");
    // A private temporary file linked to the name: the first worker's link wins, the others read its key.
    const std::string tmp = absl::StrCat(secret_path, ".tmp.", ::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return FileError(errno, absl::StrCat("create ", tmp));
    const std::string line = absl::StrCat(std::string(secret_key, kCurveKeyChars), "\n");
    const bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    const int err = errno;
    ::close(fd);
    if (!written) {
      ::unlink(tmp.c_str());
      return FileError(err, absl::StrCat("write ", tmp));
    }
    const bool linked = ::link(tmp.c_str(), secret_path.c_str()) == 0;
    const int link_err = errno;
    ::unlink(tmp.c_str());
    if (!linked && link_err != EEXIST) return FileError(link_err, absl::StrCat("link ", secret_path));
    if (::lstat(secret_path.c_str(), &st) != 0) return FileError(errno, absl::StrCat("stat ", secret_path));
  }
  if (!S_ISREG(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(secret_path, " is not a regular file"));
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s has mode %04o: a secret key must grant nothing to group or others (chmod 600 it)", secret_path,
        st.st_mode & 07777));
  }
  absl::StatusOr<std::string> secret = ReadKeyFile(secret_path);
  if (!secret.ok()) return secret.status();
  char public_key[41];
  if (zmq_curve_public(public_key, secret->c_str()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(secret_path, ": not a CURVE secret key"));
  }
  CurveKeyPair keys{std::string(public_key, kCurveKeyChars), *secret};
  if (absl::StatusOr<std::string> existing = ReadKeyFile(public_path); !existing.ok() || *existing != keys.public_key) {
    if (absl::Status s = WriteFileAtomically(public_path, keys.public_key + "\n", 0644); !s.ok()) return s;
  }
  return keys;
}

absl::StatusOr<std::string> ReadCurvePublicKey(std::string_view path) { return ReadKeyFile(std::string(path)); }

}  // namespace dhs
