// Spark-exact Murmur3 hashing (org.apache.spark.unsafe.hash.Murmur3_x86_32 as used by Spark's
// `hash()` expression and by HashPartitioning), over whole columns.
//
// Every kernel updates a running hash per row in place: the value of row i is hashed with
// hashes[i] as the seed and the result replaces hashes[i]; a null row leaves hashes[i] as it is.
// Chaining the kernels column after column gives Spark's multi-column hash(c1, c2, ...).
// No Python here: plain pointers and sizes; the bindings check them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(XORACK_NO_MULTIVERSION)
#include <immintrin.h>
#define XORACK_HAVE_AVX2_STRINGS 1
#endif

// Hot column loops are compiled twice, for AVX2 and for the baseline, and picked at load time.
// Why: the Murmur3 round is 32-bit multiplies, 8 lanes per instruction with AVX2 but emulated
// with SSE2 (the portable baseline): int64 keys went from 0.26 to 1.9 G keys/s standalone.
// target_clones needs an ifunc resolver, which glibc provides (musl does not): guard on glibc.
#if defined(__GNUC__) && defined(__x86_64__) && defined(__GLIBC__) && \
    !defined(XORACK_NO_MULTIVERSION)
#define XORACK_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define XORACK_MULTIVERSION
#endif

namespace xorack {
namespace spark_hash {

constexpr uint32_t kC1 = 0xcc9e2d51u;
constexpr uint32_t kC2 = 0x1b873593u;
constexpr int32_t kDefaultSeed = 42;  // Spark's Murmur3Hash / HashPartitioning seed

inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

// Murmur3's per-word scramble of one 32-bit input word.
inline uint32_t mix_k1(uint32_t k1) {
    k1 *= kC1;
    k1 = rotl32(k1, 15);
    return k1 * kC2;
}

// Murmur3's state update with one scrambled word.
inline uint32_t mix_h1(uint32_t h1, uint32_t k1) {
    h1 ^= k1;
    h1 = rotl32(h1, 13);
    return h1 * 5u + 0xe6546b64u;
}

// Murmur3's finalizer; `length` is the number of input bytes (4 for int, 8 for long).
inline uint32_t fmix(uint32_t h1, uint32_t length) {
    h1 ^= length;
    h1 ^= h1 >> 16;
    h1 *= 0x85ebca6bu;
    h1 ^= h1 >> 13;
    h1 *= 0xc2b2ae35u;
    h1 ^= h1 >> 16;
    return h1;
}

// Spark's Murmur3_x86_32.hashInt(input, seed).
inline int32_t hash_int(int32_t input, int32_t seed) {
    uint32_t h1 = mix_h1(static_cast<uint32_t>(seed), mix_k1(static_cast<uint32_t>(input)));
    return static_cast<int32_t>(fmix(h1, 4));
}

// Spark's Murmur3_x86_32.hashLong(input, seed): low word first, then high word.
inline int32_t hash_long(int64_t input, int32_t seed) {
    const uint64_t u = static_cast<uint64_t>(input);
    uint32_t h1 = mix_h1(static_cast<uint32_t>(seed), mix_k1(static_cast<uint32_t>(u)));
    h1 = mix_h1(h1, mix_k1(static_cast<uint32_t>(u >> 32)));
    return static_cast<int32_t>(fmix(h1, 8));
}

// A little-endian 32-bit word at an unaligned address (Spark reads words little-endian on
// every platform).
inline uint32_t load_le32(const uint8_t* p) {
    uint32_t w;
    std::memcpy(&w, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap32(w);
#endif
    return w;
}

// Spark's Murmur3_x86_32.hashUnsafeBytes(bytes, len, seed): whole 4-byte words, then each tail
// byte mixed on its own as a *signed* byte (not standard Murmur3's tail), then fmix(len).
inline int32_t hash_bytes(const uint8_t* p, size_t len, int32_t seed) {
    uint32_t h1 = static_cast<uint32_t>(seed);
    const size_t aligned = len & ~size_t{3};
    for (size_t i = 0; i < aligned; i += 4) h1 = mix_h1(h1, mix_k1(load_le32(p + i)));
    for (size_t i = aligned; i < len; ++i) {
        const int32_t signed_byte = static_cast<int8_t>(p[i]);
        h1 = mix_h1(h1, mix_k1(static_cast<uint32_t>(signed_byte)));
    }
    return static_cast<int32_t>(fmix(h1, static_cast<uint32_t>(len)));
}

// Spark's float key: floatToIntBits with -0.0 -> 0 and every NaN -> the canonical 0x7fc00000.
inline int32_t float_key(float f) {
    if (f != f) return 0x7fc00000;
    if (f == 0.0f) return 0;  // +0.0 and -0.0
    int32_t bits;
    std::memcpy(&bits, &f, 4);
    return bits;
}

// Spark's double key: doubleToLongBits with -0.0 -> 0 and every NaN -> 0x7ff8000000000000.
inline int64_t double_key(double d) {
    if (d != d) return 0x7ff8000000000000LL;
    if (d == 0.0) return 0;
    int64_t bits;
    std::memcpy(&bits, &d, 8);
    return bits;
}

// Arrow validity bit i (LSB first) of `bitmap` shifted by `bit_offset`; nullptr = all valid.
inline bool is_valid(const uint8_t* bitmap, size_t bit_offset, size_t i) {
    const size_t b = bit_offset + i;
    return bitmap == nullptr || ((bitmap[b >> 3] >> (b & 7)) & 1u);
}

// Fixed-width kernel skeleton: hashes[i] = hash_fn(key_fn(values[i]), hashes[i]) for valid rows.
// Why two loops: without nulls the loop is branch-free and the compiler vectorizes the whole
// Murmur3 round; with nulls, a select (not a branch) keeps the hashes of null rows.
template <typename T, typename KeyFn, typename HashFn>
inline void hash_fixed(const T* values, const uint8_t* valid, size_t valid_offset,
                       int32_t* hashes, size_t n, KeyFn key_fn, HashFn hash_fn) {
    if (valid == nullptr) {
        for (size_t i = 0; i < n; ++i) hashes[i] = hash_fn(key_fn(values[i]), hashes[i]);
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        const int32_t h = hash_fn(key_fn(values[i]), hashes[i]);
        hashes[i] = is_valid(valid, valid_offset, i) ? h : hashes[i];
    }
}

// Column kernels: int32-like (IntegerType, ShortType, ByteType, DateType, BooleanType widened).
XORACK_MULTIVERSION inline void hash_int32_column(const int32_t* v, const uint8_t* valid,
                                                  size_t off, int32_t* h, size_t n) {
    hash_fixed(v, valid, off, h, n, [](int32_t x) { return x; }, hash_int);
}

// LongType, TimestampType (micros), DecimalType(p <= 18) unscaled values.
XORACK_MULTIVERSION inline void hash_int64_column(const int64_t* v, const uint8_t* valid,
                                                  size_t off, int32_t* h, size_t n) {
    hash_fixed(v, valid, off, h, n, [](int64_t x) { return x; }, hash_long);
}

// FloatType.
XORACK_MULTIVERSION inline void hash_float32_column(const float* v, const uint8_t* valid,
                                                    size_t off, int32_t* h, size_t n) {
    hash_fixed(v, valid, off, h, n, float_key, hash_int);
}

// DoubleType.
XORACK_MULTIVERSION inline void hash_float64_column(const double* v, const uint8_t* valid,
                                                    size_t off, int32_t* h, size_t n) {
    hash_fixed(v, valid, off, h, n, double_key, hash_long);
}

// First row whose offsets are not a valid slice of a `data_len`-byte buffer, or n if all are.
template <typename Off>
inline size_t first_bad_offset(const Off* offsets, size_t n, size_t data_len) {
    if (offsets[0] < 0) return 0;
    for (size_t i = 0; i < n; ++i) {
        if (offsets[i + 1] < offsets[i] || static_cast<uint64_t>(offsets[i + 1]) > data_len) {
            return i;
        }
    }
    return n;
}

#if defined(XORACK_HAVE_AVX2_STRINGS)
// Bytes readable past the start of a value for the AVX2 short-value path (its last 4-byte read
// starts at byte 18 of a 16-byte value).
constexpr size_t kSimdReadable = 22;

namespace avx2 {
__attribute__((target("avx2"))) inline __m256i rotl(__m256i x, int r) {
    return _mm256_or_si256(_mm256_slli_epi32(x, r), _mm256_srli_epi32(x, 32 - r));
}

__attribute__((target("avx2"))) inline __m256i mix_k1(__m256i k1) {
    k1 = _mm256_mullo_epi32(k1, _mm256_set1_epi32(static_cast<int32_t>(kC1)));
    return _mm256_mullo_epi32(rotl(k1, 15), _mm256_set1_epi32(static_cast<int32_t>(kC2)));
}

__attribute__((target("avx2"))) inline __m256i mix_h1(__m256i h1, __m256i k1) {
    h1 = rotl(_mm256_xor_si256(h1, k1), 13);
    h1 = _mm256_add_epi32(_mm256_slli_epi32(h1, 2), h1);  // h1 * 5
    return _mm256_add_epi32(h1, _mm256_set1_epi32(static_cast<int32_t>(0xe6546b64u)));
}

__attribute__((target("avx2"))) inline __m256i fmix(__m256i h1, __m256i len) {
    h1 = _mm256_xor_si256(h1, len);
    h1 = _mm256_xor_si256(h1, _mm256_srli_epi32(h1, 16));
    h1 = _mm256_mullo_epi32(h1, _mm256_set1_epi32(static_cast<int32_t>(0x85ebca6bu)));
    h1 = _mm256_xor_si256(h1, _mm256_srli_epi32(h1, 13));
    h1 = _mm256_mullo_epi32(h1, _mm256_set1_epi32(static_cast<int32_t>(0xc2b2ae35u)));
    return _mm256_xor_si256(h1, _mm256_srli_epi32(h1, 16));
}

// Eight values of <= 16 bytes at once: every lane mixes 4 words and 3 tail bytes (fetched by
// gathers) and selects the rounds that belong to its value;
// lanes whose `keep` is 0 (nulls) keep their hash. False when the group does not qualify (a
// value longer than 16 bytes or too near the end of `data`): the caller then goes scalar.
// The caller guarantees data_len >= kSimdReadable.
__attribute__((target("avx2"))) inline bool hash8_short(const int32_t* offsets,
                                                        const uint8_t* data, size_t data_len,
                                                        __m256i keep, int32_t* h) {
    const __m256i start = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(offsets));
    const __m256i end = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(offsets + 1));
    const __m256i len = _mm256_sub_epi32(end, start);
    // Every lane, null or not, must be short and far enough from the end: the gathers read
    // all lanes.
    const size_t last = data_len - kSimdReadable;
    const int32_t last_ok = last > INT32_MAX ? INT32_MAX : static_cast<int32_t>(last);
    const __m256i too_long = _mm256_cmpgt_epi32(len, _mm256_set1_epi32(16));
    const __m256i too_late = _mm256_cmpgt_epi32(start, _mm256_set1_epi32(last_ok));
    const __m256i unfit = _mm256_or_si256(too_long, too_late);
    if (!_mm256_testz_si256(unfit, unfit)) return false;
    const int* base = reinterpret_cast<const int*>(data);
    const __m256i words = _mm256_srli_epi32(len, 2);
    __m256i h1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h));
    const __m256i seed = h1;
    for (int k = 0; k < 4; ++k) {
        const __m256i pos = _mm256_add_epi32(start, _mm256_set1_epi32(4 * k));
        const __m256i next = mix_h1(h1, mix_k1(_mm256_i32gather_epi32(base, pos, 1)));
        h1 = _mm256_blendv_epi8(h1, next, _mm256_cmpgt_epi32(words, _mm256_set1_epi32(k)));
    }
    const __m256i tail_at = _mm256_add_epi32(start, _mm256_slli_epi32(words, 2));
    const __m256i tail_len = _mm256_and_si256(len, _mm256_set1_epi32(3));
    for (int j = 0; j < 3; ++j) {
        const __m256i pos = _mm256_add_epi32(tail_at, _mm256_set1_epi32(j));
        const __m256i word = _mm256_i32gather_epi32(base, pos, 1);
        const __m256i signed_byte = _mm256_srai_epi32(_mm256_slli_epi32(word, 24), 24);
        const __m256i next = mix_h1(h1, mix_k1(signed_byte));
        h1 = _mm256_blendv_epi8(h1, next, _mm256_cmpgt_epi32(tail_len, _mm256_set1_epi32(j)));
    }
    h1 = _mm256_blendv_epi8(seed, fmix(h1, len), keep);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(h), h1);
    return true;
}
}  // namespace avx2
#endif

