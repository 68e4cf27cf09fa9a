// Round trip of every wire message (encode -> DecodeEnvelope -> Read<Msg>) with field values
// asserted, the decode-time checks (empty, truncated, corrupted offset, oversized, wrong version,
// unknown body, no body), and the absl::Status <-> wire ErrorCode mapping.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "flatbuffers/minireflect.h"

#include "common/protocol.h"
#include "common/status.h"

namespace dhs {
namespace {

using wire::ErrorCode;

constexpr char kSender[] = "worker/3";

// Encodes with `encode`, decodes, checks the envelope fields and reads the body back with `read`.
template <typename T, typename Enc, typename Rd>
T RoundTrip(const T& in, Enc encode, Rd read, wire::Body expected_type, uint64_t seq) {
  const std::string bytes = encode(in, seq, kSender);
  absl::StatusOr<Message> message = DecodeEnvelope(bytes);
  EXPECT_TRUE(message.ok()) << message.status();
  if (!message.ok()) return T();
  EXPECT_EQ(message->type, expected_type);
  EXPECT_EQ(message->sequence, seq);
  EXPECT_EQ(message->sender, kSender);
  EXPECT_EQ(message->envelope->protocol_version(), kProtocolVersion);
  absl::StatusOr<T> out = read(*message);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : T();
}

std::unique_ptr<wire::SourceInfoT> Source(uint32_t id, uint32_t bytes, uint32_t m, uint32_t consumers) {
  auto s = std::make_unique<wire::SourceInfoT>();
  s->source = id;
  s->bytes_per_row = bytes;
  s->positions_per_row = m;
  s->consumers = consumers;
  return s;
}

TEST(ProtocolRoundTrip, Hello) {
  wire::HelloT in;
  in.protocol_version = 1;
  in.gpu = 3;
  in.pid = 4242;
  in.device_name = "cpu-backend";
  in.capacity_pages = 8192;
  in.page_rows = 64;
  in.page_bytes = 64ull * 576 * 78;
  in.host_page_bytes = 64ull * (576 * 78 + 132 * 21);  // payload rows, then the index keys
  in.request_slots = 16;
  in.sources.push_back(Source(0, 576, 1, 78));
  in.sources.push_back(Source(7, 288, 4, 2));
  in.has_drafter = true;
  in.draft_ring_rows = 64 * ((2048 + 8 + 64 - 1) / 64);  // brief §6: R_d = p * ceil((W + K_max + p - 1) / p)
  wire::HelloT out = RoundTrip(in, EncodeHello, ReadHello, wire::Body::Hello, 1);
  EXPECT_EQ(out.protocol_version, 1u);
  EXPECT_EQ(out.gpu, 3u);
  EXPECT_EQ(out.pid, 4242u);
  EXPECT_EQ(out.device_name, "cpu-backend");
  EXPECT_EQ(out.capacity_pages, 8192u);
  EXPECT_EQ(out.page_rows, 64u);
  EXPECT_EQ(out.page_bytes, 2875392u);
  EXPECT_EQ(out.host_page_bytes, 3052800u);
  EXPECT_EQ(out.request_slots, 16u);
  ASSERT_EQ(out.sources.size(), 2u);
  EXPECT_EQ(out.sources[0]->source, 0u);
  EXPECT_EQ(out.sources[0]->bytes_per_row, 576u);
  EXPECT_EQ(out.sources[0]->positions_per_row, 1u);
  EXPECT_EQ(out.sources[0]->consumers, 78u);
  EXPECT_EQ(out.sources[1]->source, 7u);
  EXPECT_EQ(out.sources[1]->bytes_per_row, 288u);
  EXPECT_EQ(out.sources[1]->positions_per_row, 4u);
  EXPECT_TRUE(out.has_drafter);
  EXPECT_EQ(out.draft_ring_rows, 2112u);
}

TEST(ProtocolRoundTrip, HelloReply) {
  wire::HelloReplyT in;
  in.accepted = true;
  auto seg = std::make_unique<wire::HostSegmentInfoT>();
  seg->name = "dhs-host-0";
  seg->size_bytes = 4096 + 10ull * 65536;
  seg->page_bytes = 65536;
  seg->pages = 10;
  in.segments.push_back(std::move(seg));
  in.worker_epoch = 5;
  wire::HelloReplyT out = RoundTrip(in, EncodeHelloReply, ReadHelloReply, wire::Body::HelloReply, 2);
  EXPECT_TRUE(out.accepted);
  ASSERT_EQ(out.segments.size(), 1u);
  EXPECT_EQ(out.segments[0]->name, "dhs-host-0");
  EXPECT_EQ(out.segments[0]->size_bytes, 659456u);
  EXPECT_EQ(out.segments[0]->page_bytes, 65536u);
  EXPECT_EQ(out.segments[0]->pages, 10u);
  EXPECT_EQ(out.worker_epoch, 5u);
  EXPECT_EQ(out.reason, "");
}

TEST(ProtocolRoundTrip, AdmitRequest) {
  wire::AdmitRequestT in;
  in.request = 0x1234567890ull;
  in.gpu = 1;
  in.required_pages = 70;
  in.history_rows = 6900;
  in.complete_pages = 107;
  auto src = std::make_unique<wire::RequestSourceInfoT>();
  src->source = 2;
  src->history_rows = 6900;
  src->complete_pages = 107;
  src->required_pages = 65;
  in.sources.push_back(std::move(src));
  in.host_backed = true;
  in.resume_of = 0x0001'0000'0000'0005ull;
  wire::AdmitRequestT out = RoundTrip(in, EncodeAdmitRequest, ReadAdmitRequest, wire::Body::AdmitRequest, 3);
  EXPECT_EQ(out.request, 0x1234567890ull);
  EXPECT_EQ(out.gpu, 1u);
  EXPECT_EQ(out.required_pages, 70u);
  EXPECT_EQ(out.history_rows, 6900u);
  EXPECT_EQ(out.complete_pages, 107u);
  ASSERT_EQ(out.sources.size(), 1u);
  EXPECT_EQ(out.sources[0]->source, 2u);
  EXPECT_EQ(out.sources[0]->history_rows, 6900u);
  EXPECT_EQ(out.sources[0]->complete_pages, 107u);
  EXPECT_EQ(out.sources[0]->required_pages, 65u);
  EXPECT_TRUE(out.host_backed);
  EXPECT_EQ(out.resume_of, 0x0001'0000'0000'0005ull);
}

TEST(ProtocolRoundTrip, AdmitGrant) {
  wire::AdmitGrantT in;
  in.request = 9;
  in.slot = 4;
  in.required_pages = {10, 11, 12};
  in.optional_pages = {100, 101};
  in.optional_history_pages = {0, 1};
  in.backup_host_pages = {wire::HostPageRef(0, 17), wire::HostPageRef(1, 3)};
  in.imported_pages = 1;
  in.host_backed_pages = {0, 2, 3};  // a resume: copy, gap, copy, copy
  in.host_backed_checksums = {0xFEDCBA9876543210ull, 0, 7};  // issue 22: 0 = none known
  wire::AdmitGrantT out = RoundTrip(in, EncodeAdmitGrant, ReadAdmitGrant, wire::Body::AdmitGrant, 4);
  EXPECT_EQ(out.request, 9u);
  EXPECT_EQ(out.slot, 4u);
  EXPECT_EQ(out.required_pages, (std::vector<uint32_t>{10, 11, 12}));
  EXPECT_EQ(out.optional_pages, (std::vector<uint32_t>{100, 101}));
  EXPECT_EQ(out.optional_history_pages, (std::vector<uint32_t>{0, 1}));
  ASSERT_EQ(out.backup_host_pages.size(), 2u);
  EXPECT_EQ(out.backup_host_pages[0].segment(), 0u);
  EXPECT_EQ(out.backup_host_pages[0].page(), 17u);
  EXPECT_EQ(out.backup_host_pages[1].segment(), 1u);
  EXPECT_EQ(out.backup_host_pages[1].page(), 3u);
  EXPECT_EQ(out.imported_pages, 1u);
  EXPECT_EQ(out.host_backed_pages, (std::vector<uint32_t>{0, 2, 3}));
  EXPECT_EQ(out.host_backed_checksums, (std::vector<uint64_t>{0xFEDCBA9876543210ull, 0, 7}));
}

TEST(ProtocolRoundTrip, AdmitWaitAndReject) {
  wire::AdmitWaitT wait;
  wait.request = 21;
  wait.queue_position = 2;
  wait.deficit_pages = 33;
  wire::AdmitWaitT w = RoundTrip(wait, EncodeAdmitWait, ReadAdmitWait, wire::Body::AdmitWait, 5);
  EXPECT_EQ(w.request, 21u);
  EXPECT_EQ(w.queue_position, 2u);
  EXPECT_EQ(w.deficit_pages, 33u);

  wire::AdmitRejectT reject;
  reject.request = 22;
  reject.code = ErrorCode::RESOURCE_EXHAUSTED;
  reject.reason = "required 900 pages > M 800";
  wire::AdmitRejectT r = RoundTrip(reject, EncodeAdmitReject, ReadAdmitReject, wire::Body::AdmitReject, 6);
  EXPECT_EQ(r.request, 22u);
  EXPECT_EQ(r.code, ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(r.reason, "required 900 pages > M 800");
}

TEST(ProtocolRoundTrip, ReclaimOrderBackupReadersRetire) {
  wire::ReclaimOrderT order;
  order.order = 77;
  order.gpu = 2;
  order.request = 5;
  order.pages = {40, 41, 42};
  order.backup_pages = {42};
  order.backup_targets = {wire::HostPageRef(0, 900)};
  wire::ReclaimOrderT o = RoundTrip(order, EncodeReclaimOrder, ReadReclaimOrder, wire::Body::ReclaimOrder, 7);
  EXPECT_EQ(o.order, 77u);
  EXPECT_EQ(o.gpu, 2u);
  EXPECT_EQ(o.request, 5u);
  EXPECT_EQ(o.pages, (std::vector<uint32_t>{40, 41, 42}));
  EXPECT_EQ(o.backup_pages, (std::vector<uint32_t>{42}));
  ASSERT_EQ(o.backup_targets.size(), 1u);
  EXPECT_EQ(o.backup_targets[0].page(), 900u);

  wire::BackupCompleteT backup;
  backup.order = 77;
  backup.request = 5;
  backup.gpu = 2;
  backup.pages = {42};
  backup.host_pages = {wire::HostPageRef(0, 900)};
  backup.ok = false;
  backup.error = ErrorCode::DATA_LOSS;
  backup.message = "copy failed";
  backup.checksums = {0x8000000000000001ull};
  wire::BackupCompleteT b = RoundTrip(backup, EncodeBackupComplete, ReadBackupComplete, wire::Body::BackupComplete, 8);
  EXPECT_EQ(b.order, 77u);
  EXPECT_EQ(b.request, 5u);
  EXPECT_EQ(b.gpu, 2u);
  EXPECT_EQ(b.pages, (std::vector<uint32_t>{42}));
  ASSERT_EQ(b.host_pages.size(), 1u);
  EXPECT_EQ(b.host_pages[0].segment(), 0u);
  EXPECT_EQ(b.host_pages[0].page(), 900u);
  EXPECT_FALSE(b.ok);
  EXPECT_EQ(b.error, ErrorCode::DATA_LOSS);
  EXPECT_EQ(b.message, "copy failed");
  EXPECT_EQ(b.checksums, (std::vector<uint64_t>{0x8000000000000001ull}));

  wire::ReadersDoneT done;
  done.order = 77;
  done.request = 5;
  done.gpu = 2;
  done.pages = {40, 41, 42};
  wire::ReadersDoneT d = RoundTrip(done, EncodeReadersDone, ReadReadersDone, wire::Body::ReadersDone, 9);
  EXPECT_EQ(d.order, 77u);
  EXPECT_EQ(d.request, 5u);
  EXPECT_EQ(d.gpu, 2u);
  EXPECT_EQ(d.pages, (std::vector<uint32_t>{40, 41, 42}));

  wire::RetireT retire;
  retire.order = 77;
  retire.gpu = 2;
  retire.request = 5;
  retire.pages = {40, 41, 42};
  retire.regranted_to = 8;
  wire::RetireT t = RoundTrip(retire, EncodeRetire, ReadRetire, wire::Body::Retire, 10);
  EXPECT_EQ(t.order, 77u);
  EXPECT_EQ(t.gpu, 2u);
  EXPECT_EQ(t.request, 5u);
  EXPECT_EQ(t.pages, (std::vector<uint32_t>{40, 41, 42}));
  EXPECT_EQ(t.regranted_to, 8u);
}

TEST(ProtocolRoundTrip, HostCopyWritten) {
  wire::HostCopyWrittenT in;
  in.request = 12;
  in.gpu = 3;
  in.history_pages = {0, 7};
  in.host_pages = {wire::HostPageRef(0, 11), wire::HostPageRef(0, 95)};
  in.checksums = {1, 0xFFFFFFFFFFFFFFFFull};
  wire::HostCopyWrittenT out =
      RoundTrip(in, EncodeHostCopyWritten, ReadHostCopyWritten, wire::Body::HostCopyWritten, 21);
  EXPECT_EQ(out.request, 12u);
  EXPECT_EQ(out.gpu, 3u);
  EXPECT_EQ(out.history_pages, (std::vector<uint32_t>{0, 7}));
  ASSERT_EQ(out.host_pages.size(), 2u);
  EXPECT_EQ(out.host_pages[1].page(), 95u);
  EXPECT_TRUE(out.ok);  // the schema's default: a report of written pages
  EXPECT_EQ(out.checksums, (std::vector<uint64_t>{1, 0xFFFFFFFFFFFFFFFFull}));

  in.ok = false;
  in.error = ErrorCode::DATA_LOSS;
  in.message = "host write failed";
  out = RoundTrip(in, EncodeHostCopyWritten, ReadHostCopyWritten, wire::Body::HostCopyWritten, 22);
  EXPECT_FALSE(out.ok);
  EXPECT_EQ(out.error, ErrorCode::DATA_LOSS);
  EXPECT_EQ(out.message, "host write failed");
}

TEST(ProtocolRoundTrip, PopulateAndReadyPublish) {
  wire::PopulateOrderT pop;
  pop.order = 90;
  pop.gpu = 0;
  pop.request = 11;
  pop.pages = {7, 8};
  pop.history_pages = {30, 31};
  pop.host_pages = {wire::HostPageRef(2, 5), wire::HostPageRef(2, 6)};
  wire::PopulateOrderT p = RoundTrip(pop, EncodePopulateOrder, ReadPopulateOrder, wire::Body::PopulateOrder, 11);
  EXPECT_EQ(p.order, 90u);
  EXPECT_EQ(p.gpu, 0u);
  EXPECT_EQ(p.request, 11u);
  EXPECT_EQ(p.pages, (std::vector<uint32_t>{7, 8}));
  EXPECT_EQ(p.history_pages, (std::vector<uint32_t>{30, 31}));
  ASSERT_EQ(p.host_pages.size(), 2u);
  EXPECT_EQ(p.host_pages[1].segment(), 2u);
  EXPECT_EQ(p.host_pages[1].page(), 6u);

  wire::ReadyPublishT ready;  // ok defaults to true in the schema
  EXPECT_TRUE(ready.ok);
  ready.order = 90;
  ready.gpu = 0;
  ready.request = 11;
  ready.pages = {7, 8};
  ready.history_pages = {30, 31};
  wire::ReadyPublishT r = RoundTrip(ready, EncodeReadyPublish, ReadReadyPublish, wire::Body::ReadyPublish, 12);
  EXPECT_EQ(r.order, 90u);
  EXPECT_EQ(r.request, 11u);
  EXPECT_EQ(r.pages, (std::vector<uint32_t>{7, 8}));
  EXPECT_EQ(r.history_pages, (std::vector<uint32_t>{30, 31}));
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.error, ErrorCode::OK);
}

TEST(ProtocolRoundTrip, CompleteHeartbeatError) {
  wire::CompleteT complete;
  complete.request = 13;
  complete.gpu = 1;
  wire::CompleteT c = RoundTrip(complete, EncodeComplete, ReadComplete, wire::Body::Complete, 13);
  EXPECT_EQ(c.request, 13u);
  EXPECT_EQ(c.gpu, 1u);

  wire::CompleteAckT ack;
  ack.request = 13;
  ack.released_pages = 170;
  wire::CompleteAckT a = RoundTrip(ack, EncodeCompleteAck, ReadCompleteAck, wire::Body::CompleteAck, 13);
  EXPECT_EQ(a.request, 13u);
  EXPECT_EQ(a.released_pages, 170u);

  wire::HeartbeatT hb;
  hb.sender_time_ns = 123456789012345ull;
  hb.gpu = 6;
  hb.active_requests = 12;
  hb.pending_copies = 3;
  hb.decode_tokens_per_s = 1500.5f;
  wire::HeartbeatT h = RoundTrip(hb, EncodeHeartbeat, ReadHeartbeat, wire::Body::Heartbeat, 14);
  EXPECT_EQ(h.sender_time_ns, 123456789012345ull);
  EXPECT_EQ(h.gpu, 6u);
  EXPECT_EQ(h.active_requests, 12u);
  EXPECT_EQ(h.pending_copies, 3u);
  EXPECT_EQ(h.decode_tokens_per_s, 1500.5f);

  wire::HeartbeatAckT hack;
  hack.sender_time_ns = 123456789012345ull;
  hack.receiver_time_ns = 99;
  wire::HeartbeatAckT ha = RoundTrip(hack, EncodeHeartbeatAck, ReadHeartbeatAck, wire::Body::HeartbeatAck, 14);
  EXPECT_EQ(ha.sender_time_ns, 123456789012345ull);
  EXPECT_EQ(ha.receiver_time_ns, 99u);

  wire::ErrorReplyT err;
  err.code = ErrorCode::NOT_FOUND;
  err.message = "no request 5";
  err.answering_sequence = 15;
  wire::ErrorReplyT e = RoundTrip(err, EncodeErrorReply, ReadErrorReply, wire::Body::ErrorReply, 15);
  EXPECT_EQ(e.code, ErrorCode::NOT_FOUND);
  EXPECT_EQ(e.message, "no request 5");
  EXPECT_EQ(e.answering_sequence, 15u);
}

TEST(ProtocolRoundTrip, Introspect) {
  wire::IntrospectQueryT q;
  q.what = wire::IntrospectWhat::Pages;
  q.request = 0;
  q.gpu = 3;
  q.format = wire::IntrospectFormat::Text;
  wire::IntrospectQueryT qo = RoundTrip(q, EncodeIntrospectQuery, ReadIntrospectQuery, wire::Body::IntrospectQuery, 16);
  EXPECT_EQ(qo.what, wire::IntrospectWhat::Pages);
  EXPECT_EQ(qo.gpu, 3u);
  EXPECT_EQ(qo.format, wire::IntrospectFormat::Text);

  wire::IntrospectReplyT r;
  r.what = wire::IntrospectWhat::Status;
  r.format = wire::IntrospectFormat::Json;
  r.document = R"({"gpus":[{"M":800}]})";
  wire::IntrospectReplyT ro = RoundTrip(r, EncodeIntrospectReply, ReadIntrospectReply, wire::Body::IntrospectReply, 16);
  EXPECT_EQ(ro.what, wire::IntrospectWhat::Status);
  EXPECT_EQ(ro.format, wire::IntrospectFormat::Json);
  EXPECT_EQ(ro.document, R"({"gpus":[{"M":800}]})");
}

TEST(ProtocolRoundTrip, Serving) {
  wire::SubmitRequestT s;
  s.request = 1001;
  s.prompt = {'h', 'i', 0, 255};
  s.hash_ids = {};
  s.max_new_tokens = 32;
  s.temperature = 0.0f;
  EXPECT_EQ(s.top_p, 1.0f);  // schema default
  s.seed = 7;
  wire::SubmitRequestT so = RoundTrip(s, EncodeSubmitRequest, ReadSubmitRequest, wire::Body::SubmitRequest, 17);
  EXPECT_EQ(so.request, 1001u);
  EXPECT_EQ(so.prompt, (std::vector<uint8_t>{'h', 'i', 0, 255}));
  EXPECT_TRUE(so.hash_ids.empty());
  EXPECT_EQ(so.max_new_tokens, 32u);
  EXPECT_EQ(so.temperature, 0.0f);
  EXPECT_EQ(so.top_p, 1.0f);
  EXPECT_EQ(so.seed, 7u);

  wire::SubmitRequestT prefix;  // prepared-prefix form
  prefix.request = 1002;
  prefix.hash_ids = {46, 47, 48};
  prefix.input_tokens = 1500;
  prefix.top_p = 0.9f;
  prefix.temperature = 0.7f;
  wire::SubmitRequestT po = RoundTrip(prefix, EncodeSubmitRequest, ReadSubmitRequest, wire::Body::SubmitRequest, 18);
  EXPECT_TRUE(po.prompt.empty());
  EXPECT_EQ(po.hash_ids, (std::vector<uint64_t>{46, 47, 48}));
  EXPECT_EQ(po.input_tokens, 1500u);
  EXPECT_EQ(po.top_p, 0.9f);
  EXPECT_EQ(po.temperature, 0.7f);

  wire::SubmitAcceptedT acc;
  acc.request = 1001;
  acc.slot = 2;
  acc.queue_position = 0;
  wire::SubmitAcceptedT ao = RoundTrip(acc, EncodeSubmitAccepted, ReadSubmitAccepted, wire::Body::SubmitAccepted, 17);
  EXPECT_EQ(ao.request, 1001u);
  EXPECT_EQ(ao.slot, 2u);

  wire::TokenChunkT chunk;
  chunk.request = 1001;
  chunk.tokens = {65, 66};
  chunk.logits_digests = {0xdeadbeefcafef00dull, 1};
  chunk.finished = true;
  chunk.ttft_us = 1200;
  chunk.since_submit_us = 5400;
  wire::TokenChunkT co = RoundTrip(chunk, EncodeTokenChunk, ReadTokenChunk, wire::Body::TokenChunk, 17);
  EXPECT_EQ(co.request, 1001u);
  EXPECT_EQ(co.tokens, (std::vector<uint8_t>{65, 66}));
  EXPECT_EQ(co.logits_digests, (std::vector<uint64_t>{0xdeadbeefcafef00dull, 1}));
  EXPECT_TRUE(co.finished);
  EXPECT_EQ(co.ttft_us, 1200u);
  EXPECT_EQ(co.since_submit_us, 5400u);
}

// Issue 22: Cancel round-trips; the end reasons a status carries are read back by EndReasonOf (and none from a
// plain status), with their wire codes.
TEST(ProtocolRoundTrip, CancelAndEndReasons) {
  wire::CancelT cancel;
  cancel.request = 77;
  cancel.client = 0xabcdef;
  cancel.reason = "timeout after 30000 ms";
  wire::CancelT out = RoundTrip(cancel, EncodeCancel, ReadCancel, wire::Body::Cancel, 19);
  EXPECT_EQ(out.request, 77u);
  EXPECT_EQ(out.client, 0xabcdefu);
  EXPECT_EQ(out.reason, "timeout after 30000 ms");
  const absl::Status cancelled = RequestCancelledError("deadline");
  EXPECT_EQ(cancelled.message(), "cancelled: deadline");
  EXPECT_EQ(ToWireError(cancelled), ErrorCode::CANCELLED);
  EXPECT_EQ(EndReasonOf(cancelled), wire::EndReason::CANCELLED);
  const absl::Status stopping = WorkerStoppingError();
  EXPECT_EQ(stopping.message(), "worker stopping");
  EXPECT_EQ(ToWireError(stopping), ErrorCode::UNAVAILABLE);
  EXPECT_EQ(EndReasonOf(stopping), wire::EndReason::WORKER_STOPPING);
  EXPECT_EQ(EndReasonOf(WorkerEpochEndedError("fenced")), wire::EndReason::WORKER_EPOCH_ENDED);
  EXPECT_EQ(EndReasonOf(absl::CancelledError("cancelled: by hand")), wire::EndReason::NONE);
  EXPECT_EQ(EndReasonOf(absl::UnavailableError("worker stopping")), wire::EndReason::NONE);  // codes, never text
}

TEST(ProtocolRead, WrongTypeIsFailedPrecondition) {
  wire::CompleteT complete;
  complete.request = 1;
  const std::string bytes = EncodeComplete(complete, 1, kSender);
  absl::StatusOr<Message> message = DecodeEnvelope(bytes);
  ASSERT_TRUE(message.ok());
  absl::StatusOr<wire::HelloT> hello = ReadHello(*message);
  EXPECT_EQ(hello.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadErrorStatus(*message).code(), absl::StatusCode::kFailedPrecondition);
}

// ---- decode-time checks ----

std::string GoodBytes() {
  wire::HeartbeatT hb;
  hb.sender_time_ns = 5;
  return EncodeHeartbeat(hb, 99, "dhsctl");
}

TEST(ProtocolDecode, EmptyIsInvalidMessage) {
  EXPECT_EQ(ToWireError(DecodeEnvelope(std::string_view()).status()), ErrorCode::INVALID_MESSAGE);
}

TEST(ProtocolDecode, TruncationIsInvalidMessage) {
  const std::string good = GoodBytes();
  int refused = 0;
  for (size_t len = 1; len < good.size(); ++len) {
    absl::StatusOr<Message> message = DecodeEnvelope(std::string_view(good.data(), len));
    if (message.ok()) {
      // Only trailing alignment padding may be cut without detection: the content is intact.
      absl::StatusOr<wire::HeartbeatT> hb = ReadHeartbeat(*message);
      ASSERT_TRUE(hb.ok()) << "length " << len;
      EXPECT_EQ(hb->sender_time_ns, 5u);
      EXPECT_EQ(message->sender, "dhsctl");
      EXPECT_GE(len, good.size() - 3) << "a cut of real data was accepted";
    } else {
      EXPECT_EQ(ToWireError(message.status()), ErrorCode::INVALID_MESSAGE) << "length " << len;
      ++refused;
    }
  }
  EXPECT_GE(refused, static_cast<int>(good.size()) - 4);
}

TEST(ProtocolDecode, CorruptedRootOffsetIsInvalidMessage) {
  std::string bad = GoodBytes();
  const uint32_t offset = static_cast<uint32_t>(bad.size()) + 64;  // root table beyond the buffer
  std::memcpy(bad.data(), &offset, sizeof(offset));
  EXPECT_EQ(ToWireError(DecodeEnvelope(bad).status()), ErrorCode::INVALID_MESSAGE);
}

TEST(ProtocolDecode, CorruptedVtableOffsetIsInvalidMessage) {
  std::string bad = GoodBytes();
  uint32_t root = 0;
  std::memcpy(&root, bad.data(), sizeof(root));
  const int32_t vtable = 0x7fff0000;  // soffset from the root table to its vtable: far outside
  std::memcpy(bad.data() + root, &vtable, sizeof(vtable));
  EXPECT_EQ(ToWireError(DecodeEnvelope(bad).status()), ErrorCode::INVALID_MESSAGE);
}

TEST(ProtocolDecode, OversizedIsInvalidMessage) {
  const std::string good = GoodBytes();
  // At the limit a good message passes; one byte less of limit and it is refused.
  EXPECT_TRUE(DecodeEnvelope(good, good.size()).ok());
  EXPECT_EQ(ToWireError(DecodeEnvelope(good, good.size() - 1).status()), ErrorCode::INVALID_MESSAGE);
  std::string huge(kMaxMessageBytes + 1, '\0');
  std::memcpy(huge.data(), good.data(), good.size());
  EXPECT_EQ(ToWireError(DecodeEnvelope(huge).status()), ErrorCode::INVALID_MESSAGE);
}

TEST(ProtocolDecode, WrongVersionIsVersionMismatch) {
  const std::string bytes =
      internal::EncodeRawEnvelope(kProtocolVersion + 1, static_cast<uint8_t>(wire::Body::ErrorReply), 5, "old");
  absl::StatusOr<Message> message = DecodeEnvelope(bytes);
  EXPECT_EQ(ToWireError(message.status()), ErrorCode::VERSION_MISMATCH);
  EXPECT_EQ(PeekSequence(bytes), 5u);  // still verifiable: an ErrorReply can answer it
}

TEST(ProtocolDecode, UnknownBodyIsUnknownMessage) {
  const uint8_t unknown = static_cast<uint8_t>(wire::Body::MAX) + 1;
  absl::StatusOr<Message> message = DecodeEnvelope(internal::EncodeRawEnvelope(kProtocolVersion, unknown, 6, "new"));
  EXPECT_EQ(ToWireError(message.status()), ErrorCode::UNKNOWN_MESSAGE);
  EXPECT_EQ(ToWireError(DecodeEnvelope(internal::EncodeRawEnvelope(kProtocolVersion, 200, 6, "new")).status()),
            ErrorCode::UNKNOWN_MESSAGE);
}

TEST(ProtocolDecode, NoBodyIsInvalidMessage) {
  absl::StatusOr<Message> message = DecodeEnvelope(internal::EncodeRawEnvelope(kProtocolVersion, 0, 6, "x"));
  EXPECT_EQ(ToWireError(message.status()), ErrorCode::INVALID_MESSAGE);
}

TEST(ProtocolDecode, RandomGarbageNeverCrashes) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string garbage = GoodBytes();
    for (int flips = 0; flips < 3; ++flips) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      garbage[x % garbage.size()] = static_cast<char>(x >> 32);
    }
    absl::StatusOr<Message> message = DecodeEnvelope(garbage);
    if (message.ok() && message->type == wire::Body::Heartbeat) {
      EXPECT_TRUE(ReadHeartbeat(*message).ok());
    }
  }
}

