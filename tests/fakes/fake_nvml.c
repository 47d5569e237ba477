/*
 * fake_nvml.c - a fake NVIDIA Management Library (libnvidia-ml.so.1) for tests.
 *
 * Built by tests/fakes/fakenvml.py:
 *     gcc -shared -fPIC -O2 -Wall -Werror -o DIR/libnvidia-ml.so.1 fake_nvml.c [-DOMIT_<symbol>...]
 * and loaded by the unmodified PyPI `nvidia-ml-py` (`pynvml`) through LD_LIBRARY_PATH.
 *
 * Struct layouts, enum values and error codes follow nvidia-ml-py 13.x's pynvml.py (which
 * follows nvml.h). See README.md next to this file for the state file format.
 *
 * Environment:
 *   FAKE_NVML_STATE  path of the state file; re-read on every call that reports state.
 *                    Unset or missing file: zero devices, default driver version.
 *   FAKE_NVML_LOG    if set, every call appends "SYMBOL\n" to this file.
 *
 * Every exported symbol is wrapped in #ifndef OMIT_<symbol>, so a test can build a library
 * that lacks it (pynvml then raises NVMLError_FunctionNotFound, or NVMLLibraryMismatchError
 * for its unversioned process-list calls).
 *
 * Compile-time option FAKE_NVML_PROC_V3_CC: the _v3 process calls write 32-byte entries
 * (pid, usedGpuMemory, gpuInstanceId, computeInstanceId, usedGpuCcProtectedMemory) like the
 * early R535 drivers did, instead of the 24-byte nvmlProcessInfo_t that pynvml 13.x reads.
 *
 * No shared mutable state except the init reference count (atomic): each call parses the
 * state file into its own heap buffer, so concurrent callers (ctypes drops the GIL) are safe.
 */

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------ NVML types */

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_ALREADY_INITIALIZED 5
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_INSUFFICIENT_POWER 8
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_IRQ_ISSUE 11
#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_CORRUPTED_INFOROM 14
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_RESET_REQUIRED 16
#define NVML_ERROR_OPERATING_SYSTEM 17
#define NVML_ERROR_LIB_RM_VERSION_MISMATCH 18
#define NVML_ERROR_IN_USE 19
#define NVML_ERROR_MEMORY 20
#define NVML_ERROR_NO_DATA 21
#define NVML_ERROR_VGPU_ECC_NOT_SUPPORTED 22
#define NVML_ERROR_INSUFFICIENT_RESOURCES 23
#define NVML_ERROR_FREQ_NOT_SUPPORTED 24
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_DEPRECATED 26
#define NVML_ERROR_NOT_READY 27
#define NVML_ERROR_GPU_NOT_FOUND 28
#define NVML_ERROR_INVALID_STATE 29
#define NVML_ERROR_RESET_TYPE_NOT_SUPPORTED 30
#define NVML_ERROR_UNKNOWN 999

typedef unsigned int nvmlEnableState_t;
#define NVML_FEATURE_DISABLED 0u
#define NVML_FEATURE_ENABLED 1u

#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFull
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu

typedef struct nvmlDevice_st {
    unsigned int index;
} *nvmlDevice_t;

/* pynvml c_nvmlMemory_t */
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* pynvml c_nvmlMemory_v2_t; version = nvmlMemory_v2 = 0x02000028 (sizeof | 2 << 24) */
typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

/* pynvml c_nvmlProcessInfo_v2_t (c_nvmlProcessInfo_v3_t is the same class in pynvml 13.x) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

#ifdef FAKE_NVML_PROC_V3_CC
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessInfo_t;
_Static_assert(sizeof(nvmlProcessInfo_t) == 32, "R535-era v3 process info is 32 bytes");
#else
typedef nvmlProcessInfo_v2_t nvmlProcessInfo_t;
#endif

/* pynvml c_nvmlAccountingStats_t */
typedef struct {
    unsigned int gpuUtilization;
    unsigned int memoryUtilization;
    unsigned long long maxMemoryUsage;
    unsigned long long time;
    unsigned long long startTime;
    unsigned int isRunning;
    unsigned int reserved[5];
} nvmlAccountingStats_t;

_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(NVML_MEMORY_V2_VERSION == 0x02000028u, "nvmlMemory_v2");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(sizeof(nvmlAccountingStats_t) == 56, "nvmlAccountingStats_t");

