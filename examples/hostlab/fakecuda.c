/* A stand-in for the CUDA driver library (libcuda.so.1) for the tests and the CPU host lab.
 *
 * It exports the driver entry points triscope's uprobes watch (agent/ebpf/cuda.bpf.c) with the real
 * signatures of cuda.h (CUresult 0 = CUDA_SUCCESS) and simulates one GPU with one in-order queue:
 *
 *   - cuLaunchKernel(+_ptsz, cuLaunchKernelEx) queues gridDimX*gridDimY*gridDimZ blocks of
 *     `block_ns` of "GPU work" each (fake_set_block_ns; default 1000 ns);
 *   - the synchronisation calls (cuCtxSynchronize, cuStreamSynchronize(+_ptsz), cuEventSynchronize)
 *     SPIN in user space until the queued work is done, as CUDA's default (cudaDeviceScheduleAuto on
 *     an idle host spins); fake_set_sync_mode(1) makes them block in clock_nanosleep instead;
 *   - host-to-device copies from pageable memory go through a static staging buffer: the calling
 *     thread memcpy's each chunk into it at `staging_bw` bytes/s (busy-waiting the rest of each
 *     chunk's time), so the host spends CPU time in proportion to the bytes; each staged chunk then
 *     queues its DMA (`dma_bw` bytes/s).  The synchronous variant first waits for the queue (CUDA's
 *     "stream sync before the copy is initiated").  Copies from pinned memory (inside a range from
 *     cuMemHostAlloc / cuMemAllocHost / cuMemHostRegister) queue their DMA: the async ones return at
 *     once, the synchronous ones wait for it;
 *   - device-to-host copies: to pinned memory, queued (the synchronous one waits); to pageable
 *     memory, wait for the queue, then unstage through the same buffer at `staging_bw`;
 *   - cuMemcpy / cuMemcpyAsync (unified addressing) tell the direction from the fake device range
 *     that cuMemAlloc_v2 hands out addresses from (a PROT_NONE reservation, like the driver's);
 *   - fake_busy_ratio(): the share of the last second the simulated device was busy (the lab reads
 *     it as NVML's SM activity).
 *
 * Build: gcc -O2 -shared -fPIC -pthread -o libcuda.so.1 fakecuda.c  (examples/hostlab/fakecuda.py)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define API __attribute__((visibility("default"), noinline))

/* ------------------------------------------------------------------ the simulated device */
#define STAGING_BYTES (1 << 20)
#define MAX_PINNED 4096
#define MAX_BUSY 8192
#define DEVICE_VA (64ULL << 30)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t busy_until;                  /* CLOCK_MONOTONIC ns when the queue drains */
static uint64_t busy_start[MAX_BUSY], busy_end[MAX_BUSY];
static unsigned busy_head, busy_len;         /* ring of merged busy intervals */
static uint64_t block_ns = 1000;
static double staging_bw = 4e9, dma_bw = 25e9;
static int sync_blocking;
static char staging[STAGING_BYTES];
static struct { uintptr_t base; size_t len; int alloc; } pinned[MAX_PINNED];
static int n_pinned;
static uintptr_t dev_base, dev_next;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

/* queue `ns` of device work after what is queued; returns when it will be done */
static uint64_t enqueue(uint64_t ns) {
    pthread_mutex_lock(&mu);
    uint64_t now = now_ns();
    uint64_t start = busy_until > now ? busy_until : now;
    busy_until = start + ns;
    unsigned last = (busy_head + busy_len + MAX_BUSY - 1) % MAX_BUSY;
    if (busy_len && busy_end[last] == start) {
        busy_end[last] = busy_until;
    } else {
        unsigned i = (busy_head + busy_len) % MAX_BUSY;
        if (busy_len == MAX_BUSY)
            busy_head = (busy_head + 1) % MAX_BUSY;
        else
            busy_len++;
        busy_start[i] = start;
        busy_end[i] = busy_until;
    }
    uint64_t done = busy_until;
    pthread_mutex_unlock(&mu);
    return done;
}

static uint64_t queue_end(void) {
    pthread_mutex_lock(&mu);
    uint64_t t = busy_until;
    pthread_mutex_unlock(&mu);
    return t;
}

/* wait until `t`: spin (the default) or block, per the sync mode */
static void wait_until(uint64_t t) {
    if (sync_blocking) {
        struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ULL), .tv_nsec = (long)(t % 1000000000ULL)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
        }
        return;
    }
    while (now_ns() < t)
        __asm__ volatile("" ::: "memory");
}

