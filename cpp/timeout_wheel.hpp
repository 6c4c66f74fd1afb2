// timeout_wheel.hpp — the rotating timeout buckets (Storm's RotatingMap, the seed's
// RotatingHashMap): rotate() returns the ids whose timeout ran out.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "flat_table.hpp"

namespace xorack {

// Ids in arrival order, in chunks (no copy as it grows, at most a quarter of it unused).
class IdQueue {
 public:
  static constexpr size_t kMinChunk = size_t(1) << 12, kMaxChunk = size_t(1) << 16;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void append(const uint64_t* ids, size_t n) {
    while (n) {
      if (chunks_.empty() || chunks_.back().size == chunks_.back().cap) {
        const size_t cap = chunk_size(held_);
        chunks_.push_back(Chunk{std::unique_ptr<uint64_t[]>(new uint64_t[cap]), 0, cap});
        held_ += cap;
      }
      Chunk& c = chunks_.back();
      const size_t m = std::min(n, c.cap - c.size);
      std::memcpy(c.ids.get() + c.size, ids, m * sizeof(uint64_t));
      c.size += m;
      size_ += m;
      ids += m;
      n -= m;
    }
  }
  // Bytes held once n more ids are appended.
  size_t nbytes_after(size_t n) const {
    size_t held = held_, room = held_ - size_, chunks = chunks_.size();
    while (room < n) {
      const size_t cap = chunk_size(held);
      held += cap;
      room += cap;
      ++chunks;
    }
    return held * sizeof(uint64_t) + std::max(chunks, chunks_.capacity()) * sizeof(Chunk);
  }
  size_t nbytes() const { return nbytes_after(0); }
  // Calls f(ids, n) for each chunk, in arrival order.
  template <class F>
  void for_each_chunk(F f) const {
    for (const Chunk& c : chunks_) f(c.ids.get(), c.size);
  }
  void clear() {
    std::vector<Chunk>().swap(chunks_);
    size_ = held_ = 0;
  }

 private:
  struct Chunk {
    std::unique_ptr<uint64_t[]> ids;
    size_t size, cap;
  };
  static size_t chunk_size(size_t held) { return std::clamp(held / 4, kMinChunk, kMaxChunk); }
  std::vector<Chunk> chunks_;
  size_t size_ = 0, held_ = 0;
};

// An array of hashes that is never zero-filled (new[] without initializer): every slot used is
// written before it is read.
class HashBuffer {
 public:
  HashBuffer() = default;
  HashBuffer(HashBuffer&& o) noexcept : p_(std::move(o.p_)), cap_(std::exchange(o.cap_, 0)) {}
  HashBuffer& operator=(HashBuffer&& o) noexcept {
    p_ = std::move(o.p_);
    cap_ = std::exchange(o.cap_, 0);
    return *this;
  }
  // Room for n hashes (the content is lost when it grows).
  uint64_t* reserve(size_t n) {
    if (n > cap_) {
      p_.reset();
      p_.reset(new uint64_t[n]);
      cap_ = n;
    }
    return p_.get();
  }
  uint64_t* data() const { return p_.get(); }
  size_t capacity() const { return cap_; }

