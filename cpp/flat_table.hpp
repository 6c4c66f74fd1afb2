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
#if defined(__unix__)
#include <time.h>
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

constexpr uint64_t kHashMul1 = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kHashMul2 = 0xD6E8FEB86659FD93ULL;

// The inverse of an odd number modulo 2**64 (Newton's iteration: each step doubles the bits).
constexpr uint64_t inverse_mod64(uint64_t a) {
  uint64_t x = a;  // right to 3 bits for odd a
  for (int i = 0; i < 5; ++i) x *= 2 - a * x;
  return x;
}

// Table hash of a key: two multiply-xorshift rounds (cheap next to the cache miss it decides).
// A bijection of uint64 (xor, odd multiplies and x ^= x >> 32 all invert), so a table can store
// the hash instead of the key and get the key back with unhash_key.
inline uint64_t hash_key(uint64_t key, uint64_t seed) {
  uint64_t h = (key ^ seed) * kHashMul1;
  h ^= h >> 32;
  h *= kHashMul2;
  return h ^ (h >> 32);
}
inline uint64_t unhash_key(uint64_t h, uint64_t seed) {
  h ^= h >> 32;  // x ^= x >> 32 is its own inverse
  h *= inverse_mod64(kHashMul2);
  h ^= h >> 32;
  return (h * inverse_mod64(kHashMul1)) ^ seed;
}
static_assert(inverse_mod64(kHashMul1) * kHashMul1 == 1 && inverse_mod64(kHashMul2) * kHashMul2 == 1);

// A prefetch of the cache line at p into every cache level. Not __builtin_prefetch alone: GCC takes a
// function whose only effect is a prefetch for pure and drops its calls (found with perf: the
// batch loops ran without a single prefetch instruction).
inline void prefetch_line(const void* p) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

// Hides x's value from the optimizer, so that it cannot split a test of x into tests of the
// conditions x was computed from (and branch on a coin toss among them).
template <class T>
inline void opaque(T& x) {
#if defined(__GNUC__) || defined(__clang__)
  asm volatile("" : "+r"(x));
#else
  (void)x;
#endif
}

// ---------------------------------------------------------------------------------------------
// Slot memory
// ---------------------------------------------------------------------------------------------

// Memory for a slot array, every byte set to `fill` (left as it is when fill < 0). Big arrays
// are 2 MB aligned and advised as huge pages: a random probe into a 30 MB table otherwise misses
// the TLB as well as the cache.
inline void* alloc_filled(size_t bytes, int fill) {
  constexpr size_t kHuge = size_t(2) << 20;
  void* p = nullptr;
#if defined(__linux__)
  if (bytes >= 2 * kHuge) {
    size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    if (posix_memalign(&p, kHuge, rounded) != 0) throw std::bad_alloc();
    madvise(p, rounded, MADV_HUGEPAGE);
  }
#endif
  if (!p && !(p = std::malloc(bytes ? bytes : 1))) throw std::bad_alloc();
  if (fill >= 0) std::memset(p, fill, bytes);
  return p;
}
inline void* alloc_zeroed(size_t bytes) { return alloc_filled(bytes, 0); }

// ---------------------------------------------------------------------------------------------
// FlatTable
// ---------------------------------------------------------------------------------------------

