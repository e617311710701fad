$PRELUDE$

// One thread per element (grid-stride loop); every operand addressed through its own layout.
extern "C" __global__ void __launch_bounds__(256) $NAME$(
    $PARAMS$)
{
    for (kn_idx i = (kn_idx)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (kn_idx)gridDim.x * blockDim.x) {
$BODY$
    }
}
