#include "workerd/model/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace dhs::model {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

int DtypeBytes(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

std::string ShapeString(std::span<const int64_t> shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

absl::Status Bad(std::string_view name, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", std::string(name), "': ", std::string(what)));
}

absl::StatusOr<TensorInfo> ParseEntry(const std::string& name, const nlohmann::json& e, uint64_t data_bytes) {
  if (!e.is_object()) return Bad(name, "entry is not an object");
  TensorInfo info;
  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) return Bad(name, "missing dtype");
  info.dtype = dt->get<std::string>();
  const int elem = DtypeBytes(info.dtype);
  if (elem == 0) return Bad(name, absl::StrCat("unknown dtype '", info.dtype, "'"));
  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) return Bad(name, "missing shape");
  uint64_t count = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
      return Bad(name, "shape entries must be non-negative integers");
    }
    const uint64_t v = d.get<uint64_t>();
    if (v != 0 && count > std::numeric_limits<uint64_t>::max() / 8 / v) return Bad(name, "shape too large");
    count *= v;
    info.shape.push_back(static_cast<int64_t>(v));
  }
  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return Bad(name, "data_offsets must be two non-negative integers");
  }
  info.begin = (*off)[0].get<uint64_t>();
  info.end = (*off)[1].get<uint64_t>();
  if (info.begin > info.end) return Bad(name, absl::StrCat("data_offsets [", info.begin, ", ", info.end, "] reversed"));
  if (info.end > data_bytes) {
    return absl::DataLossError(absl::StrCat("safetensors: tensor '", name, "': data_offsets end ", info.end,
                                            " past the data buffer of ", data_bytes, " bytes (truncated file?)"));
  }
  if (info.end - info.begin != count * elem) {
    return Bad(name, absl::StrCat("data_offsets span ", info.end - info.begin, " bytes but ", info.dtype, " ",
                                  ShapeString(info.shape), " needs ", count * elem));
  }
  return info;
}

// The "__metadata__" entry: an object of strings.
absl::Status ParseMetadata(const nlohmann::json& e, std::map<std::string, std::string>& out) {
  if (!e.is_object()) return absl::InvalidArgumentError("safetensors: __metadata__ is not an object");
  for (auto m = e.begin(); m != e.end(); ++m) {
    if (!m->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: __metadata__ '", m.key(), "' is not a string"));
    }
    out[m.key()] = m->get<std::string>();
  }
  return absl::OkStatus();
}

// The entries must tile [0, data_bytes) exactly: sorted by begin, each starts where the previous ended.
absl::Status CheckTiling(const std::map<std::string, TensorInfo>& tensors, uint64_t data_bytes) {
  std::vector<std::pair<const std::string*, const TensorInfo*>> order;
  for (const auto& [name, info] : tensors) order.push_back({&name, &info});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second->begin != b.second->begin ? a.second->begin < b.second->begin : a.second->end < b.second->end;
  });
  uint64_t cursor = 0;
  const std::string* prev = nullptr;
  for (const auto& [name, info] : order) {
    if (info->begin < cursor) {
      return Bad(*name, absl::StrCat("data_offsets [", info->begin, ", ", info->end, "] overlap tensor '", *prev, "'"));
    }
    if (info->begin > cursor) {
      return Bad(*name, absl::StrCat("gap of ", info->begin - cursor, " bytes before data_offsets [", info->begin,
                                      ", ", info->end, "]"));
    }
    cursor = info->end;
    prev = name;
  }
  if (cursor != data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: tensors cover ", cursor, " bytes of a ", data_bytes,
                                                   "-byte data buffer", prev ? " (after tensor '" + *prev + "')" : ""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes) {
  if (bytes.size() < 8) {
    return absl::DataLossError(absl::StrCat("safetensors: file of ", bytes.size(), " bytes has no header length"));
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n == 0 || n > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: bad header length ", n));
  }
  if (n > bytes.size() - 8) {
    return absl::DataLossError(
        absl::StrCat("safetensors: header length ", n, " past the end of a ", bytes.size(), "-byte file"));
  }
  const char* hb = bytes.data() + 8;
  nlohmann::json header = nlohmann::json::parse(hb, hb + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError("safetensors: header is not a JSON object");
  }
  SafetensorsFile f;
  f.data_start_ = 8 + n;
  const uint64_t data_bytes = bytes.size() - f.data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (absl::Status m = ParseMetadata(*it, f.metadata_); !m.ok()) return m;
      continue;
    }
    auto info = ParseEntry(it.key(), *it, data_bytes);
    if (!info.ok()) return info.status();
    f.tensors_[it.key()] = std::move(*info);
  }
  if (absl::Status tiled = CheckTiling(f.tensors_, data_bytes); !tiled.ok()) return tiled;
  f.bytes_ = std::move(bytes);
  return f;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("safetensors: cannot open '", path, "'"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("safetensors: read error on '", path, "'"));
  auto f = Parse(std::move(bytes));
  if (!f.ok()) return absl::Status(f.status().code(), absl::StrCat(path, ": ", f.status().message()));
  return f;
}

absl::StatusOr<std::span<const uint8_t>> SafetensorsFile::Bytes(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat("safetensors: missing tensor '", std::string(name), "'"));
  const auto* p = reinterpret_cast<const uint8_t*>(bytes_.data()) + data_start_ + it->second.begin;
  return std::span<const uint8_t>(p, it->second.end - it->second.begin);
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadF32(std::string_view name,
                                                             std::span<const int64_t> shape) const {
  auto it = tensors_.find(std::string(name));
  if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat("safetensors: missing tensor '", std::string(name), "'"));
  const TensorInfo& info = it->second;
  if (info.dtype != "F32") return Bad(name, absl::StrCat("dtype ", info.dtype, ", expected F32"));
  if (!std::equal(info.shape.begin(), info.shape.end(), shape.begin(), shape.end())) {
    return Bad(name, absl::StrCat("shape ", ShapeString(info.shape), ", expected ", ShapeString(shape)));
  }
  std::vector<float> out((info.end - info.begin) / sizeof(float));
  std::memcpy(out.data(), bytes_.data() + data_start_ + info.begin, info.end - info.begin);
  return out;
}

absl::Status SafetensorsWriter::AddF32(std::string_view name, std::vector<int64_t> shape,
                                       std::span<const float> data) {
  if (name.empty() || name == "__metadata__") return absl::InvalidArgumentError("safetensors: reserved tensor name");
  for (const auto& e : entries_) {
    if (e.name == name) return Bad(name, "added twice");
  }
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) return Bad(name, "negative dimension");
    count *= d;
  }
  if (count != static_cast<int64_t>(data.size())) {
    return Bad(name, absl::StrCat("shape ", ShapeString(shape), " holds ", count, " floats, got ", data.size()));
  }
  Entry e{std::string(name), std::move(shape), std::vector<uint8_t>(data.size_bytes())};
  std::memcpy(e.bytes.data(), data.data(), data.size_bytes());
  entries_.push_back(std::move(e));
  return absl::OkStatus();
}

void SafetensorsWriter::SetMetadata(std::string_view key, std::string_view value) {
  metadata_[std::string(key)] = std::string(value);
}

std::string SafetensorsWriter::Serialize() const {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", "F32"}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  out += h;
  for (const auto& e : entries_) out.append(reinterpret_cast<const char*>(e.bytes.data()), e.bytes.size());
  return out;
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  const std::string bytes = Serialize();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("safetensors: cannot create '", path, "'"));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("safetensors: write to '", path, "' failed"));
  return absl::OkStatus();
}

}  // namespace dhs::model
