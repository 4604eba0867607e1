// Rank processes for the device data-plane tests (tests/cuda/device_comm*_test.cpp): a parent test
// starts N copies of this test binary, each running one gtest (`DeviceCommRankProcess.*`) as one
// rank on the GPUs it finds (ranks share a GPU when there are fewer GPUs than ranks: the test-only
// shared mode of device_comm.h), joined by a ZeroMQ control plane on loopback. Each rank writes a
// result file and a log; the parent compares ranks and prints the logs of any rank that failed.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/comm.h"
#include "engine/parallel/zmq_comm.h"
#include "kernels/cuda/cuda_util.h"
#include "model/cuda/device_comm.h"

namespace tandem::devcomm_testing {

// ---- inside a rank process ----

struct RankEnv {
  int rank = -1, size = 0, port = 0;
  std::string scenario, paths, out;
};

inline const char* env_or(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v ? v : dflt;
}

// Set by the parent; rank < 0 when this process is not a rank process.
inline RankEnv rank_env() {
  RankEnv e;
  e.rank = std::atoi(env_or("TANDEM_DEVCOMM_RANK", "-1"));
  e.size = std::atoi(env_or("TANDEM_DEVCOMM_SIZE", "0"));
  e.port = std::atoi(env_or("TANDEM_DEVCOMM_PORT", "0"));
  e.scenario = env_or("TANDEM_DEVCOMM_SCENARIO", "");
  e.paths = env_or("TANDEM_DEVCOMM_PATHS", "auto");
  e.out = env_or("TANDEM_DEVCOMM_OUT", "");
  return e;
}

inline Result<std::unique_ptr<Comm>> connect_control(const RankEnv& e) {
  ZmqCommOptions o;
  o.rank = e.rank;
  o.size = e.size;
  o.master_addr = "127.0.0.1";
  o.master_port = e.port;
  o.connect_timeout_s = 60;
  o.fingerprint = {{"test", "device-comm"}};
  return create_zmq_comm(o);
}

// This rank's device options: ranks spread over the visible GPUs, sharing them when fewer.
inline DeviceCommOptions rank_options(const RankEnv& e) {
  DeviceCommOptions o;
  const int ndev = kernels::cuda::device_count();
  o.rank = e.rank;
  o.size = e.size;
  o.device = ndev > 0 ? e.rank % ndev : 0;
  o.shared_gpus = ndev < e.size;
  o.paths = e.paths;
  o.nccl_library = env_or("TANDEM_NCCL_LIBRARY", "");  // as --nccl-library would (else the loader's search)
  return o;
}

// The gtest a rank process runs, registered only inside a rank process (the parent sets
// TANDEM_DEVCOMM_RANK): the binary's ordinary run neither lists nor skips it.
class RankProcessTest : public ::testing::Test {
 public:
  explicit RankProcessTest(void (*body)()) : body_(body) {}
  void TestBody() override { body_(); }

 private:
  void (*body_)();
};
inline bool register_rank_process_test(const char* name, void (*body)()) {
  if (rank_env().rank < 0) return false;
  ::testing::RegisterTest("DeviceCommRankProcess", name, nullptr, nullptr, __FILE__, __LINE__,
                          [body]() -> ::testing::Test* { return new RankProcessTest(body); });
  return true;
}

// Milliseconds on CLOCK_MONOTONIC (steady_clock on Linux): one clock for every process of the
// machine, so the ranks' and the parent's timestamps compare, and no time step moves them.
inline int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- in the parent ----

// Two consecutive free TCP ports on loopback (the control plane uses port and port + 1).
inline int free_port_pair() {
  for (int attempt = 0; attempt < 64; ++attempt) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      close(s);
      continue;
    }
    const int p = ntohs(a.sin_port);
    close(s);
    if (p + 1 > 65534) continue;
    int t = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in b = a;
    b.sin_port = htons(static_cast<uint16_t>(p + 1));
    const bool ok = bind(t, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0;
    close(t);
    if (ok) return p;
  }
  return 0;
}

struct RankProc {
  int rank = 0;
  pid_t pid = -1;
  std::string log, out;
  bool done = false;
  int status = 0;                 // waitpid status once done
  int64_t exited_ms = 0;          // now_ms() when seen exiting (or stopping, for `stopped`)
  bool stopped = false;
};

