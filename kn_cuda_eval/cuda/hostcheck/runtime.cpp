// The fiber runtime behind cuda_host.h: every thread of a block is a fiber with its own stack on
// one OS thread; a fiber runs until it reaches a barrier or exits, then switches straight to the
// next ready one.
// So a block's threads interleave only where a GPU makes them meet.
//
// __syncthreads releases when every thread that has not exited arrives. A warp operation is a
// lockstep barrier over the lanes of its mask: each lane writes its value into the warp's
// scratch (two halves, alternating per operation, so a lane running ahead never overwrites a
// value still to be read), waits for the others, then reads. Undefined behaviour on a GPU is an
// error here: a mask naming a lane that has exited or does not exist, lanes meeting with
// different masks, a deadlock (threads waiting at barriers nobody else reaches).
#include "cuda_host.h"

#include <sys/mman.h>

namespace kn_host {

uint3 g_thread_idx, g_block_idx;
dim3 g_block_dim, g_grid_dim;
int g_lane;

namespace {

constexpr size_t STACK = 256 * 1024;  // per fiber, above a guard page
constexpr size_t PAGE = 4096;
constexpr int WARP = 32;

enum State { READY, WAIT_BLOCK, WAIT_WARP, DONE };

struct Fiber {
    void* sp;
    uint3 tid;
    int warp, lane;
    State state;
    unsigned int warp_ops;  // warp operations done: picks the half of the warp scratch
};

struct Warp {
    unsigned int present;  // lanes that exist (a last, partial warp has fewer)
    unsigned int exited;
    unsigned int arrived;
    unsigned int mask;  // of the barrier being gathered
    unsigned long long slot[2][WARP];
};

struct Block {
    Fiber* fibers;
    Warp* warps;
    int* queue;  // ready fibers, a ring of nthreads entries
    int nthreads, nwarps, live, arrived_block, head, count;
    void* sched_sp;
    char* error;
    size_t error_size;
    bool failed;
    void (*body)(void*);
    void* ctx;
};

Block* g_blk = nullptr;
Fiber* g_cur = nullptr;

}  // namespace
}  // namespace kn_host

#if defined(__x86_64__)
// switch stacks: push the callee-saved registers, store the stack pointer in *save, continue on
// `to` (System V x86-64; MXCSR and the x87 control word are never changed by a kernel)
extern "C" void kn_host_switch(void** save, void* to);
asm(R"(
    .text
    .globl kn_host_switch
    .hidden kn_host_switch
    .type kn_host_switch, @function
kn_host_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kn_host_switch, .-kn_host_switch
)");
#else
#error "the host kernel runtime's fiber switch is written for x86-64"
#endif

