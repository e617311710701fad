// The C steps' parallel loops on OpenMP's team, the one oneDNN's primitives run on: the pool of
// the "active" wait policy (runtime.wait_policy). There libgomp's threads spin a while after a
// region (GOMP_SPINCOUNT), so the next region, a oneDNN primitive or a C step alike, finds them
// awake instead of waking a core that went idle (tens of microseconds each on a VM, twice a
// region). Two pools spinning beside each other would take turns on the cores instead, so in
// that policy this one replaces pool.c, with the same entry points and the same split: chunks
// claimed dynamically from one counter, every unit computed by one thread as it would be alone.
// Compiled after prelude.h (kn_task, kn_body, kn_chunk_units) with -fopenmp; loaded only once
// the policy is chosen, as loading it loads libgomp, which reads GOMP_SPINCOUNT then. Compiled
// with _GNU_SOURCE defined first (sched_getcpu, CPU_SET, pthread_setaffinity_np).
#include <omp.h>
#include <pthread.h>
#include <sched.h>

static __thread int kn_want = 1;     // threads this calling thread asked for
static int kn_forked = 0;            // a forked child: libgomp's team stayed in the parent
static __thread int kn_placed = -1;  // the CPU this thread's team was kept off, last time

// Keep this calling thread's team off the CPU the caller runs on now. A region ends at a
// barrier where the caller spins for its workers; the scheduler may queue a worker it wakes on
// the caller's own CPU (wake-affine) when the other one is idle, and there it waits for the
// caller's spin to end or the next tick: 4-10 ms stalls measured on a 2-core VM, 1 in 2 calls
// of a 1 ms model. The workers' affinity becomes the process's CPUs but that one, again
// whenever the caller has moved (sched_getcpu: tens of nanoseconds otherwise).
static void kn_omp_place(int threads) {
    if (threads <= 1 || kn_forked) return;
    const int c = sched_getcpu();
    if (c < 0 || c == kn_placed) return;
    kn_placed = c;
    static cpu_set_t allowed;
    static int have = -1;
    if (have < 0) have = sched_getaffinity(0, sizeof allowed, &allowed) == 0;
    if (!have || !CPU_ISSET(c, &allowed) || CPU_COUNT(&allowed) < 2) return;
    cpu_set_t others = allowed;
    CPU_CLR(c, &others);
#pragma omp parallel num_threads(threads)
    {
        if (omp_get_thread_num() > 0) pthread_setaffinity_np(pthread_self(), sizeof others, &others);
    }
}

// The next chunk of the job whose counter `t->word` points at; 0 when none is left.
int kn_omp_next(kn_task* t, long long* lo, long long* hi) {
    unsigned long long* next = (unsigned long long*)(size_t)t->word;
    const unsigned long long i = __atomic_fetch_add(next, 1ull, __ATOMIC_RELAXED);
    if (i >= t->nchunks) return 0;
    *lo = (long long)i * t->cs;
    *hi = *lo + t->cs < t->n ? *lo + t->cs : t->n;
    return 1;
}

static void kn_after_fork(void) { kn_forked = 1; }

// A forked child has none of the parent's threads, and its first region of ours hung in a test
// (libgomp keeps the parent's team); in a child the C steps run on the calling thread, as with
// pool.c.
__attribute__((constructor)) static void kn_omp_init(void) { pthread_atfork(0, 0, kn_after_fork); }

// Run `fn` over n units in chunks on this thread's OpenMP team, or all on this thread (one
// thread asked for, called from inside a parallel region, or in a forked child).
void kn_omp_run(kn_body fn, char* base, const long long* p, const double* f, long long n,
                long long work) {
    int threads = kn_want;
    if (threads > 1 && n > 1 && !kn_forked && !omp_in_parallel()) {
        const long long cs = kn_chunk_units(n, work, threads);
        const unsigned int nchunks = (unsigned int)((n + cs - 1) / cs);
        if ((long long)threads > (long long)nchunks) threads = (int)nchunks;
        unsigned long long next = 0;
        kn_omp_place(kn_want);
#pragma omp parallel num_threads(threads)
        {
            kn_task t = {.lo = 0, .hi = 0, .n = n, .cs = cs, .word = (unsigned long long)(size_t)&next,
                         .nchunks = nchunks, .pooled = 1};
            if (kn_omp_next(&t, &t.lo, &t.hi)) fn(&t, base, p, f);
        }
        return;
    }
    kn_task t = {.lo = 0, .hi = n, .n = n, .cs = n, .word = 0, .nchunks = 1, .pooled = 0};
    fn(&t, base, p, f);
}

// Before a oneDNN primitive (the step loop): nothing to park, as it runs on this very team;
// its workers are kept off the caller's CPU.
void kn_omp_park(void) { kn_omp_place(kn_want); }

// Threads the jobs this calling thread runs may use (itself included).
void kn_omp_threads(int n) { kn_want = n < 1 ? 1 : n; }