class RankGroup {
 public:
  // Starts `size` ranks running gtest `test` with the given scenario; extra env for every rank.
  RankGroup(int size, const std::string& test, const std::string& scenario, const std::string& paths,
            const std::map<std::string, std::string>& extra = {}) {
    char tmpl[] = "/tmp/tandem-devcomm-XXXXXX";
    dir_ = mkdtemp(tmpl) ? tmpl : "/tmp";
    port_ = free_port_pair();
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    for (int r = 0; r < size; ++r) {
      RankProc p;
      p.rank = r;
      p.log = dir_ + "/rank" + std::to_string(r) + ".log";
      p.out = dir_ + "/rank" + std::to_string(r) + ".out";
      // Everything the child needs is built before fork: between fork and exec only
      // async-signal-safe calls (this process may have CUDA's threads).
      std::map<std::string, std::string> env;
      for (char** e = environ; *e; ++e) {
        const std::string kv = *e;
        const size_t eq = kv.find('=');
        if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      env["TANDEM_DEVCOMM_RANK"] = std::to_string(r);
      env["TANDEM_DEVCOMM_SIZE"] = std::to_string(size);
      env["TANDEM_DEVCOMM_PORT"] = std::to_string(port_);
      env["TANDEM_DEVCOMM_SCENARIO"] = scenario;
      env["TANDEM_DEVCOMM_PATHS"] = paths;
      env["TANDEM_DEVCOMM_OUT"] = p.out;
      for (const auto& [k, v] : extra) env[k] = v;
      std::vector<std::string> env_strs;
      for (const auto& [k, v] : env) env_strs.push_back(k + "=" + v);
      std::vector<char*> envp;
      for (auto& x : env_strs) envp.push_back(x.data());
      envp.push_back(nullptr);
      std::string filter = "--gtest_filter=" + test, color = "--gtest_color=no";
      char* argv[] = {exe, filter.data(), color.data(), nullptr};
      const pid_t parent = getpid();
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        const int fd = open(p.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
          dup2(fd, 1);
          dup2(fd, 2);
          close(fd);
        }
        execve(exe, argv, envp.data());
        _exit(127);
      }
      p.pid = pid;
      procs_.push_back(p);
    }
  }
  ~RankGroup() {
    for (RankProc& p : procs_)
      if (!p.done && p.pid > 0) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
      }
  }

  int port() const { return port_; }
  std::vector<RankProc>& procs() { return procs_; }

  // Checks every rank once: notes exits, and stops (SIGSTOP) with their time (a stopped rank
  // still counts as running). True when every rank has exited.
  bool poll() {
    bool all = true;
    for (RankProc& p : procs_) {
      if (p.done) continue;
      int st = 0;
      const pid_t w = waitpid(p.pid, &st, WNOHANG | WUNTRACED);
      if (w == p.pid && WIFSTOPPED(st)) {
        if (!p.stopped) {
          p.stopped = true;
          p.exited_ms = now_ms();
        }
        all = false;
      } else if (w == p.pid) {
        p.done = true;
        p.status = st;
        if (!p.stopped) p.exited_ms = now_ms();
      } else {
        all = false;
      }
    }
    return all;
  }
  // Polls until every rank exited or timeout_s passed; on timeout the survivors are killed and
  // false is returned.
  bool wait(double timeout_s) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!poll()) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
        for (RankProc& p : procs_)
          if (!p.done) {
            kill(p.pid, SIGKILL);
            waitpid(p.pid, &p.status, 0);
            p.done = true;
          }
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  // Kills one rank (a stopped one after the survivors reported).
  void kill_rank(int r) {
    RankProc& p = procs_[r];
    if (p.done) return;
    kill(p.pid, SIGKILL);
    waitpid(p.pid, &p.status, 0);
    p.done = true;
  }

  static std::string read_file(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  // Every rank's log, for a failure message.
  std::string logs() const {
    std::string s;
    for (const RankProc& p : procs_) {
      std::string l = read_file(p.log);
      if (l.size() > 12000) l = "...\n" + l.substr(l.size() - 12000);
      s += "\n----- rank " + std::to_string(p.rank) + " (" + describe(p) + ") -----\n" + l;
    }
    return s;
  }
  static std::string describe(const RankProc& p) {
    if (!p.done) return p.stopped ? "stopped" : "running";
    if (WIFSIGNALED(p.status)) return "killed by signal " + std::to_string(WTERMSIG(p.status));
    return "exit " + std::to_string(WEXITSTATUS(p.status));
  }
  static bool exited_ok(const RankProc& p) { return p.done && WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0; }

  // "key value" lines of a rank's result file.
  static std::map<std::string, std::string> results(const RankProc& p) {
    std::map<std::string, std::string> m;
    std::istringstream in(read_file(p.out));
    std::string line;
    while (std::getline(in, line)) {
      const size_t sp = line.find(' ');
      if (sp != std::string::npos) m[line.substr(0, sp)] = line.substr(sp + 1);
    }
    return m;
  }

 private:
  std::string dir_;
  int port_ = 0;
  std::vector<RankProc> procs_;
};

}  // namespace tandem::devcomm_testing
