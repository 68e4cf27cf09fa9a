// tools/replay/trace.cc: the trace readers and length scaling (see trace.h).
#include "tools/replay/trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace dhs::replay {
namespace {

absl::Status LineError(std::string_view path, int64_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(path), ":", line, ": ", what));
}

absl::StatusOr<std::ifstream> OpenTrace(std::string_view path) {
  std::ifstream in{std::string(path)};
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace file ", std::string(path)));
  return in;
}

void StripCarriageReturn(std::string& line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
}

bool IsBlank(std::string_view line) { return line.find_first_not_of(" \t") == std::string_view::npos; }

// Reads an integer field >= min_value of a Mooncake object.
absl::StatusOr<int64_t> IntField(const nlohmann::json& obj, const char* name, int64_t min_value) {
  auto it = obj.find(name);
  if (it == obj.end()) return absl::InvalidArgumentError(absl::StrCat("missing field ", name));
  if (!it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) ||
      it->get<int64_t>() < min_value) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be an integer >= ", min_value));
  }
  return it->get<int64_t>();
}

absl::StatusOr<TraceRequest> ParseMooncakeLine(std::string_view line) {
  nlohmann::json obj = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!obj.is_object()) return absl::InvalidArgumentError("expected a JSON object");
  TraceRequest req;
  auto ts = obj.find("timestamp");
  if (ts == obj.end()) return absl::InvalidArgumentError("missing field timestamp");
  if (!ts->is_number() || !std::isfinite(ts->get<double>()) || ts->get<double>() < 0) {
    return absl::InvalidArgumentError("timestamp must be a number >= 0 (ms)");
  }
  req.arrival_ms = ts->get<double>();
  auto input = IntField(obj, "input_length", 1);
  if (!input.ok()) return input.status();
  auto output = IntField(obj, "output_length", 1);
  if (!output.ok()) return output.status();
  req.input_tokens = *input;
  req.output_tokens = *output;
  auto ids = obj.find("hash_ids");
  if (ids == obj.end()) return absl::InvalidArgumentError("missing field hash_ids");
  if (!ids->is_array()) return absl::InvalidArgumentError("hash_ids must be an array of integers");
  req.hash_ids.reserve(ids->size());
  for (const auto& id : *ids) {
    if (!id.is_number_integer()) return absl::InvalidArgumentError("hash_ids must be an array of integers");
    req.hash_ids.push_back(id.get<int64_t>());
  }
  return req;
}

// Parses a run of decimal digits of exactly `width` characters (width 0: any length >= 1).
bool ParseDigits(std::string_view text, size_t width, int64_t* out) {
  if (text.empty() || (width != 0 && text.size() != width) || text.size() > 18) return false;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  *out = value;
  return true;
}

absl::StatusOr<int64_t> ParseCount(std::string_view field, std::string_view name) {
  int64_t value = 0;
  if (!ParseDigits(field, 0, &value) || value < 1) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), " must be an integer >= 1, got '",
                                                   std::string(field), "'"));
  }
  return value;
}

