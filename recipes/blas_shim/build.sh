#!/usr/bin/env bash
# Build the shim against the OpenBLAS of the active Python's numpy and print
# the environment to run a long job with it, e.g.
#   eval "$(bash recipes/blas_shim/build.sh)"; dflash2 train ...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
libs=$(python -c "import numpy, os; print(os.path.join(os.path.dirname(numpy.__file__), '..', 'numpy.libs'))")
lib=$(ls "$libs"/libscipy_openblas64_*.so | head -1)
out="$here/build"; mkdir -p "$out"
gcc -O2 -shared -fPIC -o "$out/libcblas_shim.so" "$here/cblas_shim.c" "$lib" -Wl,-rpath,"$(dirname "$lib")"
echo "export LD_PRELOAD=$out/libcblas_shim.so OPENBLAS_NUM_THREADS=1"
