// Trace readers on the bundled slices, malformed input, Azure timestamps, length scaling, first-N selection,
// prompt synthesis (tools/replay/trace.h, node_client.h).
#include <cmath>
#include <limits>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/replay/node_client.h"
#include "tools/replay/trace.h"
#include "tests/common/test_util.h"

namespace dhs::replay {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kDataDir = DHS_REPLAY_DATA_DIR;
const std::string kMooncake = kDataDir + "/mooncake_conversation_head200.jsonl";
const std::string kAzureCode = kDataDir + "/azure_llm_code_2023_head200.csv";
const std::string kAzureConv = kDataDir + "/azure_llm_conv_2023_head200.csv";

// Writes `text` to a fresh file named `name` in the test's temporary directory and returns its path.
std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = dhs::testing::ProcessTempDir() + "/replay_trace_test_" + name;
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

std::vector<int64_t> Iota(int64_t first, int64_t last) {
  std::vector<int64_t> v;
  for (int64_t i = first; i <= last; ++i) v.push_back(i);
  return v;
}

TEST(MooncakeReader, BundledSliceMatchesFileText) {
  auto trace = ReadMooncakeTrace(kMooncake);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->format, TraceFormat::kMooncake);
  EXPECT_EQ(trace->block_tokens, 512);
  ASSERT_EQ(trace->requests.size(), 200u);
  // Line 1: {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, ..., 13]}
  const TraceRequest& r0 = trace->requests[0];
  EXPECT_EQ(r0.index, 0);
  EXPECT_EQ(r0.arrival_ms, 0);
  EXPECT_EQ(r0.input_tokens, 6758);
  EXPECT_EQ(r0.output_tokens, 500);
  EXPECT_EQ(r0.hash_ids, Iota(0, 13));
  // Line 2: {"timestamp": 0, "input_length": 7322, "output_length": 490, "hash_ids": [0, 14, ..., 27]}
  const TraceRequest& r1 = trace->requests[1];
  EXPECT_EQ(r1.input_tokens, 7322);
  EXPECT_EQ(r1.output_tokens, 490);
  std::vector<int64_t> ids1 = Iota(14, 27);
  ids1.insert(ids1.begin(), 0);
  EXPECT_EQ(r1.hash_ids, ids1);
  // Line 200: timestamp 72000, input 19978, output 448, 40 ids [0, 5176, ..., 5214].
  const TraceRequest& last = trace->requests[199];
  EXPECT_EQ(last.index, 199);
  EXPECT_EQ(last.arrival_ms, 72000);
  EXPECT_EQ(last.input_tokens, 19978);
  EXPECT_EQ(last.output_tokens, 448);
  ASSERT_EQ(last.hash_ids.size(), 40u);
  EXPECT_EQ(last.hash_ids[1], 5176);
  EXPECT_EQ(last.hash_ids.back(), 5214);
}

TEST(MooncakeReader, ArrivalsAreOffsetsFromTheFirstRequest) {
  auto trace = ReadMooncakeTrace(WriteTemp("offset.jsonl",
                                           "{\"timestamp\": 1000, \"input_length\": 5, \"output_length\": 2, "
                                           "\"hash_ids\": [7]}\n\n"
                                           "{\"timestamp\": 1250.5, \"input_length\": 600, \"output_length\": 1, "
                                           "\"hash_ids\": [7, 8]}\n"));
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->requests.size(), 2u);  // the blank line is skipped
  EXPECT_EQ(trace->requests[0].arrival_ms, 0);
  EXPECT_EQ(trace->requests[1].arrival_ms, 250.5);
  EXPECT_EQ(trace->requests[1].index, 1);
}

struct BadLine {
  std::string text;
  std::string message;
};

