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
template <typename T> __device__ __forceinline__ T kn_pymod_i(T a, T b) {
    if (b == 0) return 0;
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> __device__ __forceinline__ T kn_ifmod(T a, T b) { return b == 0 ? 0 : a % b; }
template <typename T> __device__ __forceinline__ T kn_idiv(T a, T b) { return b == 0 ? 0 : a / b; }
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
template <typename T> __device__ __forceinline__ T kn_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename T> __device__ __forceinline__ T kn_warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = kn_fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
