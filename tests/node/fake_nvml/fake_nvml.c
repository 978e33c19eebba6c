/*
 * A fake libnvidia-ml.so.1 for tests on machines without a GPU (FAKE: not NVIDIA's library).
 *
 * The official Python binding (nvidia-ml-py) loads it through LD_LIBRARY_PATH and calls it exactly as
 * it would call the driver's NVML. Values come from a scenario file named by GPUFLEET_FAKE_NVML_SCENARIO:
 *
 *   gpus 2                       number of GPUs
 *   at 5                         following lines apply from sample round 5 on (round = calls of
 *                                nvmlDeviceGetUtilizationRates on the busiest-polled GPU)
 *   gpu 0 util 50                also: mem_util, mem_total_mib, mem_used_mib, mem_reserved_mib,
 *                                power_mw, power_limit_mw, temp, mem_temp, throttle (bitmask),
 *                                ecc_dbe, remap_unc, lost (0/1)
 *   gpu 0 proc 4242 1024 [70]    a compute process: pid, MiB, optionally its SM utilization % (the
 *                                per-process samples; procs_clear empties the list)
 *   gpu 0 sm_clock 1410          the SM clock in MHz
 *   gpu 1 notsupported power     power, power_limit, temp, mem_temp, throttle, ecc, remap, procs,
 *                                mem_util, events, proc_util, clock answer NVML_ERROR_NOT_SUPPORTED
 *   xid 0 79                     an XID critical error event on GPU 0, code 79
 *   no_memory_v2 1               nvmlDeviceGetMemoryInfo_v2 is missing (an older driver)
 *   driver_not_loaded 1          nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_GPUS 16
#define MAX_OPS 4096
#define MAX_PROCS 8
#define MAX_XIDS 256

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_MEMORY_V2 0x02000028u
#define NVML_FI_DEV_MEMORY_TEMP 82
#define MIB (1024ull * 1024ull)

typedef void *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { unsigned int pid; unsigned long long timeStamp; unsigned int smUtil, memUtil, encUtil, decUtil; } nvmlProcessUtilizationSample_t;
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;
typedef union { double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal; long long sllVal; int siVal; unsigned short usVal; } nvmlValue_t;
typedef struct { uint32_t fieldId, scopeId; int64_t timestamp, latencyUsec; int valueType; int nvmlReturn; nvmlValue_t value; } nvmlFieldValue_t;

typedef struct {
    unsigned long long util, mem_util, mem_total_mib, mem_used_mib, mem_reserved_mib, power_mw, power_limit_mw;
    unsigned long long temp, mem_temp, throttle, ecc_dbe, remap_unc, lost;
    unsigned int unsupported; /* bit per field, see FIELD_* */
    int nprocs;
    unsigned int proc_pid[MAX_PROCS];
    unsigned long long proc_mib[MAX_PROCS];
    long long proc_sm[MAX_PROCS]; /* -1: no per-process sample for it */
    unsigned long long sm_clock;
    long long util_calls;
} gpu_t;

enum { F_POWER = 1, F_POWER_LIMIT = 2, F_TEMP = 4, F_MEM_TEMP = 8, F_THROTTLE = 16, F_ECC = 32, F_REMAP = 64,
       F_PROCS = 128, F_MEM_UTIL = 256, F_EVENTS = 512, F_PROC_UTIL = 1024, F_CLOCK = 2048 };

typedef struct { long long at; char line[160]; } op_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded, initialized, ngpus, no_memory_v2, driver_not_loaded;
static gpu_t gpus[MAX_GPUS];
static op_t ops[MAX_OPS];
static int nops, next_op;
static int xid_gpu[MAX_XIDS], xid_code[MAX_XIDS];
static int xid_head, xid_tail;