static void spin_until(uint64_t t) {
    while (now_ns() < t)
        __asm__ volatile("" ::: "memory");
}

static int is_pinned(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    int hit = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_pinned; i++)
        if (a >= pinned[i].base && a + n <= pinned[i].base + pinned[i].len) {
            hit = 1;
            break;
        }
    pthread_mutex_unlock(&mu);
    return hit;
}

static int is_device(CUdeviceptr p) { return dev_base && p >= dev_base && p < dev_base + DEVICE_VA; }

static CUresult pin_add(uintptr_t base, size_t len, int alloc) {
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_pinned; i++)
        if (base < pinned[i].base + pinned[i].len && pinned[i].base < base + len)
            r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    if (r == CUDA_SUCCESS && n_pinned == MAX_PINNED)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        pinned[n_pinned].base = base;
        pinned[n_pinned].len = len;
        pinned[n_pinned].alloc = alloc;
        n_pinned++;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* remove the range starting at `base`; its length (0: none) */
static size_t pin_remove(uintptr_t base, int alloc) {
    size_t len = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_pinned; i++)
        if (pinned[i].base == base && pinned[i].alloc == alloc) {
            len = pinned[i].len;
            pinned[i] = pinned[--n_pinned];
            break;
        }
    pthread_mutex_unlock(&mu);
    return len;
}

/* host -> device */
static CUresult h2d(const void *src, size_t n, int async) {
    if (is_pinned(src, n)) {
        uint64_t done = enqueue((uint64_t)(n / dma_bw * 1e9));
        if (!async)
            wait_until(done);
        return CUDA_SUCCESS;
    }
    if (!async)
        wait_until(queue_end());
    const char *s = src;
    for (size_t off = 0; off < n; off += STAGING_BYTES) {
        size_t c = n - off < STAGING_BYTES ? n - off : STAGING_BYTES;
        uint64_t t0 = now_ns();
        memcpy(staging, s + off, c);
        spin_until(t0 + (uint64_t)(c / staging_bw * 1e9));
        enqueue((uint64_t)(c / dma_bw * 1e9));
    }
    return CUDA_SUCCESS;
}

/* device -> host */
static CUresult d2h(void *dst, size_t n, int async) {
    if (is_pinned(dst, n)) {
        uint64_t done = enqueue((uint64_t)(n / dma_bw * 1e9));
        if (!async)
            wait_until(done);
        return CUDA_SUCCESS;
    }
    wait_until(enqueue((uint64_t)(n / dma_bw * 1e9)));
    char *d = dst;
    for (size_t off = 0; off < n; off += STAGING_BYTES) {
        size_t c = n - off < STAGING_BYTES ? n - off : STAGING_BYTES;
        uint64_t t0 = now_ns();
        memcpy(d + off, staging, c);
        spin_until(t0 + (uint64_t)(c / staging_bw * 1e9));
    }
    return CUDA_SUCCESS;
}

