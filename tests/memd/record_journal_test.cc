// memd/record_journal.h with real files in a private directory: records read back with their commits and Granted
// frame, a file cut short at every byte keeps exactly the frames written whole before the cut, a flipped byte ends
// the replay at its frame, an unreadable Open frame drops the file, and RemoveAllBut / Release remove files.
// memd/model_journal.h (issue 26): the models file written and read back, removed when empty, malformed lines refused.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "memd/model_journal.h"
#include "memd/record_journal.h"

namespace dhs::memd {
namespace {

constexpr TokenKind kBytes = TokenKind::kBytes;

class RecordJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/record_journal_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto j = RecordJournal::Create(dir_);
    ASSERT_TRUE(j.ok()) << j.status();
    journal_.emplace(std::move(*j));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  static RequestRecord Record() {
    RequestRecord r;
    r.client_request = 42;
    r.client = 0xC1E47;  // the client's identity survives the journal (a resume is found by it)
    r.prompt = {1, 2, 3, 4};
    r.hash_ids = {7, 8};
    r.input_tokens = 4;
    r.max_new_tokens = 6;
    r.temperature = 0.5f;
    r.top_p = 0.9f;
    r.seed = 11;
    return r;
  }
  std::string PathOf(RequestId id) const {
    char name[32];
    std::snprintf(name, sizeof name, "%016llx.rec", static_cast<unsigned long long>(id));
    return journal_->dir() + "/" + name;
  }
  std::string Bytes(RequestId id) const {
    std::ifstream in(PathOf(id), std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void Write(RequestId id, const std::string& bytes) const {
    std::ofstream(PathOf(id), std::ios::binary | std::ios::trunc) << bytes;
  }

  std::string dir_;
  std::optional<RecordJournal> journal_;
};

TEST_F(RecordJournalTest, RecordsReadBackWithCommitsAndGrant) {
  ASSERT_TRUE(journal_->Open(5, Record()).ok());
  ASSERT_TRUE(journal_->Commit(5, 0, kBytes, {9, 8}, {90, 80}).ok());
  ASSERT_TRUE(journal_->Commit(5, 1, kBytes, {8, 7}, {80, 70}).ok());  // a resent overlap, as the store accepts it
  ASSERT_TRUE(journal_->Granted(5, 3).ok());
  RequestRecord resumed = Record();
  resumed.tokens = {1};
  resumed.digests = {10};
  ASSERT_TRUE(journal_->Open(6, resumed).ok());  // a resumed request brings its committed tokens
  const auto all = journal_->LoadAll();
  ASSERT_EQ(all.size(), 2u);
  const JournaledRecord& r = all.at(5);
  EXPECT_EQ(r.record.client_request, 42u);
  EXPECT_EQ(r.record.client, 0xC1E47u);
  EXPECT_EQ(r.record.prompt, (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_EQ(r.record.hash_ids, (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(r.record.max_new_tokens, 6u);
  EXPECT_FLOAT_EQ(r.record.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.record.top_p, 0.9f);
  EXPECT_EQ(r.record.seed, 11u);
  EXPECT_EQ(r.record.tokens, (std::vector<uint32_t>{9, 8, 7}));
  EXPECT_EQ(r.record.digests, (std::vector<uint64_t>{90, 80, 70}));
  EXPECT_TRUE(r.granted);
  EXPECT_EQ(r.context_pages, 3u);
  EXPECT_FALSE(all.at(6).granted);
  EXPECT_EQ(all.at(6).record.tokens, (std::vector<uint32_t>{1}));
  journal_->Release(6);
  EXPECT_FALSE(std::filesystem::exists(PathOf(6)));
  journal_->RemoveAllBut({});
  EXPECT_TRUE(std::filesystem::is_empty(journal_->dir()));
}

// A kill cuts the file at any byte: what is read back is the frames written whole before the cut (a commit is acked
// only after its frame was written, so nothing acknowledged is lost).
TEST_F(RecordJournalTest, AFileCutAtAnyByteKeepsTheWholeFramesBeforeTheCut) {
  ASSERT_TRUE(journal_->Open(5, Record()).ok());
  const size_t open_end = Bytes(5).size();
  ASSERT_TRUE(journal_->Commit(5, 0, kBytes, {9, 8}, {90, 80}).ok());
  const size_t commit_end = Bytes(5).size();
  ASSERT_TRUE(journal_->Granted(5, 3).ok());
  const std::string whole = Bytes(5);
  for (size_t cut = 0; cut <= whole.size(); ++cut) {
    SCOPED_TRACE("cut at byte " + std::to_string(cut));
    Write(5, whole.substr(0, cut));
    const auto all = journal_->LoadAll();
    if (cut < open_end) {
      EXPECT_TRUE(all.empty());  // the Open frame is incomplete: the file is unreadable
      continue;
    }
    ASSERT_EQ(all.size(), 1u);
    EXPECT_EQ(all.at(5).record.tokens.size(), cut >= commit_end ? 2u : 0u);
    EXPECT_EQ(all.at(5).granted, cut == whole.size());
  }
}

TEST_F(RecordJournalTest, AFlippedByteEndsTheReplayAtItsFrame) {
  ASSERT_TRUE(journal_->Open(5, Record()).ok());
  const size_t open_end = Bytes(5).size();
  ASSERT_TRUE(journal_->Commit(5, 0, kBytes, {9, 8}, {90, 80}).ok());
  ASSERT_TRUE(journal_->Commit(5, 2, kBytes, {7}, {70}).ok());
  std::string bytes = Bytes(5);
  bytes[open_end + 20] ^= 0x20;  // the first token of the first Commit frame (after its 12-byte header, from, count)
  Write(5, bytes);
  auto all = journal_->LoadAll();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_TRUE(all.at(5).record.tokens.empty());  // the damaged frame and the ones after it are not applied
  bytes = Bytes(5);
  bytes[20] ^= 0x01;  // inside the Open frame's payload
  Write(5, bytes);
  EXPECT_TRUE(journal_->LoadAll().empty());
}

TEST_F(RecordJournalTest, ModelJournalRoundTripsAndRefusesMalformedFiles) {
  ModelJournal models(dir_);
  EXPECT_EQ(models.path(), dir_ + "/models");
  auto none = models.Load();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());  // no file: nothing known
  ASSERT_TRUE(models.Save({{3, 0xa1}, {0, 0xffffffffffffffff}}).ok());
  std::ifstream in(models.path());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "0 ffffffffffffffff\n3 00000000000000a1\n");
  EXPECT_EQ(std::filesystem::status(models.path()).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto back = models.Load();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, (ModelFingerprints{{0, 0xffffffffffffffff}, {3, 0xa1}}));
  for (const char* bad : {"0 a1\n", "0 00000000000000a1 x\n", "x 00000000000000a1\n", "0 000000000000000g\n",
                          "0 0000000000000000\n", "0 00000000000000a1\n0 00000000000000b2\n"}) {
    std::ofstream(models.path()) << bad;
    auto r = models.Load();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("models line"), std::string::npos) << r.status();
  }
  ASSERT_TRUE(models.Save({}).ok());
  EXPECT_FALSE(std::filesystem::exists(models.path()));
  EXPECT_TRUE(models.Save({}).ok());  // already gone
}

// Issue 25: an EngineIds record (libdhs) journals its prompt ids in the Open frame and its token ids in their own
// frames (4 bytes each), and reads back the same ids after a restart; a frame of the wrong width ends the replay.
TEST_F(RecordJournalTest, EngineIdRecordsReadBackTheirIds) {
  RequestRecord r;
  r.max_new_tokens = 5;
  r.token_kind = TokenKind::kEngineIds;
  r.prompt_ids = {151643, 9, 70000};
  r.input_tokens = 3;
  ASSERT_TRUE(journal_->Open(5, r).ok());
  ASSERT_TRUE(journal_->Commit(5, 0, TokenKind::kEngineIds, {100000, 256}, {1, 2}).ok());
  ASSERT_TRUE(journal_->Commit(5, 2, TokenKind::kEngineIds, {0x7fffffff}, {3}).ok());
  r.tokens = {4000};  // a resumed engine request brings its committed ids
  r.digests = {4};
  ASSERT_TRUE(journal_->Open(6, r).ok());
  auto all = journal_->LoadAll();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.at(5).record.token_kind, TokenKind::kEngineIds);
  EXPECT_EQ(all.at(5).record.prompt_ids, (std::vector<uint32_t>{151643, 9, 70000}));
  EXPECT_EQ(all.at(5).record.tokens, (std::vector<uint32_t>{100000, 256, 0x7fffffff}));
  EXPECT_EQ(all.at(5).record.digests, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(all.at(6).record.tokens, (std::vector<uint32_t>{4000}));
  // A Bytes frame in an EngineIds record (the store's kind rule): the replay stops before it.
  ASSERT_TRUE(journal_->Commit(5, 3, kBytes, {1}, {9}).ok());
  ASSERT_TRUE(journal_->Commit(5, 4, TokenKind::kEngineIds, {2}, {10}).ok());
  all = journal_->LoadAll();
  EXPECT_EQ(all.at(5).record.tokens.size(), 3u);
}

}  // namespace
}  // namespace dhs::memd