// An open-addressing hash table from nonzero uint64 keys to V, kept as an *ordered* linear-probing
// table: one array of (hash, value) slots where the slots hold the keys' hashes (a bijection of
// the key, see hash_of / key_of), the home slot of a hash is the high half of hash * capacity
// (so homes rise with the hash), probe runs never wrap around (a few spare slots follow the
// `capacity` home slots), and every run is sorted by hash. Then the whole array is sorted, and:
// - a lookup is `i = home(h); while (slot[i].hash < h) ++i;`: no hashing of the entries passed,
//   and a miss stops as early as a hit (the empty slot is all ones, greater than every hash);
// - an insertion puts the hash where the scan stopped and shifts the rest of the run one slot on
//   (a memmove), an erasure shifts back the entries after it up to the first one at its home
//   (backward-shift deletion: no tombstones, so runs never rot under an acker's insert/erase
//   churn);
// - resizing and bulk removal (erase_if) are one sequential pass: each entry goes to
//   max(its home, the slot after the entry placed before it), no probing.
// The layout depends only on the set of entries, never on the order they came in.
// Grows above its max load, shrinks below kMinLoad, to its target load in both cases (the loads
// are per table: see Loads).
template <class V>
class FlatTable {
 public:
#pragma pack(push, 2)
  // 16 bytes for V = uint64_t, 10 for V = uint16_t (packed: the wheel's per-id cost; x86 loads
  // do not care about the 2-byte alignment).
  struct Slot {
    uint64_t hash;  // kEmpty: no entry
    V value;
  };
#pragma pack(pop)

  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static constexpr size_t npos = ~size_t(0);
  // Default loads. The ordered layout makes probing cheap (no hashing, early misses) and resizes
  // one sequential pass, so the table runs fuller than the Robin Hood table it replaced
  // ([0.6, 0.85]). What a high load costs is the shift of an insertion (to the end of its run)
  // and of an erasure. AckTable's registered ids and TimeoutWheel use loads of their own (see
  // there): memory per pending id is a target too.
  static constexpr double kMaxLoad = 0.87;
  static constexpr double kTargetLoad = 0.75;  // after a resize
  static constexpr double kMinLoad = 0.2;
  // A table's loads: grow past `max`, to `target` (also after a shrink). Right after a resize
  // the load is `target`, so slot bytes / target is what an entry costs at worst: the figure
  // that the memory target (<= 32 B per pending id, AckTable + TimeoutWheel) must hold at every
  // size, not only where a benchmark happens to stop growing.
  struct Loads {
    double max = kMaxLoad, target = kTargetLoad;
  };
  static constexpr size_t kMinCapacity = 16;
  static constexpr size_t kMaxCapacity = (size_t(1) << 32) - 2048;  // indices fit in uint32

  explicit FlatTable(Loads loads = Loads{})
      : loads_(loads), seed_(process_seed()), zero_hash_(hash_key(0, seed_)) {
    allocate(kMinCapacity);
  }
  ~FlatTable() { std::free(slots_); }
  FlatTable(const FlatTable&) = delete;
  FlatTable& operator=(const FlatTable&) = delete;

  // How often the rare paths ran (for the tests, which must reach them; never read by the
  // table itself): resizes up and down, growths forced by a run reaching the spare slots at the
  // end, runs longer than 64 slots met by erase_if, and batches merged by merge_sorted.
  struct Counters {
    uint64_t grows = 0, shrinks = 0, tail_grows = 0, long_runs = 0, merges = 0;
  };
  const Counters& counters() const { return counters_; }

  size_t size() const { return size_; }
  // Whether n more entries could make the table grow (pass the max load).
  bool may_grow(size_t n) const { return size_ + n > max_size_; }
  size_t capacity() const { return cap_; }  // home slots (the array has a few more)
  size_t nbytes() const { return len_ * sizeof(Slot); }
  Slot* slots() { return slots_; }
  const Slot* slots() const { return slots_; }

  // The stored hash of a nonzero key, never kEmpty: the one key whose hash is kEmpty takes the
  // hash of key 0 instead (no valid key has it).
  uint64_t hash_of(uint64_t key) const {
    const uint64_t h = hash_key(key, seed_);
    return h == kEmpty ? zero_hash_ : h;
  }
  // The key of a stored hash.
  uint64_t key_of(uint64_t h) const { return unhash_key(h == zero_hash_ ? kEmpty : h, seed_); }

  // The slot where a probe for hash h starts.
  size_t home(uint64_t h) const { return size_t((unsigned __int128)h * cap_ >> 64); }
  void prefetch(size_t i) const { prefetch_line(slots_ + i); }
  // Prefetches the 256 bytes from slot i: an insertion or erasure at i walks on to the end of
  // its run (at loads of 0.8-0.87, often past the next line), and a miss there would otherwise
  // be taken serially. Four lines against two, with kPrefetchDistance 32 against 16: churn
  // +7 %, wheel add + rotate +6 % (means of 16 interleaved C++ harness runs each, 1 M pending,
  // 64 K batches, loaded 2-core machine; neither change alone gained).
  void prefetch_run(size_t i) const {
    prefetch_line(slots_ + i);
    prefetch_line(reinterpret_cast<const char*>(slots_ + i) + 64);
    prefetch_line(reinterpret_cast<const char*>(slots_ + i) + 128);
    prefetch_line(reinterpret_cast<const char*>(slots_ + i) + 192);
  }