// ---- every member of the union (DHS_WIRE_MESSAGES) ----

// Fills a table of any type from its mini-reflection type table (--reflect-names): every field set, scalars to
// distinct non-zero values (enums to their last value), strings "f<n>", vectors with two elements, sub-tables and
// structs filled the same way. So the round trip below covers every field of every message, also fields appended
// later, without a hand-written sample per message.
class TableFiller {
 public:
  explicit TableFiller(flatbuffers::FlatBufferBuilder& fbb) : fbb_(fbb) {}

  flatbuffers::uoffset_t Table(const flatbuffers::TypeTable* tt, int depth = 0) {
    EXPECT_LT(depth, 6) << "type nesting too deep for the filler";
    std::vector<flatbuffers::uoffset_t> offsets(tt->num_elems, 0);
    for (size_t i = 0; i < tt->num_elems; ++i) {  // offsets first: nothing may be created inside a table
      const flatbuffers::TypeCode tc = tt->type_codes[i];
      const auto type = static_cast<flatbuffers::ElementaryType>(tc.base_type);
      const flatbuffers::TypeTable* ref = tc.sequence_ref >= 0 ? tt->type_refs[tc.sequence_ref]() : nullptr;
      EXPECT_NE(type, flatbuffers::ET_UTYPE) << tt->names[i] << ": a union inside a message: extend the filler";
      if (tc.is_repeating) {
        offsets[i] = Vector(type, ref, depth);
      } else if (type == flatbuffers::ET_STRING) {
        offsets[i] = String();
      } else if (type == flatbuffers::ET_SEQUENCE && ref->st == flatbuffers::ST_TABLE) {
        offsets[i] = Table(ref, depth + 1);
      }
    }
    const flatbuffers::uoffset_t start = fbb_.StartTable();
    for (size_t i = 0; i < tt->num_elems; ++i) {
      const flatbuffers::TypeCode tc = tt->type_codes[i];
      const auto type = static_cast<flatbuffers::ElementaryType>(tc.base_type);
      const flatbuffers::TypeTable* ref = tc.sequence_ref >= 0 ? tt->type_refs[tc.sequence_ref]() : nullptr;
      const auto field = flatbuffers::FieldIndexToOffset(static_cast<flatbuffers::voffset_t>(i));
      if (offsets[i] != 0) {
        fbb_.AddOffset(field, flatbuffers::Offset<void>(offsets[i]));
        continue;
      }
      const std::vector<uint8_t> bytes = Inline(type, ref);
      fbb_.Align(type == flatbuffers::ET_SEQUENCE ? 8 : bytes.size());
      fbb_.PushBytes(bytes.data(), bytes.size());
      fbb_.TrackField(field, fbb_.GetSize());
    }
    return fbb_.EndTable(start);
  }

