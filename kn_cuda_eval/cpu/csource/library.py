"""The translation units of a plan's shared library: the kernels, and the step loop `kn_run` that
calls them in order (and oneDNN primitives between them), bound to the process's thread pool."""

from __future__ import annotations

from collections.abc import Sequence

from kn_cuda_eval.cpu.csource.kernel import PAR_WORK, CKernel

__all__ = ["library_sources"]


def library_sources(kernels: Sequence[CKernel], prelude: str, parts: int = 1) -> list[str]:
    """Translation units of one shared library (compiled in parallel, linked together): the
    kernels split over `parts` units, then the main one with a table of them and the step loop
    `kn_run(base, n, kid, p, f)`: kernel `kid[k]` with arguments `p[k]`, `f[k]` for each step k
    in order (kid -1: a oneDNN primitive, see the C comment); returns 0, or k + 1 for the first
    step that failed. `kn_bind_pool` binds the library to the process's thread pool (`pool.c`,
    `build.pool`); until it is bound every step runs on the calling thread."""
    head = [
        f"#define KN_PAR_WORK {PAR_WORK}",
        prelude,
        "#include <stdlib.h>",
        '#define KN_KERNEL __attribute__((visibility("hidden")))',
    ]
    parts = max(1, min(parts, len(kernels)))
    units = ["\n".join([*head, *(k.source for k in kernels[i::parts])]) for i in range(parts)]
    sig = "(char* restrict, const long long* restrict, const double* restrict)"
    lines = [*head, *(f"KN_KERNEL int {k.name}{sig};" for k in kernels)]
    lines.append(f"typedef int (*kn_fn){sig};")
    table = ", ".join(k.name for k in kernels) or "0"
    lines.append(f"static const kn_fn kn_kernels[] = {{{table}}};")
    lines.append(
        """
/* oneDNN primitives run from the same loop: kernel id -1, p[k] = {primitive, stream, nargs,
   args}, called through dnnl_primitive_execute (set once by kn_set_dnnl); a status other than
   success stops the loop and is kept for kn_last_status. Kernel id -2: p[k][0] is a C function
   of ours that a runner calls in a primitive's place (kn_gemv), called with p[k] + 1; it runs on
   OpenMP's team too, and a nonzero return stops the loop as a kernel's does. */
typedef int (*kn_dnnl_fn)(const void*, void*, int, const void*);
static kn_dnnl_fn kn_dnnl_execute = 0;
static __thread int kn_status = 0;

void kn_set_dnnl(void* execute) { kn_dnnl_execute = (kn_dnnl_fn)execute; }
int kn_last_status(void) { return kn_status; }

/* The thread pool's entry points (pool.c): kn_parallel runs regions through kn_run_pool; the
   step loop parks the pool's spinning workers before a oneDNN primitive, whose OpenMP team
   needs the cores. */
__attribute__((visibility("hidden"))) void (*kn_run_pool)(
    kn_body, char*, const long long*, const double*, long long, long long) = 0;
__attribute__((visibility("hidden"))) int (*kn_next_chunk)(kn_task*, long long*, long long*) = 0;
static void (*kn_park)(void) = 0;
static void (*kn_pool_set_threads)(int) = 0;

void kn_bind_pool(void* run, void* next, void* park, void* threads) {
    kn_next_chunk = (int (*)(kn_task*, long long*, long long*))next;
    kn_park = (void (*)(void))park;
    kn_pool_set_threads = (void (*)(int))threads;
    kn_run_pool = (void (*)(kn_body, char*, const long long*, const double*, long long,
                            long long))run;
}

int kn_run(char* base, int n, const int* kid, const long long* const* p, const double* const* f) {
    kn_status = 0;
    for (int k = 0; k < n; ++k) {
        if (kid[k] < 0) {
            const long long* q = p[k];
            if (kn_park) kn_park();
            if (kid[k] == -2) {  /* ours: its failure is the step's, not a oneDNN status */
                if (((int (*)(const long long*))q[0])(q + 1)) return k + 1;
                continue;
            }
            int st = kn_dnnl_execute((const void*)q[0], (void*)q[1], (int)q[2], (const void*)q[3]);
            if (st) { kn_status = st; return k + 1; }
        } else if (kn_kernels[kid[k]](base, p[k], f[k])) {
            return k + 1;
        }
    }
    return 0;
}

int kn_one(char* base, int kid, const long long* p, const double* f) {
    return kn_kernels[kid](base, p, f);
}

/* Threads for the steps this calling thread runs: the pool's and OpenMP's (oneDNN's team). */
void kn_set_threads(int n) {
    if (kn_pool_set_threads) kn_pool_set_threads(n);
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
}

int kn_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
"""
    )
    lines.append(_KERNEL_CALLS)
    return [*units, "\n".join(lines)] if kernels else ["\n".join(lines)]


_KERNEL_CALLS = """
/* oneDNN's dnnl_sgemm for kernels that multiply what they computed (the block-quantized
   product's tiles); NULL until kn_set_sgemm. */
__attribute__((visibility("hidden"))) int (*kn_sgemm)(
    char, char, long long, long long, long long, float, const float*, long long, const float*,
    long long, float, float*, long long) = 0;
void kn_set_sgemm(void* f) {
    kn_sgemm = (int (*)(char, char, long long, long long, long long, float, const float*,
                        long long, const float*, long long, float, float*, long long))f;
}

/* Before a kernel's own oneDNN call: the pool's workers parked, as before a primitive. */
__attribute__((visibility("hidden"))) void kn_park_pool(void) {
    if (kn_park) kn_park();
}
"""
