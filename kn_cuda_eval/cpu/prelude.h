// Kyanite host kernels: the C spelling of what the CUDA prelude (cuda/kernels/templates/prelude.cu)
// and the CUDA headers give the shared expression table (codegen/exprs.py): half, __half2float,
// kn_fmin, kn_idiv, ... . Written for C11 (gnu11) and the system compiler; everything is static
// inline so the vectorizer sees through it.
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define KN_INF __builtin_inff()

static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int kn_float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }

// -- f16 storage -------------------------------------------------------------------------------
#ifndef KN_SOFT_HALF
typedef _Float16 half;
static inline float __half2float(half h) { return (float)h; }
static inline half __float2half(float f) { return (half)f; }
static inline half __double2half(double d) { return (half)d; }
#else
// no _Float16: IEEE binary16 bits in a uint16_t, converted in software (round to nearest even)
typedef uint16_t half;
static inline float __half2float(half h) {
    const uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float f;
    if (e == 0x1fu) { uint32_t b = s | 0x7f800000u | (m << 13); memcpy(&f, &b, 4); return f; }
    if (e == 0) { f = (float)m * 5.9604644775390625e-8f; return s ? -f : f; }  // m * 2^-24
    uint32_t b = s | ((e + 112u) << 23) | (m << 13);
    memcpy(&f, &b, 4);
    return f;
}
static inline half kn_half_from_double(double d) {
    const uint16_t s = signbit(d) ? 0x8000u : 0;
    const double a = fabs(d);
    if (a != a) return (half)(s | 0x7e00u);
    if (a >= 65520.0) return (half)(s | 0x7c00u);  // rounds past the largest half
    if (a < 6.103515625e-05) {  // subnormal: multiples of 2^-24, ties to even
        return (half)(s | (uint16_t)nearbyint(a * 16777216.0));
    }
    int e;
    const double fr = frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1)
    double m = nearbyint(fr * 2048.0);  // 11 significant bits
    if (m == 2048.0) { m = 1024.0; e += 1; }
    return (half)(s | (uint16_t)((e + 14) << 10) | (uint16_t)((int)m - 1024));
}
static inline half __float2half(float f) { return kn_half_from_double((double)f); }
static inline half __double2half(double d) {
    // one rounding from double: the software path rounds the double itself
    return kn_half_from_double(d);
}
#endif

// -- helpers of the expression table (same semantics as prelude.cu) ----------------------------
#define KN_FLOAT_HELPERS(T, S, FMOD)                                                            \
    static inline T kn_fmin_##S(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); } \
    static inline T kn_fmax_##S(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); } \
    static inline T kn_pymod_f_##S(T a, T b) {                                                  \
        T r = FMOD(a, b);                                                                       \
        return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;                                    \
    }
KN_FLOAT_HELPERS(float, f, fmodf)
KN_FLOAT_HELPERS(double, d, fmod)

// Division and remainder by 0, and (signed) by -1, are answered without dividing: C leaves x / 0
// and INT_MIN / -1 undefined and x86's idiv traps (SIGFPE) on both. As the reference executor:
// x / 0 = 0, x % 0 = 0, x / -1 = -x wrapping (INT_MIN / -1 = INT_MIN, as onnxruntime), x % -1 = 0.
// KN_ZERO_OR_MINUS_ONE is one unsigned compare, the same cost as the zero test it replaces.
#define KN_ZERO_OR_MINUS_ONE(T, U, b) ((T)-1 < (T)0 ? (U)((U)(b) + 1u) <= 1u : (b) == 0)
#define KN_INT_HELPERS(T, S, U)                                                                 \
    static inline T kn_pymod_i_##S(T a, T b) {                                                  \
        if (KN_ZERO_OR_MINUS_ONE(T, U, b)) return 0;                                            \
        T r = (T)(a % b);                                                                       \
        return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;                               \
    }                                                                                           \
    static inline T kn_ifmod_##S(T a, T b) {                                                    \
        return KN_ZERO_OR_MINUS_ONE(T, U, b) ? (T)0 : (T)(a % b);                               \
    }                                                                                           \
    static inline T kn_idiv_##S(T a, T b) {                                                     \
        if (KN_ZERO_OR_MINUS_ONE(T, U, b)) return b == 0 ? (T)0 : (T)((U)0 - (U)a);             \
        return (T)(a / b);                                                                      \
    }                                                                                           \
    static inline T kn_ipow_##S(T a, T b) {                                                     \
        if (b < 0) return a == 1 ? 1 : (a == (T)-1 ? ((b & 1) ? (T)-1 : 1) : 0);                \
        T r = 1;                                                                                \
        while (b) { if (b & 1) r = (T)(r * a); a = (T)(a * a); b >>= 1; }                       \
        return r;                                                                               \
    }                                                                                           \
    static inline T kn_shl_##S(T a, T b) {                                                      \
        return (b < 0 || b >= (T)(8 * sizeof(T))) ? (T)0 : (T)(a << b);                         \
    }                                                                                           \
    static inline T kn_shr_##S(T a, T b) {                                                      \
        return (b < 0 || b >= (T)(8 * sizeof(T))) ? (T)(a < 0 ? -1 : 0) : (T)(a >> b);          \
    }