static unsigned int field_bit(const char *name) {
    static const struct { const char *n; unsigned int b; } map[] = {
        {"power", F_POWER}, {"power_limit", F_POWER_LIMIT}, {"temp", F_TEMP}, {"mem_temp", F_MEM_TEMP},
        {"throttle", F_THROTTLE}, {"ecc", F_ECC}, {"remap", F_REMAP}, {"procs", F_PROCS},
        {"mem_util", F_MEM_UTIL}, {"events", F_EVENTS}, {"proc_util", F_PROC_UTIL}, {"clock", F_CLOCK}};
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(map[i].n, name) == 0) return map[i].b;
    return 0;
}

static void apply(const char *line) {
    char a[32] = {0}, b[32] = {0};
    unsigned long long v = 0, w = 0;
    int g = -1;
    if (sscanf(line, "gpus %d", &ngpus) == 1) return;
    if (sscanf(line, "no_memory_v2 %d", &no_memory_v2) == 1) return;
    if (sscanf(line, "driver_not_loaded %d", &driver_not_loaded) == 1) return;
    if (sscanf(line, "xid %d %llu", &g, &v) == 2) {
        if (xid_tail < MAX_XIDS) { xid_gpu[xid_tail] = g; xid_code[xid_tail] = (int)v; xid_tail++; }
        return;
    }
    if (sscanf(line, "gpu %d %31s", &g, a) != 2 || g < 0 || g >= MAX_GPUS) return;
    gpu_t *d = &gpus[g];
    if (strcmp(a, "notsupported") == 0 && sscanf(line, "gpu %d %31s %31s", &g, a, b) == 3) {
        d->unsupported |= field_bit(b);
        return;
    }
    if (strcmp(a, "procs_clear") == 0) { d->nprocs = 0; return; }
    long long sm = -1;
    if (strcmp(a, "proc") == 0 && sscanf(line, "gpu %d %31s %llu %llu %lld", &g, a, &v, &w, &sm) >= 4) {
        if (d->nprocs < MAX_PROCS) {
            d->proc_pid[d->nprocs] = (unsigned int)v;
            d->proc_mib[d->nprocs] = w;
            d->proc_sm[d->nprocs] = sm;
            d->nprocs++;
        }
        return;
    }
    if (sscanf(line, "gpu %d %31s %lli", &g, a, (long long *)&v) != 3) return;
#define SET(field) if (strcmp(a, #field) == 0) { d->field = v; return; }
    SET(util) SET(mem_util) SET(mem_total_mib) SET(mem_used_mib) SET(mem_reserved_mib) SET(power_mw)
    SET(power_limit_mw) SET(temp) SET(mem_temp) SET(throttle) SET(ecc_dbe) SET(remap_unc) SET(lost) SET(sm_clock)
#undef SET
}

static void load_scenario(void) {
    if (loaded) return;
    loaded = 1;
    const char *path = getenv("GPUFLEET_FAKE_NVML_SCENARIO");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) { ngpus = 1; gpus[0].mem_total_mib = 1024; return; }
    char line[160];
    long long at = 0;
    while (fgets(line, sizeof line, f) && nops < MAX_OPS) {
        line[strcspn(line, "\r\n#")] = 0;
        if (!line[0]) continue;
        if (sscanf(line, "at %lld", &at) == 1) continue;
        ops[nops].at = at;
        strncpy(ops[nops].line, line, sizeof ops[nops].line - 1);
        nops++;
    }
    fclose(f);
    /* stable insertion sort by round, so "at" blocks may come in any order */
    for (int i = 1; i < nops; i++) {
        op_t key = ops[i];
        int j = i - 1;
        while (j >= 0 && ops[j].at > key.at) { ops[j + 1] = ops[j]; j--; }
        ops[j + 1] = key;
    }
}

/* Apply every op due by the current sample round (caller holds the lock). */
static void advance(void) {
    long long round = 0;
    for (int i = 0; i < MAX_GPUS; i++)
        if (gpus[i].util_calls - 1 > round) round = gpus[i].util_calls - 1;
    while (next_op < nops && ops[next_op].at <= round) apply(ops[next_op++].line);
}

