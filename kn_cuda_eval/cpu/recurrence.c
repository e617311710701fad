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

/* Eight floats in GCC/clang's generic vectors (AVX registers where the CPU has them, two SSE or
   NEON ones elsewhere): the compiler's own vectorizer keeps to 128 bits on some CPUs' tuning
   (znver1) and reloads the output at every k. */
typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float* p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float* p, v8 v) { memcpy(p, &v, sizeof v); }

/* out[j] = add[j] + sum_k h[k] * rt[k*ld + j] for j < n (add may be NULL), summed in k order:
   32 outputs at a time held in registers over all k. */
static void hmul(const float* h, const float* rt, long H, long ld, long n, const float* add,
                 float* out) {
    const v8 zero = {0};
    long j = 0;
    for (; j + 32 <= n; j += 32) {
        v8 a0 = add ? load8(add + j) : zero, a1 = add ? load8(add + j + 8) : zero;
        v8 a2 = add ? load8(add + j + 16) : zero, a3 = add ? load8(add + j + 24) : zero;
        for (long k = 0; k < H; ++k) {
            const float hk = h[k];
            const float* row = rt + k * ld + j;
            a0 += hk * load8(row);
            a1 += hk * load8(row + 8);
            a2 += hk * load8(row + 16);
            a3 += hk * load8(row + 24);
        }
        store8(out + j, a0);
        store8(out + j + 8, a1);
        store8(out + j + 16, a2);
        store8(out + j + 24, a3);
    }
    for (; j + 8 <= n; j += 8) {
        v8 a = add ? load8(add + j) : zero;
        for (long k = 0; k < H; ++k) a += h[k] * load8(rt + k * ld + j);
        store8(out + j, a);
    }
    for (; j < n; ++j) {
        float a = add ? add[j] : 0.0f;
        for (long k = 0; k < H; ++k) a += h[k] * rt[k * ld + j];
        out[j] = a;
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
