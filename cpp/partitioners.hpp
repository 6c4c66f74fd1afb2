// Replay partitioning kernels: the partition each replayed record goes to, computed from what the
// FT layer stored about it (its Spark key hash), mirroring Spark's own partitionings.
// No Python here: plain pointers and sizes; the bindings check them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "spark_hash.hpp"  // XORACK_MULTIVERSION

namespace xorack {
namespace partitioners {

// Java/Spark pmod(h, n) for n > 0: the remainder in [0, n) (HashPartitioning's partition id).
// Why through double: a 32-bit integer divide does not vectorize; the quotient of two int32s in
// double is exact enough that truncating it gives the integer quotient (|error| < 1/n), so the
// loops below vectorize (divpd): 3.8 G/s against 0.19 G/s with idiv, standalone, this machine.
inline int32_t pmod(int32_t h, int32_t n) {
    const int32_t q = static_cast<int32_t>(static_cast<double>(h) / static_cast<double>(n));
    int32_t r = h - q * n;  // truncated remainder, sign of h, like Java's %
    return r + ((r >> 31) & n);
}

// parts[i] = pmod(hashes[i], n): the partition Spark's repartition(n, keys) picks.
XORACK_MULTIVERSION inline void pmod_partition(const int32_t* hashes, int32_t* parts, size_t count,
                                               int32_t n) {
    for (size_t i = 0; i < count; ++i) parts[i] = pmod(hashes[i], n);
}

// In place: hashes[i] = pmod(hashes[i], n).
XORACK_MULTIVERSION inline void pmod_inplace(int32_t* hashes, size_t count, int32_t n) {
    for (size_t i = 0; i < count; ++i) hashes[i] = pmod(hashes[i], n);
}

// parts[i] = (start + i) mod n: successive partitions from `start` (in [0, n)).
inline void round_robin_partition(int32_t* parts, size_t count, int32_t n, int32_t start) {
    int32_t p = start;
    for (size_t i = 0; i < count; ++i) {
        parts[i] = p;
        p = (p + 1 == n) ? 0 : p + 1;
    }
}

// The 64-bit mixer of the seeded shuffle: SplitMix64's output for position `counter` of the
// stream seeded with `seed` (well distributed for consecutive counters, reproducible).
inline uint64_t shuffle_mix(uint64_t seed, uint64_t counter) {
    uint64_t z = seed + (counter + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// parts[i] = partition of stream position counter + i: the high 32 bits of the mix scaled to
// [0, n). Why multiply-shift and not %: no divide, and bias ≤ n / 2^32 (negligible).
inline void shuffle_partition(int32_t* parts, size_t count, int32_t n, uint64_t seed,
                              uint64_t counter) {
    for (size_t i = 0; i < count; ++i) {
        const uint64_t hi = shuffle_mix(seed, counter + i) >> 32;
        parts[i] = static_cast<int32_t>((hi * static_cast<uint64_t>(n)) >> 32);
    }
}

// Every record to every partition, record-major: rows[i*n + p] = i, parts[i*n + p] = p.
inline void broadcast_partition(int64_t* rows, int32_t* parts, size_t count, int32_t n) {
    size_t k = 0;
    for (size_t i = 0; i < count; ++i) {
        for (int32_t p = 0; p < n; ++p, ++k) {
            rows[k] = static_cast<int64_t>(i);
            parts[k] = p;
        }
    }
}

}  // namespace partitioners
}  // namespace xorack
