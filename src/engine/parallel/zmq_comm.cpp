// ZmqComm: Comm over ZeroMQ (see zmq_comm.h). Rank 0 holds a ROUTER socket, the others a DEALER
// each (routing id "r<rank>"); every message is [kind u8] + payload. Ranks make the same calls in
// the same order, so a kind or size that differs from the expected one means the ranks diverged:
// that fails the group rather than being repaired. Heartbeats run on a
// thread of their own with their own sockets (ZeroMQ sockets are single-threaded).
#include "engine/parallel/zmq_comm.h"

#include <zmq.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "common/numeric.h"
#include "common/log.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

enum class Kind : uint8_t { kHello = 1, kWelcome, kRefuse, kReduce, kGather, kBcast, kBarrier, kHeartbeat };

struct Header {
  uint8_t kind;
};

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string rank_id(int r) { return "r" + std::to_string(r); }

std::string serialize(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string s;
  for (const auto& [k, v] : kv) s += k + "=" + v + "\n";
  return s;
}
std::map<std::string, std::string> parse_kv(const std::string& s) {
  std::map<std::string, std::string> m;
  size_t p = 0;
  while (p < s.size()) {
    size_t e = s.find('\n', p);
    if (e == std::string::npos) e = s.size();
    std::string line = s.substr(p, e - p);
    size_t eq = line.find('=');
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
    p = e + 1;
  }
  return m;
}

void set_int(void* sock, int opt, int v) { zmq_setsockopt(sock, opt, &v, sizeof v); }

class ZmqComm : public Comm {
 public:
  explicit ZmqComm(ZmqCommOptions o) : o_(std::move(o)) {}
  ~ZmqComm() override {
    stop_ = true;
    if (hb_thread_.joinable()) hb_thread_.join();
    if (data_) zmq_close(data_);
    if (ctx_) zmq_ctx_term(ctx_);
  }

  Status start() {
    ctx_ = zmq_ctx_new();
    if (!ctx_) return make_error(StatusCode::kInternal, "zmq_ctx_new failed: {}", zmq_strerror(errno));
    const std::string ep = fmt::format("tcp://{}:{}", o_.master_addr, o_.master_port);
    data_ = zmq_socket(ctx_, o_.rank == 0 ? ZMQ_ROUTER : ZMQ_DEALER);
    set_int(data_, ZMQ_LINGER, 0);
    set_int(data_, ZMQ_SNDHWM, 0);
    set_int(data_, ZMQ_RCVHWM, 0);
    if (o_.rank == 0) {
      set_int(data_, ZMQ_ROUTER_MANDATORY, 1);  // sending to a vanished peer is an error, not a drop
      if (zmq_bind(data_, ep.c_str()) != 0)
        return make_error(StatusCode::kUnavailable, "--master-addr/--master-port: cannot bind {}: {}", ep,
                          zmq_strerror(errno));
      TANDEM_RETURN_IF_ERROR(start_heartbeat());
      return accept_ranks(ep);
    }
    const std::string id = rank_id(o_.rank);
    zmq_setsockopt(data_, ZMQ_ROUTING_ID, id.data(), id.size());
    set_int(data_, ZMQ_RECONNECT_IVL, 100);
    if (zmq_connect(data_, ep.c_str()) != 0)
      return make_error(StatusCode::kUnavailable, "cannot connect to {}: {}", ep, zmq_strerror(errno));
    const std::string fp = serialize(o_.fingerprint);
    TANDEM_RETURN_IF_ERROR(send(0, Kind::kHello, fp.data(), fp.size()));
    TANDEM_RETURN_IF_ERROR(start_heartbeat());
    // The head answers once every rank has said hello: wait as long as it waits for them.
    TANDEM_RETURN_IF_ERROR(wait(data_, o_.connect_timeout_s + 5.0, "the head's answer to this rank's hello"));
    int from;
    Kind kind;
    TANDEM_RETURN_IF_ERROR(recv(from, kind, scratch_));
    if (kind == Kind::kRefuse)
      return make_error(StatusCode::kFailedPrecondition, "the head refused this rank: {}",
                        std::string(scratch_.begin(), scratch_.end()));
    if (kind != Kind::kWelcome) return protocol_error(0, kind, Kind::kWelcome);
    welcomed_ = true;
    return Status();
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }

  std::string path() const override { return "zmq-rank-order"; }

