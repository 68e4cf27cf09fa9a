// fuzz/safetensors_fuzz.cc: libFuzzer target for the safetensors loader (issue 12): SafetensorsFile::Parse on the
// bytes, then, for a file that parses, every tensor's Bytes and ReadF32 (with its own shape) and
// Model::FromSafetensors (config from __metadata__, every tensor's dtype and shape checked). Any error status is fine;
// a crash, a sanitizer report or a hang is not.
#include <cstdint>
#include <string>

#include "spdlog/spdlog.h"
#include "workerd/model/model.h"
#include "workerd/model/safetensors.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = dhs::model::SafetensorsFile::Parse(std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  for (const auto& [name, info] : file->tensors()) {
    auto bytes = file->Bytes(name);
    if (bytes.ok() && bytes->size() != info.end - info.begin) __builtin_trap();
    (void)file->ReadF32(name, info.shape);
  }
  (void)dhs::model::Model::FromSafetensors(*file);
  return 0;
}
