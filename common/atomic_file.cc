// common/atomic_file.cc: see atomic_file.h.
#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dhs {

absl::Status FileError(int err, std::string_view what) {
  const std::string msg = absl::StrCat(std::string(what), ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view text, mode_t mode) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return FileError(errno, absl::StrCat("create ", tmp));
  const bool written =
      ::fchmod(fd, mode) == 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  ::close(fd);
  if (!written) {
    ::unlink(tmp.c_str());
    return FileError(err, absl::StrCat("write ", tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return FileError(e, absl::StrCat("rename ", tmp));
  }
  return absl::OkStatus();
}

}  // namespace dhs