// StringType / BinaryType with Arrow offsets (n + 1 of them) into `data` (`data_len` bytes),
// rows [begin, end). The caller checked the offsets with first_bad_offset.
template <typename Off>
inline void hash_bytes_rows(const Off* offsets, const uint8_t* data, const uint8_t* valid,
                            size_t off, int32_t* h, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
        if (!is_valid(valid, off, i)) continue;
        const size_t start = static_cast<size_t>(offsets[i]);
        const size_t len = static_cast<size_t>(offsets[i + 1]) - start;
        h[i] = hash_bytes(data + start, len, h[i]);
    }
}

#if defined(XORACK_HAVE_AVX2_STRINGS)
// The AVX2 column loop: groups of 8 rows through hash8_short, scalar for the rest.
// Why: 8 values per round, and no per-value loop exits to mispredict: 8-16 byte strings went
// from 0.83 to 1.76 GB/s in a standalone loop on this machine (bench_hashing: end to end).
__attribute__((target("avx2"))) inline void hash_bytes_rows_avx2(const int32_t* offsets,
                                                                 const uint8_t* data,
                                                                 size_t data_len,
                                                                 const uint8_t* valid, size_t off,
                                                                 int32_t* h, size_t n) {
    size_t i = 0;
    if (data_len >= kSimdReadable) {
        for (; i + 8 <= n; i += 8) {
            __m256i keep = _mm256_set1_epi32(-1);
            if (valid != nullptr) {
                keep = _mm256_setr_epi32(
                    -int32_t(is_valid(valid, off, i)), -int32_t(is_valid(valid, off, i + 1)),
                    -int32_t(is_valid(valid, off, i + 2)), -int32_t(is_valid(valid, off, i + 3)),
                    -int32_t(is_valid(valid, off, i + 4)), -int32_t(is_valid(valid, off, i + 5)),
                    -int32_t(is_valid(valid, off, i + 6)), -int32_t(is_valid(valid, off, i + 7)));
            }
            if (!avx2::hash8_short(offsets + i, data, data_len, keep, h + i)) {
                hash_bytes_rows(offsets, data, valid, off, h, i, i + 8);
            }
        }
    }
    hash_bytes_rows(offsets, data, valid, off, h, i, n);
}
#endif

