// Which acker shard owns a source id, and a batch of XOR events grouped by shard: the client's
// side of a sharded acker. The map is documented in python/xorack/sharding.py (blocks of
// 2**10 ids, MurmurHash3's fmix64 recast on 54 bits, the top 32 bits of the mix scaled to N
// slices); python/xorack/_fallback/sharding.py computes the same in numpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace xorack {

constexpr unsigned kShardBlockBits = 10;  // protocol.CHUNK_BITS: a chunk lives on one shard
constexpr uint64_t kMask54 = (uint64_t(1) << 54) - 1;

// The 54-bit mixer of a block number (a bijection on [0, 2**54); 0 -> 0).
inline uint64_t mix54(uint64_t x) {
  x ^= x >> 27;
  x = (x * 0x11AFD7ED558CCDULL) & kMask54;
  x ^= x >> 27;
  x = (x * 0xEB9FE1A85EC53ULL) & kMask54;
  x ^= x >> 27;
  return x;
}

// The shard (0 .. count-1) of `id << shift` (shift > 0: `id` is a chunk number of that many
// bits, routed by an id of the chunk).
inline uint32_t shard_of_id(uint64_t id, unsigned shift, uint32_t count) {
  uint64_t top = mix54((id << shift) >> kShardBlockBits) >> (54 - 32);
  return uint32_t((top * count) >> 32);
}

// Events (ids[i], vals[i]) grouped by shard, each shard's in their input order (a counting
// sort: two passes, no comparison): shard k's are out_*[offsets[k] .. offsets[k + 1]).
// `offsets` has count + 1 entries.
inline void split_by_shard(const uint64_t* ids, const uint64_t* vals, size_t n, unsigned shift,
                           uint32_t count, uint64_t* out_ids, uint64_t* out_vals,
                           int64_t* offsets) {
  std::vector<uint32_t> owner(n);
  std::vector<int64_t> next(size_t(count) + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    owner[i] = shard_of_id(ids[i], shift, count);
    ++next[owner[i] + 1];
  }
  for (uint32_t k = 0; k < count; ++k) next[k + 1] += next[k];
  for (uint32_t k = 0; k <= count; ++k) offsets[k] = next[k];
  for (size_t i = 0; i < n; ++i) {
    int64_t j = next[owner[i]]++;
    out_ids[j] = ids[i];
    out_vals[j] = vals[i];
  }
}

// Events (ids[i], vals[i]) appended to their shard's buffers, each shard's in their input order:
// shard k's go to out_ids[k][fill[k] ..] and out_vals[k][fill[k] ..], and fill[k] advances. One
// pass to find the owners and count, one to place: a client's coalescing buffer fed straight
// from a batch (where split_by_shard and a later join of each shard's parts take two copies).
// When some shard's events would pass its capacity cap[k], nothing is written and the call
// returns false. `owner` and `counts` are scratch.
inline bool scatter_by_shard(const uint64_t* ids, const uint64_t* vals, size_t n, unsigned shift,
                             uint32_t count, uint64_t* const* out_ids, uint64_t* const* out_vals,
                             const int64_t* cap, int64_t* fill, std::vector<uint32_t>& owner,
                             std::vector<int64_t>& counts) {
  owner.resize(n);
  counts.assign(count, 0);
  for (size_t i = 0; i < n; ++i) {
    owner[i] = shard_of_id(ids[i], shift, count);
    ++counts[owner[i]];
  }
  for (uint32_t k = 0; k < count; ++k)
    if (fill[k] + counts[k] > cap[k]) return false;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t k = owner[i];
    const int64_t j = fill[k]++;
    out_ids[k][j] = ids[i];
    out_vals[k][j] = vals[i];
  }
  return true;
}

}  // namespace xorack