  // Rank 0 sums in rank order (rank 0 first) in fp32; bf16 elements are widened, summed and rounded
  // back once, so every rank gets the same bits.
  Status all_reduce_sum(void* data, size_t count, CommDtype dtype, CommStream) override {
    if (dtype == CommDtype::kBf16) {
      uint16_t* p = static_cast<uint16_t*>(data);
      wide_.resize(count);
      for (size_t i = 0; i < count; ++i) wide_[i] = num::bf16_to_f32(p[i]);
      TANDEM_RETURN_IF_ERROR(all_reduce_f32(wide_.data(), count));
      for (size_t i = 0; i < count; ++i) p[i] = num::f32_to_bf16(wide_[i]);
      return Status();
    }
    return all_reduce_f32(static_cast<float*>(data), count);
  }

  Status all_reduce_f32(float* data, size_t count) {
    const size_t bytes = count * sizeof(float);
    if (o_.rank != 0) return exchange(Kind::kReduce, data, bytes, data, bytes);
    TANDEM_RETURN_IF_ERROR(collect(Kind::kReduce, bytes));
    for (int r = 1; r < o_.size; ++r) {
      const float* src = reinterpret_cast<const float*>(bufs_[r].data());
      for (size_t i = 0; i < count; ++i) data[i] += src[i];
    }
    for (int r = 1; r < o_.size; ++r) TANDEM_RETURN_IF_ERROR(send(r, Kind::kReduce, data, bytes));
    return Status();
  }

  Status all_gather(const void* in, size_t bytes, void* out, CommStream) override {
    const size_t total = bytes * o_.size;
    if (o_.rank != 0) return exchange(Kind::kGather, in, bytes, out, total);
    TANDEM_RETURN_IF_ERROR(collect(Kind::kGather, bytes));
    uint8_t* dst = static_cast<uint8_t*>(out);
    std::memmove(dst, in, bytes);
    for (int r = 1; r < o_.size; ++r) std::memcpy(dst + r * bytes, bufs_[r].data(), bytes);
    for (int r = 1; r < o_.size; ++r) TANDEM_RETURN_IF_ERROR(send(r, Kind::kGather, dst, total));
    return Status();
  }

