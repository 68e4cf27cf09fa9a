// workerd/model/safetensors.h: reader and writer of the safetensors tensor format.
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}, then the
// data buffer; offsets are byte offsets into the data buffer. The reader is generic (any tensor names, dtypes F64,
// F32, F16, BF16, I64, I32, I16, I8, U8, BOOL) and strict: the entries must tile the data buffer exactly.
// Owns: SafetensorsFile (parsed file, owns its bytes) and SafetensorsWriter (builds a file in memory).
// Thread-safety: const methods of a SafetensorsFile may be called concurrently; a writer is single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dhs::model {

struct TensorInfo {
  std::string dtype;           // "F32", ...
  std::vector<int64_t> shape;  // elements per dimension
  uint64_t begin = 0;          // byte offset into the data buffer
  uint64_t end = 0;            // one past the last byte
};

class SafetensorsFile {
 public:
  // Parses a whole file image. Errors (INVALID_ARGUMENT / DATA_LOSS, naming the tensor where one is at fault):
  // shorter than 8 bytes, header length 0 / over 100 MB / past the end of the file, header not a JSON object, entry
  // without a known dtype, a shape of non-negative integers or two ordered data_offsets, offsets past the data buffer,
  // a byte span that does not match dtype x shape, two entries overlapping, a gap between entries, data not covered to
  // its end (a truncated file reads as offsets past the data buffer).
  static absl::StatusOr<SafetensorsFile> Parse(std::string bytes);
  // Reads and parses `path`. Errors: NOT_FOUND / PERMISSION_DENIED on open, as Parse otherwise.
  static absl::StatusOr<SafetensorsFile> Load(const std::string& path);

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The bytes of tensor `name` (size end - begin). Error: NOT_FOUND naming the tensor.
  absl::StatusOr<std::span<const uint8_t>> Bytes(std::string_view name) const;
  // Copies tensor `name` as floats after checking dtype == F32 and shape == `shape`.
  // Errors: NOT_FOUND (missing), INVALID_ARGUMENT (wrong dtype or shape), each naming the tensor.
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name, std::span<const int64_t> shape) const;

 private:
  std::string bytes_;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Adds an F32 tensor; data.size() must equal the product of `shape`. Tensors are laid out in insertion order.
  // Errors: INVALID_ARGUMENT on a size mismatch, a duplicate or reserved name.
  absl::Status AddF32(std::string_view name, std::vector<int64_t> shape, std::span<const float> data);
  void SetMetadata(std::string_view key, std::string_view value);
  // The file image: deterministic for the same tensors and metadata (keys sorted, header padded with spaces to a
  // multiple of 8 bytes so that the data buffer is 8-byte aligned).
  std::string Serialize() const;
  // Writes Serialize() to `path`. Error: UNAVAILABLE / PERMISSION_DENIED naming the path.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;  // little-endian
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dhs::model
