// KV block pool and prefix cache. Blocks of block_size tokens are handed out to sequences through
// per-sequence block tables; full blocks are registered under a hash chain (hash of the parent
// block's hash and this block's tokens) so later requests sharing the prefix reuse them. A block
// may also carry a snapshot of the model's per-slot state (window ring + compressor state) taken
// when a sequence's length reached the block's end: a prefix hit must end at such a block.
// Snapshots can be far larger than a block's KV, so there may be fewer snapshot buffers than
// blocks; they are recycled least-recently-used first. The buffers are the model runner's (device
// memory on a GPU, RunnerAllocation::num_snapshots); this manager only numbers them.
// Free blocks sit in one LRU list (intrusive, no allocation): uncached blocks at the head (reused
// first), cached ones appended at the tail in reverse table order, so a request's tail goes first.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace tandem {

class KvBlockManager {
 public:
  // num_snapshots: slot-state snapshots kept at once (LRU beyond that); -1 = one per block.
  KvBlockManager(int num_blocks, int block_size, bool enable_prefix_caching, int num_snapshots = -1);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int num_free() const { return num_free_; }  // reference count 0 (cached or not)
  bool prefix_caching() const { return prefix_caching_; }
  int64_t num_cached_blocks() const { return static_cast<int64_t>(cached_.size()); }

  // Longest chain of cached full blocks matching `tokens` (at most max_blocks) that ends at a block
  // with a slot-state snapshot. Fills blocks/hashes for that chain; takes no references.
  void find_cached_prefix(std::span<const int32_t> tokens, int max_blocks, std::vector<int32_t>& blocks,
                          std::vector<uint64_t>& hashes) const;
  // Takes one reference on each block (removing it from the free list if it was free).
  void acquire(std::span<const int32_t> blocks);
  // Appends n fresh blocks to `table`, evicting least-recently-freed cached blocks as needed.
  // Returns false (and allocates nothing) if fewer than n blocks are free.
  bool allocate(int n, std::vector<int32_t>& table);
  // Drops the table's references (tail first) and clears it.
  void release(std::vector<int32_t>& table);
  // Registers the table's full blocks [hashes.size(), num_full_blocks) under the hash chain of
  // `tokens`; extends `hashes`. A hash that is already cached elsewhere keeps its first block.
  void register_full_blocks(std::span<const int32_t> tokens, std::span<const int32_t> table,
                            std::vector<uint64_t>& hashes, int num_full_blocks);
  // The block that owns `hash` in the cache, or -1.
  int cached_block(uint64_t hash) const;
  bool has_snapshot(int block) const { return meta_[block].snap >= 0; }
  // Gives `block` the number of a snapshot buffer to fill (evicting the least recently used
  // snapshot if all are taken); the block then counts as having a snapshot.
  int take_snapshot(int block);
  int snapshot(int block) const;   // the block's snapshot number (CHECKs it has one)
  void touch_snapshot(int block);  // a prefix hit used it: most recently used
  int num_snapshots() const { return static_cast<int>(snap_owner_.size()); }

  // Integrity: reference counts must equal `expected_refs` (one entry per block, counted from every
  // live block table), free-list membership must match zero references, the cache map must point
  // at blocks carrying that hash. Returns the first violation; *leaked counts blocks with
  // references but no owner.
  Status check(std::span<const int> expected_refs, int64_t* leaked) const;
  std::vector<int32_t> free_list_order() const;  // head (next to allocate) first; for tests
  int ref_count(int block) const { return meta_[block].ref; }

 private:
  struct Meta {
    int ref = 0;
    int prev = -1, next = -1;  // free list links
    bool in_free = false;
    bool cached = false;
    int snap = -1;  // snapshot slot, -1 = none
    uint64_t hash = 0;
  };
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> block_tokens) const;
  void push_front(int b);
  void push_back(int b);
  void unlink(int b);
  void evict(int b);
  void drop_snapshot(int b);

  int num_blocks_;
  int block_size_;
  bool prefix_caching_;
  std::vector<Meta> meta_;
  int head_ = -1, tail_ = -1;
  int num_free_ = 0;
  std::unordered_map<uint64_t, int> cached_;
  std::vector<int32_t> block_tokens_;  // tokens of each cached block, to rule out hash collisions
  std::vector<int> snap_owner_;        // block owning each snapshot slot, -1 = free
  std::vector<uint64_t> snap_stamp_;   // last use, for LRU
  std::vector<int> free_snaps_;
  uint64_t snap_clock_ = 0;
};

}  // namespace tandem
