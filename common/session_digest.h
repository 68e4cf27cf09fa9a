// common/session_digest.h: the page digests of a session's history (issue 26, "Sessions across nodes";
// docs/cluster_tier.md "Sessions").
//
// A session's next turn names its history pages by their content, not by block ids: page h of a request's tokens
// (tokens [h * p, (h + 1) * p), p = page rows) has the digest of ALL its tokens from position 0 to the page's end,
// so two requests share a digest for page h only when their first (h + 1) * p tokens are equal (a page's KV rows
// depend on every token before them). The worker computes them (it knows the tokens; memd knows only pages): for the
// prompt's complete pages in AdmitRequest.session_page_digests, for a finished turn's complete history pages (prompt
// then generated tokens) in Complete.session_page_digests; memd uses them as the <chain> of the session page keys
// (memd/cluster_keys.h SessionPageKey).
//
// The digest is a chain of XXH3-64 (libxxhash): d(-1) = XXH3-64 of p (4 bytes little-endian) with seed
// kSessionDigestSeed, d(h) = XXH3-64 of page h's tokens (one byte each: the byte-level vocabulary) with seed d(h - 1).
// p is in the chain's start: pages of another size never share a digest.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dhs {

inline constexpr uint64_t kSessionDigestSeed = 0x64687353657373ULL;  // "dhsSess"

// The digests of the complete pages among tokens[0, tokens.size()): floor(tokens.size() / page_rows) values, page 0
// first. Empty when page_rows is 0. Tokens are byte-level (0..255; a larger value is taken modulo 256, as the wire's
// [ubyte] prompt does).
std::vector<uint64_t> SessionPageDigests(std::span<const uint8_t> tokens, uint32_t page_rows);
std::vector<uint64_t> SessionPageDigests(std::span<const int32_t> tokens, uint32_t page_rows);

}  // namespace dhs