 private:
  // A scalar, enum or struct value as its little-endian bytes.
  std::vector<uint8_t> Inline(flatbuffers::ElementaryType type, const flatbuffers::TypeTable* ref) {
    const size_t size = flatbuffers::InlineSize(type, ref);
    std::vector<uint8_t> out(size, 0);
    if (type == flatbuffers::ET_SEQUENCE) {  // a struct: each field at its offset
      for (size_t j = 0; j < ref->num_elems; ++j) {
        const flatbuffers::TypeCode tc = ref->type_codes[j];
        const flatbuffers::TypeTable* sub = tc.sequence_ref >= 0 ? ref->type_refs[tc.sequence_ref]() : nullptr;
        const std::vector<uint8_t> field = Inline(static_cast<flatbuffers::ElementaryType>(tc.base_type), sub);
        std::memcpy(out.data() + ref->values[j], field.data(), field.size());
      }
      return out;
    }
    uint64_t v = next_++ % 100 + 1;
    if (type == flatbuffers::ET_BOOL) v = 1;
    if (ref != nullptr && ref->st == flatbuffers::ST_ENUM) {
      v = static_cast<uint64_t>(ref->values != nullptr ? ref->values[ref->num_elems - 1] : ref->num_elems - 1);
    }
    if (type == flatbuffers::ET_FLOAT) {
      const float f = static_cast<float>(v) + 0.5f;
      std::memcpy(out.data(), &f, sizeof f);
    } else if (type == flatbuffers::ET_DOUBLE) {
      const double d = static_cast<double>(v) + 0.25;
      std::memcpy(out.data(), &d, sizeof d);
    } else {
      for (size_t b = 0; b < size; ++b) out[b] = static_cast<uint8_t>(v >> (8 * b));
    }
    return out;
  }

