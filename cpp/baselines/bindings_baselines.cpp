// Benchmark baselines (not used by xorack itself): the Storm/Heron-style rotating acker, exposed
// with the same batch shape as xorack.AckTable (numpy uint64 in and out, GIL released).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "baselines/rotating_acker.hpp"

namespace py = pybind11;
using xorack::baselines::RotatingAcker;

namespace {

using U64Array = py::array_t<std::uint64_t, py::array::c_style>;
using U64Converted = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>;
using I64Converted = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;

// A contiguous uint64 1-D view of `obj` (lists and non-contiguous arrays are converted); any other
// dtype is a TypeError naming the argument, so that no float ever becomes an id silently.
U64Array as_u64(const py::handle& obj, const char* name) {
    py::array arr = py::array::ensure(obj);
    if (!arr) throw py::type_error(std::string(name) + " must be a uint64 array-like");
    if (!py::isinstance<py::array>(obj) && arr.dtype().kind() == 'i') {
        // A list of Python ints arrives as int64: accept it when no value is negative.
        auto ints = I64Converted::ensure(arr);
        for (py::ssize_t i = 0; i < ints.size(); ++i) {
            if (ints.data()[i] < 0) throw py::value_error(std::string(name) + " must be >= 0");
        }
        arr = U64Converted::ensure(arr);
    }
    if (arr.size() > 0 && !(arr.dtype().kind() == 'u' && arr.itemsize() == 8)) {
        throw py::type_error(std::string(name) + " must be uint64, got " +
                             std::string(py::str(arr.dtype())));
    }
    if (arr.ndim() != 1) throw py::value_error(std::string(name) + " must be one-dimensional");
    return U64Array::ensure(arr);
}

py::array_t<std::uint64_t> to_numpy(const std::vector<std::uint64_t>& v) {
    py::array_t<std::uint64_t> out(static_cast<py::ssize_t>(v.size()));
    if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(std::uint64_t));
    return out;
}

using BatchFn = void (RotatingAcker::*)(const std::uint64_t*, const std::uint64_t*, std::size_t,
                                        std::vector<std::uint64_t>&);

py::array_t<std::uint64_t> run_batch(RotatingAcker& acker, BatchFn fn, const py::handle& src,
                                      const py::handle& values, const char* values_name) {
    U64Array s = as_u64(src, "src_ids");
    U64Array v = as_u64(values, values_name);
    if (s.size() != v.size()) {
        throw py::value_error("src_ids and " + std::string(values_name) +
                              " must have the same length, got " + std::to_string(s.size()) +
                              " and " + std::to_string(v.size()));
    }
    std::vector<std::uint64_t> done;
    {
        // Why: the batch runs without the GIL, like xorack's kernels, so timings compare the
        // data structures and not the interpreter.
        py::gil_scoped_release release;
        (acker.*fn)(s.data(), v.data(), static_cast<std::size_t>(s.size()), done);
    }
    return to_numpy(done);
}

}  // namespace

PYBIND11_MODULE(_baselines, m) {
    m.doc() = "xorack benchmark baselines: the Storm/Heron rotating-bucket acker in C++.";

    py::class_<RotatingAcker>(m, "RotatingAcker", R"doc(
Storm/Heron-style acker: N rotating std::unordered_map<uint64, uint64> buckets; every lookup
scans the buckets. Same batch API as xorack.AckTable (register/xor return completed ids).

>>> from xorack._baselines import RotatingAcker
>>> a = RotatingAcker(3)
>>> import numpy as np
>>> a.register(np.array([7], np.uint64), np.array([5], np.uint64)).tolist()
[]
>>> a.xor(np.array([7], np.uint64), np.array([5], np.uint64)).tolist()
[7]
)doc")
        .def(py::init([](long long num_buckets) {
                 if (num_buckets < 1) throw py::value_error("num_buckets must be >= 1");
                 return new RotatingAcker(static_cast<std::size_t>(num_buckets));
             }),
             py::arg("num_buckets") = 3)
        .def(
            "register",
            [](RotatingAcker& a, const py::handle& src, const py::handle& births) {
                return run_batch(a, &RotatingAcker::register_batch, src, births, "births");
            },
            py::arg("src_ids"), py::arg("births"),
            "Registers births; returns the ids already complete (events arrived early).")
        .def(
            "xor",
            [](RotatingAcker& a, const py::handle& src, const py::handle& values) {
                return run_batch(a, &RotatingAcker::xor_batch, src, values, "values");
            },
            py::arg("src_ids"), py::arg("values"),
            "Applies events in order; returns the registered ids that reached zero (removed).")
        .def(
            "rotate",
            [](RotatingAcker& a) {
                std::vector<std::uint64_t> expired;
                {
                    py::gil_scoped_release release;
                    a.rotate(expired);
                }
                return to_numpy(expired);
            },
            "Drops the oldest bucket; returns its registered (timed-out) ids.")
        .def("__len__", &RotatingAcker::size)
        .def_property_readonly("num_buckets", &RotatingAcker::num_buckets)
        .def_property_readonly("nbytes", &RotatingAcker::nbytes,
                               "Heap bytes of the maps as glibc chunks (nodes + bucket arrays).")
        .def_property_readonly(
            "nbytes_requested",
            [](const RotatingAcker& a) { return a.alloc_stats().requested; },
            "Bytes requested from operator new (no malloc header or rounding).")
        .def_property_readonly(
            "allocations", [](const RotatingAcker& a) { return a.alloc_stats().allocations; },
            "Live heap allocations (one per entry plus the bucket arrays).");
}
