// flat_table.hpp — the open-addressing table under AckTable and TimeoutWheel, its key mixer, and
// the random-memory-read baseline its speed is judged against (benchmarks/bench_acker.py).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace xorack {

// ---------------------------------------------------------------------------------------------
// Key mixing
// ---------------------------------------------------------------------------------------------

// SplitMix64's finalizer: a bijection of uint64 with full avalanche.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A per-process random seed mixed into every key: ids can come from outside, so a crafted set
// of ids must not be able to pile up in one probe run.
inline uint64_t process_seed() {
  static const uint64_t seed = [] {
    std::random_device rd;
    uint64_t s = (uint64_t(rd()) << 32) ^ rd();
    s ^= uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    return mix64(s) | 1;
  }();
  return seed;
}

// Table hash of a key: two multiply-xorshift rounds (cheap next to the cache miss it decides).
inline uint64_t hash_key(uint64_t key, uint64_t seed) {
  uint64_t h = (key ^ seed) * 0x9E3779B97F4A7C15ULL;
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ULL;
  return h ^ (h >> 32);
}

// ---------------------------------------------------------------------------------------------
// Slot memory
// ---------------------------------------------------------------------------------------------

// Zeroed memory for a slot array. Big arrays are 2 MB aligned and advised as huge pages: a
// random probe into a 30 MB table otherwise misses the TLB as well as the cache.
inline void* alloc_zeroed(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
#if defined(__linux__)
  if (bytes >= 2 * kHuge) {
    size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    void* p = nullptr;
    if (posix_memalign(&p, kHuge, rounded) != 0) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);
    std::memset(p, 0, bytes);
    return p;
  }
#endif
  void* p = std::calloc(bytes ? bytes : 1, 1);
  if (!p) throw std::bad_alloc();
  return p;
}

// ---------------------------------------------------------------------------------------------
// FlatTable
// ---------------------------------------------------------------------------------------------

// An open-addressing hash table from nonzero uint64 keys to V: one array of (key, value) slots,
// key 0 = empty, linear probing in Robin Hood order (the entries of a run sorted by home slot),
// backward-shift deletion (no tombstones, so probe runs never rot under the insert/erase churn
// of an acker). Lookups of present keys are plain linear probing (no hashing of the entries
// passed); Robin Hood order makes erasures stop early (see erase_at) and bulk removal one forward
// pass (erase_if). Any capacity (not only powers of two): the home slot is the high half of
// hash * capacity, which lets the table size follow its content.
// Grows above kMaxLoad, shrinks below kMinLoad, to kTargetLoad in both cases.
template <class V>
class FlatTable {
 public:
#pragma pack(push, 2)
  // 16 bytes for V = uint64_t, 10 for V = uint16_t (packed: the wheel's per-id cost; x86 loads
  // do not care about the 2-byte alignment).
  struct Slot {
    uint64_t key;
    V value;
  };
#pragma pack(pop)

  static constexpr size_t npos = ~size_t(0);
  // Load kept in [0.6, 0.85] while growing: linear probing costs ~3.8 slots per hit at 0.85.
  // Measured against [0.8, 0.9]: that saves ~4 B per pending id (31.4 vs 35.7 B with the wheel)
  // but makes register+complete churn ~40% slower (longer runs to walk and shift) — and churn is
  // the FT layer's steady state, so speed wins here. Re-measured with Robin Hood order (callgrind,
  // 1 M pending, 3 churn rounds, 4 MB simulated last-level cache): [0.6, 0.85] (load 0.75 at
  // 1 M) 91 M instructions / 0.99 M misses; [0.8, 0.9] 206 M / 1.60 M; [0.85, 0.92] 189 M /
  // 1.53 M; [0.6, 0.8] (load 0.65 at 1 M) 62 M / 0.80 M. Robin Hood's erase shift at load 0.75 is
  // ~6 slots (0.37 of entries sit at home), ~10 at 0.8: the cost grows fast with the load.
  static constexpr double kMaxLoad = 0.85;
  static constexpr double kTargetLoad = 0.6;  // after a resize
  static constexpr double kMinLoad = 0.2;
  static constexpr size_t kMinCapacity = 16;
  static constexpr size_t kMaxCapacity = (size_t(1) << 32) - 1;  // indices fit in uint32

