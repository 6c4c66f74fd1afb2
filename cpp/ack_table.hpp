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
  //
  // The pairs are probed in table order (BatchOrder): the pairs of one key keep their input
  // order, and pairs of different keys never interact, so the outcome is that of input order;
  // completions are marked at their input position and collected in that order at the end.
  void register_batch(const uint64_t* keys, const uint64_t* births, size_t n,
                      std::vector<uint64_t>& done) {
    done.clear();
    const bool unregistered = any_unregistered();
    start_batch(keys, n);
    const auto* items = thread_batch_order().items();
    // The batch is probed in hash order: inserting it into a table grown step by step on the
    // way would crowd the first (smallest) hashes into one long run (quadratic). So when the
    // batch could make the table grow, a first pass settles the keys already registered and
    // lists the others; the table then makes room for those at once, and a second pass inserts
    // them. Otherwise (the steady state) one pass.
    absent_.clear();
    Ahead<Table> ahead(main_, items, n, births);
    if (!main_.may_grow(n)) {  // no growth possible: one pass
      for (size_t j = 0; j < n; ++j) register_one(ahead.next(j), births, unregistered);
    } else {
      for (size_t j = 0; j < n; ++j) {
        const uint64_t h = ahead.next(j).hash;
        if (main_.slots()[main_.seek(h)].hash == h)
          register_one(items[j], births, unregistered);
        else
          absent_.push_back(uint32_t(j));
      }
    }
    if (!absent_.empty()) {
      main_.reserve(main_.size() + absent_.size());
      for (uint32_t j : absent_) register_one(items[j], births, unregistered);
    }
    collect_marked(keys, n, done);
    shrink_all();
    trim_scratch();
  }

  // XORs events into their keys (combined per key: the outcome is decided by each key's value
  // after the whole call). Registered ids at 0 after the call are appended to `done` (in order of
  // their last occurrence in the input) and removed; unregistered entries back at 0 are dropped
  // silently.
  //
  // One pass in table order (BatchOrder; a key's events keep their input order), one probe per
  // event: an event that brings a registered id to 0 erases it at once (the line is in cache; a
  // second visit later would miss again) and marks the completion at its input position. Should
  // a later event of the same call name that key again (rare: events are pre-reduced per source
  // id by their senders), it finds the key absent, looks it up among this call's completions (an
  // index built only then) and cancels the earlier completion: a nonzero event brings the key
  // back as registered, a 0 event completes it again here. The same end state as combining
  // first, and a key's completion always sits at its last occurrence.
  void xor_batch(const uint64_t* keys, const uint64_t* vals, size_t n,
                 std::vector<uint64_t>& done) {
    done.clear();
    if (n == 0) return;
    bool indexed = false;  // completed_ holds every completion of this call so far
    size_t completions = 0;
    start_batch(keys, n);
    Ahead<Table> ahead(main_, thread_batch_order().items(), n, vals);
    for (size_t j = 0; j < n; ++j) {
      const auto& item = ahead.next(j);
      const uint64_t h = item.hash;
      const size_t i = item.pos;
      const uint64_t x = vals[i];
      const size_t s = main_.seek(h);
      auto* slots = main_.slots();
      if (slots[s].hash == h) {
        const uint64_t v = slots[s].value ^ x;
        if (v != 0) {
          slots[s].value = v;
          continue;
        }
        main_.erase_at(s);
        mark(i);
        ++completions;
        if (indexed) completed_.assign(keys[i], uint32_t(i));
        continue;
      }
      if (completions) {  // completed earlier in this call?
        if (!indexed) index_completions(keys, n);
        indexed = true;
        const int64_t pos = completed_.find(keys[i]);
        if (pos >= 0 && marked(size_t(pos))) {
          unmark(size_t(pos));  // its completion moves here, or is undone
          if (x == 0) {         // still at 0: completes at this, its later occurrence
            mark(i);
            completed_.assign(keys[i], uint32_t(i));
          } else {  // back from 0: registered again, not complete
            main_.insert_at(s, h, x);  // s is still where h belongs
          }
          continue;
        }
      }
      early_batch_.push_back({h, x});  // applied after the loop, with room made first
    }
    if (!early_batch_.empty()) {
      // (hash order, like the batch: inserting them into a table sized for them keeps runs
      // short; a table grown part way through would pack them into one long run)
      // Combined per key first (a key's events that cancel change nothing, as the call's
      // contract says: an aged entry is not dropped and re-made young by them).
      std::sort(early_batch_.begin(), early_batch_.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      size_t m = 0;
      for (size_t k = 0; k < early_batch_.size(); ++k) {
        if (m && early_batch_[m - 1].first == early_batch_[k].first)
          early_batch_[m - 1].second ^= early_batch_[k].second;
        else
          early_batch_[m++] = early_batch_[k];
      }
      early_batch_.resize(m);
      early_.reserve(early_.size() + m);
      for (const auto& [h, x] : early_batch_)
        if (x != 0) xor_unregistered(h, x);
      early_batch_.clear();
    }
    collect_marked(keys, n, done);
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
    const uint64_t h = main_.hash_of(k);
    return main_.find_hash(h) != Table::npos || find_unregistered(h, &e) != nullptr;
  }
  // The value of k into *v; false when absent.
  bool get(uint64_t k, uint64_t* v) const {
    const uint64_t h = main_.hash_of(k);
    size_t s = main_.find_hash(h);
    if (s != Table::npos) {
      *v = main_.slots()[s].value;
      return true;
    }
    const Table* et = find_unregistered(h, &s);
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
      const uint64_t h = t.hash_of(keys[i]);
      t.insert_at(t.seek(h), h, vals[i]);
    }
  }

  // The rare-path counters of the three tables, summed (for the tests).
  Table::Counters counters() const {
    Table::Counters c;
    for (const Table* t : {&main_, &early_, &old_}) {
      c.grows += t->counters().grows;
      c.shrinks += t->counters().shrinks;
      c.tail_grows += t->counters().tail_grows;
      c.long_runs += t->counters().long_runs;
    }
    return c;
  }

  // Memory held: the slot arrays plus the per-batch scratch kept between calls (not the
  // thread's BatchOrder: see thread_batch_order).
  size_t nbytes() const {
    return main_.nbytes() + early_.nbytes() + old_.nbytes() + completed_.nbytes() +
           marks_.capacity() * sizeof(uint64_t);
  }

 private:
  // Orders the batch and clears the completion marks.
  // One key's birth (see register_batch): XORed into its entry, or joined with its early
  // events, or inserted.
  template <class Item>
  void register_one(const Item& item, const uint64_t* births, bool unregistered) {
    const uint64_t h = item.hash;
    const size_t i = item.pos;
    uint64_t v = births[i];
    const size_t s = main_.seek(h);  // the key's slot, or where it belongs
    auto* slots = main_.slots();
    if (slots[s].hash == h) {  // already registered: XOR the birth in again
      v ^= slots[s].value;
      if (v == 0) {
        main_.erase_at(s);
        mark(i);
      } else {
        slots[s].value = v;
      }
      return;
    }
    if (unregistered) {
      size_t e;
      Table* et = find_unregistered(h, &e);
      if (et) {  // events came first: the birth joins them
        v ^= et->slots()[e].value;
        et->erase_at(e);
        if (v == 0) {
          mark(i);
          return;
        }
      }
    }
    main_.insert_at(s, h, v);  // may grow the table
  }

  void start_batch(const uint64_t* keys, size_t n) {
    thread_batch_order().sort(main_, keys, n);
    marks_.assign((n + 63) / 64, 0);
  }
  void mark(size_t i) { marks_[i / 64] |= uint64_t(1) << (i % 64); }
  void unmark(size_t i) { marks_[i / 64] &= ~(uint64_t(1) << (i % 64)); }
  bool marked(size_t i) const { return marks_[i / 64] >> (i % 64) & 1; }

  // done = the marked keys, in input order.
  void collect_marked(const uint64_t* keys, size_t n, std::vector<uint64_t>& done) const {
    for (size_t w = 0; w < (n + 63) / 64; ++w)
      for (uint64_t m = marks_[w]; m; m &= m - 1) done.push_back(keys[w * 64 + size_t(__builtin_ctzll(m))]);
  }

  // completed_ = key -> input position, for the marked (completed) keys of this call.
  void index_completions(const uint64_t* keys, size_t n) {
    completed_.reset(n);
    for (size_t w = 0; w < (n + 63) / 64; ++w)
      for (uint64_t m = marks_[w]; m; m &= m - 1) {
        const size_t i = w * 64 + size_t(__builtin_ctzll(m));
        completed_.assign(keys[i], uint32_t(i));
      }
  }

  // An event for a key (hash h) without a registered entry: XORed into its unregistered entry
  // (dropped at 0), or a new early entry.
  void xor_unregistered(uint64_t h, uint64_t x) {
    size_t e;
    Table* et = find_unregistered(h, &e);
    if (et) {
      const uint64_t v = et->slots()[e].value ^ x;
      if (v == 0)
        et->erase_at(e);
      else
        et->slots()[e].value = v;
    } else if (x != 0) {
      early_.insert_at(early_.seek(h), h, x);
    }
  }

  // Per-batch scratch is kept between calls (no reallocation per batch) unless it is larger than
  // both a typical batch and the table itself: an emptied table then gives its memory back.
  void trim_scratch() {
    const size_t keep = std::max<size_t>(size_t(1) << 16, size());
    completed_.trim(keep);
    thread_batch_order().trim(size_t(1) << 16);
    if (marks_.capacity() * 64 > keep) std::vector<uint64_t>().swap(marks_);
    if (early_batch_.capacity() > keep) decltype(early_batch_)().swap(early_batch_);
    if (absent_.capacity() > keep) std::vector<uint32_t>().swap(absent_);
  }

  std::vector<std::pair<uint64_t, uint64_t>> early_batch_;  // a batch's events of unknown ids
  std::vector<uint32_t> absent_;  // a register batch's keys not registered yet (batch order)

  bool any_unregistered() const { return early_.size() != 0 || old_.size() != 0; }

  // The unregistered table holding hash h and its slot (*slot), or nullptr.
  Table* find_unregistered(uint64_t h, size_t* slot) {
    return const_cast<Table*>(std::as_const(*this).find_unregistered(h, slot));
  }
  const Table* find_unregistered(uint64_t h, size_t* slot) const {
    if (early_.size() && (*slot = early_.find_hash(h)) != Table::npos) return &early_;
    if (old_.size() && (*slot = old_.find_hash(h)) != Table::npos) return &old_;
    return nullptr;
  }

  void shrink_all() {
    main_.maybe_shrink();
    early_.maybe_shrink();
    old_.maybe_shrink();
  }

  static void collect(const Table& t, uint8_t registered, std::vector<uint64_t>& k,
                      std::vector<uint64_t>& v, std::vector<uint8_t>& r) {
    t.for_each([&](uint64_t h, uint64_t value) {
      k.push_back(t.key_of(h));
      v.push_back(value);
      r.push_back(registered);
    });
  }

  // The registered ids' loads: with the wheel's (TimeoutWheel::kLoads) an entry costs at most
  // 16 / 0.80 + 10 / 0.84 = 31.9 bytes right after a resize, less until the next one (the
  // memory target: <= 32 per pending id). Against 0.75 after a resize, churn (1 M pending, 64 K
  // batches, C++ harness, interleaved runs on the loaded machine) lost ~7 %, which the
  // one-loop shifts had just gained.
  static constexpr Table::Loads kLoads{0.87, 0.80};
  Table main_{kLoads}, early_, old_;  // all with the process seed: a key has one hash in the three
  std::vector<uint64_t> marks_;   // bit i: the pair / event at input position i completed
  BatchIndex completed_;  // this call's completions, indexed only when a key recurs
};

}  // namespace xorack