  // Rank 0 is the hub: a root other than 0 first sends its bytes there.
  Status broadcast(std::vector<uint8_t>& bytes, int root) override {
    return broadcast_impl(bytes, root, o_.op_timeout_s);
  }
  Status broadcast(void* data, size_t bytes, int root, CommStream) override {
    std::vector<uint8_t> b(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
    TANDEM_RETURN_IF_ERROR(broadcast_impl(b, root, o_.op_timeout_s));
    if (b.size() != bytes) return make_error(StatusCode::kUnavailable, "broadcast: {} bytes arrived, {} expected", b.size(), bytes);
    std::memcpy(data, b.data(), bytes);
    return Status();
  }

  // timeout_s <= 0: a worker waiting for the head's next plan waits as long as the head idles.
  Status broadcast_impl(std::vector<uint8_t>& bytes, int root, double timeout_s) {
    if (root < 0 || root >= o_.size) return invalid_argument("broadcast: root {} outside [0, {})", root, o_.size);
    if (o_.rank == root && root != 0) TANDEM_RETURN_IF_ERROR(send(0, Kind::kBcast, bytes.data(), bytes.size()));
    if (o_.rank == 0) {
      if (root != 0) {
        TANDEM_RETURN_IF_ERROR(recv_from(root, Kind::kBcast, bytes, o_.op_timeout_s));
      }
      for (int r = 1; r < o_.size; ++r)
        if (r != root) TANDEM_RETURN_IF_ERROR(send(r, Kind::kBcast, bytes.data(), bytes.size()));
      return Status();
    }
    if (o_.rank == root) return Status();
    TANDEM_RETURN_IF_ERROR(wait(data_, timeout_s, "a broadcast from rank 0"));
    int from;
    Kind kind;
    TANDEM_RETURN_IF_ERROR(recv(from, kind, bytes));
    if (kind != Kind::kBcast) return protocol_error(0, kind, Kind::kBcast);
    return Status();
  }

  Status barrier(std::chrono::milliseconds timeout) override {
    const double t = std::chrono::duration<double>(timeout).count();
    if (o_.rank != 0) {
      TANDEM_RETURN_IF_ERROR(send(0, Kind::kBarrier, nullptr, 0));
      TANDEM_RETURN_IF_ERROR(wait(data_, t, "rank 0 to release the barrier"));
      int from;
      Kind kind;
      TANDEM_RETURN_IF_ERROR(recv(from, kind, scratch_));
      return kind == Kind::kBarrier ? Status() : protocol_error(0, kind, Kind::kBarrier);
    }
    // Ranks arrive in any order (three or more ranks: not rank order).
    TANDEM_RETURN_IF_ERROR(collect(Kind::kBarrier, 0, t));
    for (int r = 1; r < o_.size; ++r) TANDEM_RETURN_IF_ERROR(send(r, Kind::kBarrier, nullptr, 0));
    return Status();
  }

  std::string failure() const override {
    std::lock_guard<std::mutex> lock(fail_mu_);
    return failure_;
  }
  void fail(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(fail_mu_);
    if (failure_.empty()) {
      failure_ = reason;
      TLOG_ERROR("comm", "rank {}: {}", o_.rank, reason);
    }
    failed_ = true;
  }

 private:
  Status failed_status() const { return Status(StatusCode::kUnavailable, "tensor parallel group failed: " + failure()); }

  Status protocol_error(int peer, Kind got, Kind want) {
    fail(fmt::format("rank {} sent message kind {} where kind {} was expected (mismatched step sequence)", peer,
                     static_cast<int>(got), static_cast<int>(want)));
    return failed_status();
  }

  // Waits until `sock` is readable, the group fails, or timeout_s passes (<= 0: no limit).
  Status wait(void* sock, double timeout_s, const char* what) {
    const auto t0 = Clock::now();
    for (;;) {
      if (failed_) return failed_status();
      zmq_pollitem_t it{sock, 0, ZMQ_POLLIN, 0};
      int rc = zmq_poll(&it, 1, 100);
      if (rc > 0) return Status();
      if (rc < 0 && errno != EINTR) {
        fail(fmt::format("zmq_poll: {}", zmq_strerror(errno)));
        return failed_status();
      }
      if (timeout_s > 0 && since(t0) > timeout_s) {
        fail(fmt::format("rank {} waited {:.1f} s for {}", o_.rank, timeout_s, what));
        return failed_status();
      }
    }
  }

  Status send(int to, Kind kind, const void* data, size_t bytes) {
    if (failed_) return failed_status();
    Header h{static_cast<uint8_t>(kind)};
    if (o_.rank == 0) {
      const std::string id = rank_id(to);
      if (zmq_send(data_, id.data(), id.size(), ZMQ_SNDMORE) < 0 ||
          zmq_send(data_, &h, sizeof h, ZMQ_SNDMORE) < 0 || zmq_send(data_, data, bytes, 0) < 0) {
        fail(fmt::format("sending to rank {}: {}", to, zmq_strerror(errno)));
        return failed_status();
      }
      return Status();
    }
    if (zmq_send(data_, &h, sizeof h, ZMQ_SNDMORE) < 0 || zmq_send(data_, data, bytes, 0) < 0) {
      fail(fmt::format("sending to rank 0: {}", zmq_strerror(errno)));
      return failed_status();
    }
    return Status();
  }

  // One message (readable already): the sender's rank (rank 0 only; 0 on the others), kind, payload.
  Status recv(int& from, Kind& kind, std::vector<uint8_t>& payload) {
    from = 0;
    zmq_msg_t part;
    std::vector<std::vector<uint8_t>> frames;
    for (;;) {
      zmq_msg_init(&part);
      if (zmq_msg_recv(&part, data_, 0) < 0) {
        zmq_msg_close(&part);
        fail(fmt::format("receive: {}", zmq_strerror(errno)));
        return failed_status();
      }
      const uint8_t* p = static_cast<const uint8_t*>(zmq_msg_data(&part));
      frames.emplace_back(p, p + zmq_msg_size(&part));
      const bool more = zmq_msg_more(&part);
      zmq_msg_close(&part);
      if (!more) break;
    }
    size_t i = 0;
    if (o_.rank == 0) {
      const std::string id(frames[0].begin(), frames[0].end());
      if (id.size() < 2 || id[0] != 'r') return Status(StatusCode::kUnavailable, "message from unknown peer");
      from = std::atoi(id.c_str() + 1);
      i = 1;
    }
    if (frames.size() != i + 2 || frames[i].size() != sizeof(Header)) {
      fail(fmt::format("malformed message from rank {}", from));
      return failed_status();
    }
    Header h;
    std::memcpy(&h, frames[i].data(), sizeof h);
    kind = static_cast<Kind>(h.kind);
    payload = std::move(frames[i + 1]);
    return Status();
  }

  // Rank 0: one message of `kind` from each other rank into bufs_[r] (any arrival order).
  Status collect(Kind kind, size_t bytes, double timeout_s = -1) {
    bufs_.resize(o_.size);
    std::vector<bool> got(o_.size, false);
    for (int n = 1; n < o_.size; ++n) {
      TANDEM_RETURN_IF_ERROR(wait(data_, timeout_s < 0 ? o_.op_timeout_s : timeout_s,
                                  "the other ranks' part of a collective"));
      int from;
      Kind k;
      std::vector<uint8_t> payload;
      TANDEM_RETURN_IF_ERROR(recv(from, k, payload));
      if (from < 1 || from >= o_.size || got[from]) {
        fail(fmt::format("unexpected message from rank {}", from));
        return failed_status();
      }
      if (k != kind) return protocol_error(from, k, kind);
      if (payload.size() != bytes) {
        fail(fmt::format("rank {} sent {} bytes to a collective of {} bytes (mismatched step)", from, payload.size(),
                         bytes));
        return failed_status();
      }
      got[from] = true;
      bufs_[from] = std::move(payload);
    }
    return Status();
  }

  Status recv_from(int r, Kind kind, std::vector<uint8_t>& out, double timeout_s) {
    TANDEM_RETURN_IF_ERROR(wait(data_, timeout_s, "a message from a rank"));
    int from;
    Kind k;
    TANDEM_RETURN_IF_ERROR(recv(from, k, out));
    if (from != r || k != kind) return protocol_error(from, k, kind);
    return Status();
  }

  // Non-zero ranks: send ours, receive rank 0's answer into out (out_bytes exactly).
  Status exchange(Kind kind, const void* in, size_t in_bytes, void* out, size_t out_bytes) {
    TANDEM_RETURN_IF_ERROR(send(0, kind, in, in_bytes));
    TANDEM_RETURN_IF_ERROR(wait(data_, o_.op_timeout_s, "rank 0's answer to a collective"));
    int from;
    Kind k;
    TANDEM_RETURN_IF_ERROR(recv(from, k, scratch_));
    if (k != kind) return protocol_error(0, k, kind);
    if (scratch_.size() != out_bytes) {
      fail(fmt::format("rank 0 answered {} bytes where {} were expected", scratch_.size(), out_bytes));
      return failed_status();
    }
    std::memcpy(out, scratch_.data(), out_bytes);
    return Status();
  }

  // Rank 0: waits for every rank's hello, then compares fingerprints.
  Status accept_ranks(const std::string& ep) {
    std::map<int, std::map<std::string, std::string>> prints;
    const auto t0 = Clock::now();
    while (static_cast<int>(prints.size()) < o_.size - 1) {
      zmq_pollitem_t it{data_, 0, ZMQ_POLLIN, 0};
      int rc = zmq_poll(&it, 1, 100);
      if (rc > 0) {
        int from;
        Kind k;
        TANDEM_RETURN_IF_ERROR(recv(from, k, scratch_));
        if (k != Kind::kHello || from < 1 || from >= o_.size) continue;
        prints[from] = parse_kv(std::string(scratch_.begin(), scratch_.end()));
        TLOG_INFO("comm", "rank {} connected ({}/{})", from, prints.size() + 1, o_.size);
        continue;
      }
      if (o_.abort_check) {
        const std::string why = o_.abort_check();
        if (!why.empty()) return make_error(StatusCode::kUnavailable, "tensor parallel start-up: {}", why);
      }
      if (since(t0) > o_.connect_timeout_s) {
        std::string missing;
        for (int r = 1; r < o_.size; ++r) {
          if (prints.count(r)) continue;
          missing += (missing.empty() ? "" : ", ") + fmt::format("rank {}", r);
          if (r < static_cast<int>(o_.rank_hosts.size())) missing += " (" + o_.rank_hosts[r] + ")";
        }
        return make_error(StatusCode::kUnavailable,
                          "tensor parallel start-up: {} did not connect to {} within {:.0f} s; start them with the "
                          "same --master-addr/--master-port",
                          missing, ep, o_.connect_timeout_s);
      }
    }
    std::string diff;
    for (const auto& [r, fp] : prints) {
      for (const auto& [k, v] : o_.fingerprint) {
        auto it = fp.find(k);
        const std::string theirs = it == fp.end() ? "(missing)" : it->second;
        if (theirs != v) diff += fmt::format("{}rank {} has {} = {} where rank 0 has {}", diff.empty() ? "" : "; ", r,
                                             k, theirs, v);
      }
    }
    if (!diff.empty()) {
      for (const auto& [r, fp] : prints) (void)send(r, Kind::kRefuse, diff.data(), diff.size());
      return make_error(StatusCode::kFailedPrecondition, "tensor parallel ranks do not match: {}", diff);
    }
    for (int r = 1; r < o_.size; ++r) TANDEM_RETURN_IF_ERROR(send(r, Kind::kWelcome, nullptr, 0));
    welcomed_ = true;
    return Status();
  }

  // ---- heartbeats: a thread with its own socket; a peer silent for heartbeat_timeout_s fails the group ----
  Status start_heartbeat() {
    void* s = zmq_socket(ctx_, o_.rank == 0 ? ZMQ_ROUTER : ZMQ_DEALER);
    set_int(s, ZMQ_LINGER, 0);
    const std::string ep = fmt::format("tcp://{}:{}", o_.master_addr, o_.master_port + 1);
    if (o_.rank == 0) {
      if (zmq_bind(s, ep.c_str()) != 0) {
        Status st = make_error(StatusCode::kUnavailable, "--master-port: cannot bind {} (heartbeats use master port + 1): {}",
                               ep, zmq_strerror(errno));
        zmq_close(s);
        return st;
      }
    } else {
      const std::string id = rank_id(o_.rank);
      zmq_setsockopt(s, ZMQ_ROUTING_ID, id.data(), id.size());
      set_int(s, ZMQ_RECONNECT_IVL, 100);
      zmq_connect(s, ep.c_str());
    }
    hb_thread_ = std::thread([this, s] { heartbeat_loop(s); });
    return Status();
  }

  void heartbeat_loop(void* s) {
    const double period = 0.2;
    std::vector<Clock::time_point> seen(o_.size, Clock::now());
    bool armed = false;  // timeouts count from the moment the group formed
    auto last_sent = Clock::now() - std::chrono::seconds(1);
    while (!stop_) {
      if (welcomed_ && !armed) {
        armed = true;
        std::fill(seen.begin(), seen.end(), Clock::now());
      }
      if (since(last_sent) >= period) {
        last_sent = Clock::now();
        const uint8_t b = 1;
        if (o_.rank == 0) {
          if (armed)
            for (int r = 1; r < o_.size; ++r) {
              const std::string id = rank_id(r);
              if (zmq_send(s, id.data(), id.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0) zmq_send(s, &b, 1, ZMQ_DONTWAIT);
            }
        } else {
          zmq_send(s, &b, 1, ZMQ_DONTWAIT);
        }
      }
      zmq_pollitem_t it{s, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&it, 1, 50) > 0) {
        zmq_msg_t m;
        int from = 0;
        bool first = true;
        for (;;) {
          zmq_msg_init(&m);
          if (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
          }
          if (first && o_.rank == 0 && zmq_msg_size(&m) >= 2)
            from = std::atoi(std::string(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m)).c_str() + 1);
          first = false;
          const bool more = zmq_msg_more(&m);
          zmq_msg_close(&m);
          if (!more) break;
        }
        if (from >= 0 && from < o_.size) seen[from] = Clock::now();
      }
      if (!armed || failed_) continue;
      if (o_.rank == 0) {
        for (int r = 1; r < o_.size; ++r)
          if (since(seen[r]) > o_.heartbeat_timeout_s)
            fail(fmt::format("rank {} stopped answering (no heartbeat for {:.1f} s)", r, since(seen[r])));
      } else if (since(seen[0]) > o_.heartbeat_timeout_s) {
        fail(fmt::format("rank 0 (the head) stopped answering (no heartbeat for {:.1f} s)", since(seen[0])));
      }
    }
    zmq_close(s);
  }