/* ------------------------------------------------------------------ state */

#define MAX_DEVICES 16
#define MAX_PROCS 512
#define MAX_ACCT 512
#define MAX_ERRORS 64
#define MAX_SYMBOL 64
#define NAME_LEN 96   /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define UUID_LEN 96   /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define DRIVER_LEN 80 /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */
#define DEFAULT_DRIVER "550.54.15"
#define ANY_DEVICE (-1)

enum { KIND_COMPUTE = 0, KIND_GRAPHICS = 1 };

struct fake_device {
    int defined;
    char uuid[UUID_LEN];
    char name[NAME_LEN];
    unsigned long long total;
    unsigned long long used;
    int accounting;
    int lost;
};

struct fake_proc {
    int device;
    int kind;
    unsigned int pid;
    unsigned long long used;
};

struct fake_acct {
    int device;
    unsigned int pid;
    unsigned long long max_used;
};

struct fake_error {
    char symbol[MAX_SYMBOL];
    int device; /* ANY_DEVICE or an index */
    int code;
};

struct fake_state {
    char driver[DRIVER_LEN];
    unsigned int device_count;
    struct fake_device devices[MAX_DEVICES];
    int nprocs, nacct, nerrors;
    struct fake_proc procs[MAX_PROCS];
    struct fake_acct acct[MAX_ACCT];
    struct fake_error errors[MAX_ERRORS];
};

static struct nvmlDevice_st g_handles[MAX_DEVICES] = {
    {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15},
};

static int g_init_refcount; /* accessed with __atomic builtins */

/* Append "SYMBOL\n" to $FAKE_NVML_LOG, one write() so concurrent writers do not interleave. */
static void log_call(const char *symbol)
{
    const char *path = getenv("FAKE_NVML_LOG");
    if (path == NULL || path[0] == '\0')
        return;
    char line[MAX_SYMBOL + 2];
    int n = snprintf(line, sizeof line, "%s\n", symbol);
    if (n <= 0 || (size_t)n >= sizeof line)
        return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    ssize_t ignored = write(fd, line, (size_t)n);
    (void)ignored;
    close(fd);
}

static char *next_token(char **cursor)
{
    char *p = *cursor;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    if (*p == '\0') {
        *cursor = p;
        return NULL;
    }
    char *start = p;
    while (*p != '\0' && *p != ' ' && *p != '\t' && *p != '\r' && *p != '\n')
        p++;
    if (*p != '\0')
        *p++ = '\0';
    *cursor = p;
    return start;
}

/* A decimal unsigned number filling the whole token. */
static int parse_ull(const char *tok, unsigned long long *out)
{
    if (tok == NULL || *tok < '0' || *tok > '9')
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(tok, &end, 10);
    if (errno != 0 || *end != '\0')
        return 0;
    *out = v;
    return 1;
}

static int parse_index(const char *tok, int limit, int *out)
{
    unsigned long long v;
    if (!parse_ull(tok, &v) || v >= (unsigned long long)limit)
        return 0;
    *out = (int)v;
    return 1;
}

