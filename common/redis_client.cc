// common/redis_client.cc: see redis_client.h.
#include "common/redis_client.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_format.h"
#include "common/redis_slot.h"

namespace dhs::redis {

namespace {

constexpr uint16_t kNoMaster = 0xffff;

// Splits at any of `separators`, skipping empty parts (std::string_view throughout: this abseil's string_view is its
// own type).
std::vector<std::string_view> Split(std::string_view text, std::string_view separators) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find_first_of(separators, start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Concatenation of std::string_view pieces and integers (absl::StrCat takes only its own string_view here).
inline void AppendPiece(std::string& out, std::string_view piece) { out.append(piece); }
inline void AppendPiece(std::string& out, const char* piece) { out.append(piece); }
inline void AppendPiece(std::string& out, const std::string& piece) { out.append(piece); }
template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
void AppendPiece(std::string& out, I value) {
  out.append(std::to_string(value));
}
template <typename... T>
std::string Cat(const T&... pieces) {
  std::string out;
  (AppendPiece(out, pieces), ...);
  return out;
}

bool ParsePort(std::string_view text, uint16_t* port) {
  uint32_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v == 0 || v > 65535) return false;
  *port = static_cast<uint16_t>(v);
  return true;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// Blocks SIGPIPE in this thread while alive; a SIGPIPE raised meanwhile (a write to a closed connection) is consumed
// unless one was pending before.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    pending_before_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!pending_before_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool pending_before_ = false;
};

int PollTimeoutMs(Client::Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Client::Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left + 1, 0, 1'000'000));
}

}  // namespace

std::optional<Redirection> ParseRedirection(std::string_view error, const Endpoint& from) {
  const std::vector<std::string_view> parts = Split(error, " ");
  if (parts.size() != 3 || (parts[0] != "MOVED" && parts[0] != "ASK")) return std::nullopt;
  Redirection r;
  r.ask = parts[0] == "ASK";
  const auto [end, ec] = std::from_chars(parts[1].data(), parts[1].data() + parts[1].size(), r.slot);
  if (ec != std::errc() || end != parts[1].data() + parts[1].size() || r.slot >= kClusterSlots) return std::nullopt;
  const size_t colon = parts[2].rfind(':');
  if (colon == std::string_view::npos || !ParsePort(parts[2].substr(colon + 1), &r.target.port)) return std::nullopt;
  r.target.host = std::string(parts[2].substr(0, colon));
  if (r.target.host.empty()) r.target.host = from.host;  // "MOVED 3999 :6380": the host of the node that answered
  return r;
}

std::string Endpoint::ToString() const { return Cat(host, ":", port); }

absl::StatusOr<std::vector<Endpoint>> ParseSeeds(std::string_view spec) {
  std::vector<Endpoint> out;
  // Seeds are separated by one comma (spaces around it allowed): an empty one ("a:1,", "a:1,,b:2") is a typo.
  if (spec.find(',') != std::string_view::npos) {
    for (size_t start = 0; start <= spec.size();) {
      const size_t end = std::min(spec.find(',', start), spec.size());
      if (spec.substr(start, end - start).find_first_not_of(' ') == std::string_view::npos) {
        return absl::InvalidArgumentError(Cat("redis seeds '", spec, "': an empty seed"));
      }
      start = end + 1;
    }
  }
  for (std::string_view part : Split(spec, ", ")) {
    std::string_view rest = part;
    if (rest.starts_with("redis://")) {
      rest.remove_prefix(8);
    } else if (rest.find("://") != std::string_view::npos) {
      return absl::InvalidArgumentError(Cat("redis seed '", part, "': only redis:// is supported"));
    }
    while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
    if (rest.find('@') != std::string_view::npos) {
      return absl::InvalidArgumentError(Cat("redis seed '", part, "': credentials in the address are not supported "
                                            "(the client sends no AUTH: run the store without requirepass, on a "
                                            "private network)"));
    }
    if (rest.find_first_of("[]") != std::string_view::npos) {
      return absl::InvalidArgumentError(Cat("redis seed '", part, "': brackets are not supported (write an IPv6 "
                                            "address without them: redis://::1:6379; the port is after the last "
                                            "colon)"));
    }
    const size_t colon = rest.rfind(':');
    uint16_t port = 0;
    if (colon == std::string_view::npos || colon == 0 || !ParsePort(rest.substr(colon + 1), &port)) {
      return absl::InvalidArgumentError(Cat("redis seed '", part, "': expected HOST:PORT (port 1..65535)"));
    }
    out.push_back(Endpoint{std::string(rest.substr(0, colon)), port});
  }
  if (out.empty()) return absl::InvalidArgumentError("redis seeds: none given (expected redis://HOST:PORT)");
  return out;
}