  flatbuffers::uoffset_t String() { return fbb_.CreateString("f" + std::to_string(next_++)).o; }

  flatbuffers::uoffset_t Vector(flatbuffers::ElementaryType type, const flatbuffers::TypeTable* ref, int depth) {
    constexpr size_t kElements = 2;
    if (type == flatbuffers::ET_STRING || (type == flatbuffers::ET_SEQUENCE && ref->st == flatbuffers::ST_TABLE)) {
      std::vector<flatbuffers::Offset<void>> items;
      for (size_t j = 0; j < kElements; ++j) {
        items.emplace_back(type == flatbuffers::ET_STRING ? String() : Table(ref, depth + 1));
      }
      return fbb_.CreateVector(items).o;
    }
    std::vector<std::vector<uint8_t>> items;
    for (size_t j = 0; j < kElements; ++j) items.push_back(Inline(type, ref));
    uint8_t* data = nullptr;
    const flatbuffers::uoffset_t vec = fbb_.CreateUninitializedVector(kElements, items[0].size(), &data);
    for (size_t j = 0; j < kElements; ++j) std::memcpy(data + j * items[j].size(), items[j].data(), items[j].size());
    return vec;
  }

  flatbuffers::FlatBufferBuilder& fbb_;
  uint64_t next_ = 0;
};

