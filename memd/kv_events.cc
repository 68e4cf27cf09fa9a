#include "memd/kv_events.h"

#include <unistd.h>

#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/kv_event_stream.h"
#include "common/transport.h"
#include "spdlog/spdlog.h"
#include "zmq.hpp"

namespace dhs::memd {

KvEventPublisher::KvEventPublisher(std::unique_ptr<zmq::context_t> context, std::unique_ptr<zmq::socket_t> socket,
                                   uint64_t stream, std::string node)
    : context_(std::move(context)), socket_(std::move(socket)), stream_(stream), node_(std::move(node)) {}

KvEventPublisher::~KvEventPublisher() {
  socket_.reset();
  context_.reset();
  if (!path_.empty()) ::unlink(path_.c_str());
}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Bind(const std::string& run_dir,
                                                                         const Options& options) {
  if (options.send_hwm < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("KV event high-water mark %d: must be >= 1", options.send_hwm));
  }
  const std::string endpoint = IpcEndpoint(run_dir, kKvEventsSocket);
  try {
    auto context = std::make_unique<zmq::context_t>(1);
    auto socket = std::make_unique<zmq::socket_t>(*context, zmq::socket_type::xpub);
    socket->set(zmq::sockopt::linger, 0);
    socket->set(zmq::sockopt::sndhwm, options.send_hwm);
    socket->set(zmq::sockopt::xpub_nodrop, 1);   // a full subscriber makes the send fail (counted), never block
    socket->set(zmq::sockopt::xpub_verbose, 1);  // every subscribe message, not only the first of a topic
    socket->bind(endpoint);
    std::random_device random;
    const uint64_t stream = (uint64_t{random()} << 32) ^ random();
    auto publisher = std::unique_ptr<KvEventPublisher>(
        new KvEventPublisher(std::move(context), std::move(socket), stream, options.node));
    publisher->path_ = absl::StrFormat("%s/%s.sock", run_dir, kKvEventsSocket);
    return publisher;
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrFormat("KV event socket %s: %s", endpoint, e.what()));
  }
}

void KvEventPublisher::Poll() {
  try {
    zmq::message_t m;
    while (socket_->recv(m, zmq::recv_flags::dontwait)) {
      if (m.size() > 0 && static_cast<const uint8_t*>(m.data())[0] == 1) ++subscriptions_;
    }
  } catch (const zmq::error_t& e) {
    spdlog::warn("memd: KV event socket: {}", e.what());
  }
}

void KvEventPublisher::Publish(std::span<const KvEvent> events, int64_t now_us) {
  if (events.empty()) return;
  Poll();  // subscriptions first: a consumer that subscribed since the last tick gets this batch
  KvEventBatch batch{stream_, now_us, node_, next_seq_, {events.begin(), events.end()}};
  next_seq_ += events.size();
  const std::string bytes = EncodeKvEventBatch(batch);
  try {
    // The topic frame fails with EAGAIN when a subscriber is at its high-water mark (XPUB_NODROP); once it is
    // queued, the body frame of the same message is too (the mark counts messages).
    if (!socket_->send(zmq::buffer(kKvEventsTopic), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      dropped_ += events.size();
      return;
    }
    (void)socket_->send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    published_ += events.size();
  } catch (const zmq::error_t& e) {
    dropped_ += events.size();
    spdlog::warn("memd: KV event batch of {} events dropped: {}", events.size(), e.what());
  }
}

}  // namespace dhs::memd
