/* Route MLX's cblas_sgemm (reference BLAS in the mlx[cpu] wheel) to the
 * OpenBLAS that numpy bundles (ILP64, symbols prefixed scipy_ and suffixed 64_).
 * A workstation trick for long offline training jobs on Linux CPUs; never used
 * by the package, its tests or its benchmarks. Build: see build.sh. */
#include <stdint.h>

typedef int64_t blasint64;
extern void scipy_cblas_sgemm64_(int order, int transa, int transb, blasint64 m, blasint64 n,
                                 blasint64 k, float alpha, const float *a, blasint64 lda,
                                 const float *b, blasint64 ldb, float beta, float *c,
                                 blasint64 ldc);

void cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    scipy_cblas_sgemm64_(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
