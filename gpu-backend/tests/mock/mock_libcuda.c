/* mock_libcuda.c: a test double for libcuda.so, for gpu-backend's tests.
 *
 * Built by the tests with `gcc -shared -fPIC` into a temporary folder as libcuda.so
 * (cudarc's first candidate name) and found through LD_LIBRARY_PATH by a child test
 * process. It implements the driver calls gpu-backend makes, with the real signatures
 * and error codes, and checks their arguments strictly (context current, property
 * structs laid out as in the CUDA 12.8 headers, pages mapped inside reserved ranges,
 * no double mapping, no release of a mapped handle, ...). Numbers are invented: a card
 * of MOCK_TOTAL_BYTES (default 16 GiB) whose primary context takes MOCK_CONTEXT_BYTES
 * (default 512 MiB); every allocation is charged in whole 2 MiB pages.
 *
 * Environment:
 *   MOCK_MODE         comma-free words: "nodevice" (cuInit fails with
 *                     CUDA_ERROR_NO_DEVICE), "zerodevices" (cuDeviceGetCount says 0),
 *                     "novmm" (the VMM attribute is 0), "nonul" (cuDeviceGetName fills
 *                     the whole buffer with name bytes and writes no terminating NUL)
 *   MOCK_TOTAL_BYTES, MOCK_CONTEXT_BYTES   the card
 *   MOCK_MAX_ALLOC_BYTES   cuMemAlloc_v2 larger than this is out of memory (fragmentation)
 *   MOCK_ALLOC_OVERHEAD_BYTES   extra bytes charged per cuMemAlloc_v2 (page tables)
 *   MOCK_FAIL=<symbol>:<n>[:<code>][,...]  (at most 4) the n-th call (1-based) of
 *                     <symbol> fails with <code> (default CUDA_ERROR_ILLEGAL_ADDRESS, 700;
 *                     e.g. 2 out of memory, 1 invalid value, 719 launch failure)
 *   MOCK_FAULT_EVERY=<n>, MOCK_FAULT_SEED=<s>, MOCK_FAULT_CODE=<code>  random faults:
 *                     each call that allocates or maps (cuMemAlloc_v2, cuMemCreate,
 *                     cuMemAddressReserve, cuMemMap, cuMemSetAccess) fails with <code>
 *                     (default 700) with probability 1/n, from a xorshift generator
 *                     seeded with <s> (default 1): the same seed fails the same calls
 *   MOCK_HOLD_BACK_BYTES  free memory the driver never hands out: an allocation fails
 *                     when it would leave less than this free (default 0)
 *   MOCK_HOLD_BACK_COUNTER=<file>  a count of processes: each process that loads the
 *                     mock reads n from the file (0 when missing), writes n + 1 and holds
 *                     back (n mod 3) pages more, as an H200's driver varies between processes
 *   MOCK_LOG=1        print one line on stderr per virtual memory call:
 *                     `mock_libcuda call: <symbol> <bytes> -> <result>`
 *
 * At exit it prints one line on stderr, which the tests check for leaks:
 *   mock_libcuda report: used_bytes=0 allocs=0 handles=0 mappings=0 ranges=0 ctx_refs=0
 *
 * Compile-time variants: -DMOCK_OMIT_CORE leaves out cuDevicePrimaryCtxRetain (a driver
 * lacking a required symbol), -DMOCK_OMIT_VMM leaves out cuMemCreate (a driver
 * without virtual memory management). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef unsigned long long u64;
typedef int CUresult;
typedef int CUdevice;
typedef u64 CUdeviceptr;
typedef u64 CUhandle;
typedef void *CUcontext;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
};

#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define PAGE (2 * MIB)
#define MAX_OBJ 65536

/* CUmemAllocationProp and CUmemAccessDesc as in the CUDA 12.8 headers. */
typedef struct { int type; int id; } Location;
typedef struct {
    int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_NONE = 0 */
    Location location;        /* CU_MEM_LOCATION_TYPE_DEVICE = 1, device ordinal */
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType, gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} Prop;
typedef struct { Location location; int flags; /* PROT_READWRITE = 3 */ } AccessDesc;