  // Where hash h is or belongs: the first slot from its home whose hash is >= h (an empty slot
  // counts as greater than every hash). h is present iff slots()[seek(h)].hash == h.
  size_t seek(uint64_t h) const {
    size_t i = home(h);
    while (slots_[i].hash < h) ++i;
    return i;
  }
  size_t find_hash(uint64_t h) const {
    const size_t i = seek(h);
    return slots_[i].hash == h ? i : npos;
  }
  size_t find(uint64_t key) const { return find_hash(hash_of(key)); }

  // Inserts hash h (absent) at slot i = seek(h): the entries from i to the end of the run move
  // one slot on. May grow the table (every slot index taken before is then stale; seek again).
  void insert_at(size_t i, uint64_t h, V value) {
    // One pass that carries the displaced entry on until an empty slot takes it (a scan for
    // the end of the run, then a move, costs a second loop and its mispredicted exit).
    Slot carry;
    carry.hash = h;
    carry.value = value;
    size_t e = i;
    for (;; ++e) {
      const Slot next = slots_[e];
      slots_[e] = carry;
      if (next.hash == kEmpty) break;
      carry = next;
    }
    ++size_;
    // The last slot always stays empty (it ends every scan): grow once a run reaches the one
    // before it, or once the load passes the max load.
    if (size_ > max_size_) {
      ++counters_.grows;
      rehash(size_t(double(size_) / loads_.target) + 1);
    } else if (e >= len_ - 2) {
      ++counters_.tail_grows;
      rehash(cap_ + cap_ / 8 + 8);
    }
  }

  // Removes the entry in slot i; the displaced entries after it shift back by one, up to the
  // first entry at its home (every later entry of the run has its home after that one).
  void erase_at(size_t i) {
    size_t j = i + 1;
    for (;; ++j) {  // moves each displaced entry back as it is met: one loop
      const Slot next = slots_[j];
      if (next.hash == kEmpty || home(next.hash) >= j) break;
      slots_[j - 1] = next;
    }
    slots_[j - 1].hash = kEmpty;  // the value of an empty slot is never read
    --size_;
  }

  // Removes `key`; false when absent. Never resizes (call maybe_shrink() after a batch).
  bool erase(uint64_t key) {
    size_t i = find(key);
    if (i == npos) return false;
    erase_at(i);
    return true;
  }

  // Calls f(hash, value) for every entry, in hash order.
  template <class F>
  void for_each(F f) const {
    for (size_t i = 0; i < len_; ++i)
      if (slots_[i].hash != kEmpty) f(slots_[i].hash, slots_[i].value);
  }

