// Kyanite host thread pool: runs the parallel loops of the generated C steps (csource.py) instead
// of OpenMP. One pool per process (this library, loaded once by build.pool()); every plan library
// is bound to it (kn_bind_pool). Compiled after prelude.h (kn_task, kn_body) and without OpenMP,
// so that loading it does not load libgomp (whose spin count must be set before it loads).
//
// A job is n units of work in chunks of cs units. The caller publishes it, then claims chunks
// itself like any worker; a chunk is claimed by one compare-and-swap on `claim` (epoch << 32 |
// next chunk), so a worker that wakes late finds the chunks taken and is never waited for: the
// caller waits only for chunks already claimed (`done`). Workers spin a short calibrated time
// after a job (the next C step of the step loop comes within microseconds), then sleep on a
// futex; they sleep at once when the step loop runs a oneDNN primitive (kn_pool_park), whose
// OpenMP team needs the cores. Spinning longer, or yielding the core while spinning, made the
// workers miss most jobs on a loaded machine: the scheduler favours a thread that sleeps and is
// woken over one that has been burning its share (or handed it to another process).
//
// The job's fields are written while `claim` says KN_CLOSED and read by a worker between its
// load of `claim` and its compare-and-swap: a successful swap proves that no other job was
// published in between (the epoch only grows), so the fields it read were this job's.
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define KN_CLOSED 0xffffffffu
#define KN_MAX_WORKERS 1023

#define KN_LOAD(x, mo) __atomic_load_n(&(x), __ATOMIC_##mo)
#define KN_STORE(x, v, mo) __atomic_store_n(&(x), (v), __ATOMIC_##mo)

static inline void kn_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#ifdef __linux__
static void kn_futex_wait(unsigned int* a, unsigned int v) {
    syscall(SYS_futex, a, FUTEX_WAIT_PRIVATE, v, (void*)0, (void*)0, 0);
}
static void kn_futex_wake(unsigned int* a) {
    syscall(SYS_futex, a, FUTEX_WAKE_PRIVATE, 0x7fffffff, (void*)0, (void*)0, 0);
}
#endif

static struct {
    _Alignas(64) unsigned long long claim;  // epoch << 32 | next chunk; KN_CLOSED while written
    _Alignas(64) unsigned int done;         // chunks of the current job finished
    unsigned int caller_asleep;             // the caller sleeps on `done`
    _Alignas(64) unsigned int epoch;        // futex word of the workers between jobs
    unsigned int sleepers;                  // workers asleep (or about to be) on `epoch`
    unsigned int parked;                    // spinning workers should sleep now
    _Alignas(64) kn_body fn;                // the job (written while `claim` is closed)
    char* base;
    const long long* p;
    const double* f;
    long long n, cs;
    unsigned int nchunks, allowed;  // workers 0 .. allowed - 1 take part (the caller always)
    _Alignas(64) int busy;          // a caller owns the pool; another runs its job alone
    int workers;                    // workers started
} P;

static unsigned long long kn_spin_iters = 1000;  // pauses a waiting thread spins before sleeping
static __thread int kn_want = 1;                 // threads this calling thread asked for