// Makes arrivals offsets from the first request; rejects arrivals before it.
absl::Status RebaseArrivals(std::string_view path, const std::vector<int64_t>& lines, Trace& trace) {
  if (trace.requests.empty()) return absl::OkStatus();
  const double first = trace.requests.front().arrival_ms;
  for (size_t i = 0; i < trace.requests.size(); ++i) {
    TraceRequest& r = trace.requests[i];
    if (r.arrival_ms < first) return LineError(path, lines[i], "timestamp is earlier than the first request's");
    r.arrival_ms -= first;
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view TraceFormatName(TraceFormat format) {
  return format == TraceFormat::kMooncake ? "mooncake" : "azure";
}

absl::StatusOr<Trace> ReadMooncakeTrace(std::string_view path) {
  auto in = OpenTrace(path);
  if (!in.ok()) return in.status();
  Trace trace;
  trace.path = std::string(path);
  trace.format = TraceFormat::kMooncake;
  trace.block_tokens = 512;
  std::vector<int64_t> lines;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(*in, line)) {
    ++line_no;
    StripCarriageReturn(line);
    if (IsBlank(line)) continue;
    auto req = ParseMooncakeLine(line);
    if (!req.ok()) return LineError(path, line_no, req.status().message());
    req->index = static_cast<int64_t>(trace.requests.size());
    trace.requests.push_back(*std::move(req));
    lines.push_back(line_no);
  }
  if (trace.requests.empty()) return absl::InvalidArgumentError(absl::StrCat(trace.path, ": no requests"));
  if (auto s = RebaseArrivals(path, lines, trace); !s.ok()) return s;
  return trace;
}

absl::StatusOr<double> ParseAzureTimestampMs(std::string_view text) {
  // The instant comes from absl::ParseTime; the checks around it only make the accepted shape strict, since ParseTime
  // takes unpadded fields ("2023-1-5"), surrounding blanks, years of any width and any number of fraction digits.
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timestamp must look like 2023-11-16 18:17:03.9799600 (UTC; or with a UTC offset: Z, +01:00, -0530), got '",
        std::string(text), "': ", std::string(why)));
  };
  constexpr char kCivil[] = "%Y-%m-%d %H:%M:%S";  // the first 19 characters, every field zero-padded
  constexpr size_t kCivilSize = 19;
  const absl::TimeZone utc = absl::UTCTimeZone();
  std::string err;
  absl::Time civil;
  if (text.size() < kCivilSize) return bad("too short");
  const absl::string_view stamp(text.data(), text.size());  // absl::string_view is not std's in this Abseil
  const absl::string_view civil_text = stamp.substr(0, kCivilSize);
  if (!absl::ParseTime(kCivil, civil_text, utc, &civil, &err)) return bad(absl::StrCat("date and time: ", err));
  // Round trip: rejects unpadded or blank-padded fields and the leap second ":60" (ParseTime moves it to ":00").
  if (absl::FormatTime(kCivil, civil, utc) != std::string_view(civil_text.data(), civil_text.size())) return bad("expected YYYY-MM-DD HH:MM:SS, zero-padded");
  const std::string_view rest = text.substr(kCivilSize);
  if (rest.find_first_of(" \t") != std::string_view::npos) return bad("blank after the seconds");
  if (!rest.empty() && rest.front() == '.') {
    const size_t digits = rest.substr(1).find_first_not_of("0123456789");
    const size_t n = digits == std::string_view::npos ? rest.size() - 1 : digits;
    if (n == 0) return bad("no digit after the decimal point");
    if (n > 9) return bad(absl::StrCat("fraction of a second with ", n, " digits (at most 9)"));
  }
  absl::Time t;
  if (!absl::ParseTime("%Y-%m-%d %H:%M:%E*S", stamp, utc, &t, &err) &&
      !absl::ParseTime("%Y-%m-%d %H:%M:%E*S%Ez", stamp, utc, &t, &err)) {
    return bad(absl::StrCat("fraction or UTC offset: ", err));
  }
  // Whole ms as an integer, then the rest: exact for stamps on a whole ms (a double holds those exactly).
  const absl::Duration since_epoch = t - absl::UnixEpoch();
  const int64_t whole_ms = absl::ToInt64Milliseconds(since_epoch);
  return static_cast<double>(whole_ms) + absl::ToDoubleMilliseconds(since_epoch - absl::Milliseconds(whole_ms));
}

