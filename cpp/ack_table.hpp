// ack_table.hpp — the XOR acker table (Storm's Acker, the seed's AckerTable): source id → 64-bit
// ack value. A registered id is complete exactly when its value returns to 0.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "flat_table.hpp"
#include "lineage.hpp"

namespace xorack {

// Source id → ack value, in FlatTables: `main_` holds registered ids (16-byte slots, no flag
// needed); `early_` and `old_` the rare unregistered ids, whose events arrived before their
// register (or after their completion: a duplicate), young and old — expire_unregistered() drops
// the old ones and ages the young, so such entries cannot pile up forever. Usually empty, so the
// hot path pays one size check for them.
//
// Batching semantics (the same in the Python fallback, _fallback/ack_table.py):
// - register() takes its (id, birth) pairs one after the other, as if each were a call of its
//   own: registering [5, 5] with births [3, 3] in one call is exactly register(5, 3) then
//   register(5, 3) — the second XORs the birth in again and completes 5. Splitting a register
//   call into several never changes what completes. Completed ids come in completion order.
// - xor() combines the events of a key within the call first (XOR is associative) and then
//   decides: a registered id completes when its value is 0 after the whole call, so a value that
//   passes through 0 mid-call does not complete it. Completed ids come in order of the key's
//   last occurrence in the input (where it completes: see xor_batch).
class AckTable {
 public:
  using Table = FlatTable<uint64_t>;

  // Registers keys with their births, one (key, birth) pair after the other in input order, as
  // if each pair were a call of its own (so splitting a call never changes its outcome): a key
  // with an entry (registered, or early events) gets the birth XORed in and completes if that
  // gives 0; a fresh key is registered with its birth and waits (even a birth of 0).
  // Appends completed ids to `done` in the order they complete.
  void register_batch(const uint64_t* keys, const uint64_t* births, size_t n,
                      std::vector<uint64_t>& done) {
    done.clear();
    // In chunks that fit the room left below the maximum load (each pair inserts at most one
    // entry), so nothing resizes inside a chunk and the precomputed homes hold; re-registering
    // present ids does not inflate the table.
    for (size_t i = 0; i < n;) {
      size_t room = main_.room();
      if (room == 0) {
        main_.reserve(main_.size() + std::min(n - i, std::max<size_t>(main_.size(), 1024)));
        room = main_.room();
      }
      const size_t m = std::min(room, n - i);
      register_chunk(keys + i, births + i, m, done);
      i += m;
    }
    shrink_all();
    trim_scratch();
  }