// Claim a chunk of the job `claim` shows into `t` (k: the worker's index, -1 for the caller);
// 0 when there is none to claim or worker k does not take part.
static int kn_claim_first(kn_task* t, int k, kn_body* fn, char** base, const long long** p,
                          const double** f) {
    for (;;) {
        unsigned long long c = KN_LOAD(P.claim, ACQUIRE);
        const unsigned int i = (unsigned int)c;
        if (i == KN_CLOSED) return 0;
        *fn = KN_LOAD(P.fn, RELAXED);
        *base = KN_LOAD(P.base, RELAXED);
        *p = KN_LOAD(P.p, RELAXED);
        *f = KN_LOAD(P.f, RELAXED);
        const long long n = KN_LOAD(P.n, RELAXED), cs = KN_LOAD(P.cs, RELAXED);
        const unsigned int nchunks = KN_LOAD(P.nchunks, RELAXED);
        const unsigned int allowed = KN_LOAD(P.allowed, RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if ((k >= 0 && (unsigned int)k >= allowed) || i >= nchunks) return 0;
        if (!__atomic_compare_exchange_n(&P.claim, &c, c + 1, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            continue;  // another thread claimed it, or another job began: look again
        t->lo = (long long)i * cs;
        t->hi = t->lo + cs < n ? t->lo + cs : n;
        t->n = n;
        t->cs = cs;
        t->word = c >> 32;
        t->nchunks = nchunks;
        t->pooled = 1;
        return 1;
    }
}

// The chunk handed out last is finished: count it, and claim the next one of the same job.
int kn_pool_next(kn_task* t, long long* lo, long long* hi) {
    if (__atomic_add_fetch(&P.done, 1, __ATOMIC_SEQ_CST) == t->nchunks &&
        KN_LOAD(P.caller_asleep, SEQ_CST)) {
#ifdef __linux__
        kn_futex_wake(&P.done);
#endif
    }
    unsigned long long c = KN_LOAD(P.claim, ACQUIRE);
    for (;;) {
        const unsigned int i = (unsigned int)c;
        if ((c >> 32) != t->word || i >= t->nchunks) return 0;  // another job, or none left
        if (__atomic_compare_exchange_n(&P.claim, &c, c + 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            *lo = (long long)i * t->cs;
            *hi = *lo + t->cs < t->n ? *lo + t->cs : t->n;
            return 1;
        }
    }
}

static void* kn_worker(void* arg) {
    const int k = (int)((unsigned long long)(size_t)arg & 0xffffu);
    unsigned int last = (unsigned int)((unsigned long long)(size_t)arg >> 16);
    for (;;) {
        unsigned int e = KN_LOAD(P.epoch, ACQUIRE);
        for (unsigned long long i = 0; e == last && i < kn_spin_iters; ++i) {
            if (KN_LOAD(P.parked, RELAXED)) break;
            kn_pause();
            e = KN_LOAD(P.epoch, ACQUIRE);
        }
        if (e == last) {
#ifdef __linux__
            __atomic_add_fetch(&P.sleepers, 1, __ATOMIC_SEQ_CST);
            if (KN_LOAD(P.epoch, SEQ_CST) == last) kn_futex_wait(&P.epoch, last);
            __atomic_sub_fetch(&P.sleepers, 1, __ATOMIC_SEQ_CST);
#endif
            continue;
        }
        last = e;
        kn_task t;
        kn_body fn;
        char* base;
        const long long* p;
        const double* f;
        if (kn_claim_first(&t, k, &fn, &base, &p, &f)) fn(&t, base, p, f);
    }
    return 0;
}

static void kn_after_fork(void) {  // the child has none of the workers
    P.workers = 0;
    P.sleepers = 0;
    P.busy = 0;
}

static void kn_atfork_once(void) { pthread_atfork(0, 0, kn_after_fork); }

// Start workers up to `want` (the pool's owner only); fewer when the system refuses threads.
static void kn_grow(int want) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, kn_atfork_once);
    if (want > KN_MAX_WORKERS) want = KN_MAX_WORKERS;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  // signals stay with the caller's threads
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    const unsigned long long e = KN_LOAD(P.epoch, ACQUIRE);
    while (P.workers < want) {
        pthread_t th;
        void* arg = (void*)(size_t)((e << 16) | (unsigned long long)P.workers);
        if (pthread_create(&th, &attr, kn_worker, arg) != 0) break;
        P.workers++;
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, 0);
}

static void kn_wait_done(unsigned int nchunks) {
    unsigned long long i = 0;
    for (;;) {
        unsigned int d = KN_LOAD(P.done, ACQUIRE);
        if (d == nchunks) return;
        if (i < kn_spin_iters) {
            kn_pause();
            ++i;
            continue;
        }
#ifdef __linux__
        KN_STORE(P.caller_asleep, 1, SEQ_CST);
        d = KN_LOAD(P.done, SEQ_CST);
        if (d != nchunks) kn_futex_wait(&P.done, d);
        KN_STORE(P.caller_asleep, 0, RELAXED);
#else
        sched_yield();
#endif
    }
}

// Run `fn` over n units: in chunks on this thread and the pool's workers, or all on this thread
// (one thread asked for, the pool owned by another caller, no workers to be had).
void kn_pool_run(kn_body fn, char* base, const long long* p, const double* f, long long n,
                 long long work) {
    const int threads = kn_want;
    if (threads > 1 && n > 1 && !__atomic_exchange_n(&P.busy, 1, __ATOMIC_ACQUIRE)) {
        if (P.workers < threads - 1) kn_grow(threads - 1);
        const int allowed = P.workers < threads - 1 ? P.workers : threads - 1;
        if (allowed > 0) {
            const long long cs = kn_chunk_units(n, work, allowed + 1);
            const unsigned int nchunks = (unsigned int)((n + cs - 1) / cs);
            const unsigned long long e = (KN_LOAD(P.claim, RELAXED) >> 32) + 1;
            KN_STORE(P.claim, (e << 32) | KN_CLOSED, RELAXED);
            __atomic_thread_fence(__ATOMIC_RELEASE);
            KN_STORE(P.fn, fn, RELAXED);
            KN_STORE(P.base, base, RELAXED);
            KN_STORE(P.p, p, RELAXED);
            KN_STORE(P.f, f, RELAXED);
            KN_STORE(P.n, n, RELAXED);
            KN_STORE(P.cs, cs, RELAXED);
            KN_STORE(P.nchunks, nchunks, RELAXED);
            KN_STORE(P.allowed, (unsigned int)allowed, RELAXED);
            KN_STORE(P.done, 0u, RELAXED);
            KN_STORE(P.caller_asleep, 0u, RELAXED);
            KN_STORE(P.parked, 0u, RELAXED);
            KN_STORE(P.claim, e << 32, RELEASE);
            KN_STORE(P.epoch, (unsigned int)e, SEQ_CST);
#ifdef __linux__
            if (KN_LOAD(P.sleepers, SEQ_CST)) kn_futex_wake(&P.epoch);
#endif
            kn_task t;
            kn_body fn1;
            char* base1;
            const long long* p1;
            const double* f1;
            if (kn_claim_first(&t, -1, &fn1, &base1, &p1, &f1)) fn(&t, base, p, f);
            kn_wait_done(nchunks);
            __atomic_store_n(&P.busy, 0, __ATOMIC_RELEASE);
            return;
        }
        __atomic_store_n(&P.busy, 0, __ATOMIC_RELEASE);
    }
    kn_task t = {.lo = 0, .hi = n, .n = n, .cs = n, .word = 0, .nchunks = 1, .pooled = 0};
    fn(&t, base, p, f);
}

// Spinning workers go to sleep now (the step loop, before a oneDNN primitive).
void kn_pool_park(void) { KN_STORE(P.parked, 1u, RELAXED); }

// Threads the jobs this calling thread runs may use (itself included).
void kn_pool_threads(int n) { kn_want = n < 1 ? 1 : (n > KN_MAX_WORKERS + 1 ? KN_MAX_WORKERS + 1 : n); }

void kn_pool_set_spin(long long pauses) { kn_spin_iters = pauses < 0 ? 0 : (unsigned long long)pauses; }

int kn_pool_workers(void) { return KN_LOAD(P.workers, RELAXED); }

int kn_pool_usable(void) {
#ifdef __linux__
    return 1;
#else
    return 0;
#endif
}

// Nanoseconds one spin-wait pause takes on this CPU: the best of a few timed runs (a run that
// was preempted only reads longer).
double kn_pool_pause_ns(void) {
    double best = 1e9;
    for (int r = 0; r < 7; ++r) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < 2000; ++i) kn_pause();
        clock_gettime(CLOCK_MONOTONIC, &b);
        const double ns = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 2000.0;
        if (ns < best) best = ns;
    }
    return best;
}