// One connection: a non-blocking hiredis context.
struct Client::Conn {
  Endpoint endpoint;
  redisContext* ctx = nullptr;
  bool connecting = true;      // connect(2) in progress: wait for POLLOUT and check SO_ERROR before writing
  bool write_pending = false;  // commands appended and not all written yet
  ~Conn() {
    if (ctx != nullptr) redisFree(ctx);
  }
};

// One command of a batch.
struct Client::Op {
  std::vector<std::string_view> argv;
  uint32_t slot = 0;
  std::optional<Endpoint> fixed;  // sent to this node (a map refresh's target), never routed
  std::optional<Endpoint> ask;    // ASK target: ASKING + the command there, once
  int resends = 0;
  bool done = false;
  // The round's outcome: a reply, or a failure of its connection (retryable) or the deadline.
  ReplyPtr reply;
  Endpoint sent_to;
  absl::Status failure;
  // The final outcome when done without a usable reply.
  absl::Status final_status;
};

Client::Client(ClientConfig config) : config_(std::move(config)) { slots_.fill(kNoMaster); }
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientConfig config) {
  if (config.seeds.empty()) return absl::InvalidArgumentError("redis client: no seeds");
  if (config.max_redirects < 0) return absl::InvalidArgumentError("redis client: max_redirects < 0");
  return std::unique_ptr<Client>(new Client(std::move(config)));
}

Client::Conn* Client::Connection(const Endpoint& endpoint) {
  auto it = conns_.find(endpoint);
  if (it != conns_.end()) return it->second.get();
  redisContext* ctx = redisConnectNonBlock(endpoint.host.c_str(), endpoint.port);
  ++counters_.connects;
  if (ctx == nullptr || ctx->err != 0) {
    ++counters_.connect_failures;
    if (ctx != nullptr) redisFree(ctx);
    return nullptr;
  }
  auto conn = std::make_unique<Conn>();
  conn->endpoint = endpoint;
  conn->ctx = ctx;
  Conn* raw = conn.get();
  conns_[endpoint] = std::move(conn);
  return raw;
}

void Client::Close(const Endpoint& endpoint) { conns_.erase(endpoint); }

// The commands of one round sent to one node: the ops in send order, each preceded by an ASKING when it follows an
// ASK redirection (that reply comes first and is dropped).
struct Client::Pending {
  struct Expect {
    Op* op;
    bool asking_reply;
  };
  Conn* conn = nullptr;
  Endpoint endpoint;
  std::vector<Expect> expect;
  size_t got = 0;
  bool closed = false;
  bool waiting() const { return !closed && got < expect.size(); }
};

void Client::FailRest(Pending& p, const absl::Status& why) {
  for (size_t i = p.got; i < p.expect.size(); ++i) {
    if (!p.expect[i].asking_reply || p.expect[i].op->failure.ok()) p.expect[i].op->failure = why;
  }
  p.got = p.expect.size();
  if (!p.closed) {
    Close(p.endpoint);
    p.closed = true;
  }
}

