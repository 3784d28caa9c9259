/* The interface between the simulated CUDA driver (cuda.c, built as libcuda.so) and the
 * simulated NCCL (nccl.c, built as libnccl.so, linked against it). Both are for tests:
 * see cuda.c for what they simulate and what they check. */
#ifndef FAKE_GPU_H
#define FAKE_GPU_H

#include <pthread.h>
#include <stddef.h>

typedef struct fake_stream fake_stream;

/* One lock and one condition variable for the whole simulation: every queue, event,
 * allocation and NCCL clique is read and written under it, and every state change
 * broadcasts. Jobs run on the stream workers with the lock held. */
void fake_lock(void);
void fake_unlock(void);
/* Waits on the global condition (the lock held); `what` names the wait for the
 * diagnostic printed, before the process aborts, when it exceeds FAKE_GPU_TIMEOUT_S. */
void fake_wait(const char *what, double *waited);
void fake_broadcast(void);
/* FAKE_GPU_TIMEOUT_S (default 60): how long any wait of the simulation may last. */
double fake_timeout_s(void);
/* Waits on `c` (with `m` held) for at most `ms` milliseconds, adding the time to `waited`
 * when nothing woke it; aborts as fake_wait does once `waited` passes the timeout. */
void fake_cond_wait(pthread_cond_t *c, pthread_mutex_t *m, long ms, const char *what,
                    double *waited);

/* Queues `run(arg)` on `stream` (NULL: the legacy default stream, which runs it at once,
 * on the caller's thread). `run` is called with the lock held; `arg` is then freed. */
void fake_enqueue(fake_stream *stream, void (*run)(void *), void *arg);
/* The ordinal of the stream's GPU. */
int fake_stream_device(fake_stream *stream);
/* The ordinal of the calling thread's current context, or -1. */
int fake_current_device(void);
/* Aborts the process (after printing why) unless [ptr, ptr + bytes) lies in one live
 * allocation of GPU `device` (any GPU when `device` is -1); the message says so when ptr
 * is in memory freed not long ago (a use after free). The lock must be held. */
void fake_check_device_range(unsigned long long ptr, size_t bytes, int device, const char *what);

/* Aborts the process (after printing why) if [ptr, ptr + bytes) is memory of another GPU
 * from a memory pool that has not granted GPU `peer` read and write access: a peer in the
 * same process reads and writes it directly (NCCL's P2P). Memory from cuMemAlloc passes
 * (NCCL enables peer access to it itself). The lock must be held. */
void fake_check_peer_access(unsigned long long ptr, size_t bytes, int peer, const char *what);

/* Prints "fake GPU: <message>" and aborts the process: a call the real library would
 * answer with undefined behaviour, a crash or a hang. */
void fake_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* malloc, calloc and realloc that die (fake_die) rather than return NULL: the simulation
 * has no way to go on without its bookkeeping, and a test should not read a crash. */
void *fake_xmalloc(size_t bytes);
void *fake_xcalloc(size_t n, size_t size);
void *fake_xrealloc(void *ptr, size_t bytes);

/* Fault injection, called by tests (tests/nccl_gpu/simulated.rs):
 *   void fake_gpu_fail_alloc(int device, size_t min_bytes);  (cuda.c)
 *   void fake_gpu_fail_free(int device);                     (cuda.c)
 * (the next cuMemFreeAsync of memory of GPU `device` fails);
 *   void fake_nccl_fail_call(int device, int nth);           (nccl.c)
 *   void fake_nccl_async_error(int device, int nth);         (nccl.c)
 * (the nth collective from now on GPU `device` is accepted but never completes, and its
 * communicator's ncclCommGetAsyncError says ncclSystemError); slow streams, so that work
 * stays pending after the host call returns (every job on a stream of GPU `device` first
 * sleeps `us` microseconds; 0 turns it off):
 *   void fake_gpu_slow_jobs(int device, unsigned us);        (cuda.c)
 * the next batch of NCCL collectives on GPU `device` first waits `ms` milliseconds:
 *   void fake_nccl_delay_next(int device, unsigned ms);     (nccl.c)
 * counts of NCCL launches and collective calls per GPU:
 *   void fake_nccl_counts(int device, unsigned long long *launches,
 *                         unsigned long long *calls);         (nccl.c)
 * and of host calls that wait for, or poll, a stream of a GPU (stream and event
 * synchronisation, event queries, copies to the host):
 *   unsigned long long fake_gpu_host_waits(int device);      (cuda.c) */

#endif
