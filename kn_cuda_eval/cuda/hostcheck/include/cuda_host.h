// CUDA semantics for the host: enough of CUDA C++ for the generated kernels to compile with g++
// and run on the CPU exactly as launched. The threads of a block are fibers of the runtime
// (runtime.cpp, loaded once); they switch only at barriers (__syncthreads, warp shuffles and
// votes). Blocks run one after another, so __shared__ is static storage, shared by the block's
// fibers. This header only declares the runtime: a kernel's translation unit stays small.
#ifndef KN_CUDA_HOST_H
#define KN_CUDA_HOST_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

// -- qualifiers --------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static  // blocks run one at a time: static storage is the block's storage
// __restrict__ is a g++ keyword already

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
};

// -- bit casts and the math intrinsics ---------------------------------------------------------
template <typename To, typename From> inline To kn_host_bits(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between types of different sizes");
    To r;
    memcpy(&r, &v, sizeof r);
    return r;
}
inline float __int_as_float(int x) { return kn_host_bits<float>(x); }
inline int __float_as_int(float x) { return kn_host_bits<int>(x); }
inline float __uint_as_float(unsigned int x) { return kn_host_bits<float>(x); }
inline unsigned int __float_as_uint(float x) { return kn_host_bits<unsigned int>(x); }
inline double __longlong_as_double(long long x) { return kn_host_bits<double>(x); }
inline long long __double_as_longlong(double x) { return kn_host_bits<long long>(x); }

// the fast intrinsics are computed exactly here (the GPU's are approximations within its
// documented error; the emulator computes exactly too)
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fmaf_rn(float x, float y, float z) { return fmaf(x, y, z); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
template <typename T> inline T __ldg(const T* p) { return *p; }

// -- f16: a software half, conversions rounding to nearest even --------------------------------
struct __half {
    unsigned short x;
};
typedef __half half;

inline unsigned short kn_host_half_bits(double d) {  // one rounding, from double (exact for float)
    const unsigned short s = signbit(d) ? 0x8000 : 0;
    const double a = fabs(d);
    if (a != a) return s | 0x7e00;
    if (a >= 65520.0) return s | 0x7c00;  // the midpoint 65520 rounds to even: infinity
    if (a < 6.103515625e-05) return s | (unsigned short)nearbyint(a * 16777216.0);  // subnormal
    int e;
    frexp(a, &e);  // a in [2^(e-1), 2^e)
    unsigned int mant = (unsigned int)nearbyint(ldexp(a, 11 - e));  // in [1024, 2048]
    unsigned int exp = (unsigned int)(e + 14);
    if (mant == 2048) {
        mant = 1024;
        exp += 1;
    }
    return exp >= 31 ? (unsigned short)(s | 0x7c00) : (unsigned short)(s | (exp << 10) | (mant - 1024));
}
inline float __half2float(half h) {
    const unsigned int s = (h.x & 0x8000u) << 16;
    const unsigned int e = (h.x >> 10) & 0x1f;
    const unsigned int m = h.x & 0x3ff;
    if (e == 31) return kn_host_bits<float>(s | 0x7f800000u | (m << 13));
    if (e == 0) {
        const float v = ldexpf((float)m, -24);
        return s ? -v : v;
    }
    return kn_host_bits<float>(s | ((e + 112) << 23) | (m << 13));
}
inline half __float2half(float f) { return half{kn_host_half_bits(f)}; }
inline half __float2half_rn(float f) { return half{kn_host_half_bits(f)}; }
inline half __double2half(double d) { return half{kn_host_half_bits(d)}; }
inline unsigned short __half_as_ushort(half h) { return h.x; }
inline half __ushort_as_half(unsigned short x) { return half{x}; }
inline short __half_as_short(half h) { return (short)h.x; }
inline half __short_as_half(short x) { return half{(unsigned short)x}; }

// -- the runtime (runtime.cpp) ------------------------------------------------------------------
namespace kn_host {

// what Python passes: the launch configuration and the kernel's parameters packed as CUDA packs
// them (each at an offset aligned to its size), with one type code per parameter
struct LaunchDesc {
    unsigned int grid[3];
    unsigned int block[3];
    unsigned long long shared_mem;
    const unsigned char* args;
    unsigned long long args_size;
    const char* codes;  // 'p' pointer, 'i'/'l' 32/64-bit integer, 'f' float, 'd' double
    char* error;
    unsigned long long error_size;
};

extern uint3 g_thread_idx, g_block_idx;  // of the running fiber
extern dim3 g_block_dim, g_grid_dim;
extern int g_lane;

void sync_block();
void sync_warp(unsigned int mask);
unsigned long long exchange(unsigned int mask, unsigned long long value, int src_lane);
unsigned int vote(unsigned int mask, bool pred);
unsigned int active_mask();
// every block of the grid, every thread a fiber running body(ctx); 0, or an error in d->error
int run_grid(const LaunchDesc* d, void (*body)(void*), void* ctx);

}  // namespace kn_host

#define threadIdx (::kn_host::g_thread_idx)
#define blockIdx (::kn_host::g_block_idx)
#define blockDim (::kn_host::g_block_dim)
#define gridDim (::kn_host::g_grid_dim)
#define warpSize 32

// -- barriers, shuffles, votes: lockstep over the lanes of the mask ----------------------------
inline void __syncthreads() { kn_host::sync_block(); }
inline void __syncwarp(unsigned int mask = 0xffffffffu) { kn_host::sync_warp(mask); }
inline unsigned int __activemask() { return kn_host::active_mask(); }

namespace kn_host {
template <typename T> inline T shuffle(unsigned int mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    unsigned long long raw = 0;
    memcpy(&raw, &v, sizeof v);
    raw = exchange(mask, raw, src);
    T r;
    memcpy(&r, &raw, sizeof r);
    return r;
}
}  // namespace kn_host

template <typename T> inline T __shfl_sync(unsigned int mask, T v, int src, int width = 32) {
    const int lane = kn_host::g_lane;
    return kn_host::shuffle(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename T> inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = 32) {
    const int lane = kn_host::g_lane;
    const int src = lane ^ lane_mask;
    const bool later = (src & ~(width - 1)) > (lane & ~(width - 1));  // a later group: own value
    return kn_host::shuffle(mask, v, later || src >= 32 ? lane : src);
}
template <typename T> inline T __shfl_up_sync(unsigned int mask, T v, unsigned int delta, int width = 32) {
    const int lane = kn_host::g_lane;
    const int src = lane - (int)delta;
    return kn_host::shuffle(mask, v, src < (lane & ~(width - 1)) ? lane : src);
}
template <typename T> inline T __shfl_down_sync(unsigned int mask, T v, unsigned int delta, int width = 32) {
    const int lane = kn_host::g_lane;
    const int src = lane + (int)delta;
    return kn_host::shuffle(mask, v, src >= (lane & ~(width - 1)) + width ? lane : src);
}
inline unsigned int __ballot_sync(unsigned int mask, int pred) { return kn_host::vote(mask, pred != 0); }
inline int __all_sync(unsigned int mask, int pred) { return kn_host::vote(mask, pred != 0) == mask; }
inline int __any_sync(unsigned int mask, int pred) { return kn_host::vote(mask, pred != 0) != 0; }

// -- atomics: fibers never switch inside one, so a plain read-modify-write is atomic ----------
template <typename T> inline T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> inline T atomicSub(T* p, T v) { T o = *p; *p = o - v; return o; }
template <typename T> inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
template <typename T> inline T atomicMin(T* p, T v) { T o = *p; *p = v < o ? v : o; return o; }
template <typename T> inline T atomicMax(T* p, T v) { T o = *p; *p = v > o ? v : o; return o; }
template <typename T> inline T atomicAnd(T* p, T v) { T o = *p; *p = o & v; return o; }
template <typename T> inline T atomicOr(T* p, T v) { T o = *p; *p = o | v; return o; }
template <typename T> inline T atomicXor(T* p, T v) { T o = *p; *p = o ^ v; return o; }
template <typename T> inline T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }

// -- the launcher: unpack the argument buffer by the kernel's own parameter types ---------------
namespace kn_host {

template <typename T> constexpr char code_of() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<U>) return 'p';
    else if constexpr (std::is_same_v<U, float>) return 'f';
    else if constexpr (std::is_same_v<U, double>) return 'd';
    else if constexpr (std::is_integral_v<U> && sizeof(U) == 4) return 'i';
    else if constexpr (std::is_integral_v<U> && sizeof(U) == 8) return 'l';
    else return '?';
}

