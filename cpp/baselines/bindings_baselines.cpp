// Benchmark baselines (not used by xorack itself).
#include <pybind11/pybind11.h>

PYBIND11_MODULE(_baselines, m) { m.doc() = "xorack benchmark baselines"; }
