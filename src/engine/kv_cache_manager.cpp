// KvBlockManager: see kv_cache_manager.h.
#include "engine/kv_cache_manager.h"

#include <algorithm>

#include "common/check.h"
#include "common/hash.h"

namespace tandem {

KvBlockManager::KvBlockManager(int num_blocks, int block_size, bool enable_prefix_caching, int num_snapshots)
    : num_blocks_(num_blocks), block_size_(block_size), prefix_caching_(enable_prefix_caching), meta_(num_blocks) {
  TANDEM_CHECK(num_blocks > 0 && block_size > 0);
  for (int b = 0; b < num_blocks; ++b) push_back(b);
  if (prefix_caching_) {
    block_tokens_.assign(static_cast<size_t>(num_blocks) * block_size, 0);
    int n = num_snapshots < 0 ? num_blocks : num_snapshots;
    snap_owner_.assign(n, -1);
    snap_stamp_.assign(n, 0);
    for (int i = n - 1; i >= 0; --i) free_snaps_.push_back(i);
    cached_.reserve(num_blocks * 2);
  }
}

uint64_t KvBlockManager::chain_hash(uint64_t parent, std::span<const int32_t> block_tokens) const {
  uint64_t h = mix64(parent ^ 0x7A6D0E5ULL);
  for (int32_t t : block_tokens) h = mix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(t)));
  return h;
}

void KvBlockManager::push_front(int b) {
  Meta& m = meta_[b];
  TANDEM_DCHECK(!m.in_free);
  m.prev = -1;
  m.next = head_;
  if (head_ >= 0) meta_[head_].prev = b;
  head_ = b;
  if (tail_ < 0) tail_ = b;
  m.in_free = true;
  ++num_free_;
}

void KvBlockManager::push_back(int b) {
  Meta& m = meta_[b];
  TANDEM_DCHECK(!m.in_free);
  m.next = -1;
  m.prev = tail_;
  if (tail_ >= 0) meta_[tail_].next = b;
  tail_ = b;
  if (head_ < 0) head_ = b;
  m.in_free = true;
  ++num_free_;
}

void KvBlockManager::unlink(int b) {
  Meta& m = meta_[b];
  TANDEM_CHECK(m.in_free);
  if (m.prev >= 0) meta_[m.prev].next = m.next;
  else head_ = m.next;
  if (m.next >= 0) meta_[m.next].prev = m.prev;
  else tail_ = m.prev;
  m.prev = m.next = -1;
  m.in_free = false;
  --num_free_;
}

void KvBlockManager::evict(int b) {
  Meta& m = meta_[b];
  if (!m.cached) return;
  auto it = cached_.find(m.hash);
  if (it != cached_.end() && it->second == b) cached_.erase(it);
  m.cached = false;
  drop_snapshot(b);
  m.hash = 0;
}

void KvBlockManager::drop_snapshot(int b) {
  int slot = meta_[b].snap;
  if (slot < 0) return;
  snap_owner_[slot] = -1;
  free_snaps_.push_back(slot);
  meta_[b].snap = -1;
}

int KvBlockManager::take_snapshot(int block) {
  TANDEM_CHECK(prefix_caching_ && !snap_owner_.empty());
  int slot = meta_[block].snap;
  if (slot < 0) {
    if (!free_snaps_.empty()) {
      slot = free_snaps_.back();
      free_snaps_.pop_back();
    } else {
      slot = static_cast<int>(std::min_element(snap_stamp_.begin(), snap_stamp_.end()) - snap_stamp_.begin());
      meta_[snap_owner_[slot]].snap = -1;
    }
    snap_owner_[slot] = block;
    meta_[block].snap = slot;
  }
  snap_stamp_[slot] = ++snap_clock_;
  return slot;
}

void KvBlockManager::touch_snapshot(int block) {
  if (meta_[block].snap >= 0) snap_stamp_[meta_[block].snap] = ++snap_clock_;
}

void KvBlockManager::find_cached_prefix(std::span<const int32_t> tokens, int max_blocks,
                                        std::vector<int32_t>& blocks, std::vector<uint64_t>& hashes) const {
  blocks.clear();
  hashes.clear();
  if (!prefix_caching_) return;
  uint64_t parent = 0;
  size_t best = 0;
  for (int i = 0; i < max_blocks; ++i) {
    size_t off = static_cast<size_t>(i) * block_size_;
    if (off + block_size_ > tokens.size()) break;
    auto blk_tokens = tokens.subspan(off, block_size_);
    uint64_t h = chain_hash(parent, blk_tokens);
    auto it = cached_.find(h);
    if (it == cached_.end()) break;
    int b = it->second;
    if (!std::equal(blk_tokens.begin(), blk_tokens.end(),
                    block_tokens_.begin() + static_cast<ptrdiff_t>(b) * block_size_))
      break;  // hash collision: treat as a miss
    blocks.push_back(b);
    hashes.push_back(h);
    if (meta_[b].snap >= 0) best = blocks.size();
    parent = h;
  }
  blocks.resize(best);
  hashes.resize(best);
}

void KvBlockManager::acquire(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    if (meta_[b].ref == 0) unlink(b);
    ++meta_[b].ref;
  }
}

