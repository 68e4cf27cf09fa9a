// tests/common/echo_server.cc: a RouterServer + Server helper process for the multi-process
// transport test. Usage: common_test_echo_server <run_dir> <name> <ready_fd>
// Binds ipc://<run_dir>/<name>.sock, writes one byte to <ready_fd> once bound, then serves until
// killed: Heartbeat -> HeartbeatAck{sender_time_ns echoed, receiver_time_ns = this pid};
// everything else -> the Server's ErrorReply.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/protocol.h"
#include "common/transport.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <run_dir> <name> <ready_fd>\n", argv[0]);
    return 2;
  }
  auto router = dhs::RouterServer::Bind(argv[1], argv[2]);
  if (!router.ok()) {
    std::fprintf(stderr, "bind: %s\n", router.status().ToString().c_str());
    return 1;
  }
  dhs::Server server(router->get(), "echo");
  server.On(dhs::wire::Body::Heartbeat,
            [](const dhs::Message& m, std::string_view) -> absl::StatusOr<std::string> {
              absl::StatusOr<dhs::wire::HeartbeatT> hb = dhs::ReadHeartbeat(m);
              if (!hb.ok()) return hb.status();
              dhs::wire::HeartbeatAckT ack;
              ack.sender_time_ns = hb->sender_time_ns;
              ack.receiver_time_ns = static_cast<uint64_t>(::getpid());
              return dhs::EncodeHeartbeatAck(ack, m.sequence, "echo");
            });
  const int ready_fd = std::atoi(argv[3]);
  const char ready = 'r';
  if (::write(ready_fd, &ready, 1) != 1) return 1;
  ::close(ready_fd);
  absl::Status status = server.Run([] { return true; }, std::chrono::milliseconds(1000));
  std::fprintf(stderr, "serve: %s\n", status.ToString().c_str());
  return 1;
}