  // Removes every entry for which dead(value) is true, writing its key to out (room for size()
  // + 1 keys: every slot writes one past the last key kept); returns how many. One forward
  // pass: each survivor moves back to max(its home, the slot after the survivor before it),
  // which keeps the layout ordered and valid (an empty slot needs no special case: the entries
  // after it have their homes after it). Branch-free per slot, empty or not: when one entry in
  // three expires and a third of the slots are empty, a branch on either mispredicts so often
  // that it costs more than the pass.
  // (keys = false: writes the hashes instead, in ascending order.)
  template <class Dead>
  size_t erase_if(Dead dead, uint64_t* out, bool keys = true) {
    Slot sink;  // where a dead entry or an empty slot is "put back"
    Slot* const slots = slots_;  // locals: the stores below could alias the members
    const size_t len = len_, cap = cap_;
    const uintptr_t sink_addr = reinterpret_cast<uintptr_t>(&sink);
    size_t n_out = 0, w = 0, run = 0, long_runs = 0;
    for (size_t j = 0; j < len; ++j) {
      const Slot e = slots[j];
      const size_t empty = e.hash == kEmpty;
      const size_t keep = size_t(!dead(e.value)) & (empty ^ 1);
      slots[j].hash = kEmpty;
      out[n_out] = e.hash;  // turned into keys below, in a loop of its own
      n_out += (keep ^ 1) & (empty ^ 1);
      const size_t h = size_t((unsigned __int128)e.hash * cap >> 64);
      const size_t t = w > h ? w : h;
      // The store's address and w picked by masks, not by a branch (the compiler turns a ?:
      // on `keep` into one, which mispredicts on every third entry).
      const uintptr_t mask = uintptr_t(0) - keep;
      Slot* const dst = reinterpret_cast<Slot*>(
          (reinterpret_cast<uintptr_t>(slots + t) & mask) | (sink_addr & ~mask));
      *dst = e;
      w += (t + 1 - w) & mask;
      run = (run + 1) & (empty - 1);
      long_runs += run == 65;
    }
    if (keys)
      for (size_t k = 0; k < n_out; ++k) out[k] = key_of(out[k]);
    counters_.long_runs += long_runs;
    size_ -= n_out;
    return n_out;
  }

  // Merges a batch into the table in one sequential pass into a new slot array (the way rehash
  // moves entries): `add` holds n distinct hashes (as hash_of gives them) in ascending order,
  // followed by kEmpty (add[n]), each with the value v (an entry already present takes v).
  // Every old entry for which dead(value) is true (and that no batch entry replaces) is removed
  // instead and its key written to out (room for size() + 1 keys; null when nothing can die);
  // returns how many. `expect` (an upper bound of the entries after the merge) picks the new
  // capacity: the current one while it keeps the load in [target - 0.1, max], else the target
  // load. For the pass that is kept, replaced(old value) is called for each old entry that a
  // batch entry replaced; restart() forgets those calls when a pass is redone (a run reached
  // the end of the new array).
  // Why: inserting a big batch id by id is one random cache miss per id once the table is
  // bigger than the cache, and the machine's random-read rate caps that; a merge reads and
  // writes the table once, sequentially. Branch-free per step, as erase_if and for the same
  // reason: which stream the next entry comes from is a coin toss.
  template <class Dead, class Replaced, class Restart>
  size_t merge_sorted(const uint64_t* add, size_t n, V v, Dead dead, Replaced replaced,
                      Restart restart, uint64_t* out, size_t expect) {
    size_t cap = cap_;
    const double load = double(expect) / double(cap_);
    if (load > loads_.max || (cap_ > kMinCapacity && load < loads_.target - 0.1)) {
      cap = std::max(size_t(double(expect) / loads_.target) + 1, kMinCapacity);
      if (cap > cap_)
        ++counters_.grows;
      else if (cap < cap_)
        ++counters_.shrinks;
    }
    uint64_t no_out[1];
    if (!out) out = no_out;  // written at n_out, which stays 0 when nothing dies
    for (;;) {
      if (cap > kMaxCapacity) throw std::length_error("xorack table would exceed 2**32 slots");
      const size_t len = cap + spare(cap);
      Slot* const dst = static_cast<Slot*>(alloc_filled(len * sizeof(Slot), 0xFF));
      const Slot* sp = slots_;
      const Slot* const send = slots_ + len_;
      const uint64_t* ap = add;
      uint64_t* op = out;
      Slot sink;
      const uintptr_t sink_addr = reinterpret_cast<uintptr_t>(&sink);
      // Slot index of the next entry: max(its home, the slot after the entry put before it),
      // never past the last slot (w beyond len - 2 at the end means: retry with more slots).
      size_t w = 0, n_replaced = 0;
      const size_t last = len - 1;
      // Each step takes the smaller of the old entry *sp and the batch entry *ap (both when
      // equal: the batch entry replaces the old one), or passes an empty slot *sp. The last old
      // slot is empty, so every batch entry below the last old entry is taken by then.
      while (sp < send) {
        const Slot e = *sp;
        const uint64_t a = *ap;
        const size_t e_full = e.hash != kEmpty;
        const size_t take_a = size_t(a <= e.hash) & e_full;
        const size_t take_e = size_t(a >= e.hash) | (e_full ^ 1);
        size_t both = take_a & take_e;
        opaque(both);  // one branch on `both` (the compiler would branch on take_a first)
        if (both) {    // rare: a branch predicts it
          replaced(e.value);
          ++n_replaced;
        }
        // Picked by masks: the compiler turns a ?: on take_a into a branch, a coin toss.
        const uint64_t pick = uint64_t(0) - take_a;
        const uint64_t h = e.hash ^ ((a ^ e.hash) & pick);
        const V value = V(e.value ^ ((v ^ e.value) & V(pick)));
        const size_t expired = (take_a ^ 1) & e_full & size_t(dead(e.value));
        *op = h;  // turned into keys below, in a loop of its own
        op += expired;
        const size_t keep = e_full & (expired ^ 1);
        size_t t = size_t((unsigned __int128)h * cap >> 64);
        t = t > w ? t : w;
        t = t < last ? t : last;
        // The store's address picked by a mask, not by a branch (see erase_if).
        const uintptr_t mask = uintptr_t(0) - keep;
        Slot* const to = reinterpret_cast<Slot*>(
            (reinterpret_cast<uintptr_t>(dst + t) & mask) | (sink_addr & ~mask));
        to->hash = h;
        to->value = value;
        w += (t + 1 - w) & mask;
        ap += take_a;
        sp += take_e;
      }
      for (; ap < add + n && w < last; ++ap) {  // the batch entries above the last old one
        const size_t t = std::max<size_t>(size_t((unsigned __int128)*ap * cap >> 64), w);
        if (t >= last) break;
        dst[t].hash = *ap;
        dst[t].value = v;
        w = t + 1;
      }
      const size_t kept = size_ + n - n_replaced - size_t(op - out);
      if (ap == add + n && w <= len - 2) {  // the slot before the last stays empty
        ++counters_.merges;
        std::free(slots_);
        slots_ = dst;
        cap_ = cap;
        len_ = len;
        max_size_ = size_t(loads_.max * double(cap));
        size_ = kept;
        const size_t n_out = size_t(op - out);
        for (size_t j = 0; j < n_out; ++j) out[j] = key_of(out[j]);
        if (size_ > max_size_) {  // `expect` was too low: grow as an insertion would
          ++counters_.grows;
          rehash(size_t(double(size_) / loads_.target) + 1);
        } else if (cap_ > kMinCapacity && double(size_) < (loads_.target - 0.1) * double(cap_)) {
          ++counters_.shrinks;  // far too high (batch entries replaced many old ones): shrink
          rehash(size_t(double(size_) / loads_.target) + 1);
        }
        return n_out;
      }
      std::free(dst);
      restart();
      ++counters_.tail_grows;
      cap += cap / 8 + 8;
    }
  }

