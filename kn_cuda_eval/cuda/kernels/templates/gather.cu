$PRELUDE$

// out[.., j, ..] = x[.., indices[j], ..]; an index outside [0, axis_size) sets bit 0 of the
// plan's status word and stores 0, so the host can raise after the run.
extern "C" __global__ void __launch_bounds__(256) $NAME$(
    $PARAMS$)
{
    for (kn_idx i = (kn_idx)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (kn_idx)gridDim.x * blockDim.x) {
$BODY$
    }
}