 private:
  std::unique_ptr<uint64_t[]> p_;
  size_t cap_ = 0;
};

// Id → the rotation at which it expires (its deadline), in one FlatTable of packed 10-byte slots,
// plus the ids added in bulk during the last rotations, kept as sorted arrays ("runs").
// An id added or touched while the counter is r gets deadline r + num_buckets. rotate() advances
// the counter and expires the ids whose deadline it reached.
// In the table, the "buckets" are implicit in the deadlines: every lookup is one probe (never one
// per bucket), and rotate() streams the slot array once (FlatTable::erase_if). Per-bucket id
// lists next to the table were measured and rejected: 8 more bytes per id (the memory target is
// 32 for table + wheel) and one random probe + backward shift per expired id. (The runs below
// hold their ids instead of the table, not besides it.)
// Deadlines are stored modulo 2**16: every live deadline lies in (r, r + num_buckets], so with
// num_buckets < 2**15 the 16 low bits identify it (2 bytes instead of 4 or 8 per id).
//
// The bulk path (add + rotate, the wheel's own steady state). Once the wheel has outgrown the
// cache, add() only appends the ids to a queue (all of them share one deadline), as long as the
// wheel stays within what the table alone costs per id right after a resize (see may_queue).
// rotate() sorts the queue by hash into a run (8 bytes per id, deadline implicit) and expires
// the run whose deadline came: its ids minus those in a newer run (re-added since), found by a
// merge-join of sorted arrays. A run never enters the table in this steady state, so neither
// adding nor expiring an id touches a random cache line (the table's random probes are what the
// random-read rate caps: add + rotate, 1 M ids at the peak, 333 K per rotation, went from ~20 to
// 42-54 M ids/s in `python -m xorack._churn` on the loaded 2-core machine, and from 11.9 to 8
// bytes per id; what is left is mostly the sort, then the merge-join).
// Runs are newer than every table entry: an entry due in the table whose id is in a run is not
// expired (the run has it, with a later or equal deadline). Every other call (touch, discard,
// len, contains) first moves the runs, oldest first, and the queue into the table (flush: one
// sequential merge pass each, FlatTable::merge_sorted, or id by id for a small queue), so it
// sees exactly what eager insertion would have left. With num_buckets 1 the queued ids would be
// due at the next rotate, which flushes them first. The count of table entries per deadline
// (due_) only sizes the merged table: a wrong count would cost a resize, never a wrong expiry.
class TimeoutWheel {
  // A former queue: its distinct hashes, ascending, then kEmpty. Runs (runs_, oldest first) are
  // strictly newer than every table entry: a table entry whose id is in a run is superseded.
  struct Run {
    uint16_t deadline = 0;
    size_t size = 0;
    HashBuffer hashes;
  };

 public:
  using Table = FlatTable<uint16_t>;
  static constexpr uint32_t kMaxBuckets = (uint32_t(1) << 15) - 1;

  explicit TimeoutWheel(uint32_t num_buckets) : nb_(num_buckets) {
    if (num_buckets == 0 || num_buckets > kMaxBuckets)
      throw std::invalid_argument("num_buckets must be in [1, 2**15)");
    size_t p = 1;
    while (p < num_buckets) p <<= 1;
    due_.assign(p, 0);
    due_mask_ = uint16_t(p - 1);
  }

  // Starts (or restarts) the timeout of every id.
  void add(const uint64_t* ids, size_t n) {
    if (n == 0) return;
    if (may_queue(n)) {
      queue_.append(ids, n);
      ++queued_;
      return;
    }
    flush();
    insert(ids, n, deadline());
  }

  // Restarts the timeout of the ids present; absent ids are ignored.
  void touch(const uint64_t* ids, size_t n) {
    flush();
    const uint16_t d = deadline();
    thread_batch_order().sort(table_, ids, n);
    Ahead<Table> ahead(table_, thread_batch_order().items(), n);
    auto* slots = table_.slots();
    for (size_t i = 0; i < n; ++i) {
      const uint64_t h = ahead.next(i).hash;
      const size_t s = table_.seek(h);
      if (slots[s].hash == h) restart(slots[s].value, d);
    }
    trim_scratch();
  }

  // Forgets the ids (they never expire); absent ids are ignored.
  void discard(const uint64_t* ids, size_t n) {
    flush();
    thread_batch_order().sort(table_, ids, n);
    Ahead<Table> ahead(table_, thread_batch_order().items(), n);  // erasing never resizes
    auto* slots = table_.slots();
    for (size_t i = 0; i < n; ++i) {
      const uint64_t h = ahead.next(i).hash;
      const size_t s = table_.seek(h);
      if (slots[s].hash == h) {
        --due_[slots[s].value & due_mask_];
        table_.erase_at(s);
      }
    }
    table_.maybe_shrink();
    trim_scratch();
  }