static int parse_flag(const char *tok, int *out)
{
    if (tok != NULL && (strcmp(tok, "0") == 0 || strcmp(tok, "1") == 0)) {
        *out = tok[0] == '1';
        return 1;
    }
    return 0;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static void parse_line(struct fake_state *st, char *line)
{
    char *cur = line;
    char *kw = next_token(&cur);
    if (kw == NULL || kw[0] == '#')
        return;

    if (strcmp(kw, "driver") == 0) {
        char *v = next_token(&cur);
        if (v != NULL)
            copy_str(st->driver, sizeof st->driver, v);
    } else if (strcmp(kw, "device") == 0) {
        int idx, acct, lost;
        unsigned long long total, used;
        char *t_idx = next_token(&cur), *t_uuid = next_token(&cur), *t_total = next_token(&cur);
        char *t_used = next_token(&cur), *t_acct = next_token(&cur), *t_lost = next_token(&cur);
        if (!parse_index(t_idx, MAX_DEVICES, &idx) || t_uuid == NULL || !parse_ull(t_total, &total) ||
            !parse_ull(t_used, &used) || !parse_flag(t_acct, &acct) || !parse_flag(t_lost, &lost))
            return;
        /* NAME: the rest of the line, trimmed. */
        while (*cur == ' ' || *cur == '\t')
            cur++;
        size_t n = strlen(cur);
        while (n > 0 && (cur[n - 1] == ' ' || cur[n - 1] == '\t' || cur[n - 1] == '\r' || cur[n - 1] == '\n'))
            cur[--n] = '\0';
        struct fake_device *d = &st->devices[idx];
        d->defined = 1;
        copy_str(d->uuid, sizeof d->uuid, t_uuid);
        copy_str(d->name, sizeof d->name, n > 0 ? cur : "Fake NVIDIA GPU");
        d->total = total;
        d->used = used;
        d->accounting = acct;
        d->lost = lost;
    } else if (strcmp(kw, "proc") == 0) {
        int dev, kind;
        unsigned long long pid, used;
        char *t_dev = next_token(&cur), *t_kind = next_token(&cur), *t_pid = next_token(&cur);
        char *t_used = next_token(&cur);
        if (st->nprocs >= MAX_PROCS || !parse_index(t_dev, MAX_DEVICES, &dev) || t_kind == NULL)
            return;
        if (strcmp(t_kind, "compute") == 0)
            kind = KIND_COMPUTE;
        else if (strcmp(t_kind, "graphics") == 0)
            kind = KIND_GRAPHICS;
        else
            return;
        if (!parse_ull(t_pid, &pid) || pid > 0xFFFFFFFFull || t_used == NULL)
            return;
        if (strcmp(t_used, "na") == 0)
            used = NVML_VALUE_NOT_AVAILABLE_ULL;
        else if (!parse_ull(t_used, &used))
            return;
        struct fake_proc *p = &st->procs[st->nprocs++];
        p->device = dev;
        p->kind = kind;
        p->pid = (unsigned int)pid;
        p->used = used;
    } else if (strcmp(kw, "acct") == 0) {
        int dev;
        unsigned long long pid, max_used;
        char *t_dev = next_token(&cur), *t_pid = next_token(&cur), *t_max = next_token(&cur);
        if (st->nacct >= MAX_ACCT || !parse_index(t_dev, MAX_DEVICES, &dev) || !parse_ull(t_pid, &pid) ||
            pid > 0xFFFFFFFFull || t_max == NULL)
            return;
        if (strcmp(t_max, "na") == 0)
            max_used = NVML_VALUE_NOT_AVAILABLE_ULL;
        else if (!parse_ull(t_max, &max_used))
            return;
        struct fake_acct *a = &st->acct[st->nacct++];
        a->device = dev;
        a->pid = (unsigned int)pid;
        a->max_used = max_used;
    } else if (strcmp(kw, "error") == 0) {
        int dev = ANY_DEVICE;
        unsigned long long code;
        char *t_sym = next_token(&cur), *t_code = next_token(&cur), *t_dev = next_token(&cur);
        if (st->nerrors >= MAX_ERRORS || t_sym == NULL || strlen(t_sym) >= MAX_SYMBOL || !parse_ull(t_code, &code) ||
            code > 0x7FFFFFFFull)
            return;
        if (t_dev != NULL && t_dev[0] != '#' && !parse_index(t_dev, MAX_DEVICES, &dev))
            return;
        struct fake_error *e = &st->errors[st->nerrors++];
        copy_str(e->symbol, sizeof e->symbol, t_sym);
        e->code = (int)code;
        e->device = dev;
    }
    /* unknown keywords: ignored */
}

/* Parse $FAKE_NVML_STATE into a fresh heap struct (caller frees); NULL only when out of memory. */
static struct fake_state *load_state(void)
{
    struct fake_state *st = calloc(1, sizeof *st);
    if (st == NULL)
        return NULL;
    copy_str(st->driver, sizeof st->driver, DEFAULT_DRIVER);
    const char *path = getenv("FAKE_NVML_STATE");
    FILE *f = (path != NULL && path[0] != '\0') ? fopen(path, "re") : NULL;
    if (f != NULL) {
        char line[1024];
        while (fgets(line, sizeof line, f) != NULL) {
            size_t n = strlen(line);
            if (n > 0 && line[n - 1] != '\n' && !feof(f)) {
                /* over-long line: drop it and its remainder */
                int c;
                while ((c = fgetc(f)) != EOF && c != '\n')
                    ;
                continue;
            }
            parse_line(st, line);
        }
        fclose(f);
    }
    /* The devices are 0..n-1: the first undefined index ends the list. */
    while (st->device_count < MAX_DEVICES && st->devices[st->device_count].defined)
        st->device_count++;
    return st;
}

static int injected_error(const struct fake_state *st, const char *symbol, int device)
{
    for (int i = 0; i < st->nerrors; i++) {
        const struct fake_error *e = &st->errors[i];
        if ((e->device == ANY_DEVICE || e->device == device) && strcmp(e->symbol, symbol) == 0)
            return e->code;
    }
    return NVML_SUCCESS;
}

static int is_initialized(void)
{
    return __atomic_load_n(&g_init_refcount, __ATOMIC_SEQ_CST) > 0;
}

/* Common prologue of the calls that are not about one device. */
static nvmlReturn_t begin_system(const char *symbol, struct fake_state **out)
{
    *out = NULL;
    if (!is_initialized())
        return NVML_ERROR_UNINITIALIZED;
    struct fake_state *st = load_state();
    if (st == NULL)
        return NVML_ERROR_MEMORY;
    int code = injected_error(st, symbol, ANY_DEVICE);
    if (code != NVML_SUCCESS) {
        free(st);
        return code;
    }
    *out = st;
    return NVML_SUCCESS;
}

/*
 * Common prologue of the per-device calls: initialised, a handle of ours, an injected error
 * for this symbol (all devices or this one), then a lost device. A handle whose device has
 * since disappeared from the state file reads as lost.
 */
static nvmlReturn_t begin_device(const char *symbol, nvmlDevice_t device, struct fake_state **out,
                                 struct fake_device **dev)
{
    *out = NULL;
    *dev = NULL;
    if (!is_initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || device < &g_handles[0] || device >= &g_handles[MAX_DEVICES])
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fake_state *st = load_state();
    if (st == NULL)
        return NVML_ERROR_MEMORY;
    unsigned int idx = device->index;
    int code = injected_error(st, symbol, (int)idx);
    if (code == NVML_SUCCESS && (idx >= st->device_count || st->devices[idx].lost))
        code = NVML_ERROR_GPU_IS_LOST;
    if (code != NVML_SUCCESS) {
        free(st);
        return code;
    }
    *out = st;
    *dev = &st->devices[idx];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_out(char *buf, unsigned int length, const char *value)
{
    if (buf == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(value);
    if ((size_t)length < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, n + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------ init / shutdown */

static nvmlReturn_t do_init(const char *symbol)
{
    log_call(symbol);
    struct fake_state *st = load_state();
    if (st == NULL)
        return NVML_ERROR_MEMORY;
    int code = injected_error(st, symbol, ANY_DEVICE);
    free(st);
    if (code != NVML_SUCCESS)
        return code;
    __atomic_add_fetch(&g_init_refcount, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

#ifndef OMIT_nvmlInitWithFlags
nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init("nvmlInitWithFlags");
}
#endif

#ifndef OMIT_nvmlInit_v2
nvmlReturn_t nvmlInit_v2(void)
{
    return do_init("nvmlInit_v2");
}
#endif

#ifndef OMIT_nvmlShutdown
nvmlReturn_t nvmlShutdown(void)
{
    log_call("nvmlShutdown");
    if (!is_initialized())
        return NVML_ERROR_UNINITIALIZED;
    struct fake_state *st = load_state();
    if (st == NULL)
        return NVML_ERROR_MEMORY;
    int code = injected_error(st, "nvmlShutdown", ANY_DEVICE);
    free(st);
    if (code != NVML_SUCCESS)
        return code;
    int cur = __atomic_load_n(&g_init_refcount, __ATOMIC_SEQ_CST);
    while (cur > 0) {
        if (__atomic_compare_exchange_n(&g_init_refcount, &cur, cur - 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            return NVML_SUCCESS;
    }
    return NVML_ERROR_UNINITIALIZED;
}
#endif

#ifndef OMIT_nvmlErrorString
/* Works without init, like the real one. Strings as in nvml / pynvml's table. */
const char *nvmlErrorString(nvmlReturn_t result)
{
    log_call("nvmlErrorString");
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "The requested frequency is not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "The provided version is invalid/unsupported";
    case NVML_ERROR_DEPRECATED: return "The requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "The system is not ready for the request";
    case NVML_ERROR_GPU_NOT_FOUND: return "The GPU was not found";
    case NVML_ERROR_INVALID_STATE: return "The resource is in an invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "The requested reset type is not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}
#endif

/* ------------------------------------------------------------------ system */

#ifndef OMIT_nvmlSystemGetDriverVersion
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    log_call("nvmlSystemGetDriverVersion");
    struct fake_state *st;
    nvmlReturn_t ret = begin_system("nvmlSystemGetDriverVersion", &st);
    if (ret != NVML_SUCCESS)
        return ret;
    ret = copy_out(version, length, st->driver);
    free(st);
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetCount_v2
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    log_call("nvmlDeviceGetCount_v2");
    struct fake_state *st;
    nvmlReturn_t ret = begin_system("nvmlDeviceGetCount_v2", &st);
    if (ret != NVML_SUCCESS)
        return ret;
    if (deviceCount == NULL)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    else
        *deviceCount = st->device_count;
    free(st);
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetHandleByIndex_v2
/* Works for a lost device, as on real drivers; injected errors match the index asked for. */
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    log_call("nvmlDeviceGetHandleByIndex_v2");
    if (!is_initialized())
        return NVML_ERROR_UNINITIALIZED;
    struct fake_state *st = load_state();
    if (st == NULL)
        return NVML_ERROR_MEMORY;
    int code = injected_error(st, "nvmlDeviceGetHandleByIndex_v2", index < MAX_DEVICES ? (int)index : ANY_DEVICE);
    if (code == NVML_SUCCESS && (device == NULL || index >= st->device_count))
        code = NVML_ERROR_INVALID_ARGUMENT;
    if (code == NVML_SUCCESS)
        *device = &g_handles[index];
    free(st);
    return code;
}
#endif

/* ------------------------------------------------------------------ per device */

#ifndef OMIT_nvmlDeviceGetName
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    log_call("nvmlDeviceGetName");
    struct fake_state *st;
    struct fake_device *d;
    nvmlReturn_t ret = begin_device("nvmlDeviceGetName", device, &st, &d);
    if (ret != NVML_SUCCESS)
        return ret;
    ret = copy_out(name, length, d->name);
    free(st);
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetUUID
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    log_call("nvmlDeviceGetUUID");
    struct fake_state *st;
    struct fake_device *d;
    nvmlReturn_t ret = begin_device("nvmlDeviceGetUUID", device, &st, &d);
    if (ret != NVML_SUCCESS)
        return ret;
    ret = copy_out(uuid, length, d->uuid);
    free(st);
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetIndex
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    log_call("nvmlDeviceGetIndex");
    struct fake_state *st;
    struct fake_device *d;
    nvmlReturn_t ret = begin_device("nvmlDeviceGetIndex", device, &st, &d);
    if (ret != NVML_SUCCESS)
        return ret;
    if (index == NULL)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    else
        *index = device->index;
    free(st);
    return ret;
}
#endif

static unsigned long long free_bytes(const struct fake_device *d)
{
    return d->used >= d->total ? 0 : d->total - d->used;
}

#ifndef OMIT_nvmlDeviceGetMemoryInfo
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    log_call("nvmlDeviceGetMemoryInfo");
    struct fake_state *st;
    struct fake_device *d;
    nvmlReturn_t ret = begin_device("nvmlDeviceGetMemoryInfo", device, &st, &d);
    if (ret != NVML_SUCCESS)
        return ret;
    if (memory == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        memory->total = d->total;
        memory->used = d->used;
        memory->free = free_bytes(d);
    }
    free(st);
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetMemoryInfo_v2
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    log_call("nvmlDeviceGetMemoryInfo_v2");
    struct fake_state *st;
    struct fake_device *d;
    nvmlReturn_t ret = begin_device("nvmlDeviceGetMemoryInfo_v2", device, &st, &d);
    if (ret != NVML_SUCCESS)
        return ret;
    if (memory == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if (memory->version != NVML_MEMORY_V2_VERSION) {
        ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    } else {
        memory->total = d->total;
        memory->reserved = 0;
        memory->used = d->used;
        memory->free = free_bytes(d);
    }
    free(st);
    return ret;
}
#endif

/*
 * The count-then-fill protocol of nvmlDeviceGet*RunningProcesses*:
 * - infoCount NULL: INVALID_ARGUMENT.
 * - no process: SUCCESS, *infoCount = 0 (whatever the buffer).
 * - infos NULL or *infoCount too small: INSUFFICIENT_SIZE, *infoCount = the number needed.
 * - otherwise: the entries, *infoCount = their number, SUCCESS.
 * `stride` is the size of one entry in the caller's array (24 or 32 bytes).
 */
static nvmlReturn_t running_processes(const char *symbol, int kind, nvmlDevice_t device, unsigned int *infoCount,
                                      void *infos, size_t stride)
{
    log_call(symbol);
    struct fake_state *st;
    struct fake_device *d;
    nvmlReturn_t ret = begin_device(symbol, device, &st, &d);
    if (ret != NVML_SUCCESS)
        return ret;
    (void)d;
    if (infoCount == NULL) {
        free(st);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned int needed = 0;
    for (int i = 0; i < st->nprocs; i++)
        if (st->procs[i].device == (int)device->index && st->procs[i].kind == kind)
            needed++;
    if (needed == 0) {
        *infoCount = 0;
    } else if (infos == NULL || *infoCount < needed) {
        *infoCount = needed;
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        unsigned char *out = infos;
        unsigned int n = 0;
        for (int i = 0; i < st->nprocs; i++) {
            const struct fake_proc *p = &st->procs[i];
            if (p->device != (int)device->index || p->kind != kind)
                continue;
            nvmlProcessInfo_v2_t entry;
            memset(&entry, 0, sizeof entry); /* padding too: no stack bytes leak out */
            entry.pid = p->pid;
            entry.usedGpuMemory = p->used;
            entry.gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
            entry.computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
            memset(out + (size_t)n * stride, 0, stride); /* usedGpuCcProtectedMemory = 0 in 32-byte entries */
            memcpy(out + (size_t)n * stride, &entry, sizeof entry);
            n++;
        }
        *infoCount = n;
    }
    free(st);
    return ret;
}

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v3", KIND_COMPUTE, device, infoCount, infos,
                             sizeof(nvmlProcessInfo_t));
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v2
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos)
{
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v2", KIND_COMPUTE, device, infoCount, infos,
                             sizeof(nvmlProcessInfo_v2_t));
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v3
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    return running_processes("nvmlDeviceGetGraphicsRunningProcesses_v3", KIND_GRAPHICS, device, infoCount, infos,
                             sizeof(nvmlProcessInfo_t));
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v2
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_v2_t *infos)
{
    return running_processes("nvmlDeviceGetGraphicsRunningProcesses_v2", KIND_GRAPHICS, device, infoCount, infos,
                             sizeof(nvmlProcessInfo_v2_t));
}
#endif

#ifndef OMIT_nvmlDeviceGetAccountingMode
nvmlReturn_t nvmlDeviceGetAccountingMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    log_call("nvmlDeviceGetAccountingMode");
    struct fake_state *st;
    struct fake_device *d;
    nvmlReturn_t ret = begin_device("nvmlDeviceGetAccountingMode", device, &st, &d);
    if (ret != NVML_SUCCESS)
        return ret;
    if (mode == NULL)
        ret = NVML_ERROR_INVALID_ARGUMENT;
    else
        *mode = d->accounting ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    free(st);
    return ret;
}
#endif

#ifndef OMIT_nvmlDeviceGetAccountingStats
nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid, nvmlAccountingStats_t *stats)
{
    log_call("nvmlDeviceGetAccountingStats");
    struct fake_state *st;
    struct fake_device *d;
    nvmlReturn_t ret = begin_device("nvmlDeviceGetAccountingStats", device, &st, &d);
    if (ret != NVML_SUCCESS)
        return ret;
    if (stats == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if (!d->accounting) {
        ret = NVML_ERROR_NOT_SUPPORTED;
    } else {
        ret = NVML_ERROR_NOT_FOUND;
        for (int i = st->nacct - 1; i >= 0; i--) { /* the last line for a pid wins */
            const struct fake_acct *a = &st->acct[i];
            if (a->device == (int)device->index && a->pid == pid) {
                memset(stats, 0, sizeof *stats);
                stats->maxMemoryUsage = a->max_used;
                stats->isRunning = 1;
                ret = NVML_SUCCESS;
                break;
            }
        }
    }
    free(st);
    return ret;
}
#endif
