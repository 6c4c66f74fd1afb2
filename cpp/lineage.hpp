// lineage.hpp — record ids and anchoring: random ids (fork-safe), deterministic derived ids,
// per-source XOR reductions, output → parent lookup, and the anchor kernel of a stage batch.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flat_table.hpp"

#if defined(__unix__)
#include <pthread.h>
#include <unistd.h>
#endif

namespace xorack {

// ---------------------------------------------------------------------------------------------
// new_ids
// ---------------------------------------------------------------------------------------------

// Random ids: a SplitMix64 stream. Each call reserves a range of the counter with one atomic
// add (threads never share ids), and outputs mix64(counter): mix64 is a bijection, so ids of one
// process never repeat before 2**64 draws. The counter starts at a random point, re-drawn in
// every forked child (pthread_atfork + a pid check): Spark forks its Python workers from one
// daemon, and two children must not continue the same stream.
class IdStream {
 public:
  static IdStream& instance() {
    static IdStream s;
    return s;
  }

  // Fills out[0..n) with random nonzero ids.
  void fill(uint64_t* out, size_t n) {
#if defined(__unix__)
    if (pid_.load(std::memory_order_relaxed) != int64_t(getpid())) reseed();
#endif
    constexpr uint64_t kStep = 0x9E3779B97F4A7C15ULL;
    uint64_t base = counter_.fetch_add(uint64_t(n) * kStep, std::memory_order_relaxed);
    for (size_t i = 0; i < n; ++i) {
      uint64_t z = mix64(base + uint64_t(i + 1) * kStep);
      out[i] = z ? z : kStep;  // mix64 hits 0 for one counter value in 2**64
    }
  }

  void reseed() {
    std::random_device rd;
    uint64_t s = (uint64_t(rd()) << 32) ^ rd();
    s ^= uint64_t(std::chrono::high_resolution_clock::now().time_since_epoch().count());
#if defined(__unix__)
    int64_t pid = getpid();
    s ^= mix64(uint64_t(pid));
    pid_.store(pid, std::memory_order_relaxed);
#endif
    counter_.store(mix64(s), std::memory_order_relaxed);
  }

 private:
  IdStream() {
    reseed();
#if defined(__unix__)
    pthread_atfork(nullptr, nullptr, [] { IdStream::instance().reseed(); });
#endif
  }
  std::atomic<uint64_t> counter_{0};
  std::atomic<int64_t> pid_{-1};
};

inline void new_ids(uint64_t* out, size_t n) { IdStream::instance().fill(out, n); }

// ---------------------------------------------------------------------------------------------
// derive_ids
// ---------------------------------------------------------------------------------------------

// Deterministic nonzero ids from (origin, parent, ordinal, salt): chained mix64 rounds, no
// per-process seed, so every process and the Python fallback derive the same ids.
inline void derive_ids(const uint64_t* origin, const uint64_t* parent, const uint64_t* ordinal,
                       size_t n, uint64_t salt, uint64_t* out) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
  const uint64_t h0 = mix64(salt + kGolden);
  for (size_t i = 0; i < n; ++i) {
    uint64_t h = mix64(origin[i] ^ h0);
    h = mix64(h + parent[i]);
    h = mix64(h ^ ordinal[i]);
    out[i] = h ? h : kGolden;
  }
}

// ---------------------------------------------------------------------------------------------
// Reductions and lookups (one BatchIndex per thread, reused across calls)
// ---------------------------------------------------------------------------------------------

inline BatchIndex& scratch_index() {
  thread_local BatchIndex index;
  return index;
}

// Distinct keys in order of first appearance (appended to out_keys) and the XOR of each one's
// values (out_vals); returns the number of distinct keys.
inline size_t xor_reduce(const uint64_t* keys, const uint64_t* vals, size_t n,
                         std::vector<uint64_t>& out_keys, std::vector<uint64_t>& out_vals) {
  out_keys.clear();
  out_vals.clear();
  if (n == 0) return 0;
  if (n >= (size_t(1) << 32)) throw std::length_error("a batch must hold fewer than 2**32 rows");
  BatchIndex& idx = scratch_index();
  idx.reset(n);
  std::vector<uint32_t> homes(n);  // hash the whole batch first, then probe with prefetching
  for (size_t i = 0; i < n; ++i) homes[i] = uint32_t(idx.home(keys[i]));
  for (size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) idx.prefetch(homes[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n) idx.prefetch(homes[i + kPrefetchDistance]);
    bool inserted;
    uint32_t pos = idx.find_or_insert(keys[i], homes[i], uint32_t(out_keys.size()), &inserted);
    if (inserted) {
      out_keys.push_back(keys[i]);
      out_vals.push_back(vals[i]);
    } else {
      out_vals[pos] ^= vals[i];
    }
  }
  return out_keys.size();
}

// Thrown for a batch whose input record ids repeat (message names the position).
struct DuplicateInput : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// out[j] = position of lineage[j] in in_rec, or -1 when absent (or 0). in_rec must be unique:
// DuplicateInput names the first position that repeats an earlier id.
inline void parent_index(const uint64_t* in_rec, size_t n_in, const uint64_t* lineage,
                         size_t n_out, int64_t* out) {
  if (n_in >= (size_t(1) << 32)) throw std::length_error("in_rec is longer than 2**32");
  BatchIndex& idx = scratch_index();
  idx.reset(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    bool inserted;
    idx.find_or_insert(in_rec[i], idx.home(in_rec[i]), uint32_t(i), &inserted);
    if (!inserted)
      throw DuplicateInput("in_rec must be unique within a batch: the id at position " +
                           std::to_string(i) + " repeats an earlier one");
  }
  for (size_t j = 0; j < n_out; ++j) out[j] = lineage[j] ? idx.find(lineage[j]) : -1;
}

// The anchor kernel. Output j came from input parent[j]: out_src[j] = in_src[parent[j]];
// out_rec[j] is fresh unless `given_out_rec`; each input's event is in_rec[i] XOR its children's
// out_rec, reduced per source id into (ev_src, ev_xor) in order of first appearance.
inline void anchor(const uint64_t* in_src, const uint64_t* in_rec, size_t n_in,
                   const int64_t* parent, size_t n_out, const uint64_t* given_out_rec,
                   uint64_t* out_src, uint64_t* out_rec, std::vector<uint64_t>& ev_src,
                   std::vector<uint64_t>& ev_xor) {
  if (given_out_rec)
    std::copy(given_out_rec, given_out_rec + n_out, out_rec);
  else
    new_ids(out_rec, n_out);
  std::vector<uint64_t> ev(in_rec, in_rec + n_in);
  for (size_t j = 0; j < n_out; ++j) {
    size_t p = size_t(parent[j]);
    if (p >= n_in)
      throw std::invalid_argument("parent_index must be in [0, " + std::to_string(n_in) +
                                  "), got " + std::to_string(parent[j]));
    out_src[j] = in_src[p];
    ev[p] ^= out_rec[j];
  }
  xor_reduce(in_src, ev.data(), n_in, ev_src, ev_xor);
}

}  // namespace xorack