TEST(MooncakeReader, MalformedLinesNameFileAndLine) {
  const std::string good = "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 2, \"hash_ids\": [1]}\n";
  const std::vector<BadLine> cases = {
      {"{\"timestamp\": 0, \"input_length\": 5", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"input_length\": 5, \"output_length\": 2, \"hash_ids\": []}", "missing field timestamp"},
      {"{\"timestamp\": -1, \"input_length\": 5, \"output_length\": 2, \"hash_ids\": []}", "timestamp must be"},
      {"{\"timestamp\": 0, \"output_length\": 2, \"hash_ids\": []}", "missing field input_length"},
      {"{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 2, \"hash_ids\": []}",
       "input_length must be an integer >= 1"},
      {"{\"timestamp\": 0, \"input_length\": 5.5, \"output_length\": 2, \"hash_ids\": []}",
       "input_length must be an integer >= 1"},
      {"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": \"2\", \"hash_ids\": []}",
       "output_length must be an integer >= 1"},
      {"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 2}", "missing field hash_ids"},
      {"{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 2, \"hash_ids\": [1, \"x\"]}",
       "hash_ids must be an array of integers"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = WriteTemp("bad" + std::to_string(i) + ".jsonl", good + good + cases[i].text + "\n");
    auto trace = ReadMooncakeTrace(path);
    ASSERT_FALSE(trace.ok()) << cases[i].text;
    EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(trace.status().message()), HasSubstr(path + ":3: " + cases[i].message))
        << trace.status();
  }
}

TEST(MooncakeReader, TimestampBeforeTheFirstIsAnError) {
  const std::string path = WriteTemp("early.jsonl",
                                     "{\"timestamp\": 10, \"input_length\": 5, \"output_length\": 2, \"hash_ids\": []}\n"
                                     "{\"timestamp\": 9, \"input_length\": 5, \"output_length\": 2, \"hash_ids\": []}\n");
  auto trace = ReadMooncakeTrace(path);
  ASSERT_FALSE(trace.ok());
  EXPECT_THAT(std::string(trace.status().message()), HasSubstr(path + ":2: timestamp is earlier"));
}

TEST(MooncakeReader, MissingAndEmptyFiles) {
  auto missing = ReadMooncakeTrace(dhs::testing::ProcessTempDir() + "/no_such_trace.jsonl");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no_such_trace.jsonl"));
  auto empty = ReadMooncakeTrace(WriteTemp("empty.jsonl", "\n"));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("no requests"));
}

TEST(AzureReader, BundledCodeSliceMatchesFileText) {
  auto trace = ReadAzureTrace(kAzureCode);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->format, TraceFormat::kAzure);
  ASSERT_EQ(trace->requests.size(), 200u);  // the header is not a request
  // 2023-11-16 18:17:03.9799600,4808,10 then 2023-11-16 18:17:04.0319600,3180,8
  EXPECT_EQ(trace->requests[0].arrival_ms, 0);
  EXPECT_EQ(trace->requests[0].input_tokens, 4808);
  EXPECT_EQ(trace->requests[0].output_tokens, 10);
  EXPECT_TRUE(trace->requests[0].hash_ids.empty());
  EXPECT_NEAR(trace->requests[1].arrival_ms, 52.0, 1e-3);
  EXPECT_EQ(trace->requests[1].input_tokens, 3180);
  EXPECT_EQ(trace->requests[1].output_tokens, 8);
  // last row: 2023-11-16 18:20:23.0695450,65,10 -> 3 min 19.0895850 s after the first
  EXPECT_NEAR(trace->requests[199].arrival_ms, 199089.585, 1e-3);
  EXPECT_EQ(trace->requests[199].input_tokens, 65);
  EXPECT_EQ(trace->requests[199].output_tokens, 10);
}

