// Kyanite host recurrence: one direction of an ONNX RNN / GRU / LSTM layer over all its time
// steps, the same formulas as kn_graph/recurrence.py (the NumPy oracle) in one C loop, so that
// a step costs a matrix-vector product and a few passes over H floats instead of a dozen NumPy
// calls (~18 us a step). f32 only (float16 arrives as f32, as in the NumPy loop). Arguments as
// the op has them: xw [T,B,G*H] (the input projection), r [G*H,H] (R, its rows read as they are
// stored), rb [G*H] or NULL (the recurrent bias), p [3H] or NULL (LSTM peepholes i, o, f),
// running [T*B] or NULL (0: the row's sequence has ended: it keeps its state, outputs zeros);
// out, the caller's one buffer for the results and the scratch: y [T,B,H] zero-filled, then
// h [B,H] and c [B,H] holding the initial states (updated in place), then 6*G*H floats.
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

/* e^x and tanh x written so that the compiler vectorizes the loops that call them (libm's are
   scalar calls, ~20-40 ns each: most of a step at H = 128). Within a few ulp of libm; NaN stays
   NaN, ±inf and overflow go to inf and 0 as in libm. */
static inline float from_bits(int i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

static inline float fast_exp(float x) {
    /* e^x = 2^n · e^r with n = round(x / ln 2) and r = x - n·ln 2 (ln 2 in two parts, so n·hi
       is exact), |r| <= ln 2 / 2; e^r by its Taylor series to r^7 (truncation < 6e-9 relative).
       x is clamped to [-104, 89], past which the result underflows to 0 or overflows to inf;
       2^n is applied as two factors so that the denormal and overflow ends come out right. */
    float c = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
    float n = __builtin_rintf((c == c ? c : 0.0f) * 1.44269504088896341f);
    float r = c - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120
              + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    int ni = (int)n, n1 = ni >> 1, n2 = ni - n1;
    return p * from_bits((n1 + 127) << 23) * from_bits((n2 + 127) << 23);
}

static inline float fast_tanh(float x) {
    /* |x| < 0.5: the odd Taylor series to x^15 (truncation < 5e-9); beyond, 1 - 2/(e^2|x| + 1),
       free of cancellation there. The sign is x's. */
    float a = fabsf(x), a2 = a * a;
    float small = a * (1.0f + a2 * (-1.0f / 3 + a2 * (2.0f / 15 + a2 * (-17.0f / 315
                  + a2 * (62.0f / 2835 + a2 * (-1382.0f / 155925 + a2 * (21844.0f / 6081075
                  + a2 * (-929569.0f / 638512875))))))));
    float large = 1.0f - 2.0f / (fast_exp(2.0f * a) + 1.0f);
    return copysignf(a < 0.5f ? small : large, x);
}

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
        for (long i = 0; i < n; ++i) x[i] = fast_tanh(x[i]);
        break;
    case A_SIGMOID:
        for (long i = 0; i < n; ++i) x[i] = 1.0f / (1.0f + fast_exp(-x[i]));
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
        for (long i = 0; i < n; ++i) x[i] = a * fast_tanh(x[i] * b);
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

/* Eight floats in GCC/clang's generic vectors: AVX registers where the CPU has them, two SSE
   or NEON ones elsewhere, whatever width the compiler's tuning would pick for a plain loop. */
typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float* p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum(v8 v) {
    float t[8];
    memcpy(t, &v, sizeof t);
    return ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
}

/* out[j] = add[j] + R[j,:]·h for the n rows of R from `r` (row length H; add may be NULL):
   four rows at a time, eight lanes of each, h read from L1 and R streamed row after row. */
static void rmul(const float* r, long H, long n, const float* h, const float* add, float* out) {
    const v8 zero = {0};
    const long H8 = H & ~7L;
    long j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *r0 = r + j * H, *r1 = r0 + H, *r2 = r1 + H, *r3 = r2 + H;
        v8 a0 = zero, a1 = zero, a2 = zero, a3 = zero;
        for (long k = 0; k < H8; k += 8) {
            const v8 hk = load8(h + k);
            a0 += load8(r0 + k) * hk;
            a1 += load8(r1 + k) * hk;
            a2 += load8(r2 + k) * hk;
            a3 += load8(r3 + k) * hk;
        }
        float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);
        for (long k = H8; k < H; ++k) {
            s0 += r0[k] * h[k];
            s1 += r1[k] * h[k];
            s2 += r2[k] * h[k];
            s3 += r3[k] * h[k];
        }
        out[j] = (add ? add[j] : 0.0f) + s0;
        out[j + 1] = (add ? add[j + 1] : 0.0f) + s1;
        out[j + 2] = (add ? add[j + 2] : 0.0f) + s2;
        out[j + 3] = (add ? add[j + 3] : 0.0f) + s3;
    }
    for (; j < n; ++j) {
        float sj = 0.0f;
        for (long k = 0; k < H; ++k) sj += r[j * H + k] * h[k];
        out[j] = (add ? add[j] : 0.0f) + sj;
    }
}

