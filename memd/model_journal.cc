// memd/model_journal.cc: see model_journal.h.
#include "memd/model_journal.h"

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/atomic_file.h"

namespace dhs::memd {

absl::StatusOr<ModelFingerprints> ModelJournal::Load() const {
  std::ifstream in(path_);
  if (!in) {
    if (errno == ENOENT) return ModelFingerprints{};
    return FileError(errno, absl::StrCat("open ", path_));
  }
  ModelFingerprints out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint32_t gpu = 0;
    uint64_t model = 0;
    if (f.size() != 2 || f[1].size() != 16 || !absl::SimpleAtoi(f[0], &gpu) || !absl::SimpleHexAtoi(f[1], &model) ||
        model == 0 || !out.emplace(static_cast<GpuId>(gpu), model).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s line %d: '%s' is not \"<gpu> <fingerprint, 16 hex digits>\" of a new GPU", path_, n,
                          line.substr(0, 80)));
    }
  }
  if (in.bad()) return absl::InternalError(absl::StrCat("read ", path_));
  return out;
}

absl::Status ModelJournal::Save(const ModelFingerprints& models) const {
  if (models.empty()) {
    if (std::remove(path_.c_str()) != 0 && errno != ENOENT) return FileError(errno, absl::StrCat("remove ", path_));
    return absl::OkStatus();
  }
  std::string text;
  for (const auto& [gpu, model] : models) absl::StrAppendFormat(&text, "%d %016x\n", gpu, model);
  return WriteFileAtomically(path_, text, 0600);
}

}  // namespace dhs::memd
