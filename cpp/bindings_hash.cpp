// Python bindings of the Spark-exact hashing and replay partitioning kernels: checks the numpy
// arrays (dtype, shape, contiguity, lengths, offsets), hands plain pointers to spark_hash.hpp and
// partitioners.hpp with the GIL released. Same raw names and errors as
// python/xorack/_fallback/{spark_hash,partitioners}.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "partitioners.hpp"
#include "spark_hash.hpp"

namespace py = pybind11;
namespace sh = xorack::spark_hash;
namespace pt = xorack::partitioners;

namespace {

// Human name of a numpy dtype for error messages ("int32", "float64").
std::string dtype_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// `obj` as a 1-D C-contiguous numpy array of T, or TypeError/ValueError naming `name`.
// Why no conversion: the raw API takes exactly the buffers the checked API prepared; a silent
// cast or copy here would hide a caller bug (and an in-place update would be lost on a copy).
template <typename T>
py::array_t<T> exact_array(const py::handle& obj, const char* name, const char* expected,
                           bool writable = false) {
    if (!py::isinstance<py::array>(obj)) {
        throw py::type_error(std::string(name) + " must be a numpy " + expected + " array, got " +
                             py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
    }
    auto arr = py::reinterpret_borrow<py::array>(obj);
    if (!py::isinstance<py::array_t<T>>(arr)) {
        throw py::type_error(std::string(name) + " must be " + expected + ", got " +
                             dtype_name(arr));
    }
    if (arr.ndim() != 1) {
        throw py::value_error(std::string(name) + " must be 1-D, got " +
                              std::to_string(arr.ndim()) + " dimensions");
    }
    if (!(arr.flags() & py::array::c_style)) {
        throw py::value_error(std::string(name) + " must be C-contiguous");
    }
    if (writable && !arr.writeable()) {
        throw py::value_error(std::string(name) + " must be writable (it is updated in place)");
    }
    return py::reinterpret_borrow<py::array_t<T>>(arr);
}

// The validity bitmap pointer (nullptr for None) after checking it covers n bits from offset.
const uint8_t* bitmap_ptr(const py::object& valid, int64_t valid_offset, size_t n,
                          py::array_t<uint8_t>& keep) {
    if (valid_offset < 0) {
        throw py::value_error("valid_offset must be >= 0, got " + std::to_string(valid_offset));
    }
    if (valid.is_none()) return nullptr;
    keep = exact_array<uint8_t>(valid, "valid", "uint8 (an Arrow validity bitmap)");
    const size_t need = (static_cast<size_t>(valid_offset) + n + 7) / 8;
    if (static_cast<size_t>(keep.size()) < need) {
        throw py::value_error("valid has " + std::to_string(keep.size()) + " bytes, expected >= " +
                              std::to_string(need) + " for " + std::to_string(n) +
                              " rows at bit offset " + std::to_string(valid_offset));
    }
    return keep.data();
}

// The running-hash array (int32, writable) after checking its length against `n`.
py::array_t<int32_t> hashes_array(const py::object& hashes, size_t n, const char* what) {
    auto h = exact_array<int32_t>(hashes, "hashes", "int32", /*writable=*/true);
    if (static_cast<size_t>(h.size()) != n) {
        throw py::value_error("length mismatch: " + std::string(what) + " has " +
                              std::to_string(n) + " rows, hashes has " + std::to_string(h.size()));
    }
    return h;
}

// A partition count as a C++ int32 in [1, 2^31).
int32_t partitions_arg(int64_t n) {
    if (n <= 0 || n > INT32_MAX) {
        throw py::value_error("n must be in [1, 2147483647], got " + std::to_string(n));
    }
    return static_cast<int32_t>(n);
}

size_t count_arg(int64_t count) {
    if (count < 0) throw py::value_error("count must be >= 0, got " + std::to_string(count));
    return static_cast<size_t>(count);
}

// Binds one fixed-width column kernel `name(values, valid, valid_offset, hashes)`.
template <typename T>
void bind_fixed(py::module_& m, const char* name, const char* expected,
                void (*kernel)(const T*, const uint8_t*, size_t, int32_t*, size_t),
                const char* doc) {
    m.def(
        name,
        [kernel, expected](const py::object& values, const py::object& valid,
                           int64_t valid_offset, const py::object& hashes) {
            auto v = exact_array<T>(values, "values", expected);
            const size_t n = static_cast<size_t>(v.size());
            auto h = hashes_array(hashes, n, "values");
            py::array_t<uint8_t> keep;
            const uint8_t* bits = bitmap_ptr(valid, valid_offset, n, keep);
            const T* vp = v.data();
            int32_t* hp = h.mutable_data();
            py::gil_scoped_release release;
            kernel(vp, bits, static_cast<size_t>(valid_offset), hp, n);
        },
        py::arg("values"), py::arg("valid"), py::arg("valid_offset"), py::arg("hashes"), doc);
}

// hash_bytes for one offsets width.
template <typename Off>
void hash_bytes_impl(const py::array& offsets_arr, const py::object& data, const py::object& valid,
                     int64_t valid_offset, const py::object& hashes, const char* expected) {
    auto offsets = exact_array<Off>(offsets_arr, "offsets", expected);
    auto d = exact_array<uint8_t>(data, "data", "uint8");
    if (offsets.size() < 1) throw py::value_error("offsets must hold n + 1 >= 1 entries, got 0");
    const size_t n = static_cast<size_t>(offsets.size() - 1);
    auto h = hashes_array(hashes, n, "offsets (minus one)");
    py::array_t<uint8_t> keep;
    const uint8_t* bits = bitmap_ptr(valid, valid_offset, n, keep);
    const Off* op = offsets.data();
    const uint8_t* dp = d.data();
    int32_t* hp = h.mutable_data();
    const size_t data_len = static_cast<size_t>(d.size());
    size_t bad;
    {
        py::gil_scoped_release release;
        bad = sh::first_bad_offset(op, n, data_len);
        if (bad == n) {
            sh::hash_bytes_column(op, dp, data_len, bits, static_cast<size_t>(valid_offset), hp, n);
        }
    }
    if (bad != n) {
        throw py::value_error("offsets are not a valid slice of data at row " +
                              std::to_string(bad) + " (need 0 <= offsets[i] <= offsets[i+1] <= " +
                              std::to_string(data_len) + ")");
    }
}

}  // namespace

void bind_spark_hash(py::module_& m) {
    bind_fixed<int32_t>(m, "hash_int32", "int32", sh::hash_int32_column,
                        "hashes[i] = Spark hashInt(values[i], hashes[i]) where valid.");
    bind_fixed<int64_t>(m, "hash_int64", "int64", sh::hash_int64_column,
                        "hashes[i] = Spark hashLong(values[i], hashes[i]) where valid.");
    bind_fixed<float>(m, "hash_float32", "float32", sh::hash_float32_column,
                      "hashes[i] = Spark's FloatType hash of values[i] (-0.0 -> 0, NaN "
                      "canonical).");
    bind_fixed<double>(m, "hash_float64", "float64", sh::hash_float64_column,
                       "hashes[i] = Spark's DoubleType hash of values[i] (-0.0 -> 0, NaN "
                       "canonical).");

    m.def(
        "hash_bytes",
        [](const py::object& offsets, const py::object& data, const py::object& valid,
           int64_t valid_offset, const py::object& hashes) {
            if (!py::isinstance<py::array>(offsets)) {
                throw py::type_error("offsets must be a numpy int32 or int64 array, got " +
                                     py::str(py::type::of(offsets).attr("__name__"))
                                         .cast<std::string>());
            }
            auto arr = py::reinterpret_borrow<py::array>(offsets);
            if (py::isinstance<py::array_t<int64_t>>(arr)) {
                hash_bytes_impl<int64_t>(arr, data, valid, valid_offset, hashes, "int64");
            } else {
                hash_bytes_impl<int32_t>(arr, data, valid, valid_offset, hashes, "int32 or int64");
            }
        },
        py::arg("offsets"), py::arg("data"), py::arg("valid"), py::arg("valid_offset"),
        py::arg("hashes"),
        "hashes[i] = Spark hashUnsafeBytes(data[offsets[i]:offsets[i+1]], hashes[i]) where valid.");

    m.def(
        "hash_decimal128",
        [](const py::object& words, const py::object& valid, int64_t valid_offset,
           const py::object& hashes, bool as_long) {
            auto w = exact_array<int64_t>(words, "words", "int64 (decimal128 as lo/hi pairs)");
            if (w.size() % 2 != 0) {
                throw py::value_error("words must hold 2 int64 per row, got an odd length " +
                                      std::to_string(w.size()));
            }
            const size_t n = static_cast<size_t>(w.size() / 2);
            auto h = hashes_array(hashes, n, "words (pairs)");
            py::array_t<uint8_t> keep;
            const uint8_t* bits = bitmap_ptr(valid, valid_offset, n, keep);
            const int64_t* wp = w.data();
            int32_t* hp = h.mutable_data();
            py::gil_scoped_release release;
            if (as_long) {
                sh::hash_decimal128_long_column(wp, bits, static_cast<size_t>(valid_offset), hp, n);
            } else {
                sh::hash_decimal128_bytes_column(wp, bits, static_cast<size_t>(valid_offset), hp,
                                                 n);
            }
        },
        py::arg("words"), py::arg("valid"), py::arg("valid_offset"), py::arg("hashes"),
        py::arg("as_long"),
        "Spark's DecimalType hash: as_long (precision <= 18) hashLong of the unscaled value, "
        "else hashUnsafeBytes of BigInteger.toByteArray.");

    m.def(
        "pmod_partition",
        [](const py::object& hashes, int64_t n, bool inplace) -> py::array_t<int32_t> {
            const int32_t np_ = partitions_arg(n);
            auto h = exact_array<int32_t>(hashes, "hashes", "int32", /*writable=*/inplace);
            const size_t count = static_cast<size_t>(h.size());
            if (inplace) {
                int32_t* hp = h.mutable_data();
                py::gil_scoped_release release;
                pt::pmod_inplace(hp, count, np_);
                return h;
            }
            py::array_t<int32_t> out(static_cast<py::ssize_t>(count));
            const int32_t* hp = h.data();
            int32_t* op = out.mutable_data();
            {
                py::gil_scoped_release release;
                pt::pmod_partition(hp, op, count, np_);
            }
            return out;
        },
        py::arg("hashes"), py::arg("n"), py::arg("inplace") = false,
        "pmod(hashes, n) in [0, n): Spark HashPartitioning's partition id.");

    m.def(
        "round_robin_partition",
        [](int64_t count, int64_t n, int64_t start) {
            const int32_t np_ = partitions_arg(n);
            if (start < 0 || start >= n) {
                throw py::value_error("start must be in [0, " + std::to_string(n) + "), got " +
                                      std::to_string(start));
            }
            const size_t c = count_arg(count);
            py::array_t<int32_t> out(static_cast<py::ssize_t>(c));
            int32_t* op = out.mutable_data();
            {
                py::gil_scoped_release release;
                pt::round_robin_partition(op, c, np_, static_cast<int32_t>(start));
            }
            return out;
        },
        py::arg("count"), py::arg("n"), py::arg("start"), "(start + i) mod n for i < count.");

    m.def(
        "shuffle_partition",
        [](int64_t count, int64_t n, uint64_t seed, uint64_t counter) {
            const int32_t np_ = partitions_arg(n);
            const size_t c = count_arg(count);
            py::array_t<int32_t> out(static_cast<py::ssize_t>(c));
            int32_t* op = out.mutable_data();
            {
                py::gil_scoped_release release;
                pt::shuffle_partition(op, c, np_, seed, counter);
            }
            return out;
        },
        py::arg("count"), py::arg("n"), py::arg("seed"), py::arg("counter"),
        "Seeded pseudo-random partitions of stream positions counter .. counter + count - 1.");

    m.def(
        "broadcast_partition",
        [](int64_t count, int64_t n) {
            const int32_t np_ = partitions_arg(n);
            const size_t c = count_arg(count);
            const size_t total = c * static_cast<size_t>(np_);
            if (np_ != 0 && total / static_cast<size_t>(np_) != c) {
                throw py::value_error("count * n overflows");
            }
            py::array_t<int64_t> rows(static_cast<py::ssize_t>(total));
            py::array_t<int32_t> parts(static_cast<py::ssize_t>(total));
            int64_t* rp = rows.mutable_data();
            int32_t* pp = parts.mutable_data();
            {
                py::gil_scoped_release release;
                pt::broadcast_partition(rp, pp, c, np_);
            }
            return py::make_tuple(rows, parts);
        },
        py::arg("count"), py::arg("n"), "(rows, parts): every row to every partition, row-major.");
}
