// Kyanite generated kernel: $NAME$ — helpers shared by every kernel.
$INCLUDES$

#define KN_INF __int_as_float(0x7f800000)

typedef $IDX$ kn_idx;

template <typename T> __device__ __forceinline__ T kn_fmin(T a, T b) {
    return (a != a) ? a : ((b != b) ? b : (a < b ? a : b));  // NaN propagates, as np.minimum
}
template <typename T> __device__ __forceinline__ T kn_fmax(T a, T b) {
    return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));
}
template <typename T> __device__ __forceinline__ T kn_pymod_f(T a, T b) {
    T r = fmod(a, b);  // the sign of the divisor, as Python and np.mod
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// Division and remainder by 0, and (signed) by -1, are answered without dividing: C++ leaves
// x / 0 and INT_MIN / -1 undefined (the host checker's x86 idiv traps on both). As the reference:
// x / 0 = 0, x % 0 = 0, x / -1 = -x wrapping (INT_MIN / -1 = INT_MIN), x % -1 = 0.
template <typename T> struct kn_unsigned { typedef T type; };  // unsigned types map to themselves
template <> struct kn_unsigned<signed char> { typedef unsigned char type; };
template <> struct kn_unsigned<short> { typedef unsigned short type; };
template <> struct kn_unsigned<int> { typedef unsigned int type; };
template <> struct kn_unsigned<long> { typedef unsigned long type; };
template <> struct kn_unsigned<long long> { typedef unsigned long long type; };
template <typename T> __device__ __forceinline__ bool kn_zero_or_minus_one(T b) {
    typedef typename kn_unsigned<T>::type U;
    return (T)-1 < (T)0 ? (U)((U)b + 1u) <= 1u : b == 0;  // one unsigned compare
}
template <typename T> __device__ __forceinline__ T kn_pymod_i(T a, T b) {
    if (kn_zero_or_minus_one(b)) return 0;
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> __device__ __forceinline__ T kn_ifmod(T a, T b) {
    return kn_zero_or_minus_one(b) ? (T)0 : (T)(a % b);
}
template <typename T> __device__ __forceinline__ T kn_idiv(T a, T b) {
    typedef typename kn_unsigned<T>::type U;
    if (kn_zero_or_minus_one(b)) return b == 0 ? (T)0 : (T)((U)0 - (U)a);
    return (T)(a / b);
}
template <typename T> __device__ __forceinline__ T kn_ipow(T a, T b) {
    if (b < 0) return a == 1 ? 1 : (a == (T)-1 ? ((b & 1) ? (T)-1 : 1) : 0);
    T r = 1;
    while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
    return r;
}
template <typename T> __device__ __forceinline__ T kn_shl(T a, T b) {
    return (b < 0 || b >= (T)(8 * sizeof(T))) ? (T)0 : (T)(a << b);
}
template <typename T> __device__ __forceinline__ T kn_shr(T a, T b) {
    return (b < 0 || b >= (T)(8 * sizeof(T))) ? (T)(a < 0 ? -1 : 0) : (T)(a >> b);
}
template <typename To, typename From> __device__ __forceinline__ To kn_bitcast(From x) {
    return *reinterpret_cast<const To*>(&x);  // same size, checked by the planner
}
// the expression table's spelling of a bit cast, shared with the C prelude of the CPU backend
#define KN_BITCAST(To, From, x) kn_bitcast<To, From>(x)
template <typename T> __device__ __forceinline__ T kn_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename T> __device__ __forceinline__ T kn_warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = kn_fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
