// The peer-memory one-shot path, host side (device_comm.h; the kernel and its protocol are in
// device_comm.cu). The exchange region of the whole group lives on rank 0's GPU: rank 0 allocates
// it (one cudaMalloc: every rank's two halves of `capacity` bytes, then every rank's inbox of epoch
// flags), exports it with cudaIpcGetMemHandle, and the others open it. So rank 0 (the server) only
// ever touches its own memory: a worker that dies leaves nothing rank 0's kernels could fault on.
// The epoch counters and a failure word live in each rank's own device memory, the abort and
// error words in mapped pinned host memory, so the watchdog can stop a waiting kernel and read why
// without touching the stream.
#include <cuda_runtime_api.h>

#include <cstring>

#include "common/log.h"
#include "model/cuda/device_comm_impl.h"

namespace tandem::devcomm {
namespace {

constexpr size_t kInboxBytes = sizeof(uint64_t) * kMaxPeerRanks * kPeerBlocks;  // one rank's inbox

class PeerComm : public PathComm {
 public:
  PeerComm(const DeviceCommOptions& o, size_t capacity) : o_(o), capacity_(capacity) {}

  ~PeerComm() override {
    if (mapped_) cudaIpcCloseMemHandle(mapped_);
    if (exchange_) cudaFree(exchange_);
    if (local_) cudaFree(local_);
    if (host_words_) cudaFreeHost(host_words_);
    cudaGetLastError();
  }

  size_t region_bytes() const { return static_cast<size_t>(o_.size) * (2 * capacity_ + kInboxBytes); }