bool KvBlockManager::allocate(int n, std::vector<int32_t>& table) {
  if (n <= 0) return true;
  if (n > num_free_) return false;
  for (int i = 0; i < n; ++i) {
    int b = head_;
    TANDEM_CHECK(b >= 0);
    unlink(b);
    evict(b);
    meta_[b].ref = 1;
    table.push_back(b);
  }
  return true;
}

void KvBlockManager::release(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    int b = *it;
    TANDEM_CHECK(meta_[b].ref > 0);
    if (--meta_[b].ref == 0) {
      if (meta_[b].cached) push_back(b);
      else push_front(b);
    }
  }
  table.clear();
}

void KvBlockManager::register_full_blocks(std::span<const int32_t> tokens, std::span<const int32_t> table,
                                          std::vector<uint64_t>& hashes, int num_full_blocks) {
  if (!prefix_caching_) return;
  TANDEM_CHECK(num_full_blocks <= static_cast<int>(table.size()));
  TANDEM_CHECK(static_cast<size_t>(num_full_blocks) * block_size_ <= tokens.size());
  for (int i = static_cast<int>(hashes.size()); i < num_full_blocks; ++i) {
    uint64_t parent = i == 0 ? 0 : hashes[i - 1];
    auto blk_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    uint64_t h = chain_hash(parent, blk_tokens);
    hashes.push_back(h);
    int b = table[i];
    if (meta_[b].cached || cached_.count(h)) continue;
    cached_[h] = b;
    meta_[b].cached = true;
    meta_[b].hash = h;
    drop_snapshot(b);
    std::copy(blk_tokens.begin(), blk_tokens.end(), block_tokens_.begin() + static_cast<ptrdiff_t>(b) * block_size_);
  }
}

int KvBlockManager::cached_block(uint64_t hash) const {
  auto it = cached_.find(hash);
  return it == cached_.end() ? -1 : it->second;
}

int KvBlockManager::snapshot(int block) const {
  int slot = meta_[block].snap;
  TANDEM_CHECK(slot >= 0);
  return slot;
}

Status KvBlockManager::check(std::span<const int> expected_refs, int64_t* leaked) const {
  int64_t leak = 0;
  Status first;
  auto fail = [&](Status s) {
    if (first.ok()) first = std::move(s);
  };
  if (static_cast<int>(expected_refs.size()) != num_blocks_)
    return make_error(StatusCode::kInternal, "kv integrity: {} expected refs for {} blocks", expected_refs.size(),
                      num_blocks_);
  int free_count = 0;
  for (int b = head_, prev = -1; b >= 0; prev = b, b = meta_[b].next) {
    if (meta_[b].prev != prev) fail(make_error(StatusCode::kInternal, "kv integrity: free list broken at block {}", b));
    if (!meta_[b].in_free || meta_[b].ref != 0)
      fail(make_error(StatusCode::kInternal, "kv integrity: block {} in free list with ref {}", b, meta_[b].ref));
    if (++free_count > num_blocks_) return make_error(StatusCode::kInternal, "kv integrity: free list cycle");
  }
  if (free_count != num_free_)
    fail(make_error(StatusCode::kInternal, "kv integrity: free list holds {} blocks, counter says {}", free_count,
                    num_free_));
  for (int b = 0; b < num_blocks_; ++b) {
    const Meta& m = meta_[b];
    if (m.ref != expected_refs[b]) {
      if (m.ref > 0 && expected_refs[b] == 0) ++leak;
      fail(make_error(StatusCode::kInternal, "kv integrity: block {} has {} references, block tables hold {}", b,
                      m.ref, expected_refs[b]));
    }
    if ((m.ref == 0) != m.in_free)
      fail(make_error(StatusCode::kInternal, "kv integrity: block {} ref {} but in_free {}", b, m.ref, m.in_free));
    if (m.cached) {
      auto it = cached_.find(m.hash);
      if (it == cached_.end() || it->second != b)
        fail(make_error(StatusCode::kInternal, "kv integrity: cached block {} missing from the hash map", b));
    }
  }
  size_t owned = 0;
  for (size_t slot = 0; slot < snap_owner_.size(); ++slot) {
    int b = snap_owner_[slot];
    if (b < 0) continue;
    ++owned;
    if (meta_[b].snap != static_cast<int>(slot) || !meta_[b].cached)
      fail(make_error(StatusCode::kInternal, "kv integrity: snapshot {} owned by block {} that does not point back", slot, b));
  }
  if (owned + free_snaps_.size() != snap_owner_.size())
    fail(make_error(StatusCode::kInternal, "kv integrity: {} snapshots owned + {} free != {}", owned, free_snaps_.size(),
                    snap_owner_.size()));
  for (const auto& [h, b] : cached_)
    if (!meta_[b].cached || meta_[b].hash != h)
      fail(make_error(StatusCode::kInternal, "kv integrity: hash map points at block {} without that hash", b));
  if (leaked) *leaked = leak;
  return first;
}

std::vector<int32_t> KvBlockManager::free_list_order() const {
  std::vector<int32_t> out;
  for (int b = head_; b >= 0; b = meta_[b].next) out.push_back(b);
  return out;
}

}  // namespace tandem