static int device(nvmlDevice_t h, gpu_t **out) {
    uintptr_t i = (uintptr_t)h;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (i < 1 || (int)i > ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    advance();
    *out = &gpus[i - 1];
    return (*out)->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

#define WITH_DEVICE(h, d)                       \
    gpu_t *d;                                   \
    pthread_mutex_lock(&lock);                  \
    int rc_ = device(h, &d);                    \
    if (rc_ != NVML_SUCCESS) { pthread_mutex_unlock(&lock); return rc_; }
#define DONE(rc) do { pthread_mutex_unlock(&lock); return (rc); } while (0)
#define UNSUPPORTED(d, bit) if ((d)->unsupported & (bit)) DONE(NVML_ERROR_NOT_SUPPORTED)

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    load_scenario();
    advance();
    int rc = driver_not_loaded ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
    if (rc == NVML_SUCCESS) initialized = 1;
    pthread_mutex_unlock(&lock);
    return rc;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlInit(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { initialized = 0; return NVML_SUCCESS; }

const char *nvmlErrorString(int rc) {
    switch (rc) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}

int nvmlSystemGetDriverVersion(char *buf, unsigned int len) {
    snprintf(buf, len, "999.99-fake");
    return NVML_SUCCESS;
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = (unsigned int)ngpus;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *handle) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if ((int)index >= ngpus) return NVML_ERROR_INVALID_ARGUMENT;
    *handle = (nvmlDevice_t)(uintptr_t)(index + 1);
    return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(nvmlDevice_t h, char *buf, unsigned int len) {
    WITH_DEVICE(h, d)
    snprintf(buf, len, "GPU-fake-%04d", (int)((uintptr_t)h - 1));
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetName(nvmlDevice_t h, char *buf, unsigned int len) {
    WITH_DEVICE(h, d)
    snprintf(buf, len, "Fake NVIDIA A10G");
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) {
    uintptr_t i = (uintptr_t)h;
    pthread_mutex_lock(&lock);
    if (initialized && i >= 1 && (int)i <= ngpus) gpus[i - 1].util_calls++;
    pthread_mutex_unlock(&lock);
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_MEM_UTIL);
    u->gpu = (unsigned int)d->util;
    u->memory = (unsigned int)d->mem_util;
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    WITH_DEVICE(h, d)
    /* v1 counts driver-reserved memory as used */
    m->total = d->mem_total_mib * MIB;
    m->used = (d->mem_used_mib + d->mem_reserved_mib) * MIB;
    m->free = m->total > m->used ? m->total - m->used : 0;
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    if (no_memory_v2) return NVML_ERROR_FUNCTION_NOT_FOUND;
    WITH_DEVICE(h, d)
    if (m->version != NVML_MEMORY_V2) DONE(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    m->total = d->mem_total_mib * MIB;
    m->reserved = d->mem_reserved_mib * MIB;
    m->used = d->mem_used_mib * MIB;
    unsigned long long taken = m->used + m->reserved;
    m->free = m->total > taken ? m->total - taken : 0;
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *mw) {
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_POWER);
    *mw = (unsigned int)d->power_mw;
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t h, unsigned int *mw) {
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_POWER_LIMIT);
    *mw = (unsigned int)d->power_limit_mw;
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *t) {
    (void)sensor;
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_TEMP);
    *t = (unsigned int)d->temp;
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetFieldValues(nvmlDevice_t h, int count, nvmlFieldValue_t *values) {
    WITH_DEVICE(h, d)
    for (int i = 0; i < count; i++) {
        values[i].timestamp = (int64_t)time(NULL) * 1000000;
        if (values[i].fieldId == NVML_FI_DEV_MEMORY_TEMP && !(d->unsupported & F_MEM_TEMP)) {
            values[i].valueType = 1; /* unsigned int */
            values[i].value.uiVal = (unsigned int)d->mem_temp;
            values[i].nvmlReturn = NVML_SUCCESS;
        } else {
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t h, unsigned long long *reasons) {
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_THROTTLE);
    *reasons = d->throttle;
    DONE(NVML_SUCCESS);
}
int nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t h, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(h, reasons);
}

int nvmlDeviceGetTotalEccErrors(nvmlDevice_t h, int errorType, int counterType, unsigned long long *count) {
    (void)counterType;
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_ECC);
    *count = errorType == 1 ? d->ecc_dbe : 0;
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetRemappedRows(nvmlDevice_t h, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                              unsigned int *failure) {
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_REMAP);
    *corr = 0;
    *unc = (unsigned int)d->remap_unc;
    *pending = 0;
    *failure = 0;
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *count, nvmlProcessInfo_t *infos) {
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_PROCS);
    unsigned int n = (unsigned int)d->nprocs;
    if (n == 0) { *count = 0; DONE(NVML_SUCCESS); }
    if (!infos || *count < n) { *count = n; DONE(NVML_ERROR_INSUFFICIENT_SIZE); }
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = d->proc_pid[i];
        infos[i].usedGpuMemory = d->proc_mib[i] * MIB;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = n;
    DONE(NVML_SUCCESS);
}

