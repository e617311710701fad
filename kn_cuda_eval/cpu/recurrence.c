// Kyanite host recurrence: one direction of an ONNX RNN / GRU / LSTM layer over all its time
// steps, the same formulas as kn_graph/recurrence.py (the NumPy oracle) in one C loop, so that
// a step costs a matrix-vector product and a few passes over H floats instead of a dozen NumPy
// calls (~18 us a step). f32 only (float16 arrives as f32, as in the NumPy loop). The caller
// (recurrence.py) has folded the recurrent bias into xw and transposed R, and owns every
// buffer: xw [T,B,G*H], rt [H,G*H], rb_h [H] or NULL (GRU linear_before_reset), h [B,H] and
// c [B,H] (the states, updated in place), p [3H] or NULL (LSTM peepholes i, o, f),
// running [T*B] or NULL (0: the row's sequence has ended: it keeps its state, outputs zeros),
// y [T,B,H] zero-filled, work [5*G*H].
//
// NaN and infinities go where NumPy's ufuncs take them: every comparison below is written so
// that a NaN takes the same branch as in kn_graph/recurrence.py's Activation.apply.
#include <math.h>
#include <string.h>

enum {
    A_RELU, A_TANH, A_SIGMOID, A_SOFTSIGN, A_SOFTPLUS, A_AFFINE, A_LEAKYRELU,
    A_THRESHOLDEDRELU, A_SCALEDTANH, A_HARDSIGMOID, A_ELU
};
enum { K_RNN, K_GRU, K_LSTM };

typedef struct {
    int kind;      /* A_* */
    float a, b;    /* alpha, beta */
} act_t;

