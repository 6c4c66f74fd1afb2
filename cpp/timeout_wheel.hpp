// timeout_wheel.hpp — the rotating timeout buckets (Storm's RotatingMap, the seed's
// RotatingHashMap): rotate() returns the ids whose timeout ran out.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "flat_table.hpp"

namespace xorack {

// Id → the rotation at which it expires (its deadline), in one FlatTable of packed 10-byte slots.
// An id added or touched while the counter is r gets deadline r + num_buckets. rotate() advances
// the counter, streams the slot array once and expires the ids whose deadline it reached.
// The "buckets" are implicit in the deadlines: every lookup is one probe (never one per bucket).
// Per-bucket id lists were measured and rejected: they cost 8 more bytes per id (the memory target
// is 32 for table + wheel) and expiring through them is one random probe + backward shift per id,
// slower than the branch-free sequential sweep (FlatTable::erase_if) over the whole table.
// Deadlines are stored modulo 2**16: every live deadline lies in (r, r + num_buckets], so with
// num_buckets < 2**15 the 16 low bits identify it (2 bytes instead of 4 or 8 per id).
class TimeoutWheel {
 public:
  using Table = FlatTable<uint16_t>;
  static constexpr uint32_t kMaxBuckets = (uint32_t(1) << 15) - 1;

  explicit TimeoutWheel(uint32_t num_buckets) : nb_(num_buckets) {
    if (num_buckets == 0 || num_buckets > kMaxBuckets)
      throw std::invalid_argument("num_buckets must be in [1, 2**15)");
  }

  // Starts (or restarts) the timeout of every id.
  void add(const uint64_t* ids, size_t n) {
    const uint16_t d = uint16_t(rotation_ + nb_);
    thread_batch_order().sort(table_, ids, n);
    const auto* items = thread_batch_order().items();
    // As AckTable::register_batch: when the batch could make the table grow, restart the ids
    // present, then make room for the others at once and insert them (a table grown step by
    // step inside a hash-ordered batch crowds its first hashes into one long run).
    absent_.clear();
    Ahead<Table> ahead(table_, items, n);
    const bool may_grow = table_.may_grow(n);  // else one pass: inserts never resize
    for (size_t i = 0; i < n; ++i) {
      const uint64_t h = ahead.next(i).hash;
      const size_t s = table_.seek(h);
      if (table_.slots()[s].hash == h)
        table_.slots()[s].value = d;
      else if (may_grow)
        absent_.push_back(uint32_t(i));
      else
        table_.insert_at(s, h, d);
    }
    if (!absent_.empty()) {
      table_.reserve(table_.size() + absent_.size());
      for (uint32_t i : absent_) {
        const uint64_t h = items[i].hash;
        const size_t s = table_.seek(h);
        if (table_.slots()[s].hash == h)
          table_.slots()[s].value = d;  // a repeat within the batch
        else
          table_.insert_at(s, h, d);
      }
    }
    trim_scratch();
  }

  // Restarts the timeout of the ids present; absent ids are ignored.
  void touch(const uint64_t* ids, size_t n) {
    const uint16_t d = uint16_t(rotation_ + nb_);
    thread_batch_order().sort(table_, ids, n);
    Ahead<Table> ahead(table_, thread_batch_order().items(), n);
    auto* slots = table_.slots();
    for (size_t i = 0; i < n; ++i) {
      const uint64_t h = ahead.next(i).hash;
      const size_t s = table_.seek(h);
      if (slots[s].hash == h) slots[s].value = d;
    }
    trim_scratch();
  }

  // Forgets the ids (they never expire); absent ids are ignored.
  void discard(const uint64_t* ids, size_t n) {
    thread_batch_order().sort(table_, ids, n);
    Ahead<Table> ahead(table_, thread_batch_order().items(), n);  // erasing never resizes
    auto* slots = table_.slots();
    for (size_t i = 0; i < n; ++i) {
      const uint64_t h = ahead.next(i).hash;
      const size_t s = table_.seek(h);
      if (slots[s].hash == h) table_.erase_at(s);
    }
    table_.maybe_shrink();
    trim_scratch();
  }

  // Advances one rotation; writes the ids whose deadline it reached to `expired` (room for
  // size() + 1 ids; in no particular order), forgets them and returns how many.
  size_t rotate(uint64_t* expired) {
    ++rotation_;
    const uint16_t r = uint16_t(rotation_);
    size_t n = table_.erase_if([r](uint16_t deadline) { return deadline == r; }, expired);
    table_.maybe_shrink();
    return n;
  }
  void rotate(std::vector<uint64_t>& expired) {
    expired.resize(table_.size() + 1);  // the sweep writes one slot past the last id it keeps
    expired.resize(rotate(expired.data()));
  }

  size_t size() const { return table_.size(); }
  size_t capacity() const { return table_.capacity(); }
  bool contains(uint64_t id) const { return table_.find(id) != Table::npos; }
  uint32_t rotation() const { return rotation_; }
  const Table::Counters& counters() const { return table_.counters(); }
  // Memory held: the slot array (the batch scratch is the thread's: see thread_batch_order).
  size_t nbytes() const { return table_.nbytes(); }

 private:
  // Frees the thread's batch scratch after a batch of more than 64 K ids.
  void trim_scratch() {
    thread_batch_order().trim(size_t(1) << 16);
    if (absent_.capacity() > std::max<size_t>(size_t(1) << 16, table_.size()))
      std::vector<uint32_t>().swap(absent_);
  }

  // Loads (see AckTable::kLoads for the memory target they meet together): at most 10 / 0.84 =
  // 11.9 bytes per id right after a resize. Add + rotate (1 M ids at the peak) lost ~10 %
  // against 0.87 / 0.75.
  static constexpr Table::Loads kLoads{0.90, 0.84};
  Table table_{kLoads};
  std::vector<uint32_t> absent_;  // an add batch's ids not present yet (batch order)
  uint32_t nb_;
  uint32_t rotation_ = 0;
};

}  // namespace xorack