static u64 total_bytes = 16 * GIB, context_bytes = 512 * MIB, used_bytes;
static u64 max_alloc = ~0ull, alloc_overhead, hold_back;
static int initialized, ctx_refs, log_calls;
static char ctx_object;
#define THE_CONTEXT ((CUcontext)&ctx_object)
static __thread CUcontext current;
#define MAX_FAIL 4
static struct { char symbol[64]; long at, seen; CUresult code; } fails[MAX_FAIL];
static int n_fails;
static u64 fault_every, fault_state = 1;
static CUresult fault_code = CUDA_ERROR_ILLEGAL_ADDRESS;

static struct { CUdeviceptr ptr; u64 charged; } allocs[MAX_OBJ];
static int n_allocs;
static struct { CUhandle id; u64 size; int mapped; /* mappings now */ } handles[MAX_OBJ];
static int n_handles;
static struct { CUdeviceptr ptr; u64 size; } ranges[MAX_OBJ];
static int n_ranges;
static struct { CUdeviceptr va; u64 size; CUhandle handle; int access; } maps[MAX_OBJ];
static int n_maps;
static u64 next_alloc_va = 0x200000000ull, next_range_va = 0x7f0000000000ull;

static u64 env_u64(const char *name, u64 fallback) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 0) : fallback;
}

static int mode(const char *word) {
    const char *m = getenv("MOCK_MODE");
    return m && strstr(m, word) != NULL;
}

__attribute__((constructor)) static void mock_setup(void) {
    total_bytes = env_u64("MOCK_TOTAL_BYTES", total_bytes);
    context_bytes = env_u64("MOCK_CONTEXT_BYTES", context_bytes);
    max_alloc = env_u64("MOCK_MAX_ALLOC_BYTES", max_alloc);
    alloc_overhead = env_u64("MOCK_ALLOC_OVERHEAD_BYTES", 0);
    log_calls = env_u64("MOCK_LOG", 0) != 0;
    hold_back = env_u64("MOCK_HOLD_BACK_BYTES", 0);
    const char *counter = getenv("MOCK_HOLD_BACK_COUNTER");
    if (counter && *counter) {
        /* The file holds the next process's number and the last process's id: a
         * process that loads the mock twice counts once. */
        u64 n = 0, last = 0, me = (u64)getpid();
        FILE *f = fopen(counter, "r");
        if (f) {
            if (fscanf(f, "%llu %llu", &n, &last) != 2) n = last = 0;
            fclose(f);
        }
        if (last == me && n > 0) {
            n -= 1;
        } else {
            f = fopen(counter, "w");
            if (f) {
                fprintf(f, "%llu %llu\n", n + 1, me);
                fclose(f);
            }
        }
        hold_back += (n % 3) * PAGE;
    }
    for (const char *f = getenv("MOCK_FAIL"); f && *f && n_fails < MAX_FAIL;) {
        const char *colon = strchr(f, ':');
        if (!colon || (size_t)(colon - f) >= sizeof fails[0].symbol) break;
        memcpy(fails[n_fails].symbol, f, (size_t)(colon - f));
        char *end = NULL;
        fails[n_fails].at = strtol(colon + 1, &end, 10);
        fails[n_fails].code = CUDA_ERROR_ILLEGAL_ADDRESS;
        if (end && *end == ':') fails[n_fails].code = (CUresult)strtol(end + 1, &end, 10);
        n_fails++;
        const char *comma = strchr(colon, ',');
        f = comma ? comma + 1 : NULL;
    }
    fault_every = env_u64("MOCK_FAULT_EVERY", 0);
    fault_state = env_u64("MOCK_FAULT_SEED", 1) | 1;
    fault_code = (CUresult)env_u64("MOCK_FAULT_CODE", CUDA_ERROR_ILLEGAL_ADDRESS);
}

