// memd/record_wire.h: a request's record (memd/request_records.h) to and from its wire form, wire::RequestRecordT
// (schemas/): the AdmitRequest's record, HelloReply.interrupted_records and the record journal's Open frame
// (memd/record_journal.h) all carry it this way.
#pragma once

#include <memory>

#include "common/protocol.h"
#include "memd/request_records.h"

namespace dhs::memd {

// The record of node request `id` as the wire carries it, committed tokens and their logits digests included.
std::unique_ptr<wire::RequestRecordT> ToWireRecord(RequestId id, const RequestRecord& record);

// The record a wire record gives; `gpu` is its sender's GPU (the wire form has none).
RequestRecord FromWireRecord(const wire::RequestRecordT& w, GpuId gpu);

}  // namespace dhs::memd
