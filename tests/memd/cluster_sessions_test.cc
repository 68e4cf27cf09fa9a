// Issue 26 (sessions across nodes): memd/cluster_sessions.h, which pages of a finished turn are published under its
// session.
#include "memd/cluster_sessions.h"

#include <vector>

#include "gtest/gtest.h"

namespace dhs::memd {
namespace {

HistoryPage Page(HistoryState state, PageIndex host_page, uint64_t checksum) {
  HistoryPage p;
  p.state = state;
  p.host_page = host_page;
  p.checksum = checksum;
  return p;
}

TEST(SessionPagesTest, HisparseTurnPublishesEveryConfirmedPage) {
  core::Request r;
  for (uint32_t h = 0; h < 4; ++h) r.history.push_back(Page(HistoryState::kHost, 100 + h, 1000 + h));
  r.history.push_back(Page(HistoryState::kHostPending, 104, 0));  // still in the worker's tail: not confirmed
  const std::vector<uint64_t> digests = {11, 22, 33, 44, 55};
  const std::vector<SessionPublishPage> out = SessionPagesToPublish(r, digests);
  ASSERT_EQ(out.size(), 4u);
  for (uint32_t h = 0; h < 4; ++h) {
    EXPECT_EQ(out[h].page, h);
    EXPECT_EQ(out[h].host_page, 100 + h);
    EXPECT_EQ(out[h].checksum, 1000 + h);
    EXPECT_EQ(out[h].digest, digests[h]);
  }
}

TEST(SessionPagesTest, AdaptiveTurnPublishesOnlyBackedUpPages) {
  core::Request r;
  r.history = {Page(HistoryState::kGpuAndHost, 7, 70), Page(HistoryState::kGpu, 8, 0),
               Page(HistoryState::kPopulating, 9, 90), Page(HistoryState::kGpuDeferred, 10, 0),
               Page(HistoryState::kLost, 11, 0), Page(HistoryState::kHost, 12, 120)};
  const std::vector<SessionPublishPage> out = SessionPagesToPublish(r, std::vector<uint64_t>{1, 2, 3, 4, 5, 6});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].page, 0u);
  EXPECT_EQ(out[1].page, 2u);
  EXPECT_EQ(out[2].page, 5u);
  EXPECT_EQ(out[2].host_page, 12u);
  EXPECT_EQ(out[2].digest, 6u);
}

TEST(SessionPagesTest, SkipsPrefixPagesPagesWithoutChecksumAndPagesWithoutDigest) {
  core::Request r;
  for (uint32_t h = 0; h < 6; ++h) r.history.push_back(Page(HistoryState::kHost, h, h == 3 ? 0 : 50 + h));
  r.prefix.resize(2);  // pages 0 and 1 are shareable prefix pages: found under their prefix key
  // Page 3 has no known checksum (never imported anywhere); page 5 has no digest (the worker named 5 pages).
  const std::vector<SessionPublishPage> out = SessionPagesToPublish(r, std::vector<uint64_t>{1, 2, 3, 4, 5});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].page, 2u);
  EXPECT_EQ(out[1].page, 4u);
  EXPECT_TRUE(SessionPagesToPublish(r, {}).empty());  // a Complete without digests publishes nothing
  core::Request none;
  EXPECT_TRUE(SessionPagesToPublish(none, std::vector<uint64_t>{1, 2}).empty());  // more digests than pages
}

// Issue 26 (the lookup): a page found by a session address (r.prefix[h].session nonzero) is not a prefix page: it is
// published when it is r's own confirmed page (it missed: r computed it), skipped when r holds it shared (it was
// granted from the host tier: stored already).
TEST(SessionPagesTest, SessionAddressedPagesArePublishedUnlessHeld) {
  core::Request r;
  for (uint32_t h = 0; h < 5; ++h) r.history.push_back(Page(HistoryState::kHost, 40 + h, 400 + h));
  r.prefix.resize(4);
  r.prefix[2].session = r.prefix[3].session = 0x5e55;  // pages 0, 1 by the chain; 2, 3 by the session
  const std::vector<uint64_t> digests = {1, 2, 3, 4, 5};
  std::vector<SessionPublishPage> out = SessionPagesToPublish(r, digests, [](uint32_t h) { return h == 2; });
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].page, 3u);
  EXPECT_EQ(out[0].host_page, 43u);
  EXPECT_EQ(out[1].page, 4u);
  out = SessionPagesToPublish(r, digests);  // nothing held
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].page, 2u);
}

// Issue 26 (the lookup): a session admission's block addresses are asked under their session key too (the page's
// session address, from its digest), after the wanted ones; a session address or a page without a digest gets none;
// no session: nothing added. ServedBy takes the page's own answer first, else its alternate's.
TEST(SessionLookupTest, ChainPagesAreAskedUnderTheirSessionKeyToo) {
  std::vector<PrefixAddress> wanted(3);
  wanted[0].key = 100, wanted[0].page = 2;                         // a block address with a digest
  wanted[1].key = 101, wanted[1].page = 3;                         // a block address with a digest
  wanted[2] = PrefixPages::SessionAddress(9, 0x5e55, 0xd4, 16, 4);  // a session address already
  const std::vector<uint64_t> digests = {0xd0, 0xd1, 0xd2, 0xd3, 0xd4};
  const ClusterAsk ask = SessionAlternates(wanted, 9, 0x5e55, digests, 16);
  ASSERT_EQ(ask.asked.size(), 5u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ask.asked[i], wanted[i]);
  EXPECT_EQ(ask.alternate, (std::vector<int32_t>{3, 4, -1}));
  EXPECT_EQ(ask.asked[3], PrefixPages::SessionAddress(9, 0x5e55, 0xd2, 16, 2));
  EXPECT_EQ(ask.asked[4], PrefixPages::SessionAddress(9, 0x5e55, 0xd3, 16, 3));
  // Found: page 2 by its prefix key and its session key (the prefix one serves), page 3 by its session key only,
  // page 4 not at all.
  const std::vector<bool> found = {true, false, false, true, true};
  EXPECT_EQ(ServedBy(ask, found, 0), 0);
  EXPECT_EQ(ServedBy(ask, found, 1), 4);
  EXPECT_EQ(ServedBy(ask, found, 2), -1);
  // No session, or digests too short: nothing added.
  EXPECT_EQ(SessionAlternates(wanted, 9, 0, digests, 16).asked.size(), 3u);
  EXPECT_EQ(SessionAlternates(wanted, 9, 0x5e55, std::vector<uint64_t>{1, 2}, 16).alternate,
            (std::vector<int32_t>{-1, -1, -1}));
}

}  // namespace
}  // namespace dhs::memd