static CUresult unified(CUdeviceptr dst, CUdeviceptr src, size_t n, int async) {
    int dd = is_device(dst), sd = is_device(src);
    if (dd && !sd)
        return h2d((const void *)(uintptr_t)src, n, async);
    if (sd && !dd)
        return d2h((void *)(uintptr_t)dst, n, async);
    if (dd && sd) {
        uint64_t done = enqueue((uint64_t)(n / dma_bw * 1e9 / 10));
        if (!async)
            wait_until(done);
        return CUDA_SUCCESS;
    }
    memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

static CUresult launch(unsigned gx, unsigned gy, unsigned gz) {
    enqueue((uint64_t)gx * gy * gz * block_ns);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ control (not in CUDA) */
API void fake_set_sync_mode(int blocking) { sync_blocking = blocking; }
API void fake_set_block_ns(unsigned long long ns) { block_ns = ns; }
API void fake_set_bandwidth(double staging_bytes_per_s, double dma_bytes_per_s) {
    if (staging_bytes_per_s > 0)
        staging_bw = staging_bytes_per_s;
    if (dma_bytes_per_s > 0)
        dma_bw = dma_bytes_per_s;
}
API unsigned long long fake_queued_ns(void) {
    uint64_t t = queue_end(), now = now_ns();
    return t > now ? t - now : 0;
}
/* share of the last second the device was busy (0..1) */
API double fake_busy_ratio(void) {
    uint64_t now = now_ns(), lo = now > 1000000000ULL ? now - 1000000000ULL : 0, busy = 0;
    pthread_mutex_lock(&mu);
    for (unsigned k = 0; k < busy_len; k++) {
        unsigned i = (busy_head + k) % MAX_BUSY;
        uint64_t a = busy_start[i] > lo ? busy_start[i] : lo, b = busy_end[i] < now ? busy_end[i] : now;
        if (b > a)
            busy += b - a;
    }
    pthread_mutex_unlock(&mu);
    return (double)busy / 1e9;
}

/* ------------------------------------------------------------------ the driver API (cuda.h signatures) */
API CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
API CUresult cuDriverGetVersion(int *v) { if (v) *v = 12080; return CUDA_SUCCESS; }

API CUresult cuCtxSynchronize(void) { wait_until(queue_end()); return CUDA_SUCCESS; }
API CUresult cuStreamSynchronize(CUstream s) { (void)s; wait_until(queue_end()); return CUDA_SUCCESS; }
API CUresult cuStreamSynchronize_ptsz(CUstream s) { (void)s; wait_until(queue_end()); return CUDA_SUCCESS; }

struct CUevent_st { uint64_t at; };
API CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    (void)flags;
    *e = calloc(1, sizeof(**e));
    return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
API CUresult cuEventRecord(CUevent e, CUstream s) { (void)s; e->at = queue_end(); return CUDA_SUCCESS; }
API CUresult cuEventSynchronize(CUevent e) { wait_until(e->at); return CUDA_SUCCESS; }
API CUresult cuEventDestroy_v2(CUevent e) { free(e); return CUDA_SUCCESS; }

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    pthread_mutex_lock(&mu);
    if (!dev_base) {
        void *r = mmap(NULL, DEVICE_VA, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r != MAP_FAILED)
            dev_base = dev_next = (uintptr_t)r;
    }
    CUresult res = CUDA_ERROR_OUT_OF_MEMORY;
    if (dev_base && dev_next + n <= dev_base + DEVICE_VA) {
        *p = dev_next;
        dev_next += (n + 255) & ~(size_t)255;
        res = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return res;
}
API CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; return CUDA_SUCCESS; }

static CUresult host_alloc(void **pp, size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = pin_add((uintptr_t)p, n, 1);
    if (r != CUDA_SUCCESS) {
        munmap(p, n);
        return r;
    }
    *pp = p;
    return CUDA_SUCCESS;
}
API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) { (void)flags; return host_alloc(pp, bytesize); }
API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return host_alloc(pp, bytesize); }
API CUresult cuMemFreeHost(void *p) {
    size_t len = pin_remove((uintptr_t)p, 1);
    if (!len)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, len);
    return CUDA_SUCCESS;
}
API CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags) {
    (void)flags;
    return pin_add((uintptr_t)p, bytesize, 0);
}
API CUresult cuMemHostUnregister(void *p) {
    return pin_remove((uintptr_t)p, 0) ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { (void)dst; return h2d(src, n, 0); }
API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n) { (void)dst; return h2d(src, n, 0); }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)dst; (void)s;
    return h2d(src, n, 1);
}
API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)dst; (void)s;
    return h2d(src, n, 1);
}
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { (void)src; return d2h(dst, n, 0); }
API CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n) { (void)src; return d2h(dst, n, 0); }
API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)src; (void)s;
    return d2h(dst, n, 1);
}
API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)src; (void)s;
    return d2h(dst, n, 1);
}
API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { return unified(dst, src, n, 0); }
API CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) { return unified(dst, src, n, 0); }
API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    return unified(dst, src, n, 1);
}
API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    return unified(dst, src, n, 1);
}

API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                            unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                            unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
    (void)f; (void)blockDimX; (void)blockDimY; (void)blockDimZ; (void)sharedMemBytes; (void)hStream;
    (void)kernelParams; (void)extra;
    return launch(gridDimX, gridDimY, gridDimZ);
}
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                 unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                 unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
    (void)f; (void)blockDimX; (void)blockDimY; (void)blockDimZ; (void)sharedMemBytes; (void)hStream;
    (void)kernelParams; (void)extra;
    return launch(gridDimX, gridDimY, gridDimZ);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    (void)f; (void)kernelParams; (void)extra;
    return launch(config->gridDimX, config->gridDimY, config->gridDimZ);
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    (void)f; (void)kernelParams; (void)extra;
    return launch(config->gridDimX, config->gridDimY, config->gridDimZ);
}