template <typename Tuple, size_t... I>
inline bool unpack(Tuple& t, const unsigned char* args, size_t size, std::index_sequence<I...>) {
    size_t off = 0;
    bool ok = true;
    auto one = [&](auto& field) {
        constexpr size_t n = sizeof(field);
        off = (off + n - 1) / n * n;
        if (off + n > size) ok = false;
        else memcpy(&field, args + off, n);
        off += n;
    };
    (one(std::get<I>(t)), ...);
    return ok && off == size;
}

template <typename K, typename Tuple> struct Call {
    K kernel;
    Tuple args;
    static void run(void* self) {
        Call* c = static_cast<Call*>(self);
        std::apply(c->kernel, c->args);  // by value: every thread gets its own parameters
    }
};

template <typename... A> inline int launch(void (*kernel)(A...), const LaunchDesc* d) {
    using Tuple = std::tuple<std::remove_cv_t<A>...>;
    static constexpr char codes[] = {code_of<A>()..., '\0'};
    if (strcmp(codes, d->codes) != 0) {
        snprintf(d->error, d->error_size, "the kernel takes parameters '%s', the launch passes '%s'",
                 codes, d->codes);
        return 1;
    }
    Call<void (*)(A...), Tuple> call{kernel, Tuple{}};
    if (!unpack(call.args, d->args, d->args_size, std::index_sequence_for<A...>{})) {
        snprintf(d->error, d->error_size, "the argument buffer (%llu bytes) does not fit the parameters",
                 d->args_size);
        return 1;
    }
    return run_grid(d, &Call<void (*)(A...), Tuple>::run, &call);
}

}  // namespace kn_host

// the exported entry point of one kernel's shared object
#define KN_HOST_EXPORT(kernel)                                                                    \
    extern "C" __attribute__((visibility("default"))) int kn_host_launch(                         \
        const kn_host::LaunchDesc* d) {                                                           \
        return kn_host::launch(&kernel, d);                                                       \
    }

#endif  // KN_CUDA_HOST_H