__attribute__((destructor)) static void mock_report(void) {
    fprintf(stderr,
            "mock_libcuda report: used_bytes=%llu allocs=%d handles=%d mappings=%d ranges=%d ctx_refs=%d\n",
            used_bytes, n_allocs, n_handles, n_maps, n_ranges, ctx_refs);
}

/* Prints a virtual memory call and its result when MOCK_LOG is set; returns r. */
static CUresult logged(const char *symbol, u64 bytes, CUresult r) {
    if (log_calls) fprintf(stderr, "mock_libcuda call: %s %llu -> %d\n", symbol, bytes, r);
    return r;
}

/* The error this call of `symbol` must fail with (MOCK_FAIL, or a random fault of
 * MOCK_FAULT_EVERY for the calls that allocate or map), else CUDA_SUCCESS. */
static CUresult inject(const char *symbol) {
    CUresult hit = CUDA_SUCCESS;
    for (int i = 0; i < n_fails; i++)
        if (fails[i].at > 0 && strcmp(symbol, fails[i].symbol) == 0 && ++fails[i].seen == fails[i].at)
            hit = fails[i].code;
    if (!hit && fault_every > 0 &&
        (!strcmp(symbol, "cuMemAlloc_v2") || !strcmp(symbol, "cuMemCreate") ||
         !strcmp(symbol, "cuMemAddressReserve") || !strcmp(symbol, "cuMemMap") ||
         !strcmp(symbol, "cuMemSetAccess"))) {
        fault_state ^= fault_state << 13;
        fault_state ^= fault_state >> 7;
        fault_state ^= fault_state << 17;
        if (fault_state % fault_every == 0) hit = fault_code;
    }
    return hit;
}

static CUresult need_context(void) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (current != THE_CONTEXT || ctx_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}
#define NEED_CONTEXT() do { CUresult r_ = need_context(); if (r_) return r_; } while (0)

static u64 pages(u64 n) { return (n + PAGE - 1) / PAGE * PAGE; }

static int prop_ok(const Prop *p) {
    return p && p->type == 1 && p->requestedHandleTypes == 0 && p->location.type == 1 &&
           p->location.id == 0 && p->win32HandleMetaData == NULL;
}

/* ---- initialisation, devices, contexts ------------------------------------------ */

CUresult cuDriverGetVersion(int *v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = 12080; return CUDA_SUCCESS; }

CUresult cuInit(unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (mode("nodevice")) return CUDA_ERROR_NO_DEVICE;
    initialized = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *n = mode("zerodevices") ? 0 : 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal != 0 || mode("zerodevices")) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *buf, int len, CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!buf || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (mode("nonul")) {
        /* A name as long as the buffer, with no room left for a NUL. */
        for (int i = 0; i < len; i++) buf[i] = "Mock GPU with a long name "[i % 26];
        return CUDA_SUCCESS;
    }
    snprintf(buf, (size_t)len, "Mock GPU");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (attribute) {
    case 75: *v = 9; break;                       /* compute capability major */
    case 76: *v = 0; break;                       /* compute capability minor */
    case 102: *v = mode("novmm") ? 0 : 1; break;  /* virtual address management */
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}

#ifndef MOCK_OMIT_CORE
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (ctx_refs++ == 0) used_bytes += context_bytes;
    *c = THE_CONTEXT;
    return CUDA_SUCCESS;
}
#endif

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (ctx_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--ctx_refs == 0) used_bytes -= context_bytes;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *c) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *c = current;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext c) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (c != NULL && (c != THE_CONTEXT || ctx_refs == 0)) return CUDA_ERROR_INVALID_CONTEXT;
    current = c;
    return CUDA_SUCCESS;
}