  ZmqCommOptions o_;
  void* ctx_ = nullptr;
  void* data_ = nullptr;
  std::vector<std::vector<uint8_t>> bufs_;
  std::vector<float> wide_;  // bf16 all-reduce staging
  std::vector<uint8_t> scratch_;
  std::thread hb_thread_;
  std::atomic<bool> stop_{false}, failed_{false}, welcomed_{false};
  mutable std::mutex fail_mu_;
  std::string failure_;

};

}  // namespace

Result<std::unique_ptr<Comm>> create_zmq_comm(const ZmqCommOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size)
    return invalid_argument("rank {} outside a group of {}", options.rank, options.size);
  if (options.master_port <= 0 || options.master_port >= 65535)
    return invalid_argument("--master-port {} must be in [1, 65534] (it and the next port are used)",
                            options.master_port);
  auto c = std::make_unique<ZmqComm>(options);
  TANDEM_RETURN_IF_ERROR(c->start());
  return std::unique_ptr<Comm>(std::move(c));
}

Status zmq_wait_broadcast(ControlComm& comm, std::vector<uint8_t>& bytes) {
  auto* z = dynamic_cast<ZmqComm*>(&comm);
  if (!z) return comm.broadcast(bytes, 0);
  return z->broadcast_impl(bytes, 0, 0.0);
}

}  // namespace tandem