absl::StatusOr<Trace> ReadAzureTrace(std::string_view path) {
  auto in = OpenTrace(path);
  if (!in.ok()) return in.status();
  Trace trace;
  trace.path = std::string(path);
  trace.format = TraceFormat::kAzure;
  trace.block_tokens = 512;
  std::vector<int64_t> lines;
  std::string line;
  int64_t line_no = 0;
  bool header_seen = false;
  while (std::getline(*in, line)) {
    ++line_no;
    StripCarriageReturn(line);
    if (IsBlank(line)) continue;
    if (!header_seen) {
      if (line != "TIMESTAMP,ContextTokens,GeneratedTokens") {
        return LineError(path, line_no, "expected the header TIMESTAMP,ContextTokens,GeneratedTokens");
      }
      header_seen = true;
      continue;
    }
    std::vector<std::string> fields = absl::StrSplit(line, ',');
    if (fields.size() != 3) {
      return LineError(path, line_no, absl::StrCat("expected 3 comma-separated fields, got ", fields.size()));
    }
    TraceRequest req;
    auto ms = ParseAzureTimestampMs(fields[0]);
    if (!ms.ok()) return LineError(path, line_no, ms.status().message());
    auto input = ParseCount(fields[1], "ContextTokens");
    if (!input.ok()) return LineError(path, line_no, input.status().message());
    auto output = ParseCount(fields[2], "GeneratedTokens");
    if (!output.ok()) return LineError(path, line_no, output.status().message());
    req.index = static_cast<int64_t>(trace.requests.size());
    req.arrival_ms = *ms;
    req.input_tokens = *input;
    req.output_tokens = *output;
    trace.requests.push_back(std::move(req));
    lines.push_back(line_no);
  }
  if (!header_seen) return absl::InvalidArgumentError(absl::StrCat(trace.path, ": empty file (no header)"));
  if (trace.requests.empty()) return absl::InvalidArgumentError(absl::StrCat(trace.path, ": no requests"));
  if (auto s = RebaseArrivals(path, lines, trace); !s.ok()) return s;
  return trace;
}

absl::StatusOr<Trace> ReadTrace(std::string_view path) {
  auto ends_with = [&](std::string_view suffix) {
    return path.size() >= suffix.size() && path.substr(path.size() - suffix.size()) == suffix;
  };
  if (ends_with(".jsonl")) return ReadMooncakeTrace(path);
  if (ends_with(".csv")) return ReadAzureTrace(path);
  return absl::InvalidArgumentError(absl::StrCat("unknown trace format for ", std::string(path),
                                                 ": expected .jsonl (Mooncake) or .csv (Azure)"));
}

absl::StatusOr<Trace> ScaleLengths(Trace trace, double length_scale) {
  if (!std::isfinite(length_scale) || length_scale <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("length scale must be a number > 0, got ", length_scale));
  }
  // A scaled length must fit int64 (std::llround of a larger value is unspecified: found by fuzz/trace_fuzz.cc).
  bool too_large = false;
  auto scale = [&](int64_t n) {
    const double scaled = std::round(static_cast<double>(n) * length_scale);
    if (!(scaled < 0x1p62)) {  // far beyond any trace; also keeps the block arithmetic below in range
      too_large = true;
      return int64_t{1};
    }
    return std::max<int64_t>(1, static_cast<int64_t>(scaled));
  };
  trace.block_tokens = scale(trace.block_tokens);
  for (TraceRequest& r : trace.requests) {
    r.input_tokens = scale(r.input_tokens);
    r.output_tokens = scale(r.output_tokens);
    if (too_large) {
      return absl::InvalidArgumentError(absl::StrCat("length scale ", length_scale, " makes request ", r.index,
                                                     " (or the block size) longer than 2^62 tokens"));
    }
    const auto max_blocks = static_cast<size_t>(r.input_tokens / trace.block_tokens +
                                                (r.input_tokens % trace.block_tokens != 0));
    if (r.hash_ids.size() > max_blocks) r.hash_ids.resize(max_blocks);
  }
  if (too_large) {
    return absl::InvalidArgumentError(
        absl::StrCat("length scale ", length_scale, " makes the block size longer than 2^62 tokens"));
  }
  return trace;
}

absl::StatusOr<Trace> TakeFirst(Trace trace, int64_t n) {
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("--requests must be >= 1, got ", n));
  if (static_cast<size_t>(n) > trace.requests.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--requests ", n, " but ", trace.path, " has only ",
                                                   trace.requests.size(), " requests"));
  }
  trace.requests.resize(static_cast<size_t>(n));
  return trace;
}

}  // namespace dhs::replay