void Client::Dispatch(std::vector<Op*>& ops, std::map<Endpoint, Pending>& pending) {
  for (Op* op : ops) {
    op->reply.reset();
    op->failure = absl::OkStatus();
    Endpoint target;
    if (op->fixed) {
      target = *op->fixed;
    } else if (op->ask) {
      target = *op->ask;
    } else if (slots_[op->slot] != kNoMaster) {
      target = masters_[slots_[op->slot]];
    } else {
      op->failure = absl::UnavailableError(absl::StrFormat("no master serves slot %d", op->slot));
      continue;
    }
    op->sent_to = target;
    Pending& p = pending[target];
    p.endpoint = target;
    if (op->ask && !op->fixed) p.expect.push_back(Pending::Expect{op, true});
    p.expect.push_back(Pending::Expect{op, false});
  }
  for (auto& [endpoint, p] : pending) {
    p.conn = Connection(endpoint);
    if (p.conn == nullptr) {
      p.closed = true;
      FailRest(p, absl::UnavailableError(Cat("cannot connect to ", endpoint.ToString())));
      continue;
    }
    for (const Pending::Expect& e : p.expect) {
      std::vector<const char*> argv;
      std::vector<size_t> len;
      if (e.asking_reply) {
        argv.push_back("ASKING");
        len.push_back(6);
      } else {
        for (std::string_view a : e.op->argv) {
          argv.push_back(a.data());
          len.push_back(a.size());
        }
      }
      if (redisAppendCommandArgv(p.conn->ctx, static_cast<int>(argv.size()), argv.data(), len.data()) != REDIS_OK) {
        FailRest(p, absl::InternalError(Cat("cannot encode a command for ", endpoint.ToString())));
        break;
      }
    }
    if (!p.closed) p.conn->write_pending = true;
  }
}

// Takes every complete reply the reader holds, in order, for p's expected commands. False on a protocol error.
bool Client::TakeReplies(Pending& p) {
  void* r = nullptr;
  while (p.got < p.expect.size()) {
    if (redisGetReplyFromReader(p.conn->ctx, &r) != REDIS_OK) return false;
    if (r == nullptr) return true;
    const Pending::Expect& e = p.expect[p.got++];
    if (e.asking_reply) {
      freeReplyObject(r);
    } else {
      e.op->reply.reset(static_cast<redisReply*>(r));
    }
    r = nullptr;
  }
  return true;
}

void Client::Service(Pending& p, short revents) {
  redisContext* c = p.conn->ctx;
  auto broken = [&](const std::string& what) {
    ++counters_.connection_errors;
    FailRest(p, absl::UnavailableError(Cat(p.endpoint.ToString(), ": ", what)));
  };
  if (p.conn->connecting) {
    if ((revents & (POLLOUT | POLLERR | POLLHUP)) == 0) return;
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      ++counters_.connect_failures;
      return broken(Cat("connect: ", std::strerror(err)));
    }
    p.conn->connecting = false;
  }
  if (p.conn->write_pending && (revents & POLLOUT)) {
    int done = 0;
    if (redisBufferWrite(c, &done) != REDIS_OK) return broken(Cat("write: ", c->errstr));
    if (done) p.conn->write_pending = false;
  }
  if ((revents & (POLLIN | POLLERR | POLLHUP)) == 0) return;
  if (redisBufferRead(c) != REDIS_OK) {
    (void)TakeReplies(p);  // keep the replies that arrived before the connection broke
    return broken(c->errstr[0] != '\0' ? std::string(c->errstr) : "connection closed");
  }
  if (!TakeReplies(p)) broken(Cat("protocol error: ", c->errstr));
}

void Client::RunRound(std::vector<Op*>& ops, Clock::time_point deadline) {
  std::map<Endpoint, Pending> pending;
  Dispatch(ops, pending);
  SigpipeGuard sigpipe_guard;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Pending*> of;
    for (auto& [endpoint, p] : pending) {
      if (!p.waiting()) continue;
      const short events = (p.conn->connecting || p.conn->write_pending) ? (POLLIN | POLLOUT) : POLLIN;
      fds.push_back(pollfd{p.conn->ctx->fd, events, 0});
      of.push_back(&p);
    }
    if (fds.empty()) return;
    const int timeout_ms = PollTimeoutMs(deadline);
    const int n = (timeout_ms == 0) ? 0 : ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 && Clock::now() >= deadline) {
      for (Pending* p : of) {
        ++counters_.connection_errors;
        FailRest(*p, absl::DeadlineExceededError(Cat("no answer from ", p->endpoint.ToString(), " before the deadline")));
      }
      return;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) Service(*of[i], fds[i].revents);
    }
  }
}