TEST(AzureReader, BundledConvSliceMatchesFileText) {
  auto trace = ReadTrace(kAzureConv);  // by extension
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->requests.size(), 200u);
  // 2023-11-16 18:15:46.6805900,374,44 then 2023-11-16 18:15:50.9951690,396,109
  EXPECT_EQ(trace->requests[0].input_tokens, 374);
  EXPECT_EQ(trace->requests[0].output_tokens, 44);
  EXPECT_NEAR(trace->requests[1].arrival_ms, 4314.579, 1e-3);
  EXPECT_EQ(trace->requests[1].input_tokens, 396);
  EXPECT_EQ(trace->requests[1].output_tokens, 109);
  // last row: 2023-11-16 18:16:47.9441270,1143,409
  EXPECT_NEAR(trace->requests[199].arrival_ms, 61263.537, 1e-3);
  EXPECT_EQ(trace->requests[199].input_tokens, 1143);
}

TEST(AzureReader, MalformedLinesNameFileAndLine) {
  const std::string header = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  const std::string good = "2023-11-16 18:17:03.9799600,4808,10\n";
  const std::vector<BadLine> cases = {
      {"2023-11-16 18:17:04.0,4808", "expected 3 comma-separated fields, got 2"},
      {"2023-11-16 18:17:04.0,4808,10,1", "expected 3 comma-separated fields, got 4"},
      {"2023-11-16T18:17:04.0,4808,10", "timestamp must look like"},
      {"2023-02-30 18:17:04.0,4808,10", "timestamp must look like"},
      {"2023-11-16 18:17:04.0,-3,10", "ContextTokens must be an integer >= 1"},
      {"2023-11-16 18:17:04.0,4808,0", "GeneratedTokens must be an integer >= 1"},
      {"2023-11-16 18:17:04.0,4808,ten", "GeneratedTokens must be an integer >= 1"},
      {"2023-11-16 18:17:03.0,4808,10", "timestamp is earlier"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = WriteTemp("bad" + std::to_string(i) + ".csv", header + good + cases[i].text + "\n");
    auto trace = ReadAzureTrace(path);
    ASSERT_FALSE(trace.ok()) << cases[i].text;
    EXPECT_THAT(std::string(trace.status().message()), HasSubstr(path + ":3: " + cases[i].message))
        << trace.status();
  }
  const std::string no_header = WriteTemp("noheader.csv", good);
  EXPECT_THAT(std::string(ReadAzureTrace(no_header).status().message()),
              HasSubstr(no_header + ":1: expected the header"));
}

TEST(AzureReader, CrLfLinesAreAccepted) {
  auto trace = ReadAzureTrace(WriteTemp("crlf.csv",
                                        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                                        "2023-11-16 18:17:03,10,2\r\n2023-11-16 18:17:05.5,20,3\r\n"));
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->requests.size(), 2u);
  EXPECT_EQ(trace->requests[1].arrival_ms, 2500);
  EXPECT_EQ(trace->requests[1].output_tokens, 3);
}

TEST(ReadTrace, UnknownExtensionIsAnError) {
  auto trace = ReadTrace("trace.txt");
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trace.status().message()), HasSubstr("expected .jsonl (Mooncake) or .csv (Azure)"));
}

TEST(AzureTimestamp, KnownInstants) {
  // Unix epoch values computed by hand (days since 1970-01-01 * 86,400,000 + time of day).
  EXPECT_EQ(*ParseAzureTimestampMs("1970-01-01 00:00:00"), 0);
  EXPECT_EQ(*ParseAzureTimestampMs("1970-01-02 00:00:01.5"), 86'401'500);
  // 2000-02-29 (leap day): 11,016 days after the epoch, plus 12 h.
  EXPECT_EQ(*ParseAzureTimestampMs("2000-02-29 12:00:00"), 11016.0 * 86'400'000 + 12 * 3'600'000);
  // 2023-11-16 is 19,677 days after the epoch.
  EXPECT_NEAR(*ParseAzureTimestampMs("2023-11-16 18:17:03.9799600"),
              19677.0 * 86'400'000 + (18 * 3600 + 17 * 60 + 3) * 1000.0 + 979.96, 1e-3);
  for (const char* bad : {"", "2023-11-16", "2023-11-16 18:17:03.", "2023-11-16 18:17:03.1234567890",
                          "2023-13-01 00:00:00", "2023-11-16 24:00:00", "2023-11-16 18:60:00", "2O23-11-16 18:17:03"}) {
    EXPECT_FALSE(ParseAzureTimestampMs(bad).ok()) << bad;
  }
}