  // Makes room for `total` entries without passing the max load (may move every entry).
  void reserve(size_t total) {
    if (total > max_size_) {
      rehash(size_t(double(total) / loads_.target) + 1);
      ++counters_.grows;
    }
  }

  // Gives memory back once the table is mostly empty (may move every entry).
  void maybe_shrink() {
    if (cap_ > kMinCapacity && double(size_) < kMinLoad * double(cap_)) {
      rehash(size_t(double(size_) / loads_.target) + 1);
      ++counters_.shrinks;
    }
  }

  void swap(FlatTable& o) noexcept {
    std::swap(slots_, o.slots_);
    std::swap(loads_, o.loads_);
    std::swap(cap_, o.cap_);
    std::swap(len_, o.len_);
    std::swap(size_, o.size_);
    std::swap(max_size_, o.max_size_);
    std::swap(seed_, o.seed_);
    std::swap(zero_hash_, o.zero_hash_);
    std::swap(counters_, o.counters_);
  }

  void clear() {
    std::free(slots_);
    slots_ = nullptr;
    size_ = 0;
    allocate(kMinCapacity);
  }

 private:
  // Spare slots after the `cap` home slots: runs near the end spill into them (they never wrap
  // around). At the loads kept, a run longer than this is so rare that growing then is free.
  static size_t spare(size_t cap) { return std::min<size_t>(std::max<size_t>(cap / 8, 8), 1024); }