void Client::Settle(Op& op, bool* refresh) {
  auto finish = [&](absl::Status status) {
    op.done = true;
    op.final_status = std::move(status);
  };
  auto resend = [&](absl::Status why) {
    if (++op.resends > config_.max_redirects) finish(std::move(why));
  };
  const bool was_ask = op.ask.has_value();
  op.ask.reset();
  if (!op.failure.ok()) {
    if (absl::IsDeadlineExceeded(op.failure)) return finish(op.failure);
    *refresh = true;  // the node may be dead: ask the others who serves its slots now
    return resend(op.failure);
  }
  const redisReply* r = op.reply.get();
  if (r == nullptr) return finish(absl::InternalError("no reply"));
  if (r->type != REDIS_REPLY_ERROR || op.fixed) {
    op.done = true;  // a map refresh's reply is read by Refresh
    return;
  }
  const std::string_view err(r->str, r->len);
  if (std::optional<Redirection> to = ParseRedirection(err, op.sent_to)) {
    if (to->ask) {
      ++counters_.ask;
      if (was_ask) return finish(absl::InternalError(Cat("redirected again after ASKING: ", err)));
      op.ask = to->target;
    } else {
      ++counters_.moved;
      auto it = std::find(masters_.begin(), masters_.end(), to->target);
      if (it == masters_.end()) it = masters_.insert(masters_.end(), to->target);
      slots_[op.slot] = static_cast<uint16_t>(it - masters_.begin());
      *refresh = true;
    }
    return resend(absl::UnavailableError(Cat("too many redirections: ", err)));
  }
  if (err.starts_with("TRYAGAIN") || err.starts_with("CLUSTERDOWN")) {
    *refresh = true;
    return resend(absl::UnavailableError(std::string(err)));
  }
  op.done = true;  // the server's error reply is the command's outcome
}

void Client::Execute(std::vector<Op>& ops, Clock::time_point deadline) {
  if (!has_map_) {
    const absl::Status s = Refresh(deadline);
    if (!s.ok()) {
      for (Op& op : ops) {
        op.done = true;
        op.final_status = s;
      }
      return;
    }
  }
  while (true) {
    std::vector<Op*> round;
    for (Op& op : ops) {
      if (!op.done) round.push_back(&op);
    }
    if (round.empty()) return;
    if (Clock::now() >= deadline) {
      for (Op* op : round) {
        op->done = true;
        op->final_status = absl::DeadlineExceededError("the batch's deadline passed before an answer");
      }
      return;
    }
    RunRound(round, deadline);
    bool refresh = false;
    for (Op* op : round) Settle(*op, &refresh);
    if (refresh) (void)Refresh(deadline);  // a failed refresh keeps the map; the resends fail on their own
  }
}