// 2023-11-16 00:00:00 UTC in ms since the epoch: 19,677 days (see KnownInstants).
constexpr double kNov16Ms = 19677.0 * 86'400'000;

TEST(AzureTimestamp, FractionalSecondsOfOneToNineDigits) {
  const double base = kNov16Ms + (18 * 3600 + 17 * 60 + 3) * 1000.0;
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 18:17:03"), base);
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 18:17:03.5"), base + 500);
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 18:17:03.25"), base + 250);
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 18:17:03.000"), base);
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 18:17:03.125000"), base + 125);
  EXPECT_NEAR(*ParseAzureTimestampMs("2023-11-16 18:17:03.000000001"), base + 1e-6, 1e-4);  // 1 ns, 9 digits
  EXPECT_NEAR(*ParseAzureTimestampMs("2023-11-16 18:17:03.999999999"), base + 999.999999, 1e-3);
  // Order of stamps in one second follows the fraction.
  EXPECT_LT(*ParseAzureTimestampMs("2023-11-16 18:17:03.0999"), *ParseAzureTimestampMs("2023-11-16 18:17:03.1"));
}

TEST(AzureTimestamp, UtcOffsetsAndZ) {
  const double base = kNov16Ms + (18 * 3600 + 17 * 60 + 3) * 1000.0 + 500;  // 18:17:03.5 UTC
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 18:17:03.5Z"), base);
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 18:17:03.5+00:00"), base);
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 19:17:03.5+01:00"), base);     // one hour east of UTC
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 12:47:03.5-05:30"), base);     // 5 h 30 min west
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 12:47:03.5-0530"), base);
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-17 03:17:03.5+09:00"), base);     // the next calendar day in Tokyo
  EXPECT_EQ(*ParseAzureTimestampMs("2023-11-16 18:17:03Z"), base - 500);
}