  FlatTable() : seed_(process_seed()) { allocate(kMinCapacity); }
  ~FlatTable() { std::free(slots_); }
  FlatTable(const FlatTable&) = delete;
  FlatTable& operator=(const FlatTable&) = delete;
  FlatTable(FlatTable&& o) noexcept : slots_(o.slots_), cap_(o.cap_), size_(o.size_), seed_(o.seed_) {
    o.slots_ = nullptr;
    o.cap_ = 0;
    o.size_ = 0;
  }

  // How often the rare paths ran (for the tests, which must reach them; never read by the
  // table itself): resizes up and down, and runs longer than 64 slots in erase_if.
  struct Counters {
    uint64_t grows = 0, shrinks = 0, long_runs = 0;
  };
  const Counters& counters() const { return counters_; }

  size_t size() const { return size_; }
  size_t capacity() const { return cap_; }
  size_t nbytes() const { return cap_ * sizeof(Slot); }
  Slot* slots() { return slots_; }
  const Slot* slots() const { return slots_; }

  // The slot where a probe for `key` starts.
  size_t home(uint64_t key) const {
    return size_t((unsigned __int128)hash_key(key, seed_) * cap_ >> 64);
  }
  void prefetch(size_t i) const { __builtin_prefetch(slots_ + i, 1, 3); }
  // Prefetches slot i and the cache line after it: an insertion or erasure at i usually walks
  // on into the next line (runs of several slots at the loads kept), and a miss there would
  // otherwise be taken serially, at full memory latency. Churn, CPU time, best of 3 on the
  // loaded 2-core machine: 18.8 vs 17.1 M events/s with one line.
  void prefetch_run(size_t i) const {
    __builtin_prefetch(slots_ + i, 1, 3);
    __builtin_prefetch(slots_ + std::min(i + 64 / sizeof(Slot), cap_ - 1), 1, 3);
  }
  // How far slot i lies after the home of `key` (cyclically).
  size_t displacement(size_t i, uint64_t key) const { return offset(i, home(key)); }

  // The slot holding `key`, probing from `i` (its home), or npos.
  size_t find_from(uint64_t key, size_t i) const {
    for (;;) {
      uint64_t k = slots_[i].key;
      if (k == key) return i;
      if (k == 0) return npos;
      if (++i == cap_) i = 0;
    }
  }
  size_t find(uint64_t key) const { return find_from(key, home(key)); }

  // The slot holding `key`, probing from its home `i`; when absent, the slot where it belongs
  // in Robin Hood order (the first empty slot, or the first entry whose home lies after the
  // key's: its displacement is smaller), which insert_at() takes.
  size_t find_slot_from(uint64_t key, size_t i) const {
    for (size_t d = 0;; ++d) {
      uint64_t k = slots_[i].key;
      if (k == key || k == 0 || displacement(i, k) < d) return i;
      if (++i == cap_) i = 0;
    }
  }
  // Inserts at slot i from find_slot_from (the key absent; needs room: reserve() first): the
  // entries from i to the end of the run move one slot on (no hashing: a plain carry).
  void insert_at(size_t i, uint64_t key, V value) {
    Slot carry{key, value};
    for (;;) {
      const Slot next = slots_[i];
      slots_[i] = carry;
      if (next.key == 0) break;
      carry = next;
      if (++i == cap_) i = 0;
    }
    ++size_;
  }

  // The slot holding `key`, probing from its home `i`; inserted (value `init`) when absent.
  // Needs room: call reserve() first. May move later entries of the run (slot indices taken
  // before are stale after an insertion).
  size_t find_or_insert_from(uint64_t key, size_t i, V init, bool* inserted) {
    i = find_slot_from(key, i);
    *inserted = slots_[i].key != key;
    if (*inserted) insert_at(i, key, init);
    return i;
  }

  // Removes the entry in slot i; the displaced entries after it shift back by one. Robin Hood
  // order makes this short: the shift stops at the first entry in its home slot (every later
  // entry of the run has its home after that) instead of scanning the whole rest of the run —
  // the erase cost of the acker's completions (benchmarks/bench_acker.py, churn).
  void erase_at(size_t i) {
    for (;;) {
      size_t j = i + 1 == cap_ ? 0 : i + 1;
      const uint64_t k = slots_[j].key;
      if (k == 0 || home(k) == j) break;
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i].key = 0;
    slots_[i].value = V(0);
    --size_;
  }

  // Removes `key`; false when absent. Never resizes (call maybe_shrink() after a batch).
  bool erase(uint64_t key) {
    size_t i = find(key);
    if (i == npos) return false;
    erase_at(i);
    return true;
  }

