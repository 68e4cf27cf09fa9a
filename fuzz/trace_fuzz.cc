// fuzz/trace_fuzz.cc: libFuzzer target for dhs-replay's trace readers (issue 12). The first byte picks the reader:
// Mooncake JSONL, Azure CSV (both read from a file, so the bytes are written to a private temporary file first), or
// ParseAzureTimestampMs on the bytes alone. A trace that reads is then length-scaled (a scale from the input, so bad
// ones are refused) and cut with TakeFirst. Any error status is fine; a crash or a sanitizer report is not.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "tools/replay/trace.h"

namespace {

std::string TempPath(const char* ext) { return absl::StrCat("/tmp/dhs-fuzz-trace-", getpid(), ext); }

bool WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = size == 0 || std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t selector = data[0];
  const uint8_t scale_byte = data[1];
  data += 2;
  size -= 2;
  if (selector % 3 == 2) {
    (void)dhs::replay::ParseAzureTimestampMs(std::string_view(reinterpret_cast<const char*>(data), size));
    return 0;
  }
  const bool mooncake = selector % 3 == 0;
  const std::string path = TempPath(mooncake ? ".jsonl" : ".csv");
  if (!WriteFile(path, data, size)) __builtin_trap();
  auto trace = mooncake ? dhs::replay::ReadMooncakeTrace(path) : dhs::replay::ReadAzureTrace(path);
  std::remove(path.c_str());
  if (!trace.ok()) return 0;
  // Scales: 0 and negatives are refused; small fractions, 1, and large factors exercise the rounding.
  static const double kScales[] = {0.001, 0.01, 0.5, 1.0, 3.0, 1e6, 0.0, -1.0};
  auto scaled = dhs::replay::ScaleLengths(*trace, kScales[scale_byte % 8]);
  if (!scaled.ok()) return 0;
  (void)dhs::replay::TakeFirst(*scaled, 1 + (scale_byte >> 3));
  return 0;
}