TEST(AzureTimestamp, MalformedStampsGiveAClearError) {
  struct Case {
    const char* text;
    const char* why;  // the reason at the end of the message
  };
  const std::vector<Case> cases = {
      {"", "too short"},
      {"2023-11-16", "too short"},
      {"2023-1-16 18:17:03.5", "date and time: "},  // unpadded month: ParseTime fails on the first 19 characters
      {"2023-11-16 8:17:03.50", "date and time: "},
      {"02023-1-16 18:17:03", "expected YYYY-MM-DD HH:MM:SS, zero-padded"},  // parses, but the fields are not 4-2-2
      {" 2023-11-16 18:17:03", "expected YYYY-MM-DD HH:MM:SS, zero-padded"},
      {"2023-11-16 18:17:60", "expected YYYY-MM-DD HH:MM:SS, zero-padded"},  // leap second
      {"2023-11-16 18:17:03.", "no digit after the decimal point"},
      {"2023-11-16 18:17:03.Z", "no digit after the decimal point"},
      {"2023-11-16 18:17:03.1234567890", "fraction of a second with 10 digits (at most 9)"},
      {"2023-11-16 18:17:03 ", "blank after the seconds"},
      {"2023-11-16 18:17:03.5 +01:00", "blank after the seconds"},
      {"2023-11-16 18:17:03.5+25:00", "fraction or UTC offset: "},    // offset out of range
      {"2023-11-16 18:17:03.5UTC", "fraction or UTC offset: "},       // zone names are not offsets
      {"2023-11-16 18:17:03x", "fraction or UTC offset: "},
      {"2023-02-29 00:00:00", "date and time: Out-of-range field"},  // not a leap year
      {"2023-11-31 00:00:00", "date and time: Out-of-range field"},
  };
  for (const Case& c : cases) {
    auto ms = ParseAzureTimestampMs(c.text);
    ASSERT_FALSE(ms.ok()) << c.text << " parsed as " << *ms;
    EXPECT_EQ(ms.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(ms.status().message());
    EXPECT_THAT(message, HasSubstr(std::string("timestamp must look like 2023-11-16 18:17:03.9799600")));
    EXPECT_THAT(message, HasSubstr(std::string("got '") + c.text + "'")) << message;
    EXPECT_THAT(message, HasSubstr(c.why)) << message;
  }
}

TEST(AzureReader, OffsetsAndFractionsInAFile) {
  auto trace = ReadAzureTrace(WriteTemp("offsets.csv",
                                        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                        "2023-11-16 18:17:03.25,10,2\n"
                                        "2023-11-16 19:17:04.75+01:00,20,3\n"
                                        "2023-11-16 18:17:05Z,30,4\n"));
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->requests.size(), 3u);
  EXPECT_EQ(trace->requests[0].arrival_ms, 0);
  EXPECT_EQ(trace->requests[1].arrival_ms, 1500);
  EXPECT_EQ(trace->requests[2].arrival_ms, 1750);
  const std::string bad = WriteTemp("badstamp.csv",
                                    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,2\n"
                                    "2023-11-16 18:17:03.1234567890,10,2\n");
  EXPECT_THAT(std::string(ReadAzureTrace(bad).status().message()),
              HasSubstr(bad + ":3: timestamp must look like 2023-11-16 18:17:03.9799600"));
}

Trace ThreeRequests() {
  Trace t;
  t.path = "mem";
  t.block_tokens = 512;
  t.requests = {{0, 0, 6758, 500, Iota(0, 13)}, {1, 5, 7322, 490, {0, 14, 15}}, {2, 9, 100, 24, {99}}};
  return t;
}

TEST(ScaleLengths, RoundsAndKeepsAtLeastOneToken) {
  auto scaled = ScaleLengths(ThreeRequests(), 0.02);
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  // 512 * 0.02 = 10.24 -> 10; 6758 * 0.02 = 135.16 -> 135; 500 * 0.02 = 10; 7322 * 0.02 = 146.44 -> 146;
  // 490 * 0.02 = 9.8 -> 10; 100 * 0.02 = 2; 24 * 0.02 = 0.48 -> 0 -> at least 1.
  EXPECT_EQ(scaled->block_tokens, 10);
  EXPECT_EQ(scaled->requests[0].input_tokens, 135);
  EXPECT_EQ(scaled->requests[0].output_tokens, 10);
  EXPECT_EQ(scaled->requests[1].input_tokens, 146);
  EXPECT_EQ(scaled->requests[1].output_tokens, 10);
  EXPECT_EQ(scaled->requests[2].input_tokens, 2);
  EXPECT_EQ(scaled->requests[2].output_tokens, 1);
  // ceil(135 / 10) = 14 blocks: all 14 ids stay; arrivals unchanged.
  EXPECT_EQ(scaled->requests[0].hash_ids, Iota(0, 13));
  EXPECT_EQ(scaled->requests[1].hash_ids, (std::vector<int64_t>{0, 14, 15}));
  EXPECT_EQ(scaled->requests[2].arrival_ms, 9);
}

