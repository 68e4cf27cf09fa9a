// tests/workerd/recording_transport.h: the receiving side of a test's memd that only records what the worker sends
// (worker_serving_test's ScriptedMemd, the worker fuzz target's QuietMemd): Worker::Create takes a MemdTransport
// (issue 25: its KV side is libdhs's EmbeddedWorker opened over it), and such a memd answers nothing on its own.
// A host pool the test owns (host_span), epoch 1, nothing interrupted, nothing to poll, never a re-Hello taken.
// No gtest: the fuzz target includes it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "workerd/memd_link.h"

namespace dhs {

class RecordingTransport : public MemdTransport {
 public:
  std::span<uint8_t> host_pages() const override { return host_span; }
  uint64_t worker_epoch() const override { return 1; }
  const std::vector<uint64_t>& interrupted_requests() const override { return no_ids_; }
  const std::vector<std::unique_ptr<wire::RequestRecordT>>& interrupted_records() const override {
    return no_records_;
  }
  absl::Status Poll(MemdHandler&, const MemdLoad&) override { return absl::OkStatus(); }
  absl::StatusOr<std::optional<wire::HelloReplyT>> PollAway(const std::function<wire::HelloT()>&) override {
    return std::nullopt;
  }

  std::span<uint8_t> host_span;  // the host pool's pages (set before Worker::Create)

 private:
  std::vector<uint64_t> no_ids_;
  std::vector<std::unique_ptr<wire::RequestRecordT>> no_records_;
};

}  // namespace dhs
