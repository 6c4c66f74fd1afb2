// The classic bucketed acker, written here as the comparison baseline of `xorack bench`.
//
// RotatingAcker is what Storm's RotatingMap and Heron's rotating map (stmgr/util) build: a list
// of N `std::unordered_map<uint64_t, uint64_t>` buckets, newest at the front. A record is born
// into the front bucket; every event scans the buckets front to back until it finds its source
// id, XORs the value in, and erases the entry when it reaches zero. Every rotate() drops the last
// bucket (its registered ids have timed out) and starts a new, empty one at the front.
//
// It is deliberately *not* tuned: no reserve(), the standard hash, one node allocation per
// entry. That is the design a user gets from Storm/Heron, and what xorack's AckTable replaces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

namespace xorack::baselines {

// Live heap usage of one acker's maps: bytes requested, and the glibc chunk bytes they occupy.
struct AllocStats {
    std::size_t requested = 0;      // sum of the sizes asked from operator new
    std::size_t malloc_chunks = 0;  // the same, as glibc x86-64 chunks (header + 16-byte rounding)
    std::size_t allocations = 0;    // live allocations (nodes + bucket arrays)
};

// glibc x86-64 chunk for a request of n bytes: n + 8 header bytes, rounded up to 16, at least 32.
// Why: a node of 24 bytes really costs 32 on the heap; counting only sizeof() would flatter it.
inline std::size_t glibc_chunk_bytes(std::size_t n) {
    const std::size_t chunk = (n + 8 + 15) & ~static_cast<std::size_t>(15);
    return chunk < 32 ? 32 : chunk;
}

// A std::allocator that counts into an AllocStats: the honest memory figure of the baseline.
template <class T>
struct CountingAllocator {
    using value_type = T;
    AllocStats* stats;

    explicit CountingAllocator(AllocStats* s) noexcept : stats(s) {}
    template <class U>
    CountingAllocator(const CountingAllocator<U>& other) noexcept : stats(other.stats) {}

    T* allocate(std::size_t n) {
        const std::size_t bytes = n * sizeof(T);
        stats->requested += bytes;
        stats->malloc_chunks += glibc_chunk_bytes(bytes);
        ++stats->allocations;
        return static_cast<T*>(::operator new(bytes));
    }
    void deallocate(T* p, std::size_t n) noexcept {
        const std::size_t bytes = n * sizeof(T);
        stats->requested -= bytes;
        stats->malloc_chunks -= glibc_chunk_bytes(bytes);
        --stats->allocations;
        ::operator delete(p);
    }
    template <class U>
    bool operator==(const CountingAllocator<U>& o) const noexcept { return stats == o.stats; }
    template <class U>
    bool operator!=(const CountingAllocator<U>& o) const noexcept { return stats != o.stats; }
};

// Storm/Heron-style acker over rotating std::unordered_map buckets. Same completion semantics as
// xorack.AckTable on protocol-ordered input: only registered ids complete; events that arrive
// before their birth wait in a second, equally rotating list of buckets (Storm keeps them in the
// same entry with spoutTask == null; Heron drops them); an unregistered entry reaching 0 is
// dropped silently. Events are applied one at a time, in order, as Storm's Acker does.
class RotatingAcker {
  public:
    using Alloc = CountingAllocator<std::pair<const std::uint64_t, std::uint64_t>>;
    using Map = std::unordered_map<std::uint64_t, std::uint64_t, std::hash<std::uint64_t>,
                                   std::equal_to<std::uint64_t>, Alloc>;

    // num_buckets >= 1 maps, all empty.
    explicit RotatingAcker(std::size_t num_buckets) : num_buckets_(num_buckets) {
        for (std::size_t i = 0; i < num_buckets_; ++i) {
            registered_.emplace_back(new_map());
            early_.emplace_back(new_map());
        }
    }
    RotatingAcker(const RotatingAcker&) = delete;  // the allocators point at stats_
    RotatingAcker& operator=(const RotatingAcker&) = delete;

    // Registers n births; appends to `completed` the ids whose value is zero afterwards
    // (births cancelled by events that arrived early).
    void register_batch(const std::uint64_t* src, const std::uint64_t* births, std::size_t n,
                        std::vector<std::uint64_t>& completed) {
        for (std::size_t i = 0; i < n; ++i) register_one(src[i], births[i], completed);
    }

    // Applies n events in order; appends to `completed` each registered id that reached zero.
    void xor_batch(const std::uint64_t* src, const std::uint64_t* values, std::size_t n,
                   std::vector<std::uint64_t>& completed) {
        for (std::size_t i = 0; i < n; ++i) xor_one(src[i], values[i], completed);
    }

    // Drops the oldest bucket and opens a new front one; appends its registered ids to `expired`.
    void rotate(std::vector<std::uint64_t>& expired) {
        for (const auto& kv : registered_.back()) expired.push_back(kv.first);
        registered_.pop_back();
        early_.pop_back();
        registered_.emplace_front(new_map());
        early_.emplace_front(new_map());
    }

    // Number of registered (pending) source ids.
    std::size_t size() const {
        std::size_t n = 0;
        for (const auto& m : registered_) n += m.size();
        return n;
    }
    std::size_t num_buckets() const { return num_buckets_; }

    // Heap bytes held by the maps (nodes + bucket arrays) as glibc chunks, plus the map objects.
    std::size_t nbytes() const {
        return stats_.malloc_chunks + 2 * num_buckets_ * (sizeof(Map) + 3 * sizeof(void*));
    }
    const AllocStats& alloc_stats() const { return stats_; }

  private:
    Map new_map() { return Map(0, std::hash<std::uint64_t>(), std::equal_to<std::uint64_t>(),
                               Alloc(&stats_)); }

    void register_one(std::uint64_t key, std::uint64_t birth, std::vector<std::uint64_t>& done) {
        for (auto& m : registered_) {  // a second birth for a live id XORs into it
            auto it = m.find(key);
            if (it != m.end()) {
                it->second ^= birth;
                if (it->second == 0) {
                    m.erase(it);
                    done.push_back(key);
                }
                return;
            }
        }
        std::uint64_t value = birth;
        for (auto& m : early_) {
            auto it = m.find(key);
            if (it != m.end()) {
                value ^= it->second;
                m.erase(it);
                break;
            }
        }
        if (value == 0) {
            done.push_back(key);
        } else {
            registered_.front().emplace(key, value);
        }
    }

    void xor_one(std::uint64_t key, std::uint64_t value, std::vector<std::uint64_t>& done) {
        // The scan over all buckets is the cost this design is known for (and xorack removes).
        for (auto& m : registered_) {
            auto it = m.find(key);
            if (it != m.end()) {
                it->second ^= value;
                if (it->second == 0) {
                    m.erase(it);
                    done.push_back(key);
                }
                return;
            }
        }
        for (auto& m : early_) {
            auto it = m.find(key);
            if (it != m.end()) {
                it->second ^= value;
                if (it->second == 0) m.erase(it);  // a duplicated pair: dropped, never reported
                return;
            }
        }
        if (value != 0) early_.front().emplace(key, value);
    }

    std::size_t num_buckets_;
    AllocStats stats_;
    std::list<Map> registered_;  // front = newest bucket
    std::list<Map> early_;       // events whose birth has not arrived yet, rotating alike
};

}  // namespace xorack::baselines