// An envelope of body type `type` whose body is a table of `tt` with every field set.
std::string FilledEnvelope(wire::Body type, const flatbuffers::TypeTable* tt, uint64_t seq) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  TableFiller filler(fbb);
  const flatbuffers::uoffset_t body = filler.Table(tt);
  const auto sender = fbb.CreateString(kSender);
  wire::EnvelopeBuilder envelope(fbb);
  envelope.add_protocol_version(kProtocolVersion);
  envelope.add_sequence(seq);
  envelope.add_sender(sender);
  envelope.add_body_type(type);
  envelope.add_body(flatbuffers::Offset<void>(body));
  fbb.Finish(envelope.Finish());
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

// A table as text (the fields present, in schema order).
std::string TableText(const uint8_t* table, const flatbuffers::TypeTable* tt) {
  flatbuffers::ToStringVisitor text(" ", true, "", false);
  flatbuffers::IterateObject(table, tt, &text);
  return text.s;
}

// `body` packed with every field written, also those equal to their default (Pack leaves those out: a bool field
// whose default is true, set to true, reads back as the default), as text.
template <typename T>
std::string EveryFieldText(const T& body) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  fbb.ForceDefaults(true);
  fbb.Finish(T::TableType::Pack(fbb, &body));
  return TableText(flatbuffers::GetRoot<uint8_t>(fbb.GetBufferPointer()), T::TableType::MiniReflectTypeTable());
}

