// The only place (with bindings_hash.cpp) that knows Python: converts numpy arrays to spans,
// releases the GIL around every batch call, and maps C++ exceptions to TypeError/ValueError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ack_table.hpp"
#include "flat_table.hpp"
#include "lineage.hpp"
#include "sharding.hpp"
#include "timeout_wheel.hpp"

namespace py = pybind11;

void bind_acker(py::module_& m);       // AckTable, TimeoutWheel, new_ids, anchor (below)
void bind_spark_hash(py::module_& m);  // Murmur3 / partitioning kernels (bindings_hash.cpp)

// --- acker bindings ---------------------------------------------------------------------------
namespace {

using U64Array = py::array_t<uint64_t>;

// A read-only pointer into `a` after checking dtype, rank and contiguity (the public layer has
// already converted; this is the last line of defence: a mistake is an error, never a crash).
template <class T>
const T* checked(const py::array& a, const char* name, const char* expected) {
  if (!a.dtype().equal(py::dtype::of<T>()))
    throw py::type_error(std::string(name) + " must be " + expected + ", got " +
                         std::string(py::str(a.dtype())));
  if (a.ndim() != 1)
    throw py::value_error(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) +
                          " dimensions");
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(std::string(name) + " must be C-contiguous");
  return static_cast<const T*>(a.data());
}

const uint64_t* u64(const py::array& a, const char* name) {
  return checked<uint64_t>(a, name, "uint64");
}

void same_len(const py::array& a, const char* an, const py::array& b, const char* bn) {
  if (a.size() != b.size())
    throw py::value_error(std::string("length mismatch: ") + an + " has " +
                          std::to_string(a.size()) + ", " + bn + " has " +
                          std::to_string(b.size()));
}

// Id 0 is never a valid id (DESIGN.md): every entry point refuses it before changing anything.
void nonzero_ids(const uint64_t* p, size_t n, const char* name) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] == 0)
      throw py::value_error(std::string(name) + " contains id 0 at position " + std::to_string(i) +
                            " (ids are nonzero)");
}
void nonzero_id(uint64_t id, const char* name) {
  if (id == 0) throw py::value_error(std::string(name) + " must be a nonzero id, got 0");
}

template <class C>
py::dict counters_dict(const C& c, size_t size, size_t capacity) {
  py::dict d;
  d["size"] = size;
  d["capacity"] = capacity;
  d["grows"] = c.grows;
  d["shrinks"] = c.shrinks;
  d["tail_grows"] = c.tail_grows;
  d["long_runs"] = c.long_runs;
  d["merges"] = c.merges;
  return d;
}

U64Array to_array(const std::vector<uint64_t>& v) {
  U64Array out(py::ssize_t(v.size()));
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), v.size() * sizeof(uint64_t));
  return out;
}

// The Python-side objects: a core object plus the lock that serializes calls on it (every batch
// call runs without the GIL, so two Python threads could otherwise enter it at once).
struct PyAckTable {
  xorack::AckTable t;
  std::mutex mu;
};
struct PyTimeoutWheel {
  explicit PyTimeoutWheel(uint32_t nb) : w(nb) {}
  xorack::TimeoutWheel w;
  std::mutex mu;
};

// Runs f() with the GIL released and the object's lock held (lock released before the GIL is
// taken back, so a thread waiting for the lock while holding the GIL cannot deadlock with us).
template <class Box, class F>
auto locked(Box& box, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(box.mu);
  return f();
}

}  // namespace