  // Removes every entry for which dead(key, value) is true, writing its key to out (room for
  // size() keys); returns how many. One sequential sweep, probe run (cluster) by run, doing the
  // backward shifts of all the run's removals at once. Robin Hood order makes that one forward
  // pass: the homes of a run's entries never decrease along it, so each survivor goes to the
  // first free slot at or after its home, which is max(its home, the slot after the survivor
  // before it); survivors keep their order (Robin Hood order holds) and nothing they pass over
  // is free (a valid linear-probing layout). Any run length, no bitmap.
  // Branch-free per entry: when one entry in three expires, a branch on it mispredicts so often
  // that it costs more than the sweep. Measured with callgrind against the bitmap compaction it
  // replaces (needed before runs were kept in Robin Hood order): see benchmarks/bench_acker.py,
  // wheel add+rotate.
  template <class Dead>
  size_t erase_if(Dead dead, uint64_t* out) {
    size_t start = 0;
    while (slots_[start].key != 0) ++start;  // an empty slot exists: load < 1
    Slot sink;                                // where a dead entry is "put back"
    size_t n_out = 0;
    size_t i = start;
    do {
      if (++i == cap_) i = 0;
      if (slots_[i].key == 0) continue;
      // A run starts at i (the slot before is empty): the homes of its entries lie in it, at or
      // before them, so offsets from i order them without wrapping.
      size_t j = i, o = 0, w = 0;  // w: the first free offset after the last survivor placed
      do {
        const Slot e = slots_[j];
        slots_[j].key = 0;
        slots_[j].value = V(0);
        const bool d = dead(e.key, e.value);
        out[n_out] = e.key;
        n_out += d;
        // A survivor with no hole before it stays: no hashing for it.
        const size_t t = w == o ? o : std::max(w, offset(home(e.key), i));
        *(d ? &sink : &slots_[wrap(i + t)]) = e;
        w = d ? w : t + 1;
        if (++j == cap_) j = 0;
        ++o;
      } while (slots_[j].key != 0);
      counters_.long_runs += o > 64;
      i = j;  // empty (possibly `start`)
    } while (i != start);
    size_ -= n_out;
    return n_out;
  }

  // How many entries can be inserted before the table passes kMaxLoad.
  size_t room() const {
    size_t limit = size_t(kMaxLoad * double(cap_));
    return limit > size_ ? limit - size_ : 0;
  }

  // Makes room for `total` entries without passing kMaxLoad (may move every entry).
  void reserve(size_t total) {
    if (double(total) > kMaxLoad * double(cap_)) {
      rehash(size_t(double(total) / kTargetLoad) + 1);
      ++counters_.grows;
    }
  }

  // Gives memory back once the table is mostly empty (may move every entry).
  void maybe_shrink() {
    if (cap_ > kMinCapacity && double(size_) < kMinLoad * double(cap_)) {
      rehash(size_t(double(size_) / kTargetLoad) + 1);
      ++counters_.shrinks;
    }
  }

  void swap(FlatTable& o) noexcept {
    std::swap(slots_, o.slots_);
    std::swap(cap_, o.cap_);
    std::swap(size_, o.size_);
    std::swap(seed_, o.seed_);
    std::swap(counters_, o.counters_);
  }

  void clear() {
    std::free(slots_);
    slots_ = nullptr;
    size_ = 0;
    allocate(kMinCapacity);
  }

 private:
  size_t wrap(size_t i) const { return i >= cap_ ? i - cap_ : i; }
  // How far slot j lies after slot `from`, cyclically.
  size_t offset(size_t j, size_t from) const { return j >= from ? j - from : j + cap_ - from; }

  void allocate(size_t cap) {
    cap = std::max(cap, kMinCapacity);
    if (cap > kMaxCapacity) throw std::length_error("xorack table would exceed 2**32 slots");
    slots_ = static_cast<Slot*>(alloc_zeroed(cap * sizeof(Slot)));
    cap_ = cap;
  }

  void rehash(size_t new_cap) {
    Slot* old = slots_;
    size_t old_cap = cap_;
    allocate(new_cap);  // on failure the old array is untouched (strong guarantee)
    size_ = 0;          // counted again by insert_at
    for (size_t j = 0; j < old_cap; ++j) {
      uint64_t k = old[j].key;
      if (k == 0) continue;
      insert_at(find_slot_from(k, home(k)), k, old[j].value);
    }
    std::free(old);
  }

