$PRELUDE$

// Fused attention, one warp per query row: scores q·k_j·scale (+ mask) one key at a time with an
// online softmax; each lane keeps DVL accumulators of the output row (dv <= 32·DVL).
#define DVL $DVL$

extern "C" __global__ void __launch_bounds__(256) $NAME$(
    $PARAMS$)
{
    const kn_idx row = (kn_idx)blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= batch * m) return;  // whole warps leave together: row is uniform per warp
    const kn_idx b = row / m;
    const kn_idx i = row % m;
    const kn_idx b1 = b / heads;
    const kn_idx b2 = b % heads;
    const $T$* qrow = q + b1 * sq_0 + b2 * sq_1 + i * sq_2;
    float acc[DVL];
    for (int t = 0; t < DVL; ++t) acc[t] = 0.f;
    float mx = -KN_INF;
    float l = 0.f;
    for (kn_idx j = 0; j < n; ++j) {
$CAUSAL$
        const $T$* krow = k + b1 * sk_0 + b2 * sk_1 + j * sk_2;
        float dot = 0.f;
        for (kn_idx e = lane; e < d; e += 32) dot += $LOADQ$ * $LOADK$;
        float s = kn_warp_sum(dot) * scale;
$MASK$
        if (s == -KN_INF) continue;
        const float mnew = kn_fmax(mx, s);
        const float corr = (mx == -KN_INF) ? 0.f : expf(mx - mnew);
        const float pj = expf(s - mnew);
        l = l * corr + pj;
        const $T$* vrow = v + b1 * sv_0 + b2 * sv_1 + j * sv_2;
        for (int t = 0; t < DVL; ++t) {
            const kn_idx c = lane + 32 * t;
            const float vv = c < dv ? $LOADV$ : 0.f;
            acc[t] = acc[t] * corr + pj * vv;
        }
        mx = mnew;
    }
    for (int t = 0; t < DVL; ++t) {
        const kn_idx c = lane + 32 * t;
        if (c < dv) out[b1 * so_0 + b2 * so_1 + i * so_2 + c * so_3] = $STORE$;
    }
}