  void allocate(size_t cap) {
    cap = std::max(cap, kMinCapacity);
    if (cap > kMaxCapacity) throw std::length_error("xorack table would exceed 2**32 slots");
    const size_t len = cap + spare(cap);
    slots_ = static_cast<Slot*>(alloc_filled(len * sizeof(Slot), 0xFF));  // all kEmpty
    cap_ = cap;
    len_ = len;
    max_size_ = size_t(loads_.max * double(cap));
  }

  // Moves every entry into a new array of new_cap home slots, in one pass (the old array is in
  // hash order, so each entry goes to max(its home, the slot after the previous one)). Should the
  // last run reach the end of the new array, tries again with more home slots.
  void rehash(size_t new_cap) {
    Slot* const old = slots_;
    const size_t old_cap = cap_, old_len = len_, old_max = max_size_;
    new_cap = std::max(new_cap, size_t(double(size_) / loads_.max) + 1);
    for (;;) {
      allocate(new_cap);  // on failure the old array is untouched (strong guarantee)
      size_t w = 0, placed = 0;
      for (size_t j = 0; j < old_len; ++j) {
        if (old[j].hash == kEmpty) continue;
        const size_t t = std::max(w, home(old[j].hash));
        if (t >= len_ - 2) break;  // the slot before the last must stay empty
        slots_[t] = old[j];
        w = t + 1;
        ++placed;
      }
      if (placed == size_) break;
      std::free(slots_);
      slots_ = old;
      cap_ = old_cap;
      len_ = old_len;
      max_size_ = old_max;
      new_cap += new_cap / 8 + 8;
    }
    std::free(old);
  }

  Loads loads_;
  Slot* slots_ = nullptr;
  size_t cap_ = 0;       // home slots
  size_t len_ = 0;       // slots in the array: cap_ + spare(cap_), the last one always empty
  size_t size_ = 0;
  size_t max_size_ = 0;  // grow past this many entries
  uint64_t seed_;
  uint64_t zero_hash_;  // hash_key(0): the stand-in for the hash kEmpty
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
  void prefetch(size_t i) const { prefetch_line(slots_.data() + i); }

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
// DRAM latency (~100 ns) at a few ns per operation (see FlatTable::prefetch_run for the figures).
constexpr size_t kPrefetchDistance = 32;

// A batch's keys in table order: (hash, input position) pairs in a stable counting sort by the
// top bits of the hash (homes rise with the hash), so that a batch walks the table upwards
// instead of jumping around it. Consecutive probes then land close together (fewer TLB misses,
// DRAM pages already open, the hardware prefetcher on the same stream as ours); the keys of one
// input id keep their input order. The pairs are read in order by the probe loop (the batch's
// own arrays only at the positions it needs, prefetched with the slots). The sort costs ~3.5 ns
// per key; churn CPU time on the loaded 2-core machine (1 M pending, 64 K batches, interleaved
// runs): 16-17 M events/s in input order, 17-20 M sorted (22-26 M with batches handed in
// already sorted, the ceiling of this approach). About 4 keys per bucket measured best of 1, 4,
// 16 and 32.
class BatchOrder {
 public:
#pragma pack(push, 4)
  struct Item {
    uint64_t hash;
    uint32_t pos;  // in the batch
  };
#pragma pack(pop)

  // Orders keys[0..n) for table t (n < 2**32).
  template <class Table>
  void sort(const Table& t, const uint64_t* keys, size_t n) {
    if (n >= (size_t(1) << 32)) throw std::length_error("a batch must hold fewer than 2**32 ids");
    items_.resize(n);
    // About 4 keys per bucket: a bucket spans ~1 KB of a big table.
    int bits = 0;
    while (bits < 16 && (size_t(4) << bits) < n) ++bits;
    const int shift = 64 - bits;
    counts_.assign((size_t(1) << bits) + 1, 0);
    auto bucket = [&](uint64_t h) { return bits ? size_t(h >> shift) : 0; };
    for (size_t i = 0; i < n; ++i) ++counts_[bucket(t.hash_of(keys[i])) + 1];
    for (size_t b = 1; b < counts_.size(); ++b) counts_[b] += counts_[b - 1];
    for (size_t i = 0; i < n; ++i) {
      const uint64_t h = t.hash_of(keys[i]);  // hashing again is cheaper than storing
      items_[counts_[bucket(h)]++] = Item{h, uint32_t(i)};
    }
  }
  const Item* items() const { return items_.data(); }