void bind_acker(py::module_& m) {
  py::class_<PyAckTable>(m, "AckTable",
                         "Raw XOR acker table (validated uint64 arrays); see xorack.AckTable.")
      .def(py::init<>())
      .def("register",
           [](PyAckTable& self, const py::array& keys, const py::array& births) {
             const uint64_t* k = u64(keys, "src_ids");
             const uint64_t* b = u64(births, "births");
             same_len(keys, "src_ids", births, "births");
             nonzero_ids(k, size_t(keys.size()), "src_ids");
             std::vector<uint64_t> done;
             size_t n = size_t(keys.size());
             locked(self, [&] { self.t.register_batch(k, b, n, done); });
             return to_array(done);
           })
      .def("xor",
           [](PyAckTable& self, const py::array& keys, const py::array& vals) {
             const uint64_t* k = u64(keys, "src_ids");
             const uint64_t* v = u64(vals, "values");
             same_len(keys, "src_ids", vals, "values");
             nonzero_ids(k, size_t(keys.size()), "src_ids");
             std::vector<uint64_t> done;
             size_t n = size_t(keys.size());
             locked(self, [&] { self.t.xor_batch(k, v, n, done); });
             return to_array(done);
           })
      .def("fail",
           [](PyAckTable& self, const py::array& keys) {
             const uint64_t* k = u64(keys, "src_ids");
             size_t n = size_t(keys.size());
             nonzero_ids(k, n, "src_ids");
             py::array_t<bool> present(py::ssize_t(n), nullptr);
             auto* p = reinterpret_cast<uint8_t*>(present.mutable_data());
             locked(self, [&] { self.t.fail_batch(k, n, p); });
             return present;
           })
      .def("expire_unregistered",
           [](PyAckTable& self) {
             return locked(self, [&] { return self.t.expire_unregistered(); });
           })
      .def("__len__", [](PyAckTable& self) { return locked(self, [&] { return self.t.size(); }); })
      .def("contains",
           [](PyAckTable& self, uint64_t k) {
             nonzero_id(k, "src");
             return locked(self, [&] { return self.t.contains(k); });
           })
      .def("get",
           [](PyAckTable& self, uint64_t k) -> std::optional<uint64_t> {
             nonzero_id(k, "src");
             uint64_t v = 0;
             bool found = locked(self, [&] { return self.t.get(k, &v); });
             if (!found) return std::nullopt;
             return v;
           })
      .def("gather",
           [](PyAckTable& self, const py::array& keys) {
             // the current value of each id, 0 where it has no entry (a registered entry is
             // never 0: it completes there): one lock, one probe per id
             const uint64_t* k = u64(keys, "src_ids");
             size_t n = size_t(keys.size());
             nonzero_ids(k, n, "src_ids");
             py::array_t<uint64_t> out(py::ssize_t(n), nullptr);
             uint64_t* o = out.mutable_data();
             locked(self, [&] {
               for (size_t i = 0; i < n; ++i) {
                 uint64_t v = 0;
                 o[i] = self.t.get(k[i], &v) ? v : 0;
               }
             });
             return out;
           })
      .def("snapshot",
           [](PyAckTable& self) {
             std::vector<uint64_t> k, v;
             std::vector<uint8_t> r;
             locked(self, [&] { self.t.snapshot(k, v, r); });
             py::array_t<bool> reg(py::ssize_t(r.size()), nullptr);
             if (!r.empty()) std::memcpy(reg.mutable_data(), r.data(), r.size());
             return py::make_tuple(to_array(k), to_array(v), reg);
           })
      .def_static(
          "restore",
          [](const py::array& keys, const py::array& vals, const py::array& reg) {
            const uint64_t* k = u64(keys, "keys");
            const uint64_t* v = u64(vals, "values");
            const bool* r = checked<bool>(reg, "registered", "bool");
            same_len(keys, "keys", vals, "values");
            same_len(keys, "keys", reg, "registered");
            auto box = std::make_unique<PyAckTable>();
            size_t n = size_t(keys.size());
            {
              py::gil_scoped_release nogil;
              box->t.restore(k, v, reinterpret_cast<const uint8_t*>(r), n);
            }
            return box;
          })
      .def("nbytes", [](PyAckTable& self) { return locked(self, [&] { return self.t.nbytes(); }); })
      .def("debug_counters",
           [](PyAckTable& self) {
             size_t size = 0, cap = 0;
             auto c = locked(self, [&] {
               size = self.t.size();
               cap = self.t.capacity();
               return self.t.counters();
             });
             return counters_dict(c, size, cap);
           },
           "How often the registered ids' table grew (on load; tail_grows: a run reached the "
           "spare slots at its end), shrank, and met a run longer than 64 slots, with its size "
           "and capacity (home slots) (for the tests: proof that they reach those paths). "
           "Native only.");

  py::class_<PyTimeoutWheel>(m, "TimeoutWheel",
                             "Raw rotating timeout buckets; see xorack.TimeoutWheel.")
      .def(py::init([](long long nb) {
        if (nb < 1 || nb >= (1LL << 15))
          throw py::value_error("num_buckets must be in [1, 2**15), got " + std::to_string(nb));
        return std::make_unique<PyTimeoutWheel>(uint32_t(nb));
      }))
      .def("add",
           [](PyTimeoutWheel& self, const py::array& ids) {
             const uint64_t* p = u64(ids, "ids");
             size_t n = size_t(ids.size());
             nonzero_ids(p, n, "ids");
             locked(self, [&] { self.w.add(p, n); });
           })
      .def("touch",
           [](PyTimeoutWheel& self, const py::array& ids) {
             const uint64_t* p = u64(ids, "ids");
             size_t n = size_t(ids.size());
             nonzero_ids(p, n, "ids");
             locked(self, [&] { self.w.touch(p, n); });
           })
      .def("discard",
           [](PyTimeoutWheel& self, const py::array& ids) {
             const uint64_t* p = u64(ids, "ids");
             size_t n = size_t(ids.size());
             nonzero_ids(p, n, "ids");
             locked(self, [&] { self.w.discard(p, n); });
           })
      .def("rotate",
           [](PyTimeoutWheel& self) {
             // A raw buffer with room for every id: the sweep writes it branch-free and only
             // the pages it reaches are ever touched (a vector would zero-fill all of it). It
             // becomes the returned array as it is, shrunk to the ids written: no second buffer
             // and no copy (small: 0.06-0.3 ms per 333 K ids, 1-2 % of add + rotate).
             uint64_t* buf = nullptr;
             size_t n = 0;
             locked(self, [&] {
               buf = static_cast<uint64_t*>(
                   std::malloc((self.w.max_expiring() + 1) * sizeof(uint64_t)));
               if (buf) n = self.w.rotate(buf);
             });
             if (!buf) throw std::bad_alloc();
             if (void* shrunk = std::realloc(buf, std::max<size_t>(n, 1) * sizeof(uint64_t)))
               buf = static_cast<uint64_t*>(shrunk);  // (on failure the bigger buffer serves)
             py::capsule owner(buf, [](void* p) { std::free(p); });
             return U64Array(static_cast<py::ssize_t>(n), buf, owner);
           })
      .def_property_readonly(
          "rotation",
          [](PyTimeoutWheel& self) { return locked(self, [&] { return self.w.rotation(); }); })
      .def("__len__",
           [](PyTimeoutWheel& self) { return locked(self, [&] { return self.w.size(); }); })
      .def("contains",
           [](PyTimeoutWheel& self, uint64_t id) {
             nonzero_id(id, "id");
             return locked(self, [&] { return self.w.contains(id); });
           })
      .def("nbytes",
           [](PyTimeoutWheel& self) { return locked(self, [&] { return self.w.nbytes(); }); })
      .def("debug_counters",
           [](PyTimeoutWheel& self) {
             size_t size = 0, cap = 0;
             uint64_t queued = 0, runs = 0;
             auto c = locked(self, [&] {
               size = self.w.size();
               cap = self.w.capacity();
               queued = self.w.queued();
               runs = self.w.made_runs();
               return self.w.counters();
             });
             py::dict d = counters_dict(c, size, cap);
             d["queued"] = queued;
             d["runs"] = runs;
             return d;
           },
           "How often the wheel's table grew (on load; tail_grows: a run reached the spare "
           "slots at its end), shrank, swept a run longer than 64 slots in rotate, and merged "
           "sorted ids into it in one pass (merges); how many adds were queued (queued) and how "
           "many queues became runs at a rotate (runs); its size and capacity (for the tests; "
           "moves the queue and the runs into the table first). Native only.");

  m.def("new_ids", [](long long n) {
    if (n < 0) throw py::value_error("n must be >= 0, got " + std::to_string(n));
    U64Array out(static_cast<py::ssize_t>(n));
    uint64_t* p = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      xorack::new_ids(p, size_t(n));
    }
    return out;
  });

  m.def("derive_ids", [](const py::array& origin, const py::array& parent,
                         const py::array& ordinal, uint64_t salt) {
    const uint64_t* o = u64(origin, "origin");
    const uint64_t* p = u64(parent, "parent");
    const uint64_t* k = u64(ordinal, "ordinal");
    same_len(origin, "origin", parent, "parent");
    same_len(origin, "origin", ordinal, "ordinal");
    size_t n = size_t(origin.size());
    U64Array out(static_cast<py::ssize_t>(n));
    uint64_t* q = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      xorack::derive_ids(o, p, k, n, salt, q);
    }
    return out;
  });

  m.def("xor_reduce", [](const py::array& src, const py::array& vals) {
    const uint64_t* s = u64(src, "src");
    const uint64_t* v = u64(vals, "values");
    same_len(src, "src", vals, "values");
    size_t n = size_t(src.size());
    std::vector<uint64_t> ks, xs;
    {
      py::gil_scoped_release nogil;
      xorack::xor_reduce(s, v, n, ks, xs);
    }
    return py::make_tuple(to_array(ks), to_array(xs));
  });

  m.def("split_by_shard", [](const py::array& ids, const py::array& vals, uint32_t count,
                             unsigned shift) {
    const uint64_t* s = u64(ids, "ids");
    const uint64_t* v = u64(vals, "values");
    same_len(ids, "ids", vals, "values");
    if (count < 1) throw py::value_error("count must be >= 1");
    if (shift > 10) throw py::value_error("shift must be in [0, 10]");
    size_t n = size_t(ids.size());
    U64Array out_ids(static_cast<py::ssize_t>(n)), out_vals(static_cast<py::ssize_t>(n));
    py::array_t<int64_t> offsets(static_cast<py::ssize_t>(count) + 1);
    uint64_t* oi = out_ids.mutable_data();
    uint64_t* ov = out_vals.mutable_data();
    int64_t* off = offsets.mutable_data();
    {
      py::gil_scoped_release nogil;
      xorack::split_by_shard(s, v, n, shift, count, oi, ov, off);
    }
    return py::make_tuple(out_ids, out_vals, offsets);
  });

  m.def("scatter_by_shard", [](const py::array& ids, const py::array& vals, unsigned shift,
                               const py::list& out_ids, const py::list& out_vals,
                               py::array fill) {
    const uint64_t* s = u64(ids, "ids");
    const uint64_t* v = u64(vals, "values");
    same_len(ids, "ids", vals, "values");
    if (shift > 10) throw py::value_error("shift must be in [0, 10]");
    const size_t count = out_ids.size();
    if (count < 1 || count > (size_t(1) << 31))
      throw py::value_error("out_ids must hold one buffer per shard (1 or more)");
    if (out_vals.size() != count)
      throw py::value_error("out_ids and out_vals must hold as many buffers");
    if (!py::isinstance<py::array_t<int64_t>>(fill) || fill.ndim() != 1 ||
        size_t(fill.size()) != count || !fill.writeable() ||
        !(fill.flags() & py::array::c_style))
      throw py::type_error("fill must be a writeable contiguous int64 array, one per shard");
    std::vector<uint64_t*> oi(count), ov(count);
    std::vector<int64_t> cap(count);
    // the fill counts are read and written back with the GIL held: the scatter works on a copy
    auto* f = static_cast<int64_t*>(fill.mutable_data());
    std::vector<int64_t> at(f, f + count);
    auto buffer = [](const py::handle& h, const char* name) -> py::array {
      if (!py::isinstance<py::array_t<uint64_t>>(h))
        throw py::type_error(std::string(name) + " must hold uint64 arrays");
      auto a = py::reinterpret_borrow<py::array>(h);
      if (a.ndim() != 1 || !a.writeable() || !(a.flags() & py::array::c_style))
        throw py::type_error(std::string(name) + " must hold writeable contiguous 1-d arrays");
      return a;
    };
    std::vector<py::array> held;  // alive while the GIL is released (a list may change)
    held.reserve(2 * count);
    // every byte range written, to refuse buffers that overlap one another or the fill
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
    for (size_t k = 0; k < count; ++k) {
      py::array a = buffer(out_ids[k], "out_ids"), b = buffer(out_vals[k], "out_vals");
      if (a.size() != b.size())
        throw py::value_error("out_ids and out_vals must have the same length per shard");
      if (at[k] < 0 || at[k] > a.size())
        throw py::value_error("fill must be in [0, len(buffer)] for every shard");
      oi[k] = static_cast<uint64_t*>(a.mutable_data());
      ov[k] = static_cast<uint64_t*>(b.mutable_data());
      cap[k] = int64_t(a.size());
      if (a.size()) {
        auto lo = reinterpret_cast<uintptr_t>(oi[k]), hi = lo + uintptr_t(a.nbytes());
        ranges.emplace_back(lo, hi);
        lo = reinterpret_cast<uintptr_t>(ov[k]), hi = lo + uintptr_t(b.nbytes());
        ranges.emplace_back(lo, hi);
      }
      held.push_back(std::move(a));
      held.push_back(std::move(b));
    }
    auto flo = reinterpret_cast<uintptr_t>(f);
    ranges.emplace_back(flo, flo + uintptr_t(fill.nbytes()));
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first < ranges[i - 1].second)
        throw py::value_error("out_ids, out_vals and fill must not share memory");
    for (const py::array* in : {&ids, &vals}) {  // read while the buffers are written
      if (!in->size()) continue;
      auto lo = reinterpret_cast<uintptr_t>(in->data()), hi = lo + uintptr_t(in->nbytes());
      for (const auto& r : ranges)
        if (lo < r.second && r.first < hi)
          throw py::value_error("ids and values must not share memory with the buffers");
    }
    const size_t n = size_t(ids.size());
    bool fits;
    {
      py::gil_scoped_release nogil;
      thread_local std::vector<uint32_t> owner;
      thread_local std::vector<int64_t> counts;
      fits = xorack::scatter_by_shard(s, v, n, shift, uint32_t(count), oi.data(), ov.data(),
                                      cap.data(), at.data(), owner, counts);
      if (owner.capacity() > (size_t(1) << 20)) std::vector<uint32_t>().swap(owner);
    }
    std::copy(at.begin(), at.end(), f);
    return fits;
  });

  m.def("parent_index", [](const py::array& in_rec, const py::array& lineage) {
    const uint64_t* r = u64(in_rec, "in_rec");
    const uint64_t* l = u64(lineage, "out_lineage");
    size_t n_in = size_t(in_rec.size()), n_out = size_t(lineage.size());
    py::array_t<int64_t> out(static_cast<py::ssize_t>(n_out));
    int64_t* q = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      xorack::parent_index(r, n_in, l, n_out, q);
    }
    return out;
  });

  m.def("anchor", [](const py::array& in_src, const py::array& in_rec, const py::array& parent,
                     const std::optional<py::array>& out_rec) {
    const uint64_t* s = u64(in_src, "in_src");
    const uint64_t* r = u64(in_rec, "in_rec");
    const int64_t* pi = checked<int64_t>(parent, "parent_index", "int64");
    same_len(in_src, "in_src", in_rec, "in_rec");
    const uint64_t* given = nullptr;
    if (out_rec) {
      given = u64(*out_rec, "out_rec");
      same_len(parent, "parent_index", *out_rec, "out_rec");
    }
    size_t n_in = size_t(in_src.size()), n_out = size_t(parent.size());
    U64Array out_src(static_cast<py::ssize_t>(n_out)), out_ids(static_cast<py::ssize_t>(n_out));
    uint64_t* os = out_src.mutable_data();
    uint64_t* orr = out_ids.mutable_data();
    std::vector<uint64_t> ev_src, ev_xor;
    {
      py::gil_scoped_release nogil;
      xorack::anchor(s, r, n_in, pi, n_out, given, os, orr, ev_src, ev_xor);
    }
    return py::make_tuple(out_src, out_ids, to_array(ev_src), to_array(ev_xor));
  });

  m.def("random_read_rate", [](size_t nbytes, size_t reads, uint64_t seed, bool thread_cpu) {
    py::gil_scoped_release nogil;
    return xorack::random_read_rate(nbytes, reads, seed, thread_cpu);
  }, py::arg("nbytes"), py::arg("reads"), py::arg("seed") = 1, py::arg("thread_cpu") = false,
  "Random 64-byte reads per second over an array of nbytes (the AckTable benchmark's yardstick); "
  "thread_cpu=True times them in the thread's CPU time instead of wall time.");
}

PYBIND11_MODULE(_native, m) {
    m.doc() = "xorack native kernels (C++). Use the checked API in the xorack package.";
    bind_acker(m);
    bind_spark_hash(m);
}
