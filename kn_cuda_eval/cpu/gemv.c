/* Products of a few rows with constant float weights that oneDNN packed in column strips: the
   decode step of a language model, one or a few rows against every weight matrix.

   oneDNN's matmul packs a constant weight W [k, n] into a blocked layout such as BA16a64b:
   strips of B columns, each strip contiguous with row i of W at strip + i * B (its 16-row
   blocks of B columns follow one another). Its M=1 kernel reads that layout at 18-32 GB/s on
   2 cores; reading each strip once, front to back, with two sums per column (even and odd
   rows: twice the FMAs in flight), reaches up to 50 GB/s (benchmarks/RESULTS.md).
   The prefill's primitives keep using the same packed weights: one copy in memory.

   kn_gemv(q): q = {x, ldx, y, ldy, w, strip, k, n, rows, B, threads, alpha, beta} (x, y, w
   addresses; alpha and beta the bits of doubles): y[r][j] = alpha * sum_i x[r][i] * W[i][j]
   + beta * y[r][j] for r < rows, j < n (beta 0: y is only written). Returns 0, or 1 for a strip
   width or row count it was not built for (the caller checks first). */

#include <string.h>

#define KN_MAX_ROWS 4

#define KN_GEMV(B, R)                                                                         \
    static void kn_gemv_##B##_##R(const float* restrict x, long long ldx, float* restrict y,  \
                                  long long ldy, const float* restrict w, long long strip,    \
                                  long long k, long long n, float alpha, float beta,          \
                                  int threads) {                                              \
        long long strips = (n + B - 1) / B;                                                   \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                     \
        for (long long s = 0; s < strips; ++s) {                                              \
            float acc[R][B], odd[R][B]; /* two sums: twice the FMAs in flight */             \
            memset(acc, 0, sizeof acc);                                                       \
            memset(odd, 0, sizeof odd);                                                       \
            const float* restrict ws = w + s * strip;                                         \
            long long i = 0;                                                                  \
            for (; i + 1 < k; i += 2) {                                                       \
                const float* restrict row = ws + i * B;                                       \
                for (int r = 0; r < R; ++r) {                                                 \
                    float xv = x[r * ldx + i], xu = x[r * ldx + i + 1];                       \
                    for (int c = 0; c < B; ++c) acc[r][c] += xv * row[c];                     \
                    for (int c = 0; c < B; ++c) odd[r][c] += xu * row[B + c];                 \
                }                                                                             \
            }                                                                                 \
            if (i < k)                                                                        \
                for (int r = 0; r < R; ++r)                                                   \
                    for (int c = 0; c < B; ++c) acc[r][c] += x[r * ldx + i] * ws[i * B + c];  \
            for (int r = 0; r < R; ++r)                                                       \
                for (int c = 0; c < B; ++c) acc[r][c] += odd[r][c];                           \
            long long j0 = s * B, cols = n - j0 < B ? n - j0 : B;                             \
            for (int r = 0; r < R; ++r) {                                                     \
                float* out = y + r * ldy + j0;                                                \
                if (beta == 0.0f)                                                             \
                    for (long long c = 0; c < cols; ++c) out[c] = alpha * acc[r][c];          \
                else                                                                          \
                    for (long long c = 0; c < cols; ++c)                                      \
                        out[c] = alpha * acc[r][c] + beta * out[c];                           \
            }                                                                                 \
        }                                                                                     \
    }

#define KN_GEMV_ROWS(B) KN_GEMV(B, 1) KN_GEMV(B, 2) KN_GEMV(B, 3) KN_GEMV(B, 4)
KN_GEMV_ROWS(8)
KN_GEMV_ROWS(16)
KN_GEMV_ROWS(24)
KN_GEMV_ROWS(32)
KN_GEMV_ROWS(48)
KN_GEMV_ROWS(64)

typedef void (*kn_gemv_fn)(const float*, long long, float*, long long, const float*, long long,
                           long long, long long, float, float, int);

#define KN_GEMV_PICK(B) \
    case B: { static const kn_gemv_fn f[] = {kn_gemv_##B##_1, kn_gemv_##B##_2, kn_gemv_##B##_3, kn_gemv_##B##_4}; fn = f[rows - 1]; break; }

static double kn_bits(long long v) {
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}

int kn_gemv_strips(long long b) {
    return b == 8 || b == 16 || b == 24 || b == 32 || b == 48 || b == 64;
}

int kn_gemv(const long long* q) {
    long long rows = q[8], b = q[9];
    if (rows < 1 || rows > KN_MAX_ROWS) return 1;
    kn_gemv_fn fn = 0;
    switch (b) {
        KN_GEMV_PICK(8)
        KN_GEMV_PICK(16)
        KN_GEMV_PICK(24)
        KN_GEMV_PICK(32)
        KN_GEMV_PICK(48)
        KN_GEMV_PICK(64)
        default: return 1;
    }
    fn((const float*)q[0], q[1], (float*)q[2], q[3], (const float*)q[4], q[5], q[6], q[7],
       (float)kn_bits(q[11]), (float)kn_bits(q[12]), (int)q[10]);
    return 0;
}