  // Advances one rotation; writes the ids whose deadline it reached to `expired` (room for
  // max_expiring() + 1 ids; in no particular order), forgets them and returns how many.
  size_t rotate(uint64_t* expired) {
    const uint16_t r = uint16_t(rotation_ + 1);
    if (nb_ == 1) flush();  // a queued id would be due at once
    // Runs (after this rotation) and a due run make the table's due ids need a check first.
    const bool check = !runs_.empty() || !queue_.empty();
    size_t n = 0, m = 0;  // the table's due ids (at expired), the due run's (at due_ids)
    if (table_.size())
      n = table_.erase_if([r](uint16_t deadline) { return deadline == r; }, expired, !check);
    if (!check) {
      finish_rotation(r);
      return n;
    }
    uint64_t* const due_ids = expired + n;
    HashBuffer spare;  // the due run's array, for the new run (no fresh pages to fault in)
    if (!runs_.empty() && runs_.front().deadline == r) {
      Run& due = runs_.front();
      m = due.size;
      std::copy(due.hashes.data(), due.hashes.data() + m, due_ids);
      spare = std::move(due.hashes);
      runs_size_ -= m;
      runs_.erase(runs_.begin());
    }
    due_ids[m] = Table::kEmpty;  // the end mark drop_in reads (room: max_expiring() + 1)
    if (!queue_.empty()) make_run(std::move(spare));
    // A table id in a run is superseded (the due run expires it, or a newer run has it); a due
    // run's id in a newer run was added again since.
    const size_t a = drop_in_runs(expired, drop_in(expired, n, due_ids, m), 0);
    const size_t b = drop_in_runs(due_ids, m, 0);
    std::memmove(expired + a, due_ids, b * sizeof(uint64_t));
    finish_rotation(r);
    return to_keys(expired, a + b);
  }
  void rotate(std::vector<uint64_t>& expired) {
    expired.resize(max_expiring() + 1);  // the sweep writes one slot past the last id it keeps
    expired.resize(rotate(expired.data()));
  }
  // At most how many ids the next rotate() expires (the table's, the runs' and the queue's,
  // repeats included).
  size_t max_expiring() const { return table_.size() + runs_size_ + queue_.size(); }

  // The next four move the runs and the queue into the table first (a queued id may repeat
  // one present).
  size_t size() {
    flush();
    return table_.size();
  }
  size_t capacity() {
    flush();
    return table_.capacity();
  }
  bool contains(uint64_t id) {
    flush();
    return table_.find(id) != Table::npos;
  }
  const Table::Counters& counters() {
    flush();
    return table_.counters();
  }
  uint32_t rotation() const { return rotation_; }
  // How many add() calls queued their ids, and how many queues became runs (for the tests).
  uint64_t queued() const { return queued_; }
  uint64_t made_runs() const { return made_runs_; }
  // Memory held: the slot array, the queue, the runs and the deadline counts (the batch scratch
  // is the thread's: see thread_batch_order).
  size_t nbytes() const { return table_.nbytes() + queue_.nbytes() + held_bytes(); }

 private:
  uint16_t deadline() const { return uint16_t(rotation_ + nb_); }

  // Sets a present entry's deadline, keeping the counts per deadline.
  void restart(uint16_t& value, uint16_t d) {
    --due_[value & due_mask_];
    value = d;
    ++due_[d & due_mask_];
  }

  // Bytes held besides the table and the queue: the runs and the counts per deadline.
  size_t held_bytes() const {
    size_t b = due_.capacity() * sizeof(uint32_t) + runs_.capacity() * sizeof(Run);
    for (const Run& run : runs_) b += run.hashes.capacity() * sizeof(uint64_t);
    return b;
  }

  // Whether n more ids may wait in the queue. Only once the wheel has outgrown the cache (a
  // smaller table takes ids one by one about as fast); never more ids than the table and the
  // runs hold (so that a queue of repeats of present ids costs at most 8 bytes per present id
  // until the next rotation or flush); and only while the wheel keeps within what the table
  // alone costs per id right after a resize (sizeof(Slot) / target load, 11.9 bytes), the
  // queue's 8 bytes per id and its last chunk's unused room included (queued repeats counted
  // as held ids).
  bool may_queue(size_t n) const {
    const size_t placed = table_.size() + runs_size_;
    if (placed < kQueueMinHeld || queue_.size() + n > placed) return false;
    const double held = double(placed + queue_.size() + n);
    const double bytes = double(table_.nbytes() + queue_.nbytes_after(n) + held_bytes());
    return bytes <= held * (double(sizeof(Table::Slot)) / kLoads.target);
  }
  static constexpr size_t kQueueMinHeld = size_t(1) << 16;  // ids: 780 KB at 11.9 B/id

  // Moves the runs (oldest first: a newer deadline replaces an older one) and the queued ids
  // into the table: the queued ids one by one when they are few next to the table (each
  // insertion is a random probe, but a merge passes every slot), else by a merge.
  void flush() {
    while (!runs_.empty()) {
      Run& run = runs_.front();
      place_run(run);
      runs_size_ -= run.size;
      runs_.erase(runs_.begin());
    }
    if (queue_.empty()) return;
    if (queue_.size() * 8 < table_.capacity()) {
      queue_.for_each_chunk([&](const uint64_t* ids, size_t n) { insert(ids, n, deadline()); });
    } else {
      HashBuffer sorted;
      const size_t m = sort_queue(sorted.reserve(queue_.size() + 1));
      merge(sorted.data(), m, deadline());
    }
    queue_.clear();
  }

