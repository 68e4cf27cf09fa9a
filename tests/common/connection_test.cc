// tests/common/connection_test.cc: issue 22 in the transport (common/transport.h).
// - ConnectionTable: a close names its own connection, never a later one on the same descriptor number.
// - RouterServer: a peer's close, taken after the next connection on the same descriptor number delivered a message,
//   names the closed connection only (the interleaving forced: the close is left untaken, the descriptor number is
//   checked to be reused).
// - DealerClient: a close of an earlier connection (a hung server that died before ZeroMQ reached its successor)
//   is not the answering server's death (PeerClosed), forced with a listener that never accepts.
// - EINTR: a thread interrupts the main thread with a signal (handler installed without SA_RESTART) every 50 us
//   while it serves, replies, receives, sends and reads the socket monitors; no ZeroMQ call may fail or throw, and
//   every message arrives whole.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "common/transport.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace dhs {
namespace {

using std::chrono::milliseconds;

TEST(ConnectionTable, ACloseNamesItsOwnConnectionNotALaterOneOnTheSameDescriptor) {
  ConnectionTable t;
  const ConnectionTable::Id a = t.Opened(7);
  EXPECT_EQ(t.Of(7), a);
  EXPECT_TRUE(t.IsOpen(a));
  // The old connection's close and the new one's open, both reported before the new one's first message.
  EXPECT_EQ(t.Closed(7), a);
  const ConnectionTable::Id b = t.Opened(7);
  EXPECT_NE(b, a);
  EXPECT_EQ(t.Of(7), b);
  EXPECT_FALSE(t.IsOpen(a));
  EXPECT_TRUE(t.IsOpen(b));
  EXPECT_EQ(t.open_count(), 1u);
  EXPECT_EQ(t.closes(), 1u);
  // A message read after its connection closed belongs to that (closed) connection.
  EXPECT_EQ(t.Closed(7), b);
  EXPECT_EQ(t.Of(7), b);
  EXPECT_FALSE(t.IsOpen(b));
  // A close whose open was never seen gets an id of its own, closed; a message from an unseen descriptor opens one.
  const ConnectionTable::Id c = t.Closed(9);
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_FALSE(t.IsOpen(c));
  const ConnectionTable::Id d = t.Of(11);
  EXPECT_TRUE(t.IsOpen(d));
  // An open on a descriptor whose close was never reported: the older connection is taken as closed.
  const ConnectionTable::Id e = t.Opened(11);
  EXPECT_NE(e, d);
  EXPECT_FALSE(t.IsOpen(d));
  EXPECT_TRUE(t.IsOpen(e));
}

// A ZMTP message frame (short form) with `payload`, as a DEALER sends it: the ROUTER prepends the routing id.
void SendFrame(int fd, const std::string& payload) {
  ASSERT_LT(payload.size(), 256u);
  const std::string frame = std::string{'\x00', static_cast<char>(payload.size())} + payload;
  ASSERT_EQ(::write(fd, frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
}

// The next message on `router` within 10 s.
Incoming NextMessage(RouterServer& router) {
  for (int i = 0; i < 1000; ++i) {
    auto in = router.Poll(milliseconds(10));
    EXPECT_TRUE(in.ok()) << in.status();
    if (in.ok() && in->has_value()) return **in;
  }
  ADD_FAILURE() << "no message";
  return {};
}

// Whether `fd` of this process is closed, or is another socket than the one of inode `ino`.
bool DescriptorGone(int fd, ino_t ino) {
  struct stat st {};
  return ::fstat(fd, &st) != 0 || st.st_ino != ino;
}

TEST(RouterServerConnections, AnOldConnectionsCloseDoesNotNameTheNextOneOnTheSameDescriptor) {
  testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  auto router = RouterServer::Bind(dir.path(), "srv");
  ASSERT_TRUE(router.ok()) << router.status();
  const std::string path = dir.path() + "/srv.sock";
  const int a = testing::RawZmtpPeer(path, "worker/0");
  ASSERT_GE(a, 0);
  SendFrame(a, "from-a");
  const Incoming first = NextMessage(**router);
  ASSERT_EQ(first.bytes, "from-a");
  ASSERT_GE(first.source_fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(first.source_fd, &st), 0);
  const ino_t first_ino = st.st_ino;
  // Peer a goes; the router's I/O thread closes its descriptor (its DISCONNECTED is queued, not taken).
  ::close(a);
  for (int i = 0; i < 1000 && !DescriptorGone(first.source_fd, first_ino); ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(DescriptorGone(first.source_fd, first_ino));
  // Peer b: its own socket takes the lowest free number in this process (a's), so the router's accept takes the next
  // one: the number of a's connection on the router side, now free.
  const int b = testing::RawZmtpPeer(path, "worker/0");
  ASSERT_GE(b, 0);
  SendFrame(b, "from-b");
  const Incoming second = NextMessage(**router);
  ASSERT_EQ(second.bytes, "from-b");
  EXPECT_EQ(second.source_fd, first.source_fd) << "the descriptor number was not reused: the interleaving of the "
                                                  "issue was not forced";
  EXPECT_NE(second.connection, first.connection);
  // Taken only now, after b's message: a's close names a's connection, not b's.
  const std::vector<uint64_t> closed = (*router)->TakeDisconnected();
  EXPECT_EQ(closed, std::vector<uint64_t>{first.connection});
  ::close(b);
  std::vector<uint64_t> later;
  for (int i = 0; i < 1000 && later.empty(); ++i) {
    later = (*router)->TakeDisconnected();
    if (later.empty()) std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(later, std::vector<uint64_t>{second.connection});
}

// A unix socket listening at `path` that never accepts: a hung (SIGSTOPped) server. The kernel completes a client's
// connect into its backlog; nobody answers the ZMTP greeting, so a DEALER's queued message stays in ZeroMQ's pipe.
int HungListener(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 16) != 0) return -1;
  return fd;
}

// The re-Hello race of issue 22 at the transport: the client's first connection reaches a hung server, which then
// dies; ZeroMQ reconnects to its successor and delivers the message it had queued; the successor answers. That
// earlier connection's close (counted in disconnects()) is not the answering server's: PeerClosed stays false until
// the answering one goes.
TEST(DealerClientConnections, AnEarlierConnectionsCloseIsNotTheAnsweringServersDeath) {
  testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  const std::string path = dir.path() + "/srv.sock";
  const int hung = HungListener(path);
  ASSERT_GE(hung, 0);
  auto client = DealerClient::Connect(IpcEndpoint(dir.path(), "srv"), DealerClient::Options{"worker/0", milliseconds(20)});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Send("hello").ok());  // queued: the hung server never completes the handshake
  pollfd p{hung, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1) << "the client did not connect to the hung server";
  ASSERT_TRUE((*client)->WaitPeerConnected(true, milliseconds(10000)));
  ::close(hung);  // the hung server dies: its pending connection is reset
  ASSERT_TRUE((*client)->WaitPeerConnected(false, milliseconds(10000)));
  EXPECT_EQ((*client)->disconnects(), 1);
  auto router = RouterServer::Bind(dir.path(), "srv");  // its successor (the stale socket file is replaced)
  ASSERT_TRUE(router.ok()) << router.status();
  const Incoming hello = NextMessage(**router);
  EXPECT_EQ(hello.bytes, "hello");  // the queued message went over the new connection
  ASSERT_TRUE((*router)->Reply(hello.peer, "hello-reply").ok());
  auto reply = (*client)->Receive(milliseconds(10000));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(*reply, "hello-reply");
  EXPECT_EQ((*client)->disconnects(), 1) << "the earlier connection's close is still counted";
  EXPECT_FALSE((*client)->PeerClosed()) << "the earlier connection's close was taken for the answering server's";
  EXPECT_TRUE((*client)->peer_connected());
  router->reset();  // now the answering server goes
  bool closed = false;
  for (int i = 0; i < 1000 && !closed; ++i) {
    closed = (*client)->PeerClosed();
    if (!closed) std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(closed);
}

void OnSignal(int) {}

// Interrupts `target` with SIGUSR1 every 50 us until `stop`.
class SignalStorm {
 public:
  explicit SignalStorm(pthread_t target) : target_(target) {
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: interrupted calls fail with EINTR
    EXPECT_EQ(::sigaction(SIGUSR1, &sa, &old_), 0);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        pthread_kill(target_, SIGUSR1);
        ++sent_;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
  }
  ~SignalStorm() {
    stop_ = true;
    thread_.join();
    ::sigaction(SIGUSR1, &old_, nullptr);
  }
  uint64_t sent() const { return sent_.load(); }

 private:
  pthread_t target_;
  struct sigaction old_ {};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0};
  std::thread thread_;
};

TEST(TransportSignals, EveryZeroMqCallHandlesEintr) {
  testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  SignalStorm storm(pthread_self());
  constexpr int kRounds = 300;
  int served = 0, answered = 0, reconnects = 0;
  for (int connection = 0; connection < 3; ++connection) {
    auto router = RouterServer::Bind(dir.path(), "srv");  // bind, monitor start: interrupted too
    ASSERT_TRUE(router.ok()) << router.status();
    auto client = DealerClient::Connect(IpcEndpoint(dir.path(), "srv"), DealerClient::Options{"client", milliseconds(5)});
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->WaitPeerConnected(true, milliseconds(10000)));
    for (int i = 0; i < kRounds; ++i) {
      const std::string payload = "message " + std::to_string(i) + std::string(1000 + i, 'x');
      ASSERT_TRUE((*client)->Send(payload).ok());
      std::optional<Incoming> in;
      for (int tries = 0; tries < 100000 && !in; ++tries) {
        auto polled = (*router)->Poll(milliseconds(1));
        ASSERT_TRUE(polled.ok()) << polled.status();
        in = *polled;
        (*router)->TakeDisconnected();
      }
      ASSERT_TRUE(in.has_value());
      ASSERT_EQ(in->bytes, payload);  // whole: no part lost to an interrupted receive
      ++served;
      ASSERT_TRUE((*router)->Reply(in->peer, "re: " + payload).ok());
      absl::StatusOr<std::string> reply = (*client)->Receive(milliseconds(10000));
      ASSERT_TRUE(reply.ok()) << reply.status();
      ASSERT_EQ(*reply, "re: " + payload);
      ++answered;
      EXPECT_FALSE((*client)->PeerClosed());
      EXPECT_TRUE((*client)->peer_connected());
    }
    // The server goes: the client's monitor reports it (read under the storm).
    router->reset();
    EXPECT_TRUE((*client)->WaitPeerConnected(false, milliseconds(10000)));
    EXPECT_TRUE((*client)->PeerClosed());
    reconnects += (*client)->disconnects();
  }
  EXPECT_EQ(served, 3 * kRounds);
  EXPECT_EQ(answered, 3 * kRounds);
  EXPECT_EQ(reconnects, 3);
  EXPECT_GT(storm.sent(), 100u) << "the storm did not run";
}

}  // namespace
}  // namespace dhs