static void activate(act_t f, float* x, long n) {
    const float a = f.a, b = f.b;
    switch (f.kind) {
    case A_RELU:
        for (long i = 0; i < n; ++i) x[i] = x[i] < 0.0f ? 0.0f : x[i];
        break;
    case A_TANH:
        for (long i = 0; i < n; ++i) x[i] = tanhf(x[i]);
        break;
    case A_SIGMOID:
        for (long i = 0; i < n; ++i) x[i] = 1.0f / (1.0f + expf(-x[i]));
        break;
    case A_SOFTSIGN:
        for (long i = 0; i < n; ++i) x[i] = x[i] / (fabsf(x[i]) + 1.0f);
        break;
    case A_SOFTPLUS: /* log(1 + e^x) without overflow, as np.logaddexp(0, x) */
        for (long i = 0; i < n; ++i) {
            float v = x[i];
            x[i] = v > 0.0f ? v + log1pf(expf(-v)) : log1pf(expf(v));
        }
        break;
    case A_AFFINE:
        for (long i = 0; i < n; ++i) x[i] = x[i] * a + b;
        break;
    case A_LEAKYRELU: /* NaN: not >= 0, so a*NaN */
        for (long i = 0; i < n; ++i) x[i] = x[i] >= 0.0f ? x[i] : x[i] * a;
        break;
    case A_THRESHOLDEDRELU: /* NaN: not > a, so 0 */
        for (long i = 0; i < n; ++i) x[i] = x[i] > a ? x[i] : 0.0f;
        break;
    case A_SCALEDTANH:
        for (long i = 0; i < n; ++i) x[i] = a * tanhf(x[i] * b);
        break;
    case A_HARDSIGMOID: /* min then max: NaN stays */
        for (long i = 0; i < n; ++i) {
            float v = x[i] * a + b;
            v = v > 1.0f ? 1.0f : v;
            x[i] = v < 0.0f ? 0.0f : v;
        }
        break;
    case A_ELU: /* NaN: not > 0, so a*(e^NaN - 1) */
        for (long i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : a * (expf(x[i]) - 1.0f);
        break;
    }
}

static void clip(int on, float lim, float* x, long n) {
    if (!on) return;
    for (long i = 0; i < n; ++i) {
        float v = x[i] > lim ? lim : x[i];
        x[i] = v < -lim ? -lim : v;
    }
}

/* out[j] = add[j] + sum_k h[k] * rt[k*ld + j], j < n (add may be NULL) */
static void hmul(const float* h, const float* rt, long H, long ld, long n, const float* add,
                 float* out) {
    if (add) memcpy(out, add, (size_t)n * sizeof(float));
    else memset(out, 0, (size_t)n * sizeof(float));
    for (long k = 0; k < H; ++k) {
        const float hk = h[k];
        const float* row = rt + k * ld;
        for (long j = 0; j < n; ++j) out[j] += hk * row[j];
    }
}

/* dims: kind, T, B, H, reverse, linear_before_reset, input_forget, has_clip, act0, act1, act2
   params: clip, alpha0, beta0, alpha1, beta1, alpha2, beta2 */
int kn_recurrence(const long long* dims, const float* params, const float* xw, const float* rt,
                  const float* rb_h, float* h, float* c, const float* p,
                  const unsigned char* running, float* y, float* work) {
    const int kind = (int)dims[0];
    const long T = dims[1], B = dims[2], H = dims[3];
    const int reverse = (int)dims[4], lbr = (int)dims[5], input_forget = (int)dims[6];
    const int has_clip = (int)dims[7];
    const float lim = params[0];
    const act_t f = {(int)dims[8], params[1], params[2]};
    const act_t g = {(int)dims[9], params[3], params[4]};
    const act_t ah = {(int)dims[10], params[5], params[6]};
    const long G = kind == K_RNN ? 1 : kind == K_GRU ? 3 : 4, GH = G * H;
    float* rec = work;          /* [G*H]: h·Rᵀ plus the step's input part */
    float* cand = rec + GH;     /* [H] */
    float* tmp = cand + H;      /* [H] */
    float* nh = tmp + H;        /* [H]: the new hidden state */
    float* nc = nh + H;         /* [H]: the new cell state */
    for (long s = 0; s < T; ++s) {
        const long t = reverse ? T - 1 - s : s;
        for (long bi = 0; bi < B; ++bi) {
            const float* x = xw + (t * B + bi) * GH;
            float* hb = h + bi * H;
            const int keep = running && !running[t * B + bi];
            if (keep) continue; /* the row's state stays, Y[t] stays 0 */
            if (kind == K_RNN) {
                hmul(hb, rt, H, GH, H, x, nh);
                clip(has_clip, lim, nh, H);
                activate(f, nh, H);
            } else if (kind == K_GRU) {
                hmul(hb, rt, H, GH, lbr ? 3 * H : 2 * H, NULL, rec);
                for (long j = 0; j < 2 * H; ++j) rec[j] += x[j];
                clip(has_clip, lim, rec, 2 * H);
                activate(f, rec, 2 * H);
                const float *z = rec, *r = rec + H;
                if (lbr) {
                    for (long j = 0; j < H; ++j)
                        cand[j] = (rec[2 * H + j] + (rb_h ? rb_h[j] : 0.0f)) * r[j];
                } else {
                    for (long j = 0; j < H; ++j) tmp[j] = r[j] * hb[j];
                    hmul(tmp, rt + 2 * H, H, GH, H, NULL, cand);
                }
                for (long j = 0; j < H; ++j) cand[j] += x[2 * H + j];
                clip(has_clip, lim, cand, H);
                activate(g, cand, H);
                for (long j = 0; j < H; ++j) nh[j] = (hb[j] - cand[j]) * z[j] + cand[j];
            } else {
                float* cb = c + bi * H;
                hmul(hb, rt, H, GH, GH, x, rec);
                float *gi = rec, *go = rec + H, *gf = rec + 2 * H, *gc = rec + 3 * H;
                const int together = !p && !input_forget;
                if (together) {
                    clip(has_clip, lim, rec, 3 * H);
                    activate(f, rec, 3 * H);
                } else {
                    if (p) for (long j = 0; j < H; ++j) gi[j] += p[j] * cb[j];
                    clip(has_clip, lim, gi, H);
                    activate(f, gi, H);
                    if (input_forget) {
                        for (long j = 0; j < H; ++j) gf[j] = 1.0f - gi[j];
                    } else {
                        if (p) for (long j = 0; j < H; ++j) gf[j] += p[2 * H + j] * cb[j];
                        clip(has_clip, lim, gf, H);
                        activate(f, gf, H);
                    }
                }
                clip(has_clip, lim, gc, H);
                activate(g, gc, H);
                for (long j = 0; j < H; ++j) nc[j] = gf[j] * cb[j] + gi[j] * gc[j];
                if (!together) {
                    if (p) for (long j = 0; j < H; ++j) go[j] += p[H + j] * nc[j];
                    clip(has_clip, lim, go, H);
                    activate(f, go, H);
                }
                memcpy(nh, nc, (size_t)H * sizeof(float));
                activate(ah, nh, H);
                for (long j = 0; j < H; ++j) nh[j] *= go[j];
                memcpy(cb, nc, (size_t)H * sizeof(float));
            }
            memcpy(hb, nh, (size_t)H * sizeof(float));
            memcpy(y + (t * B + bi) * H, nh, (size_t)H * sizeof(float));
        }
    }
    return 0;
}