  // Moves a run into the table: id by id when it is small next to the table, else by a merge.
  void place_run(Run& run) {
    if (run.size * 8 < table_.capacity())
      insert(run.hashes.data(), to_keys(run.hashes.data(), run.size), run.deadline);
    else
      merge(run.hashes.data(), run.size, run.deadline);
  }

  // Merges m distinct hashes in ascending order (then kEmpty) into the table with deadline d.
  void merge(const uint64_t* sorted, size_t m, uint16_t d) {
    // Counts per deadline, from the pass that is kept: a replaced entry leaves its deadline.
    std::vector<uint32_t> left(due_.size(), 0);
    auto replaced = [&](uint16_t v) { ++left[v & due_mask_]; };
    auto restart = [&] { std::fill(left.begin(), left.end(), 0); };
    table_.merge_sorted(
        sorted, m, d, [](uint16_t) { return false; }, replaced, restart, nullptr,
        table_.size() + m);
    for (size_t i = 0; i < due_.size(); ++i) due_[i] -= left[i];
    due_[d & due_mask_] += uint32_t(m);
  }

  void finish_rotation(uint16_t r) {
    ++rotation_;
    due_[r & due_mask_] = 0;
    table_.maybe_shrink();
  }

  // Turns the queue into a run (its distinct hashes, sorted, with its deadline), in `buffer`
  // when it has room. At most kMaxRuns runs wait: past that the oldest joins the table (which
  // every run supersedes).
  void make_run(HashBuffer buffer) {
    if (runs_.size() >= kMaxRuns) {
      Run& run = runs_.front();
      place_run(run);
      runs_size_ -= run.size;
      runs_.erase(runs_.begin());
    }
    ++made_runs_;
    Run run;
    run.deadline = deadline();
    if (buffer.capacity() <= 2 * (queue_.size() + 1))  // else it would hold far more than used
      run.hashes = std::move(buffer);
    run.size = sort_queue(run.hashes.reserve(queue_.size() + 1));
    runs_size_ += run.size;
    runs_.push_back(std::move(run));
    queue_.clear();
  }

  // Drops from the n ascending hashes at h those present in runs_[first..]; returns how many
  // remain (in place, in order).
  size_t drop_in_runs(uint64_t* h, size_t n, size_t first) const {
    for (size_t k = first; k < runs_.size() && n; ++k)
      n = drop_in(h, n, runs_[k].hashes.data(), runs_[k].size);
    return n;
  }

  // Drops from the n ascending hashes at h those among the m ascending hashes at y (followed by
  // kEmpty, above every hash); returns how many remain (in place, in order). A branch-free
  // merge-join, in kWays hash ranges stepped together: one join is a chain of dependent loads
  // (the next step's addresses come from this step's comparison), several hide each other's
  // latency.
  static size_t drop_in(uint64_t* h, size_t n, const uint64_t* y, size_t m) {
    constexpr size_t kWays = 4;
    size_t hi[kWays + 1], yi[kWays + 1];
    for (size_t j = 0; j <= kWays; ++j) {  // range j: hashes in [j, j + 1) * 2**64 / kWays
      const uint64_t bound = j == kWays ? ~uint64_t(0) : uint64_t(j) << 62;
      hi[j] = j == kWays ? n : size_t(std::lower_bound(h, h + n, bound) - h);
      yi[j] = j == kWays ? m : size_t(std::lower_bound(y, y + m, bound) - y);
    }
    // Each range's y ends with the first hash of the next range (or kEmpty): above its h.
    size_t i[kWays], w[kWays], t[kWays];
    for (size_t j = 0; j < kWays; ++j) i[j] = w[j] = hi[j], t[j] = yi[j];
    auto step = [&](size_t j) {
      const uint64_t x = h[i[j]], v = y[t[j]];
      const size_t lt = x < v, gt = x > v;
      h[w[j]] = x;
      w[j] += lt;
      i[j] += lt | (gt ^ 1);
      t[j] += (gt | (lt ^ 1)) & size_t(t[j] != yi[j + 1]);
    };
    for (;;) {  // all ranges together while each has hashes left
      bool all = true;
      for (size_t j = 0; j < kWays; ++j) all &= i[j] < hi[j + 1];
      if (!all) break;
      for (size_t j = 0; j < kWays; ++j) step(j);
    }
    size_t out = 0;
    for (size_t j = 0; j < kWays; ++j) {
      while (i[j] < hi[j + 1]) step(j);
      std::memmove(h + out, h + hi[j], (w[j] - hi[j]) * sizeof(uint64_t));
      out += w[j] - hi[j];
    }
    return out;
  }

