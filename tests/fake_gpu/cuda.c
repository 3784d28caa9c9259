/* A simulated CUDA driver, built as libcuda.so, so that the NCCL backend's GPU tests run
 * on a machine without a GPU (tests/nccl_gpu.rs runs them against it).
 *
 * What it simulates: FAKE_GPU_COUNT GPUs (default 2) whose memory is host memory; one
 * worker thread per stream that runs the stream's work in order, asynchronously to the
 * host; events, stream-to-stream waits, stream-ordered allocation and free. What it
 * checks, aborting the process with a message where real CUDA would crash, corrupt
 * memory or hang: every device address a copy, memset or NCCL call uses lies in a live
 * allocation (a stream-ordered allocation becomes live, and a free ends it, where its
 * stream gets to it; freed memory is poisoned and held in a quarantine for a while rather
 * than handed out again, so a free that overtakes a use on another stream, or a use that
 * overtakes the allocation, is caught and named), host and device addresses are not
 * confused, and no wait lasts longer than FAKE_GPU_TIMEOUT_S (default 60) seconds. As on
 * a GPU, a copy from pageable host memory to a stream waits, on the host, for the work
 * queued on that stream before it (the driver stages pageable memory itself), while a copy
 * from page-locked memory (cuMemHostAlloc) returns at once and reads the memory when the
 * stream gets to it; page-locked memory freed while a queued copy still reads it aborts
 * the run. Each
 * stream sleeps up to FAKE_GPU_JITTER_US (default 20) microseconds before each job, so
 * that streams run at uneven speeds.
 *
 * What it cannot show: anything about kernels, timing, P2P or real memory limits. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_READY = 600,
};

#define MAX_GPUS 16

/* ---- the global lock, waits, and dying loudly ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

void fake_lock(void) { pthread_mutex_lock(&mu); }
void fake_unlock(void) { pthread_mutex_unlock(&mu); }
void fake_broadcast(void) { pthread_cond_broadcast(&cond); }

void fake_die(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "fake GPU: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    fflush(stderr);
    abort();
}

void *fake_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        fake_die("out of host memory (%zu bytes)", bytes);
    return p;
}

void *fake_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        fake_die("out of host memory (%zu x %zu bytes)", n, size);
    return p;
}

void *fake_xrealloc(void *ptr, size_t bytes) {
    void *p = realloc(ptr, bytes ? bytes : 1);
    if (!p)
        fake_die("out of host memory (%zu bytes)", bytes);
    return p;
}

double fake_timeout_s(void) {
    const char *v = getenv("FAKE_GPU_TIMEOUT_S");
    double t = v ? atof(v) : 0;
    return t > 0 ? t : 60;
}

void fake_cond_wait(pthread_cond_t *c, pthread_mutex_t *m, long ms, const char *what,
                    double *waited) {
    struct timespec at;
    clock_gettime(CLOCK_REALTIME, &at);
    at.tv_nsec += ms * 1000 * 1000;
    if (at.tv_nsec >= 1000000000) {
        at.tv_sec += 1;
        at.tv_nsec -= 1000000000;
    }
    if (pthread_cond_timedwait(c, m, &at) == ETIMEDOUT) {
        *waited += (double)ms / 1000;
        if (*waited > fake_timeout_s())
            fake_die("waited more than %.0f s: %s", fake_timeout_s(), what);
    }
}

void fake_wait(const char *what, double *waited) {
    fake_cond_wait(&cond, &mu, 100, what, waited);
}

/* ---- devices and contexts ---- */

/* A context is its GPU's slot in `contexts`: its ordinal is the index, so that nothing
 * writes to the shared array (cuInit may run on several threads at once). */
typedef struct {
    char unused; /* only the address matters */
} fake_ctx;

static fake_ctx contexts[MAX_GPUS];
static __thread fake_ctx *current;

static int ctx_device(const fake_ctx *ctx) { return (int)(ctx - contexts); }

static int gpu_count(void) {
    const char *v = getenv("FAKE_GPU_COUNT");
    int n = v ? atoi(v) : 2;
    return n < 0 ? 0 : n > MAX_GPUS ? MAX_GPUS : n;
}

int fake_current_device(void) { return current ? ctx_device(current) : -1; }