TEST(ScaleLengths, CutsHashBlocksToTheScaledPromptAndKeepsSharedPrefixes) {
  auto scaled = ScaleLengths(ThreeRequests(), 0.001);
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  // block 0.512 -> 1 token; 6758 * 0.001 = 6.758 -> 7 tokens -> 7 blocks; 7322 -> 7 tokens, 3 ids kept.
  EXPECT_EQ(scaled->block_tokens, 1);
  EXPECT_EQ(scaled->requests[0].input_tokens, 7);
  EXPECT_EQ(scaled->requests[0].hash_ids, Iota(0, 6));
  EXPECT_EQ(scaled->requests[1].hash_ids, (std::vector<int64_t>{0, 14, 15}));
  EXPECT_EQ(scaled->requests[0].hash_ids[0], scaled->requests[1].hash_ids[0]);  // shared prefix stays shared
  EXPECT_EQ(scaled->requests[0].output_tokens, 1);  // 0.5 rounds half away from zero -> 1
}

TEST(ScaleLengths, LargerScale) {
  auto scaled = ScaleLengths(ThreeRequests(), 2.0);
  ASSERT_TRUE(scaled.ok());
  EXPECT_EQ(scaled->block_tokens, 1024);
  EXPECT_EQ(scaled->requests[0].input_tokens, 13516);
  EXPECT_EQ(scaled->requests[0].output_tokens, 1000);
  EXPECT_EQ(scaled->requests[0].hash_ids.size(), 14u);  // ceil(13516 / 1024) = 14
}

// Found by fuzz/trace_fuzz.cc: 9223372036854 tokens x 1e6 overflowed int64 in the block count (UBSan).
TEST(ScaleLengths, RejectsLengthsBeyondInt64) {
  Trace t = ThreeRequests();
  t.requests[0].input_tokens = 9223372036854;
  auto scaled = ScaleLengths(t, 1e6);
  EXPECT_EQ(scaled.status().code(), absl::StatusCode::kInvalidArgument) << scaled.status();
  t.requests[0].input_tokens = int64_t{1} << 61;  // fits at scale 1: kept, its ids cut to ceil(2^61 / 512) blocks
  auto same = ScaleLengths(t, 1.0);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->requests[0].input_tokens, int64_t{1} << 61);
}

TEST(ScaleLengths, RejectsNonPositiveScale) {
  for (double x : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto scaled = ScaleLengths(ThreeRequests(), x);
    EXPECT_EQ(scaled.status().code(), absl::StatusCode::kInvalidArgument) << x;
    EXPECT_THAT(std::string(scaled.status().message()), HasSubstr("length scale must be a number > 0"));
  }
}

TEST(TakeFirst, KeepsTheFirstN) {
  auto first = TakeFirst(ThreeRequests(), 2);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->requests.size(), 2u);
  EXPECT_EQ(first->requests[1].input_tokens, 7322);
  EXPECT_THAT(std::string(TakeFirst(ThreeRequests(), 0).status().message()), HasSubstr("must be >= 1"));
  EXPECT_THAT(std::string(TakeFirst(ThreeRequests(), 4).status().message()), HasSubstr("has only 3 requests"));
}

TEST(SynthesizePrompt, SharedHashIdsGiveSharedPrefixes) {
  PromptRef a{0, 35, 10, {7, 8, 9}};
  PromptRef b{1, 40, 10, {7, 8, 5}};
  const std::string pa = SynthesizePrompt(a);
  const std::string pb = SynthesizePrompt(b);
  ASSERT_EQ(pa.size(), 35u);
  ASSERT_EQ(pb.size(), 40u);
  EXPECT_EQ(pa.substr(0, 20), pb.substr(0, 20));  // blocks 7 and 8 are shared
  EXPECT_NE(pa.substr(20, 10), pb.substr(20, 10)); // block 9 vs block 5
  EXPECT_EQ(pa, SynthesizePrompt(a));              // deterministic
  // Without hash ids, the request's index seeds the tokens: different requests differ.
  EXPECT_NE(SynthesizePrompt({0, 64, 10, {}}), SynthesizePrompt({1, 64, 10, {}}));
  EXPECT_EQ(SynthesizePrompt({3, 0, 10, {}}), "");
}

}  // namespace
}  // namespace dhs::replay