/* dims: kind, H, reverse, linear_before_reset, input_forget, has_clip, act0, act1, act2
   params: clip, alpha0, beta0, alpha1, beta1, alpha2, beta2 */
int kn_recurrence(const long long* dims, const float* params, long long T, long long B,
                  const float* xw, const float* r, const float* rb, const float* p,
                  const unsigned char* running, float* out) {
    const int kind = (int)dims[0];
    const long H = dims[1];
    const int reverse = (int)dims[2], lbr = (int)dims[3], input_forget = (int)dims[4];
    const int has_clip = (int)dims[5];
    const float lim = params[0];
    const act_t f = {(int)dims[6], params[1], params[2]};
    const act_t g = {(int)dims[7], params[3], params[4]};
    const act_t ah = {(int)dims[8], params[5], params[6]};
    const long G = kind == K_RNN ? 1 : kind == K_GRU ? 3 : 4, GH = G * H;
    float* y = out;             /* [T,B,H] */
    float* h = y + T * B * H;   /* [B,H] */
    float* c = h + B * H;       /* [B,H] (LSTM) */
    float* work = c + B * H;
    float* rec = work;          /* [G*H]: R·h plus the step's input part */
    float* xb = rec + GH;       /* [G*H]: the step's input projection plus the recurrent bias */
    float* cand = xb + GH;      /* [H] */
    float* tmp = cand + H;      /* [H] */
    float* nh = tmp + H;        /* [H]: the new hidden state */
    float* nc = nh + H;         /* [H]: the new cell state */
    for (long s = 0; s < T; ++s) {
        const long t = reverse ? T - 1 - s : s;
        for (long bi = 0; bi < B; ++bi) {
            float* hb = h + bi * H;
            if (running && !running[t * B + bi]) continue; /* its state stays, Y[t] stays 0 */
            const float* x = xw + (t * B + bi) * GH;
            if (rb) { /* as the NumPy loop folds it: all but linear_before_reset's candidate */
                const long folded = kind == K_GRU && lbr ? 2 * H : GH;
                for (long j = 0; j < GH; ++j) xb[j] = j < folded ? x[j] + rb[j] : x[j];
                x = xb;
            }
            if (kind == K_RNN) {
                rmul(r, H, H, hb, x, nh);
                clip(has_clip, lim, nh, H);
                activate(f, nh, H);
            } else if (kind == K_GRU) {
                rmul(r, H, lbr ? 3 * H : 2 * H, hb, NULL, rec);
                for (long j = 0; j < 2 * H; ++j) rec[j] += x[j];
                clip(has_clip, lim, rec, 2 * H);
                activate(f, rec, 2 * H);
                const float *z = rec, *rg = rec + H;
                if (lbr) {
                    for (long j = 0; j < H; ++j)
                        cand[j] = (rec[2 * H + j] + (rb ? rb[2 * H + j] : 0.0f)) * rg[j];
                } else {
                    for (long j = 0; j < H; ++j) tmp[j] = rg[j] * hb[j];
                    rmul(r + 2 * H * H, H, H, tmp, NULL, cand);
                }
                for (long j = 0; j < H; ++j) cand[j] += x[2 * H + j];
                clip(has_clip, lim, cand, H);
                activate(g, cand, H);
                for (long j = 0; j < H; ++j) nh[j] = (hb[j] - cand[j]) * z[j] + cand[j];
            } else {
                float* cb = c + bi * H;
                rmul(r, H, GH, hb, x, rec);
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
