$PRELUDE$

// Fused attention, one warp per query row: scores q·k_j·scale (+ mask) one key at a time with an
// online softmax in $ACC$; each lane keeps DVL accumulators of the output row (dv <= 32·DVL). A
// block strides over groups of 8 rows when the grid is capped (the trip count depends on blockIdx
// only; a warp whose row is past the end leaves: nothing but warp shuffles synchronise).
#define DVL $DVL$

extern "C" __global__ void __launch_bounds__(256) $NAME$(
    $PARAMS$)
{
    const int lane = threadIdx.x % 32;
    for (kn_idx first = (kn_idx)blockIdx.x * 8; first < batch * m; first += (kn_idx)gridDim.x * 8) {
    const kn_idx row = first + threadIdx.x / 32;
    if (row >= batch * m) break;  // whole warps leave together: row is uniform per warp
    const kn_idx b = row / m;
    const kn_idx i = row % m;
    const kn_idx b1 = b / heads;
    const kn_idx b2 = b % heads;
    const $T$* qrow = q + b1 * sq_0 + b2 * sq_1 + i * sq_2;
    $ACC$ acc[DVL];
    for (int t = 0; t < DVL; ++t) acc[t] = 0;
    $ACC$ mx = -KN_INF;
    $ACC$ l = 0;
    for (kn_idx j = 0; j < n; ++j) {
$CAUSAL$
        const $T$* krow = k + b1 * sk_0 + b2 * sk_1 + j * sk_2;
        $ACC$ dot = 0;
        for (kn_idx e = lane; e < d; e += 32) dot += $LOADQ$ * $LOADK$;
        $ACC$ s = kn_warp_sum(dot) * scale;
$MASK$
        if (s == -KN_INF) continue;
        const $ACC$ mnew = kn_fmax(mx, s);
        const $ACC$ corr = (mx == -KN_INF) ? ($ACC$)0 : $EXP$(mx - mnew);
        const $ACC$ pj = $EXP$(s - mnew);
        l = l * corr + pj;
        const $T$* vrow = v + b1 * sv_0 + b2 * sv_1 + j * sv_2;
        for (int t = 0; t < DVL; ++t) {
            const kn_idx c = lane + 32 * t;
            const $ACC$ vv = c < dv ? $LOADV$ : ($ACC$)0;
            acc[t] = acc[t] * corr + pj * vv;
        }
        mx = mnew;
    }
    for (int t = 0; t < DVL; ++t) {
        const kn_idx c = lane + 32 * t;
        if (c < dv) out[b1 * so_0 + b2 * so_1 + i * so_2 + c * so_3] = $STORE$;
    }
    }
}