/* ---- plain allocations ---------------------------------------------------------- */

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    NEED_CONTEXT();
    *free_bytes = (size_t)(total_bytes - used_bytes);
    *total = (size_t)total_bytes;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    NEED_CONTEXT();
    { CUresult f_ = inject("cuMemAlloc_v2"); if (f_) return f_; }
    if (n == 0 || !p) return CUDA_ERROR_INVALID_VALUE;
    u64 charged = pages(n) + alloc_overhead;
    if (n > max_alloc || used_bytes + charged + hold_back > total_bytes || n_allocs == MAX_OBJ)
        return CUDA_ERROR_OUT_OF_MEMORY;
    used_bytes += charged;
    *p = next_alloc_va;
    next_alloc_va += pages(n);
    allocs[n_allocs].ptr = *p;
    allocs[n_allocs++].charged = charged;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    NEED_CONTEXT();
    { CUresult f_ = inject("cuMemFree_v2"); if (f_) return f_; }
    for (int i = 0; i < n_allocs; i++) {
        if (allocs[i].ptr == p) {
            used_bytes -= allocs[i].charged;
            allocs[i] = allocs[--n_allocs];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- virtual memory management -------------------------------------------------- */

CUresult cuMemGetAllocationGranularity(size_t *g, const Prop *prop, int option) {
    NEED_CONTEXT();
    if (!g || !prop_ok(prop) || (option != 0 && option != 1)) return CUDA_ERROR_INVALID_VALUE;
    *g = PAGE;
    return CUDA_SUCCESS;
}

static CUresult address_reserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, u64 flags) {
    NEED_CONTEXT();
    if (!p || size == 0 || size % PAGE || flags != 0 || n_ranges == MAX_OBJ) return CUDA_ERROR_INVALID_VALUE;
    { CUresult f_ = inject("cuMemAddressReserve"); if (f_) return f_; }
    /* The address space ends below 2^57: a larger reservation fails, as on a GPU. */
    if (size > (1ull << 56) || next_range_va + size + PAGE > (1ull << 57)) return CUDA_ERROR_OUT_OF_MEMORY;
    (void)align; (void)addr;
    *p = next_range_va;
    next_range_va += size + PAGE; /* a gap between ranges */
    ranges[n_ranges].ptr = *p;
    ranges[n_ranges++].size = size;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, u64 flags) {
    return logged("cuMemAddressReserve", size, address_reserve(p, size, align, addr, flags));
}

static CUresult address_free(CUdeviceptr p, size_t size) {
    NEED_CONTEXT();
    for (int i = 0; i < n_ranges; i++) {
        if (ranges[i].ptr == p) {
            if (ranges[i].size != size) return CUDA_ERROR_INVALID_VALUE;
            for (int m = 0; m < n_maps; m++)
                if (maps[m].va >= p && maps[m].va < p + size) return CUDA_ERROR_INVALID_VALUE;
            ranges[i] = ranges[--n_ranges];
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    return logged("cuMemAddressFree", size, address_free(p, size));
}

#ifndef MOCK_OMIT_VMM
static u64 next_handle = 1;

static CUresult mem_create(CUhandle *h, size_t size, const Prop *prop, u64 flags) {
    NEED_CONTEXT();
    { CUresult f_ = inject("cuMemCreate"); if (f_) return f_; }
    if (!h || !prop_ok(prop) || flags != 0 || size == 0 || size % PAGE || n_handles == MAX_OBJ)
        return CUDA_ERROR_INVALID_VALUE;
    if (used_bytes + size + hold_back > total_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
    used_bytes += size;
    *h = next_handle++;
    handles[n_handles].id = *h;
    handles[n_handles].size = size;
    handles[n_handles++].mapped = 0;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUhandle *h, size_t size, const Prop *prop, u64 flags) {
    return logged("cuMemCreate", size, mem_create(h, size, prop, flags));
}
#endif

static int find_handle(CUhandle h) {
    for (int i = 0; i < n_handles; i++) if (handles[i].id == h) return i;
    return -1;
}

static int find_map(CUdeviceptr va, u64 size) {
    for (int i = 0; i < n_maps; i++) if (maps[i].va == va && maps[i].size == size) return i;
    return -1;
}

static CUresult mem_release(CUhandle h) {
    NEED_CONTEXT();
    int i = find_handle(h);
    if (i < 0 || handles[i].mapped) return CUDA_ERROR_INVALID_VALUE; /* stricter than CUDA */
    used_bytes -= handles[i].size;
    handles[i] = handles[--n_handles];
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUhandle h) {
    int i = find_handle(h);
    u64 bytes = i < 0 ? 0 : handles[i].size;
    return logged("cuMemRelease", bytes, mem_release(h));
}

static CUresult mem_map(CUdeviceptr va, size_t size, size_t offset, CUhandle h, u64 flags) {
    NEED_CONTEXT();
    { CUresult f_ = inject("cuMemMap"); if (f_) return f_; }
    int i = find_handle(h);
    /* A handle may be mapped at several places at once, as with CUDA. */
    if (i < 0 || handles[i].size != size || offset != 0 || flags != 0 || va % PAGE ||
        n_maps == MAX_OBJ)
        return CUDA_ERROR_INVALID_VALUE;
    int inside = 0;
    for (int r = 0; r < n_ranges; r++)
        if (va >= ranges[r].ptr && va + size <= ranges[r].ptr + ranges[r].size) inside = 1;
    if (!inside) return CUDA_ERROR_INVALID_VALUE;
    for (int m = 0; m < n_maps; m++)
        if (va < maps[m].va + maps[m].size && maps[m].va < va + size) return CUDA_ERROR_INVALID_VALUE;
    handles[i].mapped++;
    maps[n_maps].va = va;
    maps[n_maps].size = size;
    maps[n_maps].handle = h;
    maps[n_maps++].access = 0;
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, CUhandle h, u64 flags) {
    return logged("cuMemMap", size, mem_map(va, size, offset, h, flags));
}

static CUresult set_access(CUdeviceptr va, size_t size, const AccessDesc *desc, size_t count) {
    NEED_CONTEXT();
    { CUresult f_ = inject("cuMemSetAccess"); if (f_) return f_; }
    if (count != 1 || !desc || desc->location.type != 1 || desc->location.id != 0 || desc->flags != 3 ||
        size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* The span must be covered exactly by mappings laid back to back. */
    for (u64 at = va; at < va + size;) {
        int m = -1;
        for (int k = 0; k < n_maps; k++)
            if (maps[k].va == at) m = k;
        if (m < 0 || at + maps[m].size > va + size) return CUDA_ERROR_INVALID_VALUE;
        at += maps[m].size;
    }
    for (int k = 0; k < n_maps; k++)
        if (maps[k].va >= va && maps[k].va < va + size) maps[k].access = 1;
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr va, size_t size, const AccessDesc *desc, size_t count) {
    return logged("cuMemSetAccess", size, set_access(va, size, desc, count));
}

static CUresult mem_unmap(CUdeviceptr va, size_t size) {
    NEED_CONTEXT();
    { CUresult f_ = inject("cuMemUnmap"); if (f_) return f_; }
    int m = find_map(va, size);
    if (m < 0) return CUDA_ERROR_INVALID_VALUE;
    handles[find_handle(maps[m].handle)].mapped--;
    maps[m] = maps[--n_maps];
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
    return logged("cuMemUnmap", size, mem_unmap(va, size));
}

/* ---- errors --------------------------------------------------------------------- */

static const char *error_name(int e) {
    switch (e) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    default: return NULL;
    }
}

static const char *error_text(int e) {
    switch (e) {
    case CUDA_SUCCESS: return "no error";
    case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
    case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
    case CUDA_ERROR_NO_DEVICE: return "no CUDA-capable device is detected";
    case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
    case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    default: return NULL;
    }
}

CUresult cuGetErrorName(int e, const char **s) {
    *s = error_name(e);
    return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(int e, const char **s) {
    *s = error_text(e);
    return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