  // Frees the scratch when it holds room for more than `keep` ids (the counts never pass
  // 2**16 + 1 entries).
  void trim(size_t keep) {
    if (items_.capacity() > keep) std::vector<Item>().swap(items_);
  }
  size_t nbytes() const {
    return items_.capacity() * sizeof(Item) + counts_.capacity() * sizeof(uint32_t);
  }

 private:
  std::vector<Item> items_;
  std::vector<uint32_t> counts_;
};

// The BatchOrder of the calling thread: the scratch of a batch call, shared by every table the
// thread uses (calls on one table are serialized, and a call never enters another). Per thread
// and per batch (12 bytes per id of the batch), not per pending id: a table's nbytes() leaves it
// out; it is freed after a call whose batch held more than 64 K ids.
inline BatchOrder& thread_batch_order() {
  thread_local BatchOrder order;
  return order;
}

// Walks a sorted batch, prefetching the home line(s) of the item kPrefetchDistance ahead (and
// its entry in `extra`, the batch's value array, when given): the probes find their lines in
// cache. Homes are taken when prefetching; a table that grows meanwhile only loses those.
template <class Table>
class Ahead {
 public:
  Ahead(const Table& t, const BatchOrder::Item* items, size_t n, const uint64_t* extra = nullptr)
      : t_(t), items_(items), n_(n), extra_(extra) {
    for (size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) fetch(i);
  }
  // The i-th item to probe; call with i = 0, 1, 2, ... in turn.
  const BatchOrder::Item& next(size_t i) {
    if (i + kPrefetchDistance < n_) fetch(i + kPrefetchDistance);
    return items_[i];
  }

 private:
  void fetch(size_t i) const {
    t_.prefetch_run(t_.home(items_[i].hash));
    if (extra_) prefetch_line(extra_ + items_[i].pos);
  }
  const Table& t_;
  const BatchOrder::Item* items_;
  size_t n_;
  const uint64_t* extra_;
};

// ---------------------------------------------------------------------------------------------
// Memory baseline
// ---------------------------------------------------------------------------------------------

// Seconds on a clock: the steady clock, or the calling thread's CPU time (which a shared machine
// does not inflate by running other processes meanwhile).
inline double clock_seconds(bool thread_cpu) {
#if defined(__unix__)
  if (thread_cpu) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
#endif
  (void)thread_cpu;
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Random 64-byte reads per second over an array of `bytes`, with independent addresses (so the
// CPU overlaps misses, as the batched table probes do). The yardstick of the AckTable benchmark.
// thread_cpu: timed in the thread's CPU time instead of wall time.
inline double random_read_rate(size_t bytes, size_t reads, uint64_t seed, bool thread_cpu = false) {
  size_t lines = std::max<size_t>(bytes / 64, 1);
  struct alignas(64) Line {
    uint64_t w[8];
  };
  Line* mem = static_cast<Line*>(alloc_zeroed(lines * sizeof(Line)));
  for (size_t i = 0; i < lines; ++i) mem[i].w[0] = i;  // touch every page
  uint64_t s = seed, acc = 0;
  const double t0 = clock_seconds(thread_cpu);
  for (size_t r = 0; r < reads; ++r) {
    s += 0x9E3779B97F4A7C15ULL;
    size_t i = size_t((unsigned __int128)mix64(s) * lines >> 64);
    const Line& l = mem[i];
    acc += l.w[0] ^ l.w[7];
  }
  double sec = clock_seconds(thread_cpu) - t0;
  std::free(mem);
  if (acc == 42) sec += 1e-12;  // keeps the reads from being optimized away
  return sec > 0 ? double(reads) / sec : 0.0;
}

}  // namespace xorack