// Round trip of one member with every field set: filled envelope -> DecodeEnvelope -> Read<Name> -> Encode<Name> ->
// DecodeEnvelope -> Read<Name>; what comes back, every field written, reads as the same text as the filled body, which
// names every field of the type.
template <typename T, typename Rd, typename Enc>
void RoundTripEveryField(wire::Body type, Rd read, Enc encode, std::set<wire::Body>& covered) {
  SCOPED_TRACE(BodyName(type));
  covered.insert(type);
  const flatbuffers::TypeTable* tt = T::TableType::MiniReflectTypeTable();
  constexpr wire::Body kOwnType = wire::BodyTraits<typename T::TableType>::enum_value;  // a copy: no ODR use
  EXPECT_EQ(type, kOwnType);
  const std::string bytes = FilledEnvelope(type, tt, 40 + static_cast<uint64_t>(type));
  absl::StatusOr<Message> in = DecodeEnvelope(bytes);
  ASSERT_TRUE(in.ok()) << in.status();
  absl::StatusOr<T> body = read(*in);
  ASSERT_TRUE(body.ok()) << body.status();
  const std::string again = encode(*body, in->sequence, in->sender);
  absl::StatusOr<Message> out = DecodeEnvelope(again);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->type, type);
  EXPECT_EQ(out->sequence, in->sequence);
  EXPECT_EQ(out->sender, kSender);
  absl::StatusOr<T> back = read(*out);
  ASSERT_TRUE(back.ok()) << back.status();
  const std::string text = TableText(static_cast<const uint8_t*>(in->envelope->body()), tt);
  EXPECT_EQ(EveryFieldText(*back), text);
  for (size_t i = 0; i < tt->num_elems; ++i) {
    EXPECT_NE(text.find(std::string("\"") + tt->names[i] + "\": "), std::string::npos)
        << tt->names[i] << " was not set: " << text;
  }
  // VisitMessage dispatches it to the visitor of its own type.
  bool visited = false;
  EXPECT_TRUE(VisitMessage(*out, [&](const auto& b) {
                visited = std::is_same_v<std::decay_t<decltype(b)>, T>;
              }).ok());
  EXPECT_TRUE(visited);
}