CUresult cuInit(unsigned flags) {
    (void)flags;
    return gpu_count() ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int *version) {
    *version = 12020;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    *count = gpu_count();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (ordinal < 0 || ordinal >= gpu_count())
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
    if (device < 0 || device >= gpu_count())
        return CUDA_ERROR_INVALID_DEVICE;
    switch (attribute) {
    case 75: /* compute capability major */
        *value = 9;
        break;
    case 115: /* memory pools supported: cudarc then allocates with cuMemAllocAsync */
        *value = 1;
        break;
    default:
        *value = 0;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
    if (device < 0 || device >= gpu_count())
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "simulated GPU %d (tests/fake_gpu)", device);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    (void)device;
    *bytes = (size_t)1 << 34;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    *free_bytes = *total = (size_t)1 << 34;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(fake_ctx **ctx, CUdevice device) {
    if (device < 0 || device >= gpu_count())
        return CUDA_ERROR_INVALID_DEVICE;
    *ctx = &contexts[device];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    (void)device;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(fake_ctx *ctx) {
    current = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(fake_ctx **ctx) {
    *ctx = current;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = ctx_device(current);
    return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int *can, CUdevice device, CUdevice peer) {
    *can = device != peer;
    return CUDA_SUCCESS;
}

/* Memory pools: each GPU's default pool, pools made with cuMemPoolCreate, and the current
 * pool of each GPU (where cuMemAllocAsync allocates). A pool records which GPUs may read
 * and write its memory: its own, and those granted with cuMemPoolSetAccess; the simulated
 * NCCL checks that every peer whose buffers a collective reads or writes directly has
 * access to them (fake_check_peer_access). */
typedef struct fake_pool {
    int device;
    int access[MAX_GPUS]; /* CUmemAccess_flags per GPU: 0 none, 1 read, 3 read and write */
} fake_pool;

enum { CU_MEM_LOCATION_TYPE_DEVICE = 1, CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 };

typedef struct {
    int type, id;
} CUmemLocation;

typedef struct {
    CUmemLocation location;
    int flags;
} CUmemAccessDesc;

typedef struct {
    int allocType, handleTypes;
    CUmemLocation location;
    /* the rest is not read */
} CUmemPoolProps;

static fake_pool default_pools[MAX_GPUS];
static fake_pool *current_pools[MAX_GPUS];

/* The lock held. */
static fake_pool *current_pool(int device) {
    if (!current_pools[device]) {
        default_pools[device].device = device;
        current_pools[device] = &default_pools[device];
    }
    return current_pools[device];
}

CUresult cuDeviceGetDefaultMemPool(fake_pool **pool, CUdevice device) {
    if (device < 0 || device >= gpu_count())
        return CUDA_ERROR_INVALID_DEVICE;
    default_pools[device].device = device;
    *pool = &default_pools[device];
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(fake_pool **pool, CUdevice device) {
    if (device < 0 || device >= gpu_count())
        return CUDA_ERROR_INVALID_DEVICE;
    fake_lock();
    *pool = current_pool(device);
    fake_unlock();
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice device, fake_pool *pool) {
    if (device < 0 || device >= gpu_count())
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pool || pool->device != device)
        return CUDA_ERROR_INVALID_VALUE;
    fake_lock();
    current_pools[device] = pool;
    fake_unlock();
    return CUDA_SUCCESS;
}

CUresult cuMemPoolCreate(fake_pool **pool, const CUmemPoolProps *props) {
    if (!props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        props->location.id < 0 || props->location.id >= gpu_count())
        return CUDA_ERROR_INVALID_VALUE;
    fake_pool *p = fake_xcalloc(1, sizeof *p);
    p->device = props->location.id;
    *pool = p; /* never destroyed: allocations may still point at it */
    return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(fake_pool *pool) {
    (void)pool;
    return CUDA_SUCCESS;
}

/* As CUDA: each descriptor names a GPU (a device location) and the access it gets;
 * access for a GPU that cannot reach the pool's GPU peer to peer is refused. */
CUresult cuMemPoolSetAccess(fake_pool *pool, const CUmemAccessDesc *descs, size_t count) {
    if (!pool || !descs || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        const CUmemAccessDesc *d = &descs[i];
        if (d->location.type != CU_MEM_LOCATION_TYPE_DEVICE || d->location.id < 0 ||
            d->location.id >= gpu_count() || (d->flags != 0 && d->flags != 1 && d->flags != 3))
            return CUDA_ERROR_INVALID_VALUE;
        if (d->location.id == pool->device && d->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_DEVICE; /* the owner's access cannot be taken */
    }
    fake_lock();
    for (size_t i = 0; i < count; i++)
        pool->access[descs[i].location.id] = descs[i].flags;
    fake_unlock();
    return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAccess(int *flags, fake_pool *pool, const CUmemLocation *location) {
    if (!pool || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
        location->id < 0 || location->id >= gpu_count())
        return CUDA_ERROR_INVALID_VALUE;
    fake_lock();
    *flags = location->id == pool->device ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                          : pool->access[location->id];
    fake_unlock();
    return CUDA_SUCCESS;
}

/* ---- allocations ---- */

typedef struct {
    CUdeviceptr ptr;
    size_t bytes;
    int device;
    int ready; /* 0 until its stream reaches a stream-ordered allocation */
    fake_pool *pool; /* the pool of a stream-ordered allocation, else NULL */
} allocation;

/* Live allocations, read and written under the lock only: alloc_on grows the array and
 * free_now moves its last entry, so a reader without the lock could see either half-done. */
static allocation *allocs;
static size_t n_allocs, cap_allocs;

/* Freed blocks, oldest first, kept poisoned and not given back to malloc for a while: a
 * freed address that malloc handed out again at once would pass for live memory, and the
 * use after free would go unnoticed. The oldest leave (really freed) once the quarantine
 * holds more than QUARANTINE_BYTES or QUARANTINE_BLOCKS; the newest always stays. */
#define QUARANTINE_BYTES ((size_t)256 << 20)
#define QUARANTINE_BLOCKS 4096
static allocation quarantine[QUARANTINE_BLOCKS]; /* a ring */
static size_t q_oldest, q_count, q_bytes;

static allocation *find_alloc(CUdeviceptr ptr) {
    for (size_t i = 0; i < n_allocs; i++)
        if (ptr >= allocs[i].ptr && ptr < allocs[i].ptr + allocs[i].bytes)
            return &allocs[i];
    return NULL;
}

/* The quarantined block that holds `ptr`, newest first (the lock held). */
static allocation *find_freed(CUdeviceptr ptr) {
    for (size_t k = q_count; k-- > 0;) {
        allocation *a = &quarantine[(q_oldest + k) % QUARANTINE_BLOCKS];
        if (ptr >= a->ptr && ptr < a->ptr + a->bytes)
            return a;
    }
    return NULL;
}

static void release_oldest(void) {
    allocation *a = &quarantine[q_oldest];
    free((void *)(uintptr_t)a->ptr);
    q_bytes -= a->bytes;
    q_oldest = (q_oldest + 1) % QUARANTINE_BLOCKS;
    q_count--;
}

static void put_in_quarantine(allocation a) {
    if (q_count == QUARANTINE_BLOCKS)
        release_oldest();
    quarantine[(q_oldest + q_count) % QUARANTINE_BLOCKS] = a;
    q_count++;
    q_bytes += a.bytes;
    while (q_bytes > QUARANTINE_BYTES && q_count > 1)
        release_oldest();
}

void fake_check_device_range(CUdeviceptr ptr, size_t bytes, int device, const char *what) {
    if (bytes == 0)
        return;
    allocation *a = find_alloc(ptr);
    if (!a) {
        allocation *f = find_freed(ptr);
        if (f)
            fake_die("%s: %#llx is a use after free: it lies in the %zu-byte allocation at "
                     "%#llx of GPU %d, which was freed (cuMemFree, or a cuMemFreeAsync its "
                     "stream got to) before this use",
                     what, ptr, f->bytes, f->ptr, f->device);
        fake_die("%s: %#llx is not in a live GPU allocation (freed long ago, never "
                 "allocated, or a host address)",
                 what, ptr);
    }
    if (ptr + bytes > a->ptr + a->bytes)
        fake_die("%s: %zu bytes at %#llx run past the end of a %zu-byte allocation at %#llx",
                 what, bytes, ptr, a->bytes, a->ptr);
    if (device >= 0 && a->device != device)
        fake_die("%s: %#llx is memory of GPU %d, not of GPU %d", what, ptr, a->device, device);
    if (!a->ready)
        fake_die("%s: %#llx is used before the stream that allocated it (cuMemAllocAsync) "
                 "gets to the allocation",
                 what, ptr);
}

void fake_check_peer_access(CUdeviceptr ptr, size_t bytes, int peer, const char *what) {
    allocation *a = bytes ? find_alloc(ptr) : NULL;
    if (!a || !a->pool || a->device == peer)
        return;
    if (a->pool->access[peer] != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        fake_die("%s: GPU %d reads and writes %#llx directly, memory of GPU %d from a memory "
                 "pool that grants it %s (cuMemPoolSetAccess on the pool the memory came "
                 "from: the GPU's current pool when it was allocated)",
                 what, peer, ptr, a->device,
                 a->pool->access[peer] ? "read access only" : "no access");
}

/* The lock must be held. */
static void check_host_range(const void *ptr, size_t bytes, const char *what) {
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    if (!bytes)
        return;
    if (find_alloc(p))
        fake_die("%s: %p is GPU memory where a host address was expected", what, ptr);
    if (find_freed(p))
        fake_die("%s: %p is freed GPU memory (a use after free) where a host address was "
                 "expected",
                 what, ptr);
}

/* Fault injection, for tests: the next allocation of at least `fail_bytes` bytes on GPU
 * `fail_device` fails with CUDA_ERROR_OUT_OF_MEMORY. */
static int fail_device = -1;
static size_t fail_bytes;

void fake_gpu_fail_alloc(int device, size_t min_bytes) {
    fake_lock();
    fail_device = device;
    fail_bytes = min_bytes;
    fake_unlock();
}

static CUresult alloc_on(CUdeviceptr *ptr, size_t bytes, int device, int ready, int pooled) {
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (device < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    fake_lock();
    int fail = device == fail_device && bytes >= fail_bytes;
    if (fail)
        fail_device = -1;
    fake_unlock();
    if (fail)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = NULL;
    if (posix_memalign(&p, 256, bytes)) {
        /* Out of host memory: give the quarantine back before saying out of memory. */
        fake_lock();
        while (q_count)
            release_oldest();
        fake_unlock();
        if (posix_memalign(&p, 256, bytes))
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Not zero: code that reads memory it never wrote sees garbage, as on a GPU. */
    memset(p, 0xA5, bytes);
    fake_lock();
    if (n_allocs == cap_allocs) {
        cap_allocs = cap_allocs ? 2 * cap_allocs : 64;
        allocs = fake_xrealloc(allocs, cap_allocs * sizeof *allocs);
    }
    fake_pool *pool = pooled ? current_pool(device) : NULL;
    allocs[n_allocs++] = (allocation){(CUdeviceptr)(uintptr_t)p, bytes, device, ready, pool};
    fake_unlock();
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

/* Frees `ptr` (the lock held): it must be the start of a live allocation. Its memory is
 * poisoned and quarantined, not given back to malloc yet. */
static void free_now(CUdeviceptr ptr, const char *what) {
    for (size_t i = 0; i < n_allocs; i++) {
        if (allocs[i].ptr == ptr) {
            memset((void *)(uintptr_t)ptr, 0xDD, allocs[i].bytes);
            put_in_quarantine(allocs[i]);
            allocs[i] = allocs[--n_allocs];
            return;
        }
    }
    allocation *f = find_freed(ptr);
    if (f && f->ptr == ptr)
        fake_die("%s: %#llx was freed already (a double free)", what, ptr);
    if (f)
        fake_die("%s: %#llx lies in a freed allocation at %#llx (a use after free)", what, ptr,
                 f->ptr);
    fake_die("%s: %#llx is not the start of a live allocation (a double free?)", what, ptr);
}

/* ---- streams ---- */

typedef struct job {
    void (*run)(void *);
    void *arg;
    struct job *next;
} job;

struct fake_stream {
    int device;
    job *head, *tail;
    unsigned long long enqueued, completed;
    int destroyed;
};

/* Streams are never freed: events recorded on a stream may outlive it. */
static fake_stream *streams[4096];
static size_t n_streams;

int fake_stream_device(fake_stream *s) { return s ? s->device : fake_current_device(); }

/* Test control: per GPU, how long each job of its streams sleeps before it runs, so that
 * work stays pending well after the host call that queued it returned. (The default
 * stream runs work on the calling thread, so nothing on it can be left pending.) */
static unsigned slow_us[MAX_GPUS];

void fake_gpu_slow_jobs(int device, unsigned us) {
    fake_lock();
    if (device >= 0 && device < MAX_GPUS)
        slow_us[device] = us;
    fake_unlock();
}

static void *worker(void *arg) {
    fake_stream *s = arg;
    const char *v = getenv("FAKE_GPU_JITTER_US");
    unsigned jitter_us = v ? (unsigned)atoi(v) : 20, seed = (unsigned)(uintptr_t)s;
    fake_lock();
    for (;;) {
        while (!s->head && !s->destroyed)
            pthread_cond_wait(&cond, &mu);
        if (!s->head)
            break;
        /* Streams run at uneven speeds, so that work ordered only by luck (a free on one
         * stream that must wait for a read on another) comes out of order sometimes. */
        unsigned sleep_us = jitter_us ? (unsigned)rand_r(&seed) % (jitter_us + 1) : 0;
        if (s->device >= 0 && s->device < MAX_GPUS)
            sleep_us += slow_us[s->device];
        if (sleep_us) {
            fake_unlock();
            usleep((useconds_t)sleep_us);
            fake_lock();
        }
        job *j = s->head;
        s->head = j->next;
        if (!s->head)
            s->tail = NULL;
        j->run(j->arg);
        free(j->arg);
        free(j);
        s->completed++;
        fake_broadcast();
    }
    fake_unlock();
    return NULL;
}

/* The legacy default stream (NULL) and the per-thread one (0x2) run work at once. */
static int is_default(fake_stream *s) { return s == NULL || (uintptr_t)s == 0x2; }

/* fake_enqueue with the lock held, for callers whose bookkeeping must change in the
 * same hold as the queue (cuEventRecord: no other job may slip in between). */
static void enqueue_locked(fake_stream *s, void (*run)(void *), void *arg) {
    if (is_default(s)) {
        run(arg);
        free(arg);
        return;
    }
    if (s->destroyed)
        fake_die("work queued on a destroyed stream");
    job *j = fake_xmalloc(sizeof *j);
    *j = (job){run, arg, NULL};
    if (s->tail)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    s->enqueued++;
    fake_broadcast();
}

void fake_enqueue(fake_stream *s, void (*run)(void *), void *arg) {
    fake_lock();
    enqueue_locked(s, run, arg);
    fake_unlock();
}

CUresult cuStreamCreate(fake_stream **out, unsigned flags) {
    (void)flags;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    fake_stream *s = fake_xcalloc(1, sizeof *s);
    s->device = ctx_device(current);
    fake_lock();
    if (n_streams == sizeof streams / sizeof *streams)
        fake_die("more than %zu streams", n_streams);
    streams[n_streams++] = s;
    fake_unlock();
    pthread_t t;
    if (pthread_create(&t, NULL, worker, s))
        fake_die("cannot start a stream worker");
    pthread_detach(t);
    *out = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreateWithPriority(fake_stream **out, unsigned flags, int priority) {
    (void)priority;
    return cuStreamCreate(out, flags);
}

/* Like CUDA: returns at once; the stream's queued work still runs. */
CUresult cuStreamDestroy_v2(fake_stream *s) {
    if (is_default(s))
        return CUDA_ERROR_INVALID_HANDLE;
    fake_lock();
    s->destroyed = 1;
    fake_broadcast();
    fake_unlock();
    return CUDA_SUCCESS;
}

/* Per GPU: host calls that wait for (or poll) a stream's progress, for tests. */
static unsigned long long host_waits[MAX_GPUS];

static void count_wait(int device) {
    if (device >= 0 && device < MAX_GPUS)
        host_waits[device]++;
}

unsigned long long fake_gpu_host_waits(int device) {
    fake_lock();
    unsigned long long n = device >= 0 && device < MAX_GPUS ? host_waits[device] : 0;
    fake_unlock();
    return n;
}

static void drain(fake_stream *s, const char *what) {
    unsigned long long target = s->enqueued;
    double waited = 0;
    while (s->completed < target)
        fake_wait(what, &waited);
}

CUresult cuStreamSynchronize(fake_stream *s) {
    if (is_default(s))
        return CUDA_SUCCESS;
    fake_lock();
    count_wait(s->device);
    drain(s, "cuStreamSynchronize");
    fake_unlock();
    return CUDA_SUCCESS;
}

CUresult cuStreamQuery(fake_stream *s) {
    if (is_default(s))
        return CUDA_SUCCESS;
    fake_lock();
    count_wait(s->device);
    CUresult r = s->completed < s->enqueued ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    fake_unlock();
    return r;
}

/* Every stream of the current GPU (all of them without a current context). */
CUresult cuCtxSynchronize(void) {
    int device = fake_current_device();
    fake_lock();
    count_wait(device);
    for (size_t i = 0; i < n_streams; i++)
        if (device < 0 || streams[i]->device == device)
            drain(streams[i], "cuCtxSynchronize");
    fake_unlock();
    return CUDA_SUCCESS;
}

/* ---- events ---- */

typedef struct {
    fake_stream *stream; /* NULL until recorded */
    unsigned long long target;
    struct timespec at;
    double first_poll; /* when cuEventQuery first found it pending (0: not yet) */
} fake_event;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

CUresult cuEventCreate(fake_event **out, unsigned flags) {
    (void)flags;
    *out = fake_xcalloc(1, sizeof **out);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(fake_event *e) {
    /* Events recorded on a stream are read by jobs queued after them: leak them. */
    (void)e;
    return CUDA_SUCCESS;
}

static void stamp(void *arg) {
    fake_event *e = *(fake_event **)arg;
    clock_gettime(CLOCK_MONOTONIC, &e->at);
}

CUresult cuEventRecord(fake_event *e, fake_stream *s) {
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    fake_event **arg = fake_xmalloc(sizeof *arg);
    *arg = e;
    /* One lock hold: the event completes when its stamp job has run, so the target must
     * count exactly the jobs queued before that one (another thread's enqueue may not slip
     * in between). On the default stream the stamp runs at once and the event is done. */
    fake_lock();
    e->stream = is_default(s) ? NULL : s;
    e->target = is_default(s) ? 0 : s->enqueued + 1;
    e->first_poll = 0;
    enqueue_locked(s, stamp, arg);
    fake_unlock();
    return CUDA_SUCCESS;
}

static int event_done(fake_event *e) { return !e->stream || e->stream->completed >= e->target; }

/* A host thread that polls an event for longer than the timeout is as stuck as one that
 * waits for it: say so rather than spin forever. */
CUresult cuEventQuery(fake_event *e) {
    fake_lock();
    if (e->stream)
        count_wait(e->stream->device);
    CUresult r = CUDA_SUCCESS;
    if (!event_done(e)) {
        r = CUDA_ERROR_NOT_READY;
        double now = now_s();
        if (e->first_poll == 0)
            e->first_poll = now;
        else if (now - e->first_poll > fake_timeout_s())
            fake_die("an event polled for more than %.0f s (cuEventQuery): its stream never "
                     "gets there",
                     fake_timeout_s());
    }
    fake_unlock();
    return r;
}

CUresult cuEventSynchronize(fake_event *e) {
    fake_lock();
    if (e->stream)
        count_wait(e->stream->device);
    double waited = 0;
    while (!event_done(e))
        fake_wait("cuEventSynchronize", &waited);
    fake_unlock();
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *ms, fake_event *start, fake_event *end) {
    fake_lock();
    /* The stamps are read under the lock too: a stream worker writes them. */
    int done = event_done(start) && event_done(end);
    if (done)
        *ms = (float)((end->at.tv_sec - start->at.tv_sec) * 1e3 +
                      (end->at.tv_nsec - start->at.tv_nsec) / 1e6);
    fake_unlock();
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

typedef struct {
    fake_stream *stream;
    unsigned long long target;
} wait_arg;

static void wait_event_job(void *arg) {
    wait_arg *w = arg;
    double waited = 0;
    while (w->stream->completed < w->target)
        fake_wait("a stream waiting for an event (cuStreamWaitEvent)", &waited);
}

CUresult cuStreamWaitEvent(fake_stream *s, fake_event *e, unsigned flags) {
    (void)flags;
    fake_lock();
    wait_arg w = {e->stream, e->target};
    fake_unlock();
    if (!w.stream)
        return CUDA_SUCCESS;
    if (is_default(s)) {
        fake_lock();
        wait_event_job(&w);
        fake_unlock();
        return CUDA_SUCCESS;
    }
    wait_arg *arg = fake_xmalloc(sizeof *arg);
    *arg = w;
    fake_enqueue(s, wait_event_job, arg);
    return CUDA_SUCCESS;
}

/* ---- memory: allocation, free, copies ---- */

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes) {
    return alloc_on(ptr, bytes, fake_current_device(), 1, 0);
}

static void ready_job(void *arg) {
    CUdeviceptr ptr = *(CUdeviceptr *)arg;
    allocation *a = find_alloc(ptr);
    if (!a || a->ptr != ptr)
        fake_die("a stream-ordered allocation at %#llx was freed before its stream made it",
                 ptr);
    a->ready = 1;
}

/* Stream-ordered allocation: the memory is usable from the point of `s` where it is
 * allocated on, by work ordered after it. */
CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t bytes, fake_stream *s) {
    CUresult r = alloc_on(ptr, bytes, fake_stream_device(s), is_default(s), 1);
    if (r != CUDA_SUCCESS || is_default(s))
        return r;
    CUdeviceptr *arg = fake_xmalloc(sizeof *arg);
    *arg = *ptr;
    fake_enqueue(s, ready_job, arg);
    return CUDA_SUCCESS;
}

static void free_job(void *arg) { free_now(*(CUdeviceptr *)arg, "cuMemFreeAsync"); }

/* Fault injection, for tests: the next cuMemFreeAsync of memory of GPU `device` fails
 * with CUDA_ERROR_INVALID_VALUE (and leaves the memory allocated). */
static int fail_free_device = -1;

void fake_gpu_fail_free(int device) {
    fake_lock();
    fail_free_device = device;
    fake_unlock();
}

CUresult cuMemFreeAsync(CUdeviceptr ptr, fake_stream *s) {
    fake_lock();
    allocation *a = find_alloc(ptr);
    int fail = a && a->device == fail_free_device;
    if (fail)
        fail_free_device = -1;
    fake_unlock();
    if (fail)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr *arg = fake_xmalloc(sizeof *arg);
    *arg = ptr;
    fake_enqueue(s, free_job, arg);
    return CUDA_SUCCESS;
}

/* Waits for all work queued so far on every stream, as CUDA's synchronous free does. */
CUresult cuMemFree_v2(CUdeviceptr ptr) {
    fake_lock();
    for (size_t i = 0; i < n_streams; i++)
        drain(streams[i], "cuMemFree");
    free_now(ptr, "cuMemFree");
    fake_unlock();
    return CUDA_SUCCESS;
}

/* ---- page-locked host memory ---- */

typedef struct {
    uintptr_t ptr;
    size_t bytes;
    unsigned long long readers; /* queued copies that read or write it */
} pinned_block;

static pinned_block *pinned;
static size_t n_pinned, cap_pinned;

/* The page-locked block that holds [ptr, ptr + bytes), or NULL (the lock held). */
static pinned_block *find_pinned(const void *ptr, size_t bytes) {
    uintptr_t p = (uintptr_t)ptr;
    for (size_t i = 0; i < n_pinned; i++)
        if (p >= pinned[i].ptr && p + bytes <= pinned[i].ptr + pinned[i].bytes)
            return &pinned[i];
    return NULL;
}

CUresult cuMemHostAlloc(void **out, size_t bytes, unsigned flags) {
    (void)flags;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake_lock();
    if (n_pinned == cap_pinned) {
        cap_pinned = cap_pinned ? 2 * cap_pinned : 16;
        pinned = fake_xrealloc(pinned, cap_pinned * sizeof *pinned);
    }
    pinned[n_pinned++] = (pinned_block){(uintptr_t)p, bytes, 0};
    fake_unlock();
    *out = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **out, size_t bytes) { return cuMemHostAlloc(out, bytes, 0); }

CUresult cuMemFreeHost(void *p) {
    fake_lock();
    pinned_block *b = find_pinned(p, 1);
    if (!b || b->ptr != (uintptr_t)p)
        fake_die("cuMemFreeHost(%p): not page-locked memory from cuMemHostAlloc", p);
    if (b->readers)
        fake_die("cuMemFreeHost(%p): %llu queued copies still use this page-locked memory", p,
                 b->readers);
    *b = pinned[--n_pinned];
    fake_unlock();
    free(p);
    return CUDA_SUCCESS;
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    /* 0 host to device (src is the staged copy below, unless `pinned`), 1 device to host,
     * 2 d2d */
    int kind;
    /* The page-locked host side of a host copy (read or written when the stream gets to
     * the copy), or NULL: pageable memory. */
    const void *pinned;
    unsigned char staged[];
} copy_arg;

static void copy_job(void *arg) {
    copy_arg *c = arg;
    CUdeviceptr dst = (CUdeviceptr)(uintptr_t)c->dst, src = (CUdeviceptr)(uintptr_t)c->src;
    if (c->pinned) {
        pinned_block *b = find_pinned(c->pinned, c->bytes);
        if (!b)
            fake_die("a queued copy's page-locked memory at %p was freed before the copy ran",
                     c->pinned);
        b->readers--;
    }
    switch (c->kind) {
    case 0:
        fake_check_device_range(dst, c->bytes, -1, "cuMemcpyHtoDAsync destination");
        memcpy(c->dst, c->pinned ? c->src : c->staged, c->bytes);
        break;
    case 1:
        fake_check_device_range(src, c->bytes, -1, "cuMemcpyDtoHAsync source");
        check_host_range(c->dst, c->bytes, "cuMemcpyDtoHAsync destination");
        memcpy(c->dst, c->src, c->bytes);
        break;
    default:
        fake_check_device_range(dst, c->bytes, -1, "cuMemcpyDtoDAsync destination");
        fake_check_device_range(src, c->bytes, -1, "cuMemcpyDtoDAsync source");
        memmove(c->dst, c->src, c->bytes);
    }
}

static CUresult copy(void *dst, const void *src, size_t bytes, int kind, fake_stream *s) {
    if (bytes == 0)
        return CUDA_SUCCESS;
    const void *host = kind == 0 ? src : kind == 1 ? dst : NULL;
    fake_lock();
    pinned_block *pin = host ? find_pinned(host, bytes) : NULL;
    if (pin)
        pin->readers++;
    fake_unlock();
    copy_arg *c = fake_xmalloc(sizeof *c + (kind == 0 && !pin ? bytes : 0));
    *c = (copy_arg){dst, src, bytes, kind, pin ? host : NULL};
    if (kind == 0 && !pin) {
        /* Pageable host memory is staged at the call, so the caller may reuse it at once;
         * the driver may first wait for the stream's queued work (its staging buffers
         * drain only as fast as the stream runs), where no abort reaches the host thread:
         * the simulation always does. */
        fake_lock();
        check_host_range(src, bytes, "cuMemcpyHtoDAsync source");
        if (!is_default(s)) {
            count_wait(s->device);
            drain(s, "a copy from pageable host memory (cuMemcpyHtoDAsync) waiting for the "
                     "work queued before it on its stream");
        }
        fake_unlock();
        memcpy(c->staged, src, bytes);
    }
    fake_enqueue(s, copy_job, c);
    if (kind == 1 && !pin && !is_default(s)) {
        /* A copy to pageable host memory returns once it is done. */
        fake_lock();
        count_wait(s->device);
        drain(s, "cuMemcpyDtoHAsync");
        fake_unlock();
    }
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, fake_stream *s) {
    return copy((void *)(uintptr_t)dst, src, bytes, 0, s);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, fake_stream *s) {
    return copy(dst, (const void *)(uintptr_t)src, bytes, 1, s);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, fake_stream *s) {
    return copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes, 2, s);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, fake_ctx *dst_ctx, CUdeviceptr src, fake_ctx *src_ctx,
                           size_t bytes, fake_stream *s) {
    (void)dst_ctx;
    (void)src_ctx;
    return copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes, 2, s);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    return copy((void *)(uintptr_t)dst, src, bytes, 0, NULL);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    return copy(dst, (const void *)(uintptr_t)src, bytes, 1, NULL);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    return copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes, 2, NULL);
}

typedef struct {
    CUdeviceptr dst;
    unsigned char value;
    size_t bytes;
} memset_arg;

static void memset_job(void *arg) {
    memset_arg *m = arg;
    fake_check_device_range(m->dst, m->bytes, -1, "cuMemsetD8Async");
    memset((void *)(uintptr_t)m->dst, m->value, m->bytes);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, fake_stream *s) {
    memset_arg *m = fake_xmalloc(sizeof *m);
    *m = (memset_arg){dst, value, bytes};
    fake_enqueue(s, memset_job, m);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t bytes) {
    return cuMemsetD8Async(dst, value, bytes, NULL);
}

/* ---- errors ---- */

static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
};

static CUresult describe_error(CUresult r, int text, const char **out) {
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++) {
        if (errors[i].code == r) {
            *out = text ? errors[i].text : errors[i].name;
            return CUDA_SUCCESS;
        }
    }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult r, const char **name) { return describe_error(r, 0, name); }

CUresult cuGetErrorString(CUresult r, const char **text) { return describe_error(r, 1, text); }