namespace {

struct SlotMap {
  bool cluster = true;
  std::vector<Endpoint> masters;
  std::set<Endpoint> nodes;
  std::array<uint16_t, kClusterSlots> slots;
};

// One node of a CLUSTER SLOTS range: [host, port, id, ...]; an empty or "?" host is the node that answered.
bool NodeOf(const redisReply* n, const Endpoint& asked, Endpoint* e) {
  if (n->type != REDIS_REPLY_ARRAY || n->elements < 2 || n->element[0]->type != REDIS_REPLY_STRING ||
      n->element[1]->type != REDIS_REPLY_INTEGER || n->element[1]->integer <= 0 || n->element[1]->integer > 65535) {
    return false;
  }
  e->host.assign(n->element[0]->str, n->element[0]->len);
  if (e->host.empty() || e->host == "?") e->host = asked.host;
  e->port = static_cast<uint16_t>(n->element[1]->integer);
  return true;
}

// The answer of `asked` to CLUSTER SLOTS: ranges [lo, hi, master, replicas...], or the error of a server without
// cluster support (one server: every slot is its). Errors: Unavailable (another error reply), Internal (malformed).
absl::StatusOr<SlotMap> ParseSlotMap(const redisReply* r, const Endpoint& asked) {
  SlotMap map;
  map.slots.fill(kNoMaster);
  if (r->type == REDIS_REPLY_ERROR) {
    const std::string_view err(r->str, r->len);
    if (err.find("cluster support disabled") == std::string_view::npos) {
      return absl::UnavailableError(Cat(asked.ToString(), " CLUSTER SLOTS: ", err));
    }
    map.cluster = false;
    map.masters = {asked};
    map.nodes = {asked};
    map.slots.fill(0);
    return map;
  }
  const absl::Status malformed = absl::InternalError(Cat(asked.ToString(), " CLUSTER SLOTS: malformed reply"));
  if (r->type != REDIS_REPLY_ARRAY) return malformed;
  for (size_t i = 0; i < r->elements; ++i) {
    const redisReply* range = r->element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 || range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER) {
      return malformed;
    }
    const long long lo = range->element[0]->integer, hi = range->element[1]->integer;
    Endpoint master;
    if (lo < 0 || hi >= kClusterSlots || lo > hi || !NodeOf(range->element[2], asked, &master)) return malformed;
    auto it = std::find(map.masters.begin(), map.masters.end(), master);
    if (it == map.masters.end()) it = map.masters.insert(map.masters.end(), master);
    for (long long slot = lo; slot <= hi; ++slot) map.slots[slot] = static_cast<uint16_t>(it - map.masters.begin());
    map.nodes.insert(master);
    for (size_t k = 3; k < range->elements; ++k) {
      Endpoint replica;
      if (NodeOf(range->element[k], asked, &replica)) map.nodes.insert(replica);
    }
  }
  return map;
}

}  // namespace

absl::Status Client::Refresh(Clock::time_point deadline) {
  // Candidates: the seeds, then every node of the last map (a dead seed is survived), each once.
  std::vector<Endpoint> candidates;
  std::set<Endpoint> seen;
  for (const auto& list : {config_.seeds, masters_, nodes_}) {
    for (const Endpoint& e : list) {
      if (seen.insert(e).second) candidates.push_back(e);
    }
  }
  absl::Status last = absl::UnavailableError("no node to ask CLUSTER SLOTS");
  for (const Endpoint& node : candidates) {
    if (Clock::now() >= deadline) return absl::DeadlineExceededError("cluster map refresh: deadline passed");
    Op op;
    op.argv = {"CLUSTER", "SLOTS"};
    op.fixed = node;
    std::vector<Op*> round = {&op};
    RunRound(round, std::min(deadline, Clock::now() + config_.refresh_attempt_timeout));
    if (!op.failure.ok()) {
      last = op.failure;
      continue;
    }
    absl::StatusOr<SlotMap> map = ParseSlotMap(op.reply.get(), node);
    if (!map.ok()) {
      last = map.status();
      continue;
    }
    masters_ = std::move(map->masters);
    nodes_.assign(map->nodes.begin(), map->nodes.end());
    slots_ = map->slots;
    cluster_mode_ = map->cluster;
    has_map_ = true;
    ++counters_.map_refreshes;
    return absl::OkStatus();
  }
  return last;
}

absl::Status Client::RefreshMap(std::chrono::milliseconds timeout) { return Refresh(Clock::now() + timeout); }

std::vector<GetResult> Client::Get(std::span<const std::string> keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return {};
  const Clock::time_point deadline = Clock::now() + timeout;
  std::vector<Op> ops(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ops[i].argv = {"GET", keys[i]};
    ops[i].slot = KeySlot(keys[i]);
  }
  Execute(ops, deadline);
  std::vector<GetResult> out(keys.size());
  counters_.get_keys += keys.size();
  for (size_t i = 0; i < keys.size(); ++i) {
    Op& op = ops[i];
    GetResult& g = out[i];
    redisReply* r = op.reply.get();
    if (!op.final_status.ok()) {
      g.status = op.final_status;
    } else if (r == nullptr) {
      g.status = absl::InternalError("no reply");
    } else if (r->type == REDIS_REPLY_STRING) {
      g.value.emplace(r->str, r->len);
      counters_.bytes_read += r->len;
    } else if (r->type == REDIS_REPLY_NIL) {
      // a miss
    } else if (r->type == REDIS_REPLY_ERROR) {
      g.status = absl::InternalError(Cat("GET: ", std::string_view(r->str, r->len)));
    } else {
      g.status = absl::InternalError(absl::StrFormat("GET: unexpected reply type %d", r->type));
    }
    if (!g.status.ok()) {
      ++counters_.get_errors;
      if (absl::IsDeadlineExceeded(g.status)) ++counters_.timeouts;
    } else if (g.value) {
      ++counters_.get_hits;
    } else {
      ++counters_.get_misses;
    }
  }
  return out;
}