TEST(ProtocolRoundTrip, EveryMemberOfTheUnionWithEveryField) {
  std::set<wire::Body> covered;
#define DHS_ROUND_TRIP(Name) RoundTripEveryField<wire::Name##T>(wire::Body::Name, Read##Name, Encode##Name, covered);
  DHS_WIRE_MESSAGES(DHS_ROUND_TRIP)
#undef DHS_ROUND_TRIP
  // Every member of the generated union (NONE excluded), each once: the list and the schema agree.
  std::set<wire::Body> members;
  for (wire::Body b : wire::EnumValuesBody()) {
    if (b != wire::Body::NONE) members.insert(b);
  }
  EXPECT_EQ(covered, members);
  EXPECT_EQ(std::size(kWireMessages), members.size());
}

TEST(ProtocolRoundTrip, VisitMessageRefusesAnUndecodedOrUnknownMessage) {
  Message unknown;
  unknown.type = static_cast<wire::Body>(200);
  const absl::Status s = VisitMessage(unknown, [](const auto&) { ADD_FAILURE() << "visited"; });
  EXPECT_EQ(ToWireError(s), ErrorCode::UNKNOWN_MESSAGE) << s;
  Message undecoded;
  undecoded.type = wire::Body::Heartbeat;
  EXPECT_EQ(VisitMessage(undecoded, [](const auto&) { ADD_FAILURE() << "visited"; }).code(),
            absl::StatusCode::kFailedPrecondition);
}

// ---- a receiver's account of the union (ReceiveMessage) ----

// FirstUnaccountedMessage names the first member (in list order) that a receiver neither handles nor lists as not
// expected, or handles and lists both; ReceiveMessage's static_assert requires NONE.
struct OnlyHello {
  void operator()(const wire::HelloT&) {}
};
struct Everything {
  void operator()(const auto&) {}
};
static_assert(FirstUnaccountedMessage<OnlyHello, MessageSet<>>() == wire::Body::HelloReply);        // member 2
static_assert(FirstUnaccountedMessage<OnlyHello, MessageSet<wire::Body::Hello>>() == wire::Body::Hello);  // both
static_assert(FirstUnaccountedMessage<Everything, MessageSet<>>() == wire::Body::NONE);
static_assert(FirstUnaccountedMessage<Everything, MessageSet<wire::Body::Cancel>>() == wire::Body::Cancel);
static_assert(kBodyOf<wire::TokensCommittedAckT> == wire::Body::TokensCommittedAck);
static_assert(MessageSet<wire::Body::Hello, wire::Body::Cancel>::Has(wire::Body::Cancel) &&
              !MessageSet<wire::Body::Hello, wire::Body::Cancel>::Has(wire::Body::Attach));

// Serves every member but Cancel, recording Heartbeats.
struct HeartbeatsOnly {
  std::vector<uint64_t> sender_times;
  void operator()(const wire::HeartbeatT& hb) { sender_times.push_back(hb.sender_time_ns); }
  template <typename Body>
    requires(!std::is_same_v<Body, wire::HeartbeatT> && !std::is_same_v<Body, wire::CancelT>)
  void operator()(const Body&) {}
};