namespace kn_host {
namespace {

void fail(const char* fmt, int a = 0, int b = 0) {
    Block* bl = g_blk;
    if (!bl->failed) {
        int n = snprintf(bl->error, bl->error_size, "block (%u,%u,%u): ", g_block_idx.x,
                         g_block_idx.y, g_block_idx.z);
        if (n >= 0 && (size_t)n < bl->error_size) snprintf(bl->error + n, bl->error_size - n, fmt, a, b);
    }
    bl->failed = true;
}

void push_ready(Block* bl, int f) {
    bl->fibers[f].state = READY;
    bl->queue[(bl->head + bl->count) % bl->nthreads] = f;
    bl->count += 1;
}

void release_block(Block* bl) {
    bl->arrived_block = 0;
    for (int i = 0; i < bl->nthreads; ++i)
        if (bl->fibers[i].state == WAIT_BLOCK) push_ready(bl, i);
}

void activate(Fiber* f) {
    g_cur = f;
    g_thread_idx = f->tid;
    g_lane = f->lane;
}

// leave the current fiber (waiting, or done): straight into the next ready one, or back to the
// scheduler when none is ready (it then finds the block done, failed or deadlocked)
void leave() {
    Block* bl = g_blk;
    Fiber* me = g_cur;
    if (bl->count > 0 && !bl->failed) {
        const int i = bl->queue[bl->head];
        bl->head = (bl->head + 1) % bl->nthreads;
        bl->count -= 1;
        activate(&bl->fibers[i]);
        kn_host_switch(&me->sp, bl->fibers[i].sp);
    } else {
        kn_host_switch(&me->sp, bl->sched_sp);
    }
}

[[noreturn]] void entry() {
    Block* bl = g_blk;
    bl->body(bl->ctx);
    Fiber* f = g_cur;
    f->state = DONE;
    bl->live -= 1;
    Warp& w = bl->warps[f->warp];
    w.exited |= 1u << f->lane;
    if (w.arrived && (w.mask >> f->lane & 1u))
        fail("thread %d exited while lanes of its warp wait for it at a warp operation",
             (int)(f - bl->fibers));
    if (bl->arrived_block && bl->arrived_block == bl->live) release_block(bl);  // exited: not counted
    leave();
    __builtin_unreachable();
}

// the lanes of `mask` meet; returns the scratch half this operation uses
unsigned long long* meet(unsigned int mask) {
    Block* bl = g_blk;
    Fiber* f = g_cur;
    Warp& w = bl->warps[f->warp];
    unsigned long long* slot = w.slot[f->warp_ops & 1u];
    f->warp_ops += 1;
    if (!(mask >> f->lane & 1u)) fail("lane %d calls a warp operation whose mask leaves it out", f->lane);
    if ((mask & ~w.present) || (mask & w.exited))
        fail("warp %d: a warp operation names lanes that do not exist or have exited (mask %x)",
             f->warp, (int)mask);
    if (w.arrived == 0) w.mask = mask;
    else if (w.mask != mask) fail("warp %d: lanes meet with different masks", f->warp);
    w.arrived |= 1u << f->lane;
    if (w.arrived == w.mask || bl->failed) {
        w.arrived = 0;
        for (int l = 0; l < WARP; ++l)
            if ((w.mask >> l & 1u) && l != f->lane) push_ready(bl, f->warp * WARP + l);
        return slot;
    }
    f->state = WAIT_WARP;
    leave();
    return slot;
}

unsigned long long* publish(unsigned long long value) {
    Warp& w = g_blk->warps[g_cur->warp];
    unsigned long long* slot = w.slot[g_cur->warp_ops & 1u];
    slot[g_cur->lane] = value;
    return slot;
}

bool run_block(Block* bl, char* stacks) {
    for (int i = 0; i < bl->nthreads; ++i) {
        Fiber& f = bl->fibers[i];
        void** top = (void**)(stacks + (size_t)(i + 1) * (STACK + PAGE));  // page aligned
        top[-1] = nullptr;          // the entry's return address: it never returns
        top[-2] = (void*)&entry;    // where the first switch "returns" to
        for (int r = 3; r <= 8; ++r) top[-r] = nullptr;  // the six callee-saved registers
        f.sp = top - 8;
        f.warp_ops = 0;
        f.state = READY;
        bl->queue[i] = i;
    }
    for (int w = 0; w < bl->nwarps; ++w) {
        bl->warps[w].exited = 0;
        bl->warps[w].arrived = 0;
    }
    bl->head = 0;
    bl->count = bl->nthreads;
    bl->live = bl->nthreads;
    bl->arrived_block = 0;
    while (bl->count > 0 && !bl->failed) {  // fibers pass control on among themselves
        const int i = bl->queue[bl->head];
        bl->head = (bl->head + 1) % bl->nthreads;
        bl->count -= 1;
        activate(&bl->fibers[i]);
        kn_host_switch(&bl->sched_sp, g_cur->sp);
    }
    if (!bl->failed && bl->live > 0) {
        int at_block = 0, at_warp = 0;
        for (int i = 0; i < bl->nthreads; ++i) {
            at_block += bl->fibers[i].state == WAIT_BLOCK;
            at_warp += bl->fibers[i].state == WAIT_WARP;
        }
        fail("deadlock: %d threads wait at __syncthreads, %d at warp operations, none can go on",
             at_block, at_warp);
    }
    return !bl->failed;
}

}  // namespace

void sync_block() {
    Block* bl = g_blk;
    bl->arrived_block += 1;
    if (bl->arrived_block == bl->live) {
        release_block(bl);
        return;
    }
    g_cur->state = WAIT_BLOCK;
    leave();
}

void sync_warp(unsigned int mask) { meet(mask); }

unsigned long long exchange(unsigned int mask, unsigned long long value, int src_lane) {
    publish(value);
    return meet(mask)[src_lane];
}

unsigned int vote(unsigned int mask, bool pred) {
    publish(pred ? 1u : 0u);
    const unsigned long long* slot = meet(mask);
    unsigned int bits = 0;
    for (int l = 0; l < WARP; ++l)
        if ((mask >> l & 1u) && slot[l]) bits |= 1u << l;
    return bits;
}

unsigned int active_mask() {
    const Warp& w = g_blk->warps[g_cur->warp];
    return w.present & ~w.exited;
}

int run_grid(const LaunchDesc* d, void (*body)(void*), void* ctx) {
    if (d->shared_mem != 0) {
        snprintf(d->error, d->error_size, "dynamic shared memory (%llu bytes) is not emulated",
                 d->shared_mem);
        return 1;
    }
    const long long nthreads = (long long)d->block[0] * d->block[1] * d->block[2];
    if (nthreads <= 0 || nthreads > 1024) {
        snprintf(d->error, d->error_size, "a block of %lld threads (1 to 1024 allowed)", nthreads);
        return 1;
    }
    const int n = (int)nthreads;
    const size_t bytes = (size_t)n * (STACK + PAGE);
    char* stacks = (char*)mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) {
        snprintf(d->error, d->error_size, "cannot map %zu bytes of fiber stacks", bytes);
        return 1;
    }
    // fiber i: a guard page at i·(STACK+PAGE), its stack above it, growing down towards it
    for (int i = 0; i < n; ++i) mprotect(stacks + (size_t)i * (STACK + PAGE), PAGE, PROT_NONE);
    const int nwarps = (n + WARP - 1) / WARP;
    Fiber* fibers = new Fiber[n];
    Warp* warps = new Warp[nwarps];
    int* queue = new int[n];
    for (int w = 0; w < nwarps; ++w) {
        const int lanes = n - w * WARP < WARP ? n - w * WARP : WARP;
        warps[w].present = lanes == WARP ? 0xffffffffu : (1u << lanes) - 1;
    }
    const unsigned int bx = d->block[0], by = d->block[1];
    for (int i = 0; i < n; ++i) {
        fibers[i].tid = uint3{i % bx, i / bx % by, i / (bx * by)};
        fibers[i].warp = i / WARP;
        fibers[i].lane = i % WARP;
    }
    Block bl{fibers, warps, queue, n, nwarps, 0, 0, 0, 0, nullptr, d->error, d->error_size, false,
             body, ctx};
    g_blk = &bl;
    g_block_dim = dim3{d->block[0], d->block[1], d->block[2]};
    g_grid_dim = dim3{d->grid[0], d->grid[1], d->grid[2]};
    bool ok = true;
    for (unsigned int z = 0; ok && z < d->grid[2]; ++z)
        for (unsigned int y = 0; ok && y < d->grid[1]; ++y)
            for (unsigned int x = 0; ok && x < d->grid[0]; ++x) {
                g_block_idx = uint3{x, y, z};
                ok = run_block(&bl, stacks);
            }
    g_blk = nullptr;
    g_cur = nullptr;
    delete[] fibers;
    delete[] warps;
    delete[] queue;
    munmap(stacks, bytes);
    return ok ? 0 : 2;
}

}  // namespace kn_host
