$PRELUDE$

// $TPR$ threads per row, 256 / $TPR$ rows per block; a block strides over row groups when the
// grid is capped. Every thread of a row group joins each group reduction (inactive rows too),
// and the trip count depends on blockIdx only, so shuffles and barriers stay uniform.
#define TPR $TPR$
#define RPB (256 / TPR)

struct KnAdd { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct KnMul { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; } };
struct KnMax { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return kn_fmax(a, b); } };
struct KnMin { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return kn_fmin(a, b); } };

template <typename T, typename F> __device__ __forceinline__ T kn_group_reduce(T v, F f) {
    for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
#if TPR > 32
    __shared__ T sh[TPR / 32];
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh[0];
    for (int k = 1; k < TPR / 32; ++k) v = f(v, sh[k]);
#endif
    return v;
}

// (value, index) pairs: the larger (smaller) value wins, NaN wins over numbers, ties go to the
// smaller index — np.argmax / np.argmin.
template <typename T> __device__ __forceinline__ bool kn_arg_better(T v, long long i, T w, long long j, bool greater) {
    if (v != v) return (w == w) || i < j;
    if (w != w) return false;
    if (v == w) return i < j;
    return greater ? v > w : v < w;
}
template <typename T> __device__ __forceinline__ void kn_group_arg(T& v, long long& i, bool greater) {
    for (int o = 16; o > 0; o >>= 1) {
        T w = __shfl_xor_sync(0xffffffffu, v, o);
        long long j = __shfl_xor_sync(0xffffffffu, i, o);
        if (kn_arg_better(w, j, v, i, greater)) { v = w; i = j; }
    }
#if TPR > 32
    __shared__ T shv[TPR / 32];
    __shared__ long long shi[TPR / 32];
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { shv[threadIdx.x >> 5] = v; shi[threadIdx.x >> 5] = i; }
    __syncthreads();
    v = shv[0]; i = shi[0];
    for (int k = 1; k < TPR / 32; ++k) if (kn_arg_better(shv[k], shi[k], v, i, greater)) { v = shv[k]; i = shi[k]; }
#endif
}

extern "C" __global__ void __launch_bounds__(256) $NAME$(
    $PARAMS$)
{
    const int lane = threadIdx.x % TPR;
    for (kn_idx first = (kn_idx)blockIdx.x * RPB; first < rows; first += (kn_idx)gridDim.x * RPB) {
        const kn_idx row = first + threadIdx.x / TPR;
        const bool active = row < rows;
$BODY$
    }
}