// StringType / BinaryType column: hashes[i] = hashUnsafeBytes(value i, hashes[i]) where valid.
template <typename Off>
inline void hash_bytes_column(const Off* offsets, const uint8_t* data, size_t data_len,
                              const uint8_t* valid, size_t off, int32_t* h, size_t n) {
#if defined(XORACK_HAVE_AVX2_STRINGS)
    if constexpr (std::is_same_v<Off, int32_t>) {
        if (__builtin_cpu_supports("avx2")) {
            hash_bytes_rows_avx2(offsets, data, data_len, valid, off, h, n);
            return;
        }
    }
#endif
    hash_bytes_rows(offsets, data, valid, off, h, 0, n);
}

// DecimalType(p > 18): Java's BigInteger.toByteArray of the unscaled value (minimal big-endian
// two's complement, at least one byte), hashed with hashUnsafeBytes. `words` holds Arrow's
// decimal128 layout: per row a little-endian 128-bit value as (low uint64, high int64).
inline void hash_decimal128_bytes_column(const int64_t* words, const uint8_t* valid, size_t off,
                                         int32_t* h, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (!is_valid(valid, off, i)) continue;
        const uint64_t lo = static_cast<uint64_t>(words[2 * i]);
        const uint64_t hi = static_cast<uint64_t>(words[2 * i + 1]);
        uint8_t be[16];
        for (int k = 0; k < 8; ++k) {
            be[k] = static_cast<uint8_t>(hi >> (56 - 8 * k));
            be[8 + k] = static_cast<uint8_t>(lo >> (56 - 8 * k));
        }
        // Drop leading bytes that only repeat the sign (keeping the sign bit in the next byte).
        const uint8_t sign = (be[0] & 0x80u) ? 0xffu : 0x00u;
        int skip = 0;
        while (skip < 15 && be[skip] == sign && ((be[skip + 1] ^ sign) & 0x80u) == 0) ++skip;
        h[i] = hash_bytes(be + skip, static_cast<size_t>(16 - skip), h[i]);
    }
}

// DecimalType(p <= 18) from decimal128 storage: hashLong of the low 64 bits (the value fits).
inline void hash_decimal128_long_column(const int64_t* words, const uint8_t* valid, size_t off,
                                        int32_t* h, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const int32_t v = hash_long(words[2 * i], h[i]);
        h[i] = is_valid(valid, off, i) ? v : h[i];
    }
}

}  // namespace spark_hash
}  // namespace xorack
