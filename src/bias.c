/* The biased lock's slow paths and the membarrier set-up (bias.h). */
#define _GNU_SOURCE
#include "bias.h"

#include <pthread.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#else
#include <sched.h>
#endif

__thread char rk_thread_tag_byte __attribute__((tls_model("initial-exec")));

static pthread_once_t membarrier_once = PTHREAD_ONCE_INIT;
static int membarrier_ok;

static void membarrier_setup(void)
{
#if defined(__linux__) && defined(__NR_membarrier)
    long cmds = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    membarrier_ok = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                    syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
#endif
}

int rk_membarrier_ready(void)
{
    pthread_once(&membarrier_once, membarrier_setup);
    return membarrier_ok;
}

void rk_membarrier(void)
{
#if defined(__linux__) && defined(__NR_membarrier)
    syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
#endif
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* Spin a little, then sleep on a futex (glibc's low-level lock). */
void rk_block_wait(rk_block_t *l)
{
    for (int i = 0; i < 100; i++) {
        relax();
        int z = 0;
        if (__atomic_load_n(&l->v, __ATOMIC_RELAXED) == 0 &&
            __atomic_compare_exchange_n(&l->v, &z, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return;
    }
    while (__atomic_exchange_n(&l->v, 2, __ATOMIC_ACQUIRE) != 0) {
#ifdef __linux__
        syscall(SYS_futex, &l->v, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
#else
        sched_yield();
#endif
    }
}

void rk_block_wake(rk_block_t *l)
{
#ifdef __linux__
    syscall(SYS_futex, &l->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
#else
    (void)l;
#endif
}

/* Under v, by a thread other than the owner: take the bias away and wait
 * for the owner to leave its plain section. */
void rk_block_revoke(rk_block_t *l)
{
    rk_block_unbias(l);
    /* A full barrier on every thread: the owner either sees biased == 0 at
     * its second check, or its inside = 1 is visible to rk_block_wait_out. */
    rk_membarrier();
    rk_block_wait_out(l);
}

int rk_block_unbias(rk_block_t *l)
{
    int was = __atomic_load_n(&l->biased, __ATOMIC_RELAXED);
    __atomic_store_n(&l->biased, 0, __ATOMIC_SEQ_CST);
    l->streak = 0;
    return was;
}

void rk_block_wait_out(rk_block_t *l)
{
    while (__atomic_load_n(&l->inside, __ATOMIC_ACQUIRE))
        relax();
}

void rk_block_rebind(rk_block_t *l, int take)
{
    const void *o = take && rk_membarrier_ready() ? rk_thread_tag() : NULL;
    /* A biased previous owner would have to be revoked first: callers
     * unbind (take == 0) a lock whose owner is the caller or gone. */
    __atomic_store_n(&l->biased, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&l->owner, o, __ATOMIC_RELAXED);
    l->streak = 0;
    if (o)
        __atomic_store_n(&l->biased, 1, __ATOMIC_RELAXED);
}
