// tests/common/curve_test.cc: the CURVE keys of a worker's TCP serving socket (common/curve_keys.h) and the transport's
// tcp:// + CURVE path (RouterServer::BindTcp, DealerClient::Options::curve_server_key), issue 22: keys created once
// with their modes and reused, a secret readable by others refused, bad key files refused with the file named; a
// client holding the server's public key is answered, one without a key or with another key is never answered, and the
// server keeps answering the good client.
#include <sys/stat.h>
#include <zmq.h>

#include <chrono>
#include <fstream>

#include "common/curve_keys.h"
#include "common/protocol.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace dhs {
namespace {

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

TEST(CurveKeys, CreatedOnceWithTheirModesAndReused) {
  if (!CurveAvailable()) GTEST_SKIP() << "libzmq without CURVE";
  dhs::testing::ScopedTempDir dir;
  absl::StatusOr<CurveKeyPair> first = LoadOrCreateServerKeys(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->public_key.size(), kCurveKeyChars);
  EXPECT_EQ(first->secret_key.size(), kCurveKeyChars);
  EXPECT_EQ(ModeOf(dir.path() + "/" + kCurveSecretFile), 0600u);
  EXPECT_EQ(ModeOf(dir.path() + "/" + kCurvePublicFile), 0644u);
  // The public key is the secret's (derived independently here) and is what the .pub file holds.
  char derived[41];
  ASSERT_EQ(zmq_curve_public(derived, first->secret_key.c_str()), 0);
  EXPECT_EQ(first->public_key, std::string(derived, 40));
  absl::StatusOr<std::string> pub = ReadCurvePublicKey(dir.path() + "/" + kCurvePublicFile);
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(*pub, first->public_key);
  absl::StatusOr<CurveKeyPair> again = LoadOrCreateServerKeys(dir.path());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->secret_key, first->secret_key);
  // A lost .pub is written again from the secret.
  ASSERT_EQ(::unlink((dir.path() + "/" + kCurvePublicFile).c_str()), 0);
  ASSERT_TRUE(LoadOrCreateServerKeys(dir.path()).ok());
  EXPECT_EQ(*ReadCurvePublicKey(dir.path() + "/" + kCurvePublicFile), first->public_key);
}

TEST(CurveKeys, ASecretOthersMayReadAndBadKeyFilesAreRefused) {
  if (!CurveAvailable()) GTEST_SKIP() << "libzmq without CURVE";
  dhs::testing::ScopedTempDir dir;
  ASSERT_TRUE(LoadOrCreateServerKeys(dir.path()).ok());
  const std::string secret = dir.path() + "/" + kCurveSecretFile;
  ASSERT_EQ(::chmod(secret.c_str(), 0640), 0);
  absl::StatusOr<CurveKeyPair> loose = LoadOrCreateServerKeys(dir.path());
  EXPECT_EQ(loose.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(loose.status().message().find("mode 0640"), std::string::npos) << loose.status();
  ASSERT_EQ(::chmod(secret.c_str(), 0600), 0);
  std::ofstream(secret) << "not a key\n";
  EXPECT_EQ(LoadOrCreateServerKeys(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);
  const std::string bad = dir.path() + "/bad.pub";
  std::ofstream(bad) << "short\n";
  absl::StatusOr<std::string> key = ReadCurvePublicKey(bad);
  EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(key.status().message().find("bad.pub"), std::string::npos);
  EXPECT_EQ(ReadCurvePublicKey(dir.path() + "/missing.pub").status().code(), absl::StatusCode::kNotFound);
}

// One request/reply over tcp://127.0.0.1:* with CURVE: answered only with the server's key.
TEST(CurveTransport, OnlyAClientWithTheServersKeyIsAnswered) {
  if (!CurveAvailable()) GTEST_SKIP() << "libzmq without CURVE";
  dhs::testing::ScopedTempDir dir;
  absl::StatusOr<CurveKeyPair> keys = LoadOrCreateServerKeys(dir.path());
  ASSERT_TRUE(keys.ok()) << keys.status();
  RouterServer::Options options;
  options.curve_secret_key = keys->secret_key;
  auto server = RouterServer::BindTcp("tcp://127.0.0.1:*", options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string endpoint = (*server)->endpoint();
  ASSERT_EQ(endpoint.rfind("tcp://127.0.0.1:", 0), 0u) << endpoint;
  EXPECT_NE(endpoint, "tcp://127.0.0.1:*");  // the bound port
  auto echo_for = [&](DealerClient& c, std::chrono::milliseconds wait) -> absl::StatusOr<std::string> {
    if (absl::Status s = c.Send("ping"); !s.ok()) return s;
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < deadline) {
      auto in = (*server)->Poll(std::chrono::milliseconds(10));
      if (!in.ok()) return in.status();
      if (in->has_value()) (*server)->Reply((*in)->peer, "pong:" + (*in)->bytes).IgnoreError();
      auto reply = c.Receive(std::chrono::milliseconds(0));
      if (reply.ok()) return reply;
    }
    return absl::DeadlineExceededError("no reply");
  };
  char other_public[41], other_secret[41];
  ASSERT_EQ(zmq_curve_keypair(other_public, other_secret), 0);
  for (const std::string& bad : {std::string(), std::string(other_public, 40)}) {
    DealerClient::Options o;
    o.curve_server_key = bad;
    auto client = DealerClient::Connect(endpoint, o);
    ASSERT_TRUE(client.ok());
    EXPECT_TRUE(absl::IsDeadlineExceeded(echo_for(**client, std::chrono::milliseconds(1000)).status()))
        << "answered with key '" << bad << "'";
  }
  DealerClient::Options o;
  o.curve_server_key = keys->public_key;
  auto client = DealerClient::Connect(endpoint, o);
  ASSERT_TRUE(client.ok());
  absl::StatusOr<std::string> reply = echo_for(**client, std::chrono::milliseconds(10000));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(*reply, "pong:ping");
  EXPECT_EQ(RouterServer::BindTcp("ipc:///tmp/x", options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dhs