std::vector<absl::Status> Client::Set(std::span<const SetItem> items, std::chrono::milliseconds timeout) {
  if (items.empty()) return {};
  const Clock::time_point deadline = Clock::now() + timeout;
  std::vector<Op> ops(items.size());
  std::vector<std::string> ttls(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    ops[i].argv = {"SET", items[i].key, items[i].value};
    if (items[i].ttl_ms > 0) {
      ttls[i] = std::to_string(items[i].ttl_ms);
      ops[i].argv.push_back("PX");
      ops[i].argv.push_back(ttls[i]);
    }
    ops[i].slot = KeySlot(items[i].key);
  }
  Execute(ops, deadline);
  std::vector<absl::Status> out(items.size());
  counters_.set_keys += items.size();
  for (size_t i = 0; i < items.size(); ++i) {
    Op& op = ops[i];
    redisReply* r = op.reply.get();
    if (!op.final_status.ok()) {
      out[i] = op.final_status;
    } else if (r == nullptr) {
      out[i] = absl::InternalError("no reply");
    } else if (r->type == REDIS_REPLY_STATUS) {
      counters_.bytes_written += items[i].value.size();
    } else if (r->type == REDIS_REPLY_ERROR) {
      out[i] = absl::InternalError(Cat("SET: ", std::string_view(r->str, r->len)));
    } else {
      out[i] = absl::InternalError(absl::StrFormat("SET: unexpected reply type %d", r->type));
    }
    if (out[i].ok()) {
      ++counters_.set_ok;
    } else {
      ++counters_.set_errors;
      if (absl::IsDeadlineExceeded(out[i])) ++counters_.timeouts;
    }
  }
  return out;
}

absl::Status Client::Ping(std::chrono::milliseconds timeout) {
  std::vector<Op> ops(1);
  ops[0].argv = {"PING"};
  ops[0].slot = 0;
  Execute(ops, Clock::now() + timeout);
  if (!ops[0].final_status.ok()) return ops[0].final_status;
  redisReply* r = ops[0].reply.get();
  if (r == nullptr) return absl::InternalError("no reply");
  if (r->type == REDIS_REPLY_ERROR) return absl::InternalError(Cat("PING: ", std::string_view(r->str, r->len)));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Client::WaitReplicas(std::string_view key, int replicas, std::chrono::milliseconds timeout) {
  const std::string n = std::to_string(replicas), ms = std::to_string(timeout.count());
  std::vector<Op> ops(1);
  ops[0].argv = {"WAIT", n, ms};
  ops[0].slot = KeySlot(key);
  ops[0].resends = config_.max_redirects;  // no resend: WAIT counts the writes of this one connection
  Execute(ops, Clock::now() + timeout + std::chrono::milliseconds(500));
  if (!ops[0].final_status.ok()) return ops[0].final_status;
  redisReply* r = ops[0].reply.get();
  if (r == nullptr) return absl::InternalError("no reply");
  if (r->type != REDIS_REPLY_INTEGER) {
    return absl::InternalError(
        Cat("WAIT: ", r->type == REDIS_REPLY_ERROR ? std::string_view(r->str, r->len) : "not an integer"));
  }
  return static_cast<int64_t>(r->integer);
}

std::optional<Endpoint> Client::MasterOf(uint32_t slot) const {
  if (!has_map_ || slot >= kClusterSlots || slots_[slot] == kNoMaster) return std::nullopt;
  return masters_[slots_[slot]];
}

std::vector<Endpoint> Client::KnownNodes() const { return nodes_; }

}  // namespace dhs::redis