  // XORs events into their keys (combined per key: the outcome is decided by each key's value
  // after the whole call). Registered ids at 0 after the call are appended to `done` (in order of
  // their last occurrence in the input) and removed; unregistered entries back at 0 are dropped
  // silently.
  //
  // One pass, one probe per event: an event that brings a registered id to 0 erases it at once
  // (the line is in cache; a second visit later would miss again), so the completion is recorded
  // at the key's current occurrence. Should a later event of the same call name that key again
  // (rare: events are pre-reduced per source id by their senders), it finds the key absent, looks
  // it up among this call's completions (an index built only then) and cancels the earlier
  // completion: a nonzero event brings the key back as registered, a 0 event completes it again
  // here. The same end state as combining first, and a key's completion always sits at its last
  // occurrence.
  void xor_batch(const uint64_t* keys, const uint64_t* vals, size_t n,
                 std::vector<uint64_t>& done) {
    done.clear();
    if (n == 0) return;
    hash_batch(keys, n);
    auto* slots = main_.slots();
    bool indexed = false;  // completed_ holds every completion of this call so far
    size_t cancelled = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i + kPrefetchDistance < n) main_.prefetch_run(homes_[i + kPrefetchDistance]);
      const uint64_t k = keys[i], x = vals[i];
      const size_t s = main_.find_from(k, homes_[i]);  // plain probe: present keys are the rule
      if (s != Table::npos) {
        const uint64_t v = slots[s].value ^ x;
        if (v != 0) {
          slots[s].value = v;
          continue;
        }
        main_.erase_at(s);
        if (indexed) completed_.assign(k, uint32_t(done.size()));
        done.push_back(k);
        continue;
      }
      if (!done.empty()) {  // completed earlier in this call?
        if (!indexed) index_completions(done, n);
        indexed = true;
        const int64_t pos = completed_.find(k);
        if (pos >= 0 && done[size_t(pos)] == k) {
          done[size_t(pos)] = 0;  // its completion moves here, or is undone
          ++cancelled;
          if (x == 0) {  // still at 0: completes at this, its later occurrence
            completed_.assign(k, uint32_t(done.size()));
            done.push_back(k);
          } else {  // back from 0: registered again, not complete
            main_.insert_at(main_.find_slot_from(k, homes_[i]), k, x);  // room: k left
          }
          continue;
        }
      }
      xor_unregistered(k, x);
    }
    if (cancelled) done.erase(std::remove(done.begin(), done.end(), uint64_t(0)), done.end());
    shrink_all();
    trim_scratch();
  }

  // present[i] = whether keys[i] had an entry before the call; all those entries are removed.
  void fail_batch(const uint64_t* keys, size_t n, uint8_t* present) {
    for (size_t i = 0; i < n; ++i) present[i] = contains(keys[i]);
    for (size_t i = 0; i < n; ++i)
      if (present[i] && !main_.erase(keys[i]) && !early_.erase(keys[i])) old_.erase(keys[i]);
    shrink_all();
  }

  // Drops the unregistered entries that were already there at the previous call (returns how
  // many) and ages the others. Called once per timeout rotation, it bounds the life of entries
  // whose register never comes, e.g. events duplicated after their source completed.
  size_t expire_unregistered() {
    size_t dropped = old_.size();
    old_.swap(early_);
    early_.clear();
    return dropped;
  }

  size_t size() const { return main_.size() + early_.size() + old_.size(); }
  size_t capacity() const { return main_.capacity(); }  // of the registered ids' table
  bool contains(uint64_t k) const {
    size_t e;
    return main_.find(k) != Table::npos || find_unregistered(k, &e) != nullptr;
  }
  // The value of k into *v; false when absent.
  bool get(uint64_t k, uint64_t* v) const {
    size_t s = main_.find(k);
    if (s != Table::npos) {
      *v = main_.slots()[s].value;
      return true;
    }
    const Table* et = find_unregistered(k, &s);
    if (!et) return false;
    *v = et->slots()[s].value;
    return true;
  }

  // Every entry as (key, value, registered), sorted by key.
  void snapshot(std::vector<uint64_t>& keys, std::vector<uint64_t>& vals,
                std::vector<uint8_t>& reg) const {
    std::vector<uint64_t> k, v;
    std::vector<uint8_t> r;
    k.reserve(size());
    collect(main_, 1, k, v, r);
    collect(early_, 0, k, v, r);
    collect(old_, 0, k, v, r);
    std::vector<size_t> order(k.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return k[a] < k[b]; });
    keys.resize(k.size());
    vals.resize(k.size());
    reg.resize(k.size());
    for (size_t i = 0; i < order.size(); ++i) {
      keys[i] = k[order[i]];
      vals[i] = v[order[i]];
      reg[i] = r[order[i]];
    }
  }

  // Loads entries into an empty table. Throws std::invalid_argument on key 0, a repeated key, or
  // an unregistered entry with value 0 (such entries never exist).
  void restore(const uint64_t* keys, const uint64_t* vals, const uint8_t* reg, size_t n) {
    if (size() != 0) throw std::logic_error("restore needs an empty AckTable");
    size_t nreg = 0;
    for (size_t i = 0; i < n; ++i) nreg += reg[i] != 0;
    main_.reserve(nreg);
    early_.reserve(n - nreg);
    for (size_t i = 0; i < n; ++i) {
      if (keys[i] == 0)
        throw std::invalid_argument("keys contains id 0 at position " + std::to_string(i));
      if (!reg[i] && vals[i] == 0)
        throw std::invalid_argument("values[" + std::to_string(i) +
                                    "] is 0 for an unregistered key: such entries do not exist");
      Table& t = reg[i] ? main_ : early_;
      if (contains(keys[i])) {
        main_.clear();
        early_.clear();
        old_.clear();
        throw std::invalid_argument("keys must be unique: position " + std::to_string(i) +
                                    " repeats an earlier key");
      }
      bool inserted;
      t.find_or_insert_from(keys[i], t.home(keys[i]), vals[i], &inserted);
    }
  }

  // The rare-path counters of the three tables, summed (for the tests).
  Table::Counters counters() const {
    Table::Counters c;
    for (const Table* t : {&main_, &early_, &old_}) {
      c.grows += t->counters().grows;
      c.shrinks += t->counters().shrinks;
      c.long_runs += t->counters().long_runs;
    }
    return c;
  }

  // Memory held: both slot arrays plus the per-batch scratch vectors.
  size_t nbytes() const {
    return main_.nbytes() + early_.nbytes() + old_.nbytes() + homes_.capacity() * sizeof(uint32_t) +
           completed_.nbytes();
  }

 private:
  // homes_[i] = the home slot of keys[i] in main_; the first probes prefetched.
  void hash_batch(const uint64_t* keys, size_t n) {
    homes_.resize(n);
    for (size_t i = 0; i < n; ++i) homes_[i] = (uint32_t)main_.home(keys[i]);
    for (size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) main_.prefetch_run(homes_[i]);
  }

  // completed_ = key -> position in done, for the (unique, nonzero) keys of done.
  void index_completions(const std::vector<uint64_t>& done, size_t n) {
    if (n >= (size_t(1) << 32))
      throw std::length_error("a batch must hold fewer than 2**32 events");
    completed_.reset(n);
    for (size_t p = 0; p < done.size(); ++p) completed_.assign(done[p], uint32_t(p));
  }

  // An event for a key without a registered entry: XORed into its unregistered entry (dropped
  // at 0), or a new early entry.
  void xor_unregistered(uint64_t k, uint64_t x) {
    size_t e;
    Table* et = find_unregistered(k, &e);
    if (et) {
      const uint64_t v = et->slots()[e].value ^ x;
      if (v == 0)
        et->erase_at(e);
      else
        et->slots()[e].value = v;
    } else if (x != 0) {
      early_.reserve(early_.size() + 1);
      early_.insert_at(early_.find_slot_from(k, early_.home(k)), k, x);
    }
  }

  // register_batch on n pairs that fit main_'s room (nothing resizes).
  void register_chunk(const uint64_t* keys, const uint64_t* births, size_t n,
                      std::vector<uint64_t>& done) {
    hash_batch(keys, n);
    auto* slots = main_.slots();
    const bool unregistered = any_unregistered();
    for (size_t i = 0; i < n; ++i) {
      if (i + kPrefetchDistance < n) main_.prefetch_run(homes_[i + kPrefetchDistance]);
      const uint64_t k = keys[i];
      uint64_t v = births[i];
      // One probe: the key's slot, or the empty slot that ends its probe run.
      const size_t s = main_.find_slot_from(k, homes_[i]);
      if (slots[s].key == k) {  // already registered: XOR the birth in again
        v ^= slots[s].value;
        if (v == 0) {
          main_.erase_at(s);
          done.push_back(k);
        } else {
          slots[s].value = v;
        }
        continue;
      }
      if (unregistered) {
        size_t e;
        Table* et = find_unregistered(k, &e);
        if (et) {  // events came first: the birth joins them
          v ^= et->slots()[e].value;
          et->erase_at(e);
          if (v == 0) {
            done.push_back(k);
            continue;
          }
        }
      }
      main_.insert_at(s, k, v);
    }
  }

  // Per-batch scratch is kept between calls (no reallocation per batch) unless it is larger than
  // both a typical batch and the table itself: an emptied table then gives its memory back.
  void trim_scratch() {
    const size_t keep = std::max<size_t>(size_t(1) << 16, size());
    if (homes_.capacity() > keep) std::vector<uint32_t>().swap(homes_);
    completed_.trim(keep);
  }

  bool any_unregistered() const { return early_.size() != 0 || old_.size() != 0; }

  // The unregistered table holding k and its slot (*slot), or nullptr.
  Table* find_unregistered(uint64_t k, size_t* slot) {
    return const_cast<Table*>(std::as_const(*this).find_unregistered(k, slot));
  }
  const Table* find_unregistered(uint64_t k, size_t* slot) const {
    if (early_.size() && (*slot = early_.find(k)) != Table::npos) return &early_;
    if (old_.size() && (*slot = old_.find(k)) != Table::npos) return &old_;
    return nullptr;
  }

  void shrink_all() {
    main_.maybe_shrink();
    early_.maybe_shrink();
    old_.maybe_shrink();
  }

  static void collect(const Table& t, uint8_t registered, std::vector<uint64_t>& k,
                      std::vector<uint64_t>& v, std::vector<uint8_t>& r) {
    const auto* s = t.slots();
    for (size_t i = 0; i < t.capacity(); ++i) {
      if (s[i].key == 0) continue;
      k.push_back(s[i].key);
      v.push_back(s[i].value);
      r.push_back(registered);
    }
  }

  Table main_, early_, old_;
  std::vector<uint32_t> homes_;  // slot indices fit in 32 bits (kMaxCapacity)
  BatchIndex completed_;  // this call's completions, indexed only when a key recurs
};

}  // namespace xorack