  // This rank's epochs and host words; on rank 0 also the group's exchange region and its IPC
  // handle (local; errors are reported to the agreement round).
  Status allocate(cudaIpcMemHandle_t& handle) {
    TANDEM_RETURN_IF_ERROR(
        cuda_status(cudaMalloc(&local_, sizeof(uint64_t) * kPeerBlocks + sizeof(uint32_t)), "cudaMalloc (epochs)"));
    TANDEM_RETURN_IF_ERROR(cuda_status(cudaMemset(local_, 0, sizeof(uint64_t) * kPeerBlocks + sizeof(uint32_t)), "cudaMemset"));
    TANDEM_RETURN_IF_ERROR(
        cuda_status(cudaHostAlloc(&host_words_, 2 * sizeof(uint32_t), cudaHostAllocMapped), "cudaHostAlloc (mapped)"));
    std::memset(host_words_, 0, 2 * sizeof(uint32_t));
    TANDEM_RETURN_IF_ERROR(cuda_status(cudaHostGetDevicePointer(&host_words_dev_, host_words_, 0),
                                       "cudaHostGetDevicePointer"));
    if (o_.rank == 0) {
      TANDEM_RETURN_IF_ERROR(cuda_status(cudaMalloc(&exchange_, region_bytes()), "cudaMalloc (peer exchange region)"));
      TANDEM_RETURN_IF_ERROR(cuda_status(cudaMemset(exchange_, 0, region_bytes()), "cudaMemset"));
      TANDEM_RETURN_IF_ERROR(cuda_status(cudaIpcGetMemHandle(&handle, exchange_), "cudaIpcGetMemHandle"));
    }
    return cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  // Ranks other than 0 open rank 0's region (local; errors go to the agreement round).
  Status open(const std::vector<uint8_t>& handle0) {
    uint8_t* base = static_cast<uint8_t*>(exchange_);
    if (o_.rank != 0) {
      cudaIpcMemHandle_t h;
      if (handle0.size() != sizeof h) return make_error(StatusCode::kDataLoss, "rank 0 sent a malformed IPC handle");
      std::memcpy(&h, handle0.data(), sizeof h);
      Status st = cuda_status(cudaIpcOpenMemHandle(&mapped_, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      if (!st.ok()) {
        mapped_ = nullptr;
        return st.with_context("opening rank 0's exchange region");
      }
      base = static_cast<uint8_t*>(mapped_);
    }
    base_ = PeerArgs{};
    base_.rank = o_.rank;
    base_.size = o_.size;
    base_.capacity = capacity_;
    for (int p = 0; p < o_.size; ++p) {
      base_.data[p] = base + static_cast<size_t>(p) * 2 * capacity_;
      base_.inbox[p] = reinterpret_cast<uint64_t*>(base + static_cast<size_t>(o_.size) * 2 * capacity_ +
                                                   static_cast<size_t>(p) * kInboxBytes);
    }
    base_.epoch = static_cast<uint64_t*>(local_);
    base_.state = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(local_) + sizeof(uint64_t) * kPeerBlocks);
    base_.host_abort = static_cast<const volatile uint32_t*>(host_words_dev_);
    base_.host_error = static_cast<uint32_t*>(host_words_dev_) + 1;
    base_.timeout_ns = static_cast<uint64_t>(o_.peer_timeout_s * 1e9);
    return Status();
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  std::string path() const override { return comm_path_name(kind()); }
  CommPath kind() const override { return CommPath::kPeerOneShot; }
  size_t device_bytes() const override { return o_.rank == 0 ? region_bytes() : 0; }

  // Rank-order fp32 sums; messages above the capacity go in chunks (every rank chunks alike).
  Status all_reduce_sum(void* data, size_t count, CommDtype dtype, CommStream stream) override {
    const size_t elem = comm_dtype_bytes(dtype), bytes = count * elem;
    uint8_t* p = static_cast<uint8_t*>(data);
    for (size_t off = 0; off < bytes; off += capacity_) {
      PeerArgs a = base_;
      a.mode = PeerMode::kSum;
      a.bf16 = dtype == CommDtype::kBf16;
      a.in = p + off;
      a.out = p + off;
      a.bytes = std::min(capacity_, bytes - off);
      a.unit = aligned(16, {a.in, a.out}, a.bytes) ? 16 : static_cast<int>(elem);
      launch_peer(a, static_cast<cudaStream_t>(stream));
    }
    return Status();
  }

  Status all_gather(const void* in, size_t bytes, void* out, CommStream stream) override {
    const uint8_t* src = static_cast<const uint8_t*>(in);
    uint8_t* dst = static_cast<uint8_t*>(out);
    for (size_t off = 0; off < bytes; off += capacity_) {
      PeerArgs a = base_;
      a.mode = PeerMode::kGather;
      a.in = src + off;
      a.out = dst + off;
      a.bytes = std::min(capacity_, bytes - off);
      a.out_stride = bytes;
      a.unit = copy_unit({a.in, a.out}, a.bytes, bytes);
      launch_peer(a, static_cast<cudaStream_t>(stream));
    }
    return Status();
  }

  Status broadcast(void* data, size_t bytes, int root, CommStream stream) override {
    uint8_t* p = static_cast<uint8_t*>(data);
    for (size_t off = 0; off < bytes; off += capacity_) {
      PeerArgs a = base_;
      a.mode = PeerMode::kBroadcast;
      a.root = root;
      a.in = p + off;
      a.out = p + off;
      a.bytes = std::min(capacity_, bytes - off);
      a.unit = copy_unit({a.in, a.out}, a.bytes, a.bytes);
      launch_peer(a, static_cast<cudaStream_t>(stream));
    }
    return Status();
  }

  std::string failure() const override {
    const uint32_t who = reinterpret_cast<volatile const uint32_t*>(host_words_)[1];
    if (who == 0) return "";
    return fmt::format("rank {}: a peer-memory collective waited more than {:.1f} s for rank {}", o_.rank,
                       o_.peer_timeout_s, who - 1);
  }
  void abort() override {
    reinterpret_cast<volatile uint32_t*>(host_words_)[0] = 1u;
  }

 private:
  static bool aligned(size_t a, std::initializer_list<const void*> ptrs, size_t n) {
    if (n % a) return false;
    for (const void* p : ptrs)
      if (reinterpret_cast<uintptr_t>(p) % a) return false;
    return true;
  }
  // Widest unit every pointer, the chunk's length and the row stride are multiples of.
  static int copy_unit(std::initializer_list<const void*> ptrs, size_t n, size_t stride) {
    for (int u : {16, 4, 2})
      if (aligned(u, ptrs, n) && stride % static_cast<size_t>(u) == 0) return u;
    return 1;
  }

  DeviceCommOptions o_;
  size_t capacity_;
  void* exchange_ = nullptr;     // rank 0: the region [size][2][capacity_] + [size] inboxes, exported
  void* mapped_ = nullptr;       // other ranks: rank 0's region opened here
  void* local_ = nullptr;        // epochs [kPeerBlocks] u64 + failure word u32
  void* host_words_ = nullptr;   // mapped pinned: [0] abort (host -> device), [1] 1 + rank given up on
  void* host_words_dev_ = nullptr;
  PeerArgs base_;
};

}  // namespace

Result<std::unique_ptr<PathComm>> create_peer_comm(const DeviceCommOptions& o, const std::vector<RankFacts>& facts,
                                                   ControlComm& control) {
  // The capacity is a multiple of 256 so every chunk but the last keeps 16-byte units.
  const size_t capacity = (o.max_peer_bytes + 255) / 256 * 256;
  auto comm = std::make_unique<PeerComm>(o, capacity);
  // Rank 0's GPU (where the region lives) must be visible here and reachable, unless it is ours.
  Status local;
  const RankFacts& r0 = facts[0];
  if (o.rank != 0 && r0.gpu_uuid != facts[o.rank].gpu_uuid) {
    int dev = -1;
    if (cudaDeviceGetByPCIBusId(&dev, r0.pci_bus.c_str()) != cudaSuccess) {
      cudaGetLastError();
      local = make_error(StatusCode::kUnavailable,
                         "rank 0's GPU ({}) is not visible in rank {}'s process (keep CUDA_VISIBLE_DEVICES the same on "
                         "every rank of a host)",
                         r0.pci_bus, o.rank);
    } else {
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, o.device, dev) != cudaSuccess || !can) {
        cudaGetLastError();
        local = make_error(StatusCode::kUnavailable, "GPU {} of rank {} cannot access rank 0's GPU {} (no P2P path)",
                           o.device, o.rank, dev);
      }
    }
  }
  cudaIpcMemHandle_t handle{};
  if (local.ok()) local = comm->allocate(handle);
  std::string why;
  TANDEM_ASSIGN_OR_RETURN(bool all_ok, control_all_agree(control, local.ok(), local.message(), &why));
  if (!all_ok) return make_error(StatusCode::kUnavailable, "{}", why);
  std::vector<uint8_t> h0;
  if (o.rank == 0) h0.assign(reinterpret_cast<uint8_t*>(&handle), reinterpret_cast<uint8_t*>(&handle) + sizeof handle);
  TANDEM_RETURN_IF_ERROR(control.broadcast(h0, 0));
  local = comm->open(h0);
  TANDEM_ASSIGN_OR_RETURN(all_ok, control_all_agree(control, local.ok(), local.message(), &why));
  if (!all_ok) return make_error(StatusCode::kUnavailable, "{}", why);
  return std::unique_ptr<PathComm>(std::move(comm));
}

}  // namespace tandem::devcomm