  // Turns the n hashes at h into keys; returns n.
  size_t to_keys(uint64_t* h, size_t n) const {
    for (size_t i = 0; i < n; ++i) h[i] = table_.key_of(h[i]);
    return n;
  }

  // Writes the queue's distinct hashes in ascending order to out (room for queue_.size() + 1),
  // then kEmpty; returns
  // how many. A counting sort by the top 8 bits (a scatter into 256 streams), then within each
  // bucket (which the cache holds) a counting sort by enough further bits for about one hash per
  // bucket (one scatter into 2**19 buckets costs more than both), then an insertion sort, which
  // has next to nothing left to do, and a pass that drops repeats.
  size_t sort_queue(uint64_t* const out) const {
    const size_t n = queue_.size();
    int bits2 = 0;
    while (bits2 < 12 && (size_t(256) << bits2) < n) ++bits2;
    uint32_t counts[257] = {0}, ends[256];
    queue_.for_each_chunk([&](const uint64_t* ids, size_t c) {
      for (size_t i = 0; i < c; ++i) ++counts[(table_.hash_of(ids[i]) >> 56) + 1];
    });
    for (size_t b = 1; b < 257; ++b) counts[b] += counts[b - 1];
    std::copy(counts, counts + 256, ends);
    queue_.for_each_chunk([&](const uint64_t* ids, size_t c) {
      for (size_t i = 0; i < c; ++i) {
        const uint64_t h = table_.hash_of(ids[i]);  // hashing again is cheaper than storing
        out[ends[h >> 56]++] = h;
      }
    });
    std::vector<uint64_t> bucket;
    std::vector<uint32_t> sub((size_t(1) << bits2) + 1);
    const int shift2 = 56 - bits2;
    const uint64_t mask2 = (uint64_t(1) << bits2) - 1;
    for (size_t b = 0; b < 256; ++b) {
      const size_t lo = counts[b], hi = ends[b];
      bucket.assign(out + lo, out + hi);
      std::fill(sub.begin(), sub.end(), 0);
      for (uint64_t h : bucket) ++sub[((h >> shift2) & mask2) + 1];
      for (size_t j = 1; j < sub.size(); ++j) sub[j] += sub[j - 1];
      for (uint64_t h : bucket) out[lo + sub[(h >> shift2) & mask2]++] = h;
    }
    for (size_t i = 1; i < n; ++i) {
      const uint64_t x = out[i];
      size_t j = i;
      for (; j > 0 && out[j - 1] > x; --j) out[j] = out[j - 1];
      out[j] = x;
    }
    size_t m = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
      out[m] = out[i];
      m += out[i] != out[m - 1];
    }
    out[m] = Table::kEmpty;  // the end mark merge_sorted reads
    return m;
  }

  // Starts (or restarts) the timeout of every id, id by id.
  void insert(const uint64_t* ids, size_t n, uint16_t d) {
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
      if (table_.slots()[s].hash == h) {
        restart(table_.slots()[s].value, d);
      } else if (may_grow) {
        absent_.push_back(uint32_t(i));
      } else {
        table_.insert_at(s, h, d);
        ++due_[d & due_mask_];
      }
    }
    if (!absent_.empty()) {
      table_.reserve(table_.size() + absent_.size());
      for (uint32_t i : absent_) {
        const uint64_t h = items[i].hash;
        const size_t s = table_.seek(h);
        if (table_.slots()[s].hash == h) {
          restart(table_.slots()[s].value, d);  // a repeat within the batch
        } else {
          table_.insert_at(s, h, d);
          ++due_[d & due_mask_];
        }
      }
    }
    trim_scratch();
  }

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
  // Ids added since the last rotation, all with deadline rotation_ + nb_.
  IdQueue queue_;
  static constexpr size_t kMaxRuns = 4;
  std::vector<Run> runs_;
  size_t runs_size_ = 0;  // ids in the runs (repeats across runs included)
  uint64_t queued_ = 0, made_runs_ = 0;
  std::vector<uint32_t> due_;     // table entries per deadline (index: deadline & due_mask_)
  uint16_t due_mask_ = 0;
  std::vector<uint32_t> absent_;  // an add batch's ids not present yet (batch order)
  uint32_t nb_;
  uint32_t rotation_ = 0;
};

}  // namespace xorack