KN_INT_HELPERS(signed char, i8, unsigned char)
KN_INT_HELPERS(short, i16, unsigned short)
KN_INT_HELPERS(int, i32, unsigned int)
KN_INT_HELPERS(long, il, unsigned long)
KN_INT_HELPERS(long long, i64, unsigned long long)
KN_INT_HELPERS(unsigned char, u8, unsigned char)
KN_INT_HELPERS(unsigned short, u16, unsigned short)
KN_INT_HELPERS(unsigned int, u32, unsigned int)
KN_INT_HELPERS(unsigned long, ul, unsigned long)
KN_INT_HELPERS(unsigned long long, u64, unsigned long long)

#define KN_INT_GENERIC(F, a, b)                                                                 \
    _Generic((a), signed char: F##_i8, short: F##_i16, int: F##_i32, long: F##_il,              \
             long long: F##_i64, unsigned char: F##_u8, unsigned short: F##_u16,                \
             unsigned int: F##_u32, unsigned long: F##_ul, unsigned long long: F##_u64)(a, b)
#define kn_fmin(a, b) _Generic((a), float: kn_fmin_f, double: kn_fmin_d)(a, b)
#define kn_fmax(a, b) _Generic((a), float: kn_fmax_f, double: kn_fmax_d)(a, b)
#define kn_pymod_f(a, b) _Generic((a), float: kn_pymod_f_f, double: kn_pymod_f_d)(a, b)
#define kn_pymod_i(a, b) KN_INT_GENERIC(kn_pymod_i, a, b)
#define kn_ifmod(a, b) KN_INT_GENERIC(kn_ifmod, a, b)
#define kn_idiv(a, b) KN_INT_GENERIC(kn_idiv, a, b)
#define kn_ipow(a, b) KN_INT_GENERIC(kn_ipow, a, b)
#define kn_shl(a, b) KN_INT_GENERIC(kn_shl, a, b)
#define kn_shr(a, b) KN_INT_GENERIC(kn_shr, a, b)
// the bit cast of the expression table (the CUDA prelude defines the same macro)
#define KN_BITCAST(To, From, x) \
    ({ From kn_bc_in_ = (x); To kn_bc_out_; memcpy(&kn_bc_out_, &kn_bc_in_, sizeof(To)); kn_bc_out_; })

// -- vectorizable f32 exp, tanh and erf ---------------------------------------------------------
// Branch-free (every path computed, then selected), so loops calling them vectorize; libm's
// scalar calls do not. Accuracy: exp and tanh about 1 ulp, erf within 2.5 ulp of the correctly
// rounded result (checked against scipy in tests/kn_cuda_eval/cpu/test_executor.py).
static inline float kn_exp2i(int n) { return __int_as_float((n + 127) << 23); }

static inline float kn_expf(float x) {
    const float xc = x > 88.72283935546875f ? 88.72283935546875f : (x < -103.97208f ? -103.97208f : x);
    const float t = xc * 1.44269504088896341f;
    const float n = (t + 12582912.0f) - 12582912.0f;  // rint in the default rounding mode
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    const int ni = (int)n;
    const int n1 = ni / 2;  // two factors keep 2^n normal down to subnormal results
    const float res = y * kn_exp2i(n1) * kn_exp2i(ni - n1);
    return x != x ? x : (x > 88.72283935546875f ? KN_INF : (x < -103.97208f ? 0.0f : res));
}

static inline float kn_tanhf(float x) {
    const float a = fabsf(x);
    const float z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    const float small = p * z * x + x;
    const float e = kn_expf(2.0f * (a > 20.0f ? 20.0f : a));
    const float big = 1.0f - 2.0f / (e + 1.0f);
    const float r = a < 0.625f ? small : (x < 0 ? -big : big);
    return x != x ? x : r;
}

static inline float kn_erff(float x) {
    const float a = fabsf(x);
    const float s = a * a;
    float p = 8.227343641920015e-05f;  // erf(a)/a as a polynomial in a^2 on [0, 0.9]
    p = p * s - 0.0008109858026728034f;
    p = p * s + 0.005198286380618811f;
    p = p * s - 0.02685839869081974f;
    p = p * s + 0.1128368079662323f;
    p = p * s - 0.37612631916999817f;
    p = p * s + 1.128379225730896f;
    const float small = p * a;
    const float t = a > 4.0f ? 4.0f : a;  // log(erfc(t)) + t^2 as a polynomial on [0.85, 4]
    float q = 2.585951186517832e-08f;
    q = q * t - 7.522892815359228e-07f;
    q = q * t + 9.691824743640609e-06f;
    q = q * t - 7.130781887099147e-05f;
    q = q * t + 0.0003100782632827759f;
    q = q * t - 0.0005866701249033213f;
    q = q * t - 0.0020297968294471502f;
    q = q * t + 0.022052695974707603f;
    q = q * t - 0.10532823204994202f;
    q = q * t + 0.3648276925086975f;
    q = q * t - 1.1288601160049438f;
    q = q * t + 7.112443563528359e-05f;
    const float large = 1.0f - kn_expf(q - t * t);
    const float r = a < 0.9f ? small : large;
    return x != x ? x : (x < 0 ? -r : r);
}

// the table's f32 calls, mapped onto the vectorizable versions
#define expf kn_expf
#define tanhf kn_tanhf
#define erff kn_erff

// -- work split -----------------------------------------------------------------------------------
// A parallel step is a region function run over n units of work: by the process's thread pool
// (pool.c) in chunks claimed dynamically, on the calling thread and the pool's workers, or all on
// the calling thread when the step is small. The region loops `while (kn_next(t, &lo, &hi))` over
// the chunks it gets; every unit is computed by one thread, as it would be alone, so the results
// do not depend on the split.
typedef struct kn_task {
    long long lo, hi;          // a chunk claimed and not yet handed out (none when lo == hi)
    long long n, cs;           // the job: n units in chunks of cs
    unsigned long long word;   // the job's epoch (pool.c)
    unsigned int nchunks;
    int pooled;                // 0: no chunks after [lo, hi) (the serial path)
} kn_task;
typedef void (*kn_body)(kn_task*, char*, const long long*, const double*);

#ifdef KN_POOL_SOURCE
#define KN_CHUNKS_PER_THREAD 4  // chunks per participating thread: balance against claim costs
#define KN_CHUNK_WORK 16384     // the least work (csource's weight units) worth a chunk of its own

// Units per chunk of a job of n units and `work` weight on `threads` threads (the caller's
// included): one chunk per KN_CHUNK_WORK of work, at least one per thread, at most
// KN_CHUNKS_PER_THREAD per thread (pool.c and ompool.c split jobs alike).
static inline long long kn_chunk_units(long long n, long long work, int threads) {
    long long want = work / KN_CHUNK_WORK;
    const long long most = (long long)threads * KN_CHUNKS_PER_THREAD;
    want = want < threads ? threads : (want > most ? most : want);
    want = want < n ? want : n;
    return (n + want - 1) / want;
}
#endif

#ifndef KN_POOL_SOURCE
#ifndef KN_PAR_WORK
#define KN_PAR_WORK 65536
#endif
// the pool's entry points, set by kn_bind_pool (unset: every step runs on the calling thread)
extern __attribute__((visibility("hidden"))) void (*kn_run_pool)(
    kn_body, char*, const long long*, const double*, long long, long long);
extern __attribute__((visibility("hidden"))) int (*kn_next_chunk)(kn_task*, long long*, long long*);

static inline int kn_next(kn_task* t, long long* lo, long long* hi) {
    if (t->lo < t->hi) {
        *lo = t->lo;
        *hi = t->hi;
        t->lo = t->hi;
        return 1;
    }
    return t->pooled && kn_next_chunk(t, lo, hi);
}

// `body` over n units; `work` (units times their weight) decides whether threads are worth it
static inline void kn_parallel(kn_body body, char* base, const long long* p, const double* f,
                               long long n, long long work) {
    if (n <= 0) return;
    if (n > 1 && work > KN_PAR_WORK && kn_run_pool) {
        kn_run_pool(body, base, p, f, n, work);
        return;
    }
    kn_task t = {.lo = 0, .hi = n, .n = n, .cs = n, .word = 0, .nchunks = 1, .pooled = 0};
    body(&t, base, p, f);
}
#endif