// ReceiveMessage hands a served message's body to the handler and a not-expected one's type to refuse, each once.
TEST(ProtocolReceive, HandlesServedMessagesAndRefusesTheRest) {
  HeartbeatsOnly handle;
  std::vector<wire::Body> refused;
  wire::HeartbeatT hb;
  hb.sender_time_ns = 77;
  const std::string heartbeat = EncodeHeartbeat(hb, 1, "t");
  const std::string cancel = EncodeCancel(wire::CancelT{}, 2, "t");
  for (const std::string* bytes : {&heartbeat, &cancel}) {
    absl::StatusOr<Message> m = DecodeEnvelope(*bytes);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(ReceiveMessage<MessageSet<wire::Body::Cancel>>(*m, handle,
                                                                [&](wire::Body type) { refused.push_back(type); })
                    .ok());
  }
  EXPECT_EQ(handle.sender_times, (std::vector<uint64_t>{77}));
  EXPECT_EQ(refused, (std::vector<wire::Body>{wire::Body::Cancel}));
}

// ---- the schema's stated version ----

// schemas/dhs.fbs's header states the protocol version; it must be the code's (kProtocolVersion). The test reads
// the schema of the source tree (DHS_SCHEMA_PATH, set by tests/common/meson.build).
TEST(ProtocolVersion, TheSchemaStatesTheCodesVersion) {
  const char* path = std::getenv("DHS_SCHEMA_PATH");
  ASSERT_NE(path, nullptr) << "DHS_SCHEMA_PATH not set (meson test sets it)";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  const std::string schema = text.str();
  const std::regex stated(R"(dhs::kProtocolVersion \(common/protocol\.h\) = (\d+))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(schema, m, stated)) << path << " states no protocol version";
  EXPECT_EQ(std::stoul(m[1].str()), kProtocolVersion) << path << " states version " << m[1].str();
  const std::string rest = m.suffix().str();
  EXPECT_FALSE(std::regex_search(rest, m, stated)) << path << " states the version twice";
}

// ---- status mapping ----

TEST(StatusMapping, EveryWireCodeRoundTrips) {
  for (ErrorCode code : wire::EnumValuesErrorCode()) {
    absl::Status status = FromWireError(code, "m");
    EXPECT_EQ(ToWireError(status), code) << wire::EnumNameErrorCode(code);
    EXPECT_EQ(status.ok(), code == ErrorCode::OK);
  }
}

TEST(StatusMapping, CanonicalCodes) {
  EXPECT_EQ(ToWireError(absl::NotFoundError("x")), ErrorCode::NOT_FOUND);
  EXPECT_EQ(ToWireError(absl::ResourceExhaustedError("x")), ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToWireError(absl::InvalidArgumentError("x")), ErrorCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToWireError(absl::OkStatus()), ErrorCode::OK);
  EXPECT_EQ(FromWireError(ErrorCode::UNAVAILABLE, "gone").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FromWireError(ErrorCode::UNAVAILABLE, "gone").message(), "gone");
  EXPECT_EQ(FromWireError(ErrorCode::VERSION_MISMATCH, "v").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FromWireError(static_cast<ErrorCode>(999), "future").code(), absl::StatusCode::kUnknown);
}

// Issue 23: "fenced" is a code (ErrorReply.reason FENCED, code FAILED_PRECONDITION), not a text prefix: it survives
// EncodeError -> ReadErrorStatus; the same text without the code is not a fence; a reason never rides on OK.
TEST(StatusMapping, FencedTravelsAsItsCode) {
  const absl::Status fenced = FencedError("the worker of GPU 2 (epoch 3) was fenced (test)");
  EXPECT_EQ(fenced.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fenced.message(), "fenced: the worker of GPU 2 (epoch 3) was fenced (test)");
  EXPECT_TRUE(IsFenced(fenced));
  EXPECT_EQ(ToWireError(fenced), ErrorCode::FAILED_PRECONDITION);
  absl::StatusOr<Message> message = DecodeEnvelope(EncodeError(fenced, 12, "memd"));
  ASSERT_TRUE(message.ok());
  absl::StatusOr<wire::ErrorReplyT> reply = ReadErrorReply(*message);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->code, ErrorCode::FAILED_PRECONDITION);
  EXPECT_EQ(reply->reason, wire::ErrorReason::FENCED);
  const absl::Status read = ReadErrorStatus(*message);
  EXPECT_TRUE(IsFenced(read)) << read;
  EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(read.message(), fenced.message());

  const absl::Status text_only = absl::FailedPreconditionError("fenced: but not coded");
  EXPECT_FALSE(IsFenced(text_only));
  message = DecodeEnvelope(EncodeError(text_only, 13, "memd"));
  ASSERT_TRUE(message.ok());
  EXPECT_EQ(ReadErrorReply(*message)->reason, wire::ErrorReason::NONE);
  EXPECT_FALSE(IsFenced(ReadErrorStatus(*message)));
  EXPECT_TRUE(WithErrorReason(absl::OkStatus(), wire::ErrorReason::FENCED).ok());
  EXPECT_FALSE(IsFenced(WithErrorReason(absl::OkStatus(), wire::ErrorReason::FENCED)));
  EXPECT_EQ(ErrorReasonOf(WorkerEpochEndedError("fenced")), wire::ErrorReason::NONE);
}

TEST(StatusMapping, EncodeErrorCarriesCodeMessageAndSequence) {
  const std::string bytes = EncodeError(absl::NotFoundError("no request 77"), 31, "memd");
  absl::StatusOr<Message> message = DecodeEnvelope(bytes);
  ASSERT_TRUE(message.ok());
  EXPECT_EQ(message->type, wire::Body::ErrorReply);
  EXPECT_EQ(message->sequence, 31u);
  EXPECT_EQ(message->sender, "memd");
  absl::StatusOr<wire::ErrorReplyT> reply = ReadErrorReply(*message);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->code, ErrorCode::NOT_FOUND);
  EXPECT_EQ(reply->message, "no request 77");
  EXPECT_EQ(reply->answering_sequence, 31u);
  EXPECT_EQ(ReadErrorStatus(*message).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dhs