  Slot* slots_ = nullptr;
  size_t cap_ = 0;
  size_t size_ = 0;
  uint64_t seed_;
  Counters counters_;
};

// ---------------------------------------------------------------------------------------------
// BatchIndex
// ---------------------------------------------------------------------------------------------

// A scratch map key -> uint32 position, valid for one batch: insert-only, power-of-two capacity
// at load <= 1/2, and an epoch per slot so that starting the next batch costs nothing (no
// clearing pass). Used to combine the events of a key within a call.
class BatchIndex {
 public:
  // Prepares for up to n keys; forgets the previous batch in O(1).
  void reset(size_t n) {
    size_t want = 16;
    while (want < 2 * n) want <<= 1;
    // Reallocate when too small, when the epoch wraps, or when a past giant batch left far more
    // than needed (a thread-local must not pin the memory of its largest batch forever).
    bool oversized = slots_.size() > (size_t(1) << 17) && slots_.size() > 8 * want;
    if (want > slots_.size() || oversized || ++epoch_ == 0) {
      std::vector<Slot>(want, Slot{0, 0, 0}).swap(slots_);
      epoch_ = 1;
    }
    mask_ = slots_.size() - 1;
    seed_ = process_seed();
  }

  size_t home(uint64_t key) const { return size_t(hash_key(key, seed_)) & mask_; }
  void prefetch(size_t i) const { __builtin_prefetch(slots_.data() + i, 1, 3); }

  // The position stored for key (probing from its home i); stores `pos` first when absent.
  uint32_t find_or_insert(uint64_t key, size_t i, uint32_t pos, bool* inserted) {
    for (;;) {
      Slot& s = slots_[i];
      if (s.epoch != epoch_) {
        s = Slot{key, pos, epoch_};
        *inserted = true;
        return pos;
      }
      if (s.key == key) {
        *inserted = false;
        return s.pos;
      }
      i = (i + 1) & mask_;
    }
  }

  // Stores pos for key (inserted, or replacing the position stored before).
  void assign(uint64_t key, uint32_t pos) {
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.epoch != epoch_ || s.key == key) {
        s = Slot{key, pos, epoch_};
        return;
      }
    }
  }

  // Memory held by the slots.
  size_t nbytes() const { return slots_.capacity() * sizeof(Slot); }
  // Frees the slots when they hold room for more than `keep` keys (the next reset reallocates).
  void trim(size_t keep) {
    if (slots_.size() > 2 * keep) {
      std::vector<Slot>().swap(slots_);
      epoch_ = 0;
    }
  }

  // The position stored for key, or -1.
  int64_t find(uint64_t key) const {
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.epoch != epoch_) return -1;
      if (s.key == key) return s.pos;
    }
  }

 private:
  struct Slot {
    uint64_t key;
    uint32_t pos;
    uint32_t epoch;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  uint32_t epoch_ = 0;
  uint64_t seed_ = 0;
};

// How many prefetches run ahead of the probes in batch loops: enough in-flight misses to cover
// DRAM latency (~100 ns) at a few ns per operation, few enough to stay within the L1 fill buffers.
constexpr size_t kPrefetchDistance = 16;

// ---------------------------------------------------------------------------------------------
// Memory baseline
// ---------------------------------------------------------------------------------------------

// Random 64-byte reads per second over an array of `bytes`, with independent addresses (so the
// CPU overlaps misses, as the batched table probes do). The yardstick of the AckTable benchmark.
inline double random_read_rate(size_t bytes, size_t reads, uint64_t seed) {
  size_t lines = std::max<size_t>(bytes / 64, 1);
  struct alignas(64) Line {
    uint64_t w[8];
  };
  Line* mem = static_cast<Line*>(alloc_zeroed(lines * sizeof(Line)));
  for (size_t i = 0; i < lines; ++i) mem[i].w[0] = i;  // touch every page
  uint64_t s = seed, acc = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t r = 0; r < reads; ++r) {
    s += 0x9E3779B97F4A7C15ULL;
    size_t i = size_t((unsigned __int128)mix64(s) * lines >> 64);
    const Line& l = mem[i];
    acc += l.w[0] ^ l.w[7];
  }
  auto t1 = std::chrono::steady_clock::now();
  std::free(mem);
  double sec = std::chrono::duration<double>(t1 - t0).count();
  if (acc == 42) sec += 1e-12;  // keeps the reads from being optimized away
  return sec > 0 ? double(reads) / sec : 0.0;
}

}  // namespace xorack
