#!/usr/bin/env bash
# Sharded acker scaling on a machine with the cores (issue 27, item 5), in one go, offline:
#   1. build and install xorack with its C++ extension (pip, no network, no build isolation:
#      scikit-build-core, pybind11, cmake and ninja must be there already);
#   2. check the installed package imports with the native kernels (outside the checkout);
#   3. benchmarks/bench_shards.py for 1/2/4/8/16 shards with 8 and 16 client processes, each
#      cell with each way of sending (SEND: direct = a request per shard per batch; split = 64K
#      requests per shard, each batch split then copied into the shards' buffers; coalesced =
#      the same scattered straight into them; background = coalesced, sent by the buffer's
#      thread while the client goes on), interleaved; a compact table per client count.
# Run from the repository root:  bash benchmarks/device_shards.sh   (~3-5 min on 16 cores)
# Results go to $OUT/ when OUT is set (else a temporary directory): device_shards.log (all of
# this script's output), shards_<clients>.json and .md (the cells and their table).
# Smaller runs (a smoke test): SHARDS=1,2 CLIENTS=2 SEND=coalesced RECORDS=65536 BATCHES=2 ROUNDS=1 bash ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-$(mktemp -d -t xorack-shards-XXXX)}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/device_shards.log"
exec > >(tee "$LOG") 2>&1

SHARDS=${SHARDS:-1,2,4,8,16}
CLIENTS=${CLIENTS:-8 16}
SEND=${SEND:-direct,split,coalesced,background}
RECORDS=${RECORDS:-131072}
BATCHES=${BATCHES:-16}
ROUNDS=${ROUNDS:-5}
PY=${PYTHON:-python3}
unset PYTHONPATH XORACK_BACKEND # the installed package, its native kernels

fail() {
    echo "device_shards: FAILED: $*"
    echo "device_shards: log in $LOG"
    exit 1
}

echo "== machine: $(nproc) cores, $(uname -srm), $($PY --version 2>&1), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== repo: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --short 2>/dev/null | wc -l) changed files"

echo "== build prerequisites"
$PY - <<'EOF' || fail "a build prerequisite is missing (see above): the build needs them offline"
import importlib, shutil, sys
missing = []
for mod in ("scikit_build_core", "pybind11", "numpy", "pyarrow", "pandas"):
    try:
        m = importlib.import_module(mod)
        print(f"  {mod} {getattr(m, '__version__', '?')}")
    except ImportError:
        missing.append(mod)
for tool, module in (("cmake", "cmake"), ("ninja", "ninja")):
    path = shutil.which(tool)
    if path is None:
        try:
            importlib.import_module(module)
            path = f"python package {module}"
        except ImportError:
            missing.append(tool)
    print(f"  {tool}: {path}")
if missing:
    print("  MISSING:", ", ".join(missing))
    sys.exit(1)
EOF

echo "== build and install (pip install --no-build-isolation --no-deps .)"
BUILD_DIR="$OUT_DIR/build"
t0=$(date +%s)
built=0
# 1. as is; 2. in a fresh build directory; 3. the same into an externally managed Python
for extra in "" "-Cbuild-dir=$BUILD_DIR" "-Cbuild-dir=$BUILD_DIR --break-system-packages"; do
    # shellcheck disable=SC2086
    if PIP_NO_INDEX=1 $PY -m pip install -q --no-build-isolation --no-deps $extra . \
        >"$OUT_DIR/pip.log" 2>&1; then
        built=1
        break
    fi
    echo "  pip install --no-build-isolation --no-deps $extra . FAILED; its last lines:"
    tail -12 "$OUT_DIR/pip.log" | sed 's/^/    /'
done
[ "$built" = 1 ] || fail "pip could not build and install xorack (logs above, $OUT_DIR/pip.log)"
echo "  built and installed in $(($(date +%s) - t0)) s"

echo "== the installed package"
(cd / && $PY -c "import xorack, sys; print('  xorack', xorack.__version__, 'from', xorack.__file__, 'backend', xorack.backend); sys.exit(xorack.backend != 'native')") ||
    fail "the installed xorack does not load its native extension (backend above)"

status=0
for clients in $CLIENTS; do
    echo "== bench_shards: $clients clients, shards $SHARDS, sends $SEND (interleaved)"
    t0=$(date +%s)
    if $PY benchmarks/bench_shards.py --clients "$clients" --shards "$SHARDS" \
        --send "$SEND" --records "$RECORDS" --batches "$BATCHES" --rounds "$ROUNDS" \
        --out "$OUT_DIR/shards_$clients.json" >"$OUT_DIR/shards_$clients.md" 2>"$OUT_DIR/shards_$clients.err"; then
        cat "$OUT_DIR/shards_$clients.md"
    else
        status=1
        echo "  bench_shards FAILED for $clients clients:"
        tail -20 "$OUT_DIR/shards_$clients.err"
    fi
    echo "  ($(($(date +%s) - t0)) s)"
done

echo "== summary (events/s vs 1 shard; acker CPU per 1K events), from $OUT_DIR/shards_*.json"
$PY - "$OUT_DIR" <<'EOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("shards_*.json")):
    data = json.loads(path.read_text())
    cells = data["cells"]
    for send in ("direct", "split", "coalesced", "background"):
        row = {c["shards"]: c for c in cells if c["send"] == send}
        if 1 not in row:
            continue
        base = row[1]["xor_events_per_s"]
        parts = [
            f"{n}: {c['xor_events_per_s'] / 1e6:.1f}M ({c['xor_events_per_s'] / base:.2f}x, "
            f"{c['acker_cpu_us_per_1k_events']:.0f}us)"
            for n, c in sorted(row.items())
        ]
        print(f"  {cells[0]['clients']} clients {send:9s} " + "; ".join(parts))
EOF
echo "== done: results in $OUT_DIR"
exit $status