int nvmlEventSetCreate(void **set) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *set = (void *)(uintptr_t)1;
    return NVML_SUCCESS;
}

int nvmlDeviceRegisterEvents(nvmlDevice_t h, unsigned long long types, void *set) {
    (void)types;
    (void)set;
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_EVENTS);
    DONE(NVML_SUCCESS);
}

int nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeoutms) {
    (void)set;
    struct timespec nap = {0, 5 * 1000000L};
    for (unsigned int waited = 0;; waited += 5) {
        pthread_mutex_lock(&lock);
        if (!initialized) { pthread_mutex_unlock(&lock); return NVML_ERROR_UNINITIALIZED; }
        advance();
        if (xid_head < xid_tail) {
            data->device = (nvmlDevice_t)(uintptr_t)(xid_gpu[xid_head] + 1);
            data->eventType = 0x8; /* nvmlEventTypeXidCriticalError */
            data->eventData = (unsigned long long)xid_code[xid_head];
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            xid_head++;
            pthread_mutex_unlock(&lock);
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&lock);
        if (waited >= timeoutms) return NVML_ERROR_TIMEOUT;
        nanosleep(&nap, NULL);
    }
}

int nvmlEventSetFree(void *set) {
    (void)set;
    return NVML_SUCCESS;
}

/* Per-process SM utilization: one sample per process that has an "sm" value, stamped with the current
 * round (microseconds like NVML's CPU timestamps); only samples newer than lastSeenTimeStamp. */
int nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *out, unsigned int *count,
                                    unsigned long long lastSeen) {
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_PROC_UTIL);
    unsigned long long stamp = (unsigned long long)(d->util_calls + 1) * 1000000ull;
    unsigned int n = 0;
    for (int i = 0; i < d->nprocs; i++)
        if (d->proc_sm[i] >= 0 && stamp > lastSeen) n++;
    if (n == 0) DONE(NVML_ERROR_NOT_FOUND);
    if (!out || *count < n) { *count = n; DONE(NVML_ERROR_INSUFFICIENT_SIZE); }
    unsigned int k = 0;
    for (int i = 0; i < d->nprocs; i++) {
        if (d->proc_sm[i] < 0 || stamp <= lastSeen) continue;
        out[k].pid = d->proc_pid[i];
        out[k].timeStamp = stamp;
        out[k].smUtil = (unsigned int)d->proc_sm[i];
        out[k].memUtil = 0;
        out[k].encUtil = 0;
        out[k].decUtil = 0;
        k++;
    }
    *count = k;
    DONE(NVML_SUCCESS);
}

int nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned int *clock) {
    WITH_DEVICE(h, d)
    UNSUPPORTED(d, F_CLOCK);
    *clock = type == 1 ? (unsigned int)d->sm_clock : 0; /* NVML_CLOCK_SM = 1 */
    DONE(NVML_SUCCESS);
}
