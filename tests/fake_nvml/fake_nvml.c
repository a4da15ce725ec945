/*
 * fake_nvml.c - a fake libnvidia-ml.so.1 for gpubox's tests.
 *
 * It implements the part of the NVML C ABI that gpubox's NVML backend and nvitop call, with
 * the struct layouts of nvidia-ml-py 13.615.71, so the real pynvml module (ctypes marshalling,
 * error mapping) runs against it on a machine without a GPU. Every figure comes from a scenario
 * file; nothing is random.
 *
 * Build:  cc -shared -fPIC -O2 -Wall -Werror -o libnvidia-ml.so.1 fake_nvml.c -lpthread
 *         add -DOLD_DRIVER for a driver that lacks the GPM functions,
 *         nvmlDeviceGetCurrentClocksEventReasons and nvmlDeviceGetFieldValues.
 *
 * ---------------------------------------------------------------------------------------------
 * Scenario file
 * ---------------------------------------------------------------------------------------------
 * Named by the environment variable FAKE_NVML_SCENARIO and read when NVML is initialised (the
 * first nvmlInit after load or after the last nvmlShutdown; all counters start again then).
 * Unset: nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED, as on a box without the driver.
 * A file that cannot be read or parsed: NVML_ERROR_UNKNOWN, and one line on stderr.
 *
 * One `key=value` per line; blank lines and lines starting with '#' are ignored; spaces around
 * keys and values are trimmed. Section headers start a new object:
 *
 *   [system]   (optional; keys before any header are system keys too)
 *   [gpu]      a physical GPU; GPU indexes follow the order of the [gpu] sections
 *   [mig]      a MIG device of the last [gpu]; slot indexes follow the order of [mig] sections
 *   [process]  a process on the last [gpu]; with gpu_instance_id= it runs in that MIG device
 *
 * Numbers are decimal or 0x-hex; booleans are 0/1. Unknown keys are an error (typos show up).
 *
 * [system]
 *   driver_version=550.54.15        nvml_version=12.550.54.15     cuda_driver_version=12040
 *   device_count=N                  optional; must equal the number of [gpu] sections
 *   init_error=NAME                 nvmlInit fails: driver_not_loaded | no_permission |
 *                                   lib_rm_version_mismatch | unknown
 *   process_utilization=ok          nvmlDeviceGetProcessUtilization works; or no_permission |
 *                                   not_supported: it fails so
 *   struct_version_mismatch=0       1: the driver knows no version of the versioned structs
 *                                   (nvmlMemory_v2_t, nvmlGpmMetricsGet_t, nvmlGpmSupport_t):
 *                                   those calls return NVML_ERROR_ARGUMENT_VERSION_MISMATCH
 *   unsupported=fnA,fnB             these NVML functions return NVML_ERROR_NOT_SUPPORTED
 *   missing=fnA,fnB                 these return NVML_ERROR_FUNCTION_NOT_FOUND, which pynvml raises
 *                                   as NVMLError_FunctionNotFound, as for a symbol an older
 *                                   driver lacks (the OLD_DRIVER build leaves symbols out instead)
 *   pcie_throughput_delay_us=0      nvmlDeviceGetPcieThroughput sleeps this long, as the real
 *                                   call blocks ~20 ms per direction
 *
 * [gpu]
 *   name=  uuid=  serial=  pci_bus_id=00000000:18:00.0  pci_device_id=0x233010DE
 *   pci_subsystem_id=  architecture=hopper (kepler..blackwell)  cuda_cc=90 (major*10+minor)
 *   gpm=1  pcie_counters=1 (NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES)  pcie_throughput=1
 *   gpu_util=  mem_util=  sm_active=  sm_occupancy= (GPM %, may have decimals)
 *   pcie_tx_bps=  pcie_rx_bps=  (bytes/s)  pcie_gen=  pcie_gen_max=  pcie_width=  pcie_width_max=
 *   memory_total=  memory_used=  memory_reserved=  (bytes)  bar1_total=  bar1_used=
 *   power_mw=  power_limit_mw=  enforced_power_limit_mw= (default power_limit_mw)  temperature=
 *   sm_clock=  mem_clock=  graphics_clock= (default sm_clock)  video_clock=
 *   max_sm_clock=  max_mem_clock=  max_graphics_clock= (default max_sm_clock)  max_video_clock=
 *   clock_event_reasons=0x4   fan_speed= (-1: no fan, NOT_SUPPORTED)  performance_state=0
 *   persistence_mode=1  display_mode=0  display_active=0  compute_mode=0  ecc_errors=0
 *   encoder_util=  decoder_util=  nvlink_links=0
 *   mig_capable=0  mig_mode=0  max_mig_devices=7
 *   lost_after=N   after N calls of nvmlDeviceGetUtilizationRates on this GPU, every call about
 *                  it (and its MIG devices) returns NVML_ERROR_GPU_IS_LOST; -1 (default): never
 *   unsupported=fnA,fnB  missing=fnA,fnB  as the system keys, for this GPU and its MIG devices only
 *
 *   Health, as the doctor reads it:
 *   ecc_mode=1  ecc_mode_pending= (default ecc_mode)   nvmlDeviceGetEccMode (current, pending);
 *                  with ecc_mode=0 nvmlDeviceGetTotalEccErrors is NOT_SUPPORTED, as with ECC off
 *   ecc_corrected_volatile=  ecc_uncorrected_volatile=  ecc_corrected_aggregate=
 *   ecc_uncorrected_aggregate=   nvmlDeviceGetTotalEccErrors per error and counter type; each
 *                  defaults to ecc_errors (the older key, which still sets all four)
 *   remapped_rows_corrected=0  remapped_rows_uncorrected=0  remap_pending=0  remap_failure=0
 *                  nvmlDeviceGetRemappedRows; NOT_SUPPORTED before Ampere
 *   retired_pages_pending=0  nvmlDeviceGetRetiredPagesPendingStatus; NOT_SUPPORTED from Ampere on,
 *                  where row remapping replaces page retirement
 *   power_default_limit_mw= (default power_limit_mw)  power_min_limit_mw= (default a quarter of
 *                  the default limit)  power_max_limit_mw= (default the default limit)
 *   temperature_shutdown=92  temperature_slowdown=89  temperature_mem_max=95
 *   temperature_gpu_max=87   nvmlDeviceGetTemperatureThreshold; other thresholds NOT_SUPPORTED
 *   pcie_gen_gpu_max= (default pcie_gen_max)  nvmlDeviceGetGpuMaxPcieLinkGeneration: what the GPU
 *                  alone can do; pcie_gen_max is what the GPU and the slot allow together
 *   pcie_replays=0  pcie_replays_per_call=0   nvmlDeviceGetPcieReplayCounter: the value (or the
 *                  sequence, see below) plus pcie_replays_per_call for every earlier call
 *   energy_mj=0  energy_mj_per_call=0   nvmlDeviceGetTotalEnergyConsumption (mJ since the driver
 *                  loaded): energy_mj plus energy_mj_per_call for every earlier call
 *
 *   Sequences: pcie_gen, pcie_width, clock_event_reasons and pcie_replays take one value or a
 *   comma-separated list (at most 64): successive calls return the values in turn and the last one
 *   repeats, e.g. pcie_gen=1,5 for a link that idles at Gen1 and runs at Gen5 once loaded. Each
 *   figure counts its own calls (both clock-event-reason calls share one count); a new nvmlInit
 *   starts every sequence again.
 *
 * [mig]
 *   gpu_instance_id=  compute_instance_id=0  uuid=MIG-...  name=  memory_total=  memory_used=
 *   bar1_total= (default the GPU's)  bar1_used=  sm_active=  sm_occupancy= (its GPM, read
 *   through nvmlGpmMigSampleGet on the parent)
 *
 * [process]
 *   pid=  used_memory= (bytes)  sm_util=  mem_util=  enc_util=0  dec_util=0
 *   type=compute | graphics | both | mps (an MPS client: listed by the MPS call only)
 *   sampled=1 (0: no utilization sample, the process ran no
 *   kernel)   gpu_instance_id=  compute_instance_id=0  (MIG only)
 *
 * ---------------------------------------------------------------------------------------------
 * Time
 * ---------------------------------------------------------------------------------------------
 * nvmlDeviceGetFieldValues runs a virtual clock per device: each call advances it by exactly
 * 1,000,000 us, and the PCIe byte counters read rate * virtual seconds, so delta bytes over delta
 * timestamp is exactly the scenario's rate. Process-utilization samples carry wall-clock
 * microseconds, made strictly increasing per device, so a caller that passes the last timestamp
 * it saw always gets one fresh sample per process; one that passes a later time gets
 * NVML_ERROR_NOT_FOUND, as does any caller on a GPU whose processes are all sampled=0.
 * GPM metrics are the scenario's figures over any two filled samples (sample2 newer).
 *
 * ---------------------------------------------------------------------------------------------
 * Devices
 * ---------------------------------------------------------------------------------------------
 * A handle is a pointer to one of the library's device records; any other pointer, or NULL,
 * gives NVML_ERROR_INVALID_ARGUMENT, as does a NULL output pointer. MIG device handles answer
 * name, UUID, index (the parent's), memory, BAR1, running processes, instance ids and the
 * parent handle; the other figures are NOT_SUPPORTED on them, as with a real driver. A GPU in
 * MIG mode has no utilization rates and no per-process utilization (NOT_SUPPORTED).
 * nvmlDeviceGetPcieThroughput reports KB/s with 1 KB = 1024 bytes.
 */

#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

/* ============================================================================================
 * NVML ABI: return codes, enums and structs, laid out as pynvml 13.615.71 declares them.
 * ========================================================================================== */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 };
enum { NVML_TEMPERATURE_GPU = 0 };
enum {
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1,
    NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2,
    NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3,
    NVML_TEMPERATURE_THRESHOLD_COUNT = 8,
};
enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };
enum { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 };
enum { NVML_VALUE_TYPE_UNSIGNED_INT = 1, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3 };

enum {
    NVML_FI_DEV_NVLINK_LINK_COUNT = 91,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139,
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197,
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198,
};

enum {
    NVML_GPM_METRIC_GRAPHICS_UTIL = 1,
    NVML_GPM_METRIC_SM_UTIL = 2,
    NVML_GPM_METRIC_SM_OCCUPANCY = 3,
    NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20,
    NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21,
    NVML_GPM_METRIC_MAX = 477, /* pynvml sizes nvmlGpmMetricsGet_t.metrics with this */
};
#define NVML_GPM_METRICS_GET_VERSION 1u
#define NVML_GPM_SUPPORT_VERSION 1u

#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned long long bar1Total, bar1Free, bar1Used;
} nvmlBAR1Memory_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    const char *shortName;
    const char *longName;
    const char *unit;
} nvmlGpmMetricInfo_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

/* Sizes pynvml's ctypes structures have on x86-64 / aarch64 Linux. */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 0x28, "nvmlMemory_v2_t (nvmlMemory_v2 = 0x02000028)");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t");
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t");
_Static_assert(offsetof(nvmlGpmMetricsGet_t, metrics) == 24, "nvmlGpmMetricsGet_t");

/* ============================================================================================
 * The box the scenario describes
 * ========================================================================================== */

#define MAX_GPUS 64
#define MAX_MIGS_PER_GPU 8
#define MAX_PROCS 8192
#define STR_LEN 96
#define LIST_LEN 2048
#define VIRTUAL_EPOCH_US 1700000000000000LL /* field-value clock starts here (Nov 2023) */
#define SEQ_MAX 64
#define UNSET_U32 UINT_MAX   /* a key the scenario left out: finish_gpu fills in its default */
#define UNSET_U64 ULLONG_MAX

/* A figure that changes from call to call: v[0], v[1], ... on successive calls; the last repeats. */
struct seq {
    unsigned long long v[SEQ_MAX];
    unsigned int n;
    unsigned long long calls;
};

struct dev {
    /* identity */
    int is_mig;
    unsigned int index;   /* GPU index; for a MIG device its parent's */
    unsigned int slot;    /* MIG slot under the parent */
    struct dev *parent;   /* MIG devices only */
    char name[STR_LEN], uuid[STR_LEN], serial[32], pci_bus_id[32], architecture[32];
    unsigned int pci_device_id, pci_subsystem_id, cuda_cc;
    /* capabilities */
    unsigned int gpm, pcie_counters, pcie_throughput, mig_capable, mig_mode, max_mig_devices;
    /* figures */
    unsigned int gpu_util, mem_util;
    double sm_active, sm_occupancy;
    unsigned long long pcie_tx_bps, pcie_rx_bps;
    struct seq pcie_gen, pcie_width;
    unsigned int pcie_gen_max, pcie_width_max, pcie_gen_gpu_max;
    struct seq pcie_replays;
    unsigned long long pcie_replays_per_call;
    unsigned long long energy_mj, energy_mj_per_call, energy_calls;
    unsigned long long memory_total, memory_used, memory_reserved, bar1_total, bar1_used;
    unsigned int power_mw, power_limit_mw, enforced_power_limit_mw, temperature;
    unsigned int sm_clock, mem_clock, graphics_clock, video_clock;
    unsigned int max_sm_clock, max_mem_clock, max_graphics_clock, max_video_clock;
    struct seq clock_event_reasons;
    unsigned long long ecc_errors;
    unsigned int ecc_mode, ecc_mode_pending;
    unsigned long long ecc_corrected_volatile, ecc_uncorrected_volatile;
    unsigned long long ecc_corrected_aggregate, ecc_uncorrected_aggregate;
    unsigned int remapped_rows_corrected, remapped_rows_uncorrected, remap_pending, remap_failure;
    unsigned int retired_pages_pending;
    unsigned int power_default_limit_mw, power_min_limit_mw, power_max_limit_mw;
    unsigned int temperature_shutdown, temperature_slowdown, temperature_mem_max;
    unsigned int temperature_gpu_max;
    long long fan_speed;
    unsigned int performance_state, persistence_mode, display_mode, display_active, compute_mode;
    unsigned int encoder_util, decoder_util, nvlink_links;
    long long lost_after;
    char unsupported[LIST_LEN]; /* "fnA,fnB" */
    char missing[LIST_LEN];
    unsigned int gpu_instance_id, compute_instance_id; /* MIG devices only */
    /* state */
    struct dev *migs[MAX_MIGS_PER_GPU];
    unsigned int n_migs;
    unsigned long long util_calls, field_calls, gpm_seq, last_util_ts;
    int lost;
};

struct proc {
    struct dev *gpu;
    unsigned int pid;
    unsigned long long used_memory;
    unsigned int sm_util, mem_util, enc_util, dec_util, sampled;
    char type[16];
    long long gpu_instance_id; /* -1: not in a MIG device */
    unsigned int compute_instance_id;
};

struct sys {
    char driver_version[80], nvml_version[80], init_error[32], process_utilization[32];
    long long device_count;
    unsigned int cuda_driver_version, struct_version_mismatch, pcie_throughput_delay_us;
    char unsupported[LIST_LEN], missing[LIST_LEN];
};

/* GPM samples are handed out as opaque pointers; we keep the list to validate them. */
struct nvmlGpmSample_st {
    struct dev *dev; /* NULL until nvmlGpmSampleGet fills it */
    unsigned long long seq;
    struct nvmlGpmSample_st *next;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;
static struct sys g_sys;
static struct dev g_gpus[MAX_GPUS];
static struct dev g_migs[MAX_GPUS * MAX_MIGS_PER_GPU];
static struct proc g_procs[MAX_PROCS];
static unsigned int g_n_gpus, g_n_migs, g_n_procs;
static struct nvmlGpmSample_st *g_samples;

static void lock(void) { pthread_mutex_lock(&g_lock); }
static void unlock(void) { pthread_mutex_unlock(&g_lock); }

/* ============================================================================================
 * Scenario parsing: table-driven, so each key is one line below.
 * ========================================================================================== */

enum ktype { K_STR, K_U32, K_U64, K_I64, K_DBL, K_SEQ };
struct key { const char *name; enum ktype type; size_t off; size_t size; };

#define KS(s, f) {#f, K_STR, offsetof(struct s, f), sizeof(((struct s *)0)->f)}
#define KU(s, f) {#f, K_U32, offsetof(struct s, f), 0}
#define KL(s, f) {#f, K_U64, offsetof(struct s, f), 0}
#define KI(s, f) {#f, K_I64, offsetof(struct s, f), 0}
#define KD(s, f) {#f, K_DBL, offsetof(struct s, f), 0}
#define KQ(s, f) {#f, K_SEQ, offsetof(struct s, f), 0}

static const struct key SYS_KEYS[] = {
    KS(sys, driver_version), KS(sys, nvml_version), KU(sys, cuda_driver_version),
    KI(sys, device_count), KS(sys, init_error), KS(sys, process_utilization),
    KU(sys, struct_version_mismatch), KS(sys, unsupported), KU(sys, pcie_throughput_delay_us),
    KS(sys, missing),
    {NULL, K_STR, 0, 0},
};

static const struct key GPU_KEYS[] = {
    KS(dev, name), KS(dev, uuid), KS(dev, serial), KS(dev, pci_bus_id), KU(dev, pci_device_id),
    KU(dev, pci_subsystem_id), KS(dev, architecture), KU(dev, cuda_cc), KU(dev, gpm),
    KU(dev, pcie_counters), KU(dev, pcie_throughput), KU(dev, gpu_util), KU(dev, mem_util),
    KD(dev, sm_active), KD(dev, sm_occupancy), KL(dev, pcie_tx_bps), KL(dev, pcie_rx_bps),
    KQ(dev, pcie_gen), KU(dev, pcie_gen_max), KQ(dev, pcie_width), KU(dev, pcie_width_max),
    KU(dev, pcie_gen_gpu_max), KQ(dev, pcie_replays), KL(dev, pcie_replays_per_call),
    KL(dev, energy_mj), KL(dev, energy_mj_per_call),
    KL(dev, memory_total), KL(dev, memory_used), KL(dev, memory_reserved), KL(dev, bar1_total),
    KL(dev, bar1_used), KU(dev, power_mw), KU(dev, power_limit_mw),
    KU(dev, enforced_power_limit_mw), KU(dev, temperature), KU(dev, sm_clock),
    KU(dev, mem_clock), KU(dev, graphics_clock), KU(dev, video_clock), KU(dev, max_sm_clock),
    KU(dev, max_mem_clock), KU(dev, max_graphics_clock), KU(dev, max_video_clock),
    KQ(dev, clock_event_reasons), KL(dev, ecc_errors), KI(dev, fan_speed),
    KU(dev, ecc_mode), KU(dev, ecc_mode_pending), KL(dev, ecc_corrected_volatile),
    KL(dev, ecc_uncorrected_volatile), KL(dev, ecc_corrected_aggregate),
    KL(dev, ecc_uncorrected_aggregate), KU(dev, remapped_rows_corrected),
    KU(dev, remapped_rows_uncorrected), KU(dev, remap_pending), KU(dev, remap_failure),
    KU(dev, retired_pages_pending), KU(dev, power_default_limit_mw), KU(dev, power_min_limit_mw),
    KU(dev, power_max_limit_mw), KU(dev, temperature_shutdown), KU(dev, temperature_slowdown),
    KU(dev, temperature_mem_max), KU(dev, temperature_gpu_max), KS(dev, missing),
    KU(dev, performance_state), KU(dev, persistence_mode), KU(dev, display_mode),
    KU(dev, display_active), KU(dev, compute_mode), KU(dev, encoder_util),
    KU(dev, decoder_util), KU(dev, nvlink_links), KU(dev, mig_capable), KU(dev, mig_mode),
    KU(dev, max_mig_devices), KI(dev, lost_after), KS(dev, unsupported),
    {NULL, K_STR, 0, 0},
};

static const struct key MIG_KEYS[] = {
    KU(dev, gpu_instance_id), KU(dev, compute_instance_id), KS(dev, uuid), KS(dev, name),
    KL(dev, memory_total), KL(dev, memory_used), KL(dev, bar1_total), KL(dev, bar1_used),
    KD(dev, sm_active), KD(dev, sm_occupancy),
    {NULL, K_STR, 0, 0},
};

static const struct key PROC_KEYS[] = {
    KU(proc, pid), KL(proc, used_memory), KU(proc, sm_util), KU(proc, mem_util),
    KU(proc, enc_util), KU(proc, dec_util), KS(proc, type), KU(proc, sampled),
    KI(proc, gpu_instance_id), KU(proc, compute_instance_id),
    {NULL, K_STR, 0, 0},
};

static char g_parse_error[256];

static void seq_set(struct seq *s, unsigned long long x)
{
    s->v[0] = x;
    s->n = 1;
    s->calls = 0;
}

/* The value for this call; the next call gets the next one, and the last value repeats. */
static unsigned long long seq_next(struct seq *s)
{
    unsigned long long x = s->v[s->calls < s->n ? s->calls : s->n - 1];
    s->calls++;
    return x;
}

/* "a,b,c" into a sequence; returns 0, or -1 with g_parse_error set. */
static int parse_seq(struct seq *s, const char *k, const char *v)
{
    s->n = 0;
    s->calls = 0;
    for (const char *p = v;;) {
        char *end = NULL;
        while (isspace((unsigned char)*p))
            p++;
        errno = 0;
        unsigned long long x = strtoull(p, &end, 0);
        if (s->n == SEQ_MAX) {
            snprintf(g_parse_error, sizeof g_parse_error, "more than %d values for %s", SEQ_MAX, k);
            return -1;
        }
        if (*p == '-' || errno || end == p) {
            snprintf(g_parse_error, sizeof g_parse_error, "bad value list for %s: '%.64s'", k, v);
            return -1;
        }
        s->v[s->n++] = x;
        while (isspace((unsigned char)*end))
            end++;
        if (*end == '\0')
            return 0;
        if (*end != ',') {
            snprintf(g_parse_error, sizeof g_parse_error, "bad value list for %s: '%.64s'", k, v);
            return -1;
        }
        p = end + 1;
    }
}

static int set_key(const struct key *keys, void *obj, const char *k, const char *v)
{
    for (const struct key *key = keys; key->name; key++) {
        if (strcmp(key->name, k) != 0)
            continue;
        char *field = (char *)obj + key->off, *end = NULL;
        errno = 0;
        switch (key->type) {
        case K_STR:
            if (strlen(v) >= key->size) {
                snprintf(g_parse_error, sizeof g_parse_error, "value of %s too long", k);
                return -1;
            }
            strcpy(field, v);
            return 0;
        case K_U32: {
            unsigned long long x = strtoull(v, &end, 0);
            if (*v == '-' || x > UINT_MAX)
                errno = ERANGE;
            *(unsigned int *)field = (unsigned int)x;
            break;
        }
        case K_U64:
            if (*v == '-')
                errno = ERANGE;
            *(unsigned long long *)field = strtoull(v, &end, 0);
            break;
        case K_I64:
            *(long long *)field = strtoll(v, &end, 0);
            break;
        case K_DBL:
            *(double *)field = strtod(v, &end);
            break;
        case K_SEQ:
            return parse_seq((struct seq *)field, k, v);
        }
        if (errno || end == v || *end) {
            snprintf(g_parse_error, sizeof g_parse_error, "bad number for %s: '%s'", k, v);
            return -1;
        }
        return 0;
    }
    snprintf(g_parse_error, sizeof g_parse_error, "unknown key '%s'", k);
    return -1;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

static void gpu_defaults(struct dev *d, unsigned int index)
{
    memset(d, 0, sizeof *d);
    d->index = index;
    snprintf(d->name, sizeof d->name, "NVIDIA H100 80GB HBM3");
    snprintf(d->uuid, sizeof d->uuid, "GPU-00000000-0000-0000-0000-%012x", index);
    snprintf(d->serial, sizeof d->serial, "132302%07u", index);
    snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "00000000:%02X:00.0", 0x18 + index);
    snprintf(d->architecture, sizeof d->architecture, "hopper");
    d->pci_device_id = 0x233010DE;
    d->pci_subsystem_id = 0x16C110DE;
    d->cuda_cc = 90;
    d->gpm = d->pcie_counters = d->pcie_throughput = 1;
    seq_set(&d->pcie_gen, 5);
    seq_set(&d->pcie_width, 16);
    seq_set(&d->clock_event_reasons, 0);
    seq_set(&d->pcie_replays, 0);
    d->pcie_gen_max = 5;
    d->pcie_width_max = 16;
    d->pcie_gen_gpu_max = UNSET_U32;
    d->ecc_mode = 1;
    d->ecc_mode_pending = UNSET_U32;
    d->ecc_corrected_volatile = d->ecc_uncorrected_volatile = UNSET_U64;
    d->ecc_corrected_aggregate = d->ecc_uncorrected_aggregate = UNSET_U64;
    d->power_default_limit_mw = d->power_min_limit_mw = d->power_max_limit_mw = UNSET_U32;
    d->temperature_shutdown = 92;
    d->temperature_slowdown = 89;
    d->temperature_mem_max = 95;
    d->temperature_gpu_max = 87;
    d->memory_total = 85520809984ULL;
    d->bar1_total = 137438953472ULL;
    d->power_limit_mw = 700000;
    d->enforced_power_limit_mw = UINT_MAX;
    d->temperature = 30;
    d->sm_clock = d->max_sm_clock = 1980;
    d->mem_clock = d->max_mem_clock = 2619;
    d->graphics_clock = d->max_graphics_clock = UINT_MAX;
    d->video_clock = d->max_video_clock = 1545;
    d->fan_speed = -1;
    d->persistence_mode = 1;
    d->max_mig_devices = 7;
    d->lost_after = -1;
}

static int finish_gpu(struct dev *d)
{
    if (d->enforced_power_limit_mw == UINT_MAX)
        d->enforced_power_limit_mw = d->power_limit_mw;
    if (d->graphics_clock == UINT_MAX)
        d->graphics_clock = d->sm_clock;
    if (d->max_graphics_clock == UINT_MAX)
        d->max_graphics_clock = d->max_sm_clock;
    if (d->pcie_gen_gpu_max == UNSET_U32)
        d->pcie_gen_gpu_max = d->pcie_gen_max;
    if (d->ecc_mode_pending == UNSET_U32)
        d->ecc_mode_pending = d->ecc_mode;
    unsigned long long *ecc[] = {&d->ecc_corrected_volatile, &d->ecc_uncorrected_volatile,
                                 &d->ecc_corrected_aggregate, &d->ecc_uncorrected_aggregate};
    for (size_t i = 0; i < sizeof ecc / sizeof ecc[0]; i++)
        if (*ecc[i] == UNSET_U64)
            *ecc[i] = d->ecc_errors;
    if (d->power_default_limit_mw == UNSET_U32)
        d->power_default_limit_mw = d->power_limit_mw;
    if (d->power_min_limit_mw == UNSET_U32)
        d->power_min_limit_mw = d->power_default_limit_mw / 4;
    if (d->power_max_limit_mw == UNSET_U32)
        d->power_max_limit_mw = d->power_default_limit_mw;
    if (d->memory_used > d->memory_total || d->memory_reserved > d->memory_used) {
        snprintf(g_parse_error, sizeof g_parse_error,
                 "GPU %u: need memory_reserved <= memory_used <= memory_total", d->index);
        return -1;
    }
    if (d->n_migs && !d->mig_mode) {
        snprintf(g_parse_error, sizeof g_parse_error, "GPU %u has [mig] sections but mig_mode=0",
                 d->index);
        return -1;
    }
    if (d->mig_mode)
        d->mig_capable = 1;
    return 0;
}

/* Read the scenario into the globals. Returns NVML_SUCCESS or the error nvmlInit reports. */
static nvmlReturn_t load_scenario(void)
{
    const char *path = getenv("FAKE_NVML_SCENARIO");
    memset(&g_sys, 0, sizeof g_sys);
    g_n_gpus = g_n_migs = g_n_procs = 0;
    if (!path || !*path)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "fake NVML: cannot read scenario %s: %s\n", path, strerror(errno));
        return NVML_ERROR_UNKNOWN;
    }
    snprintf(g_sys.driver_version, sizeof g_sys.driver_version, "550.54.15");
    snprintf(g_sys.nvml_version, sizeof g_sys.nvml_version, "12.550.54.15");
    snprintf(g_sys.process_utilization, sizeof g_sys.process_utilization, "ok");
    g_sys.cuda_driver_version = 12040;
    g_sys.device_count = -1;

    const struct key *keys = SYS_KEYS;
    void *obj = &g_sys;
    struct dev *gpu = NULL;
    char line[4096];
    int lineno = 0, rc = 0;
    g_parse_error[0] = '\0';
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        if (*s == '[') {
            if (strcmp(s, "[system]") == 0) {
                keys = SYS_KEYS, obj = &g_sys;
            } else if (strcmp(s, "[gpu]") == 0) {
                if (gpu && finish_gpu(gpu) != 0) {
                    rc = -1;
                    break;
                }
                if (g_n_gpus == MAX_GPUS) {
                    snprintf(g_parse_error, sizeof g_parse_error, "more than %d GPUs", MAX_GPUS);
                    rc = -1;
                    break;
                }
                gpu = &g_gpus[g_n_gpus];
                gpu_defaults(gpu, g_n_gpus++);
                keys = GPU_KEYS, obj = gpu;
            } else if (strcmp(s, "[mig]") == 0) {
                if (!gpu || gpu->n_migs == MAX_MIGS_PER_GPU) {
                    snprintf(g_parse_error, sizeof g_parse_error,
                             "[mig] needs a [gpu] before it, at most %d per GPU", MAX_MIGS_PER_GPU);
                    rc = -1;
                    break;
                }
                struct dev *m = &g_migs[g_n_migs++];
                memset(m, 0, sizeof *m);
                m->is_mig = 1;
                m->parent = gpu;
                m->index = gpu->index;
                m->slot = gpu->n_migs;
                m->gpu_instance_id = gpu->n_migs + 1;
                snprintf(m->uuid, sizeof m->uuid, "MIG-00000000-0000-0000-%04x-%012x", gpu->index,
                         gpu->n_migs);
                snprintf(m->name, sizeof m->name, "%.80s MIG", gpu->name);
                gpu->migs[gpu->n_migs++] = m;
                keys = MIG_KEYS, obj = m;
            } else if (strcmp(s, "[process]") == 0) {
                if (!gpu || g_n_procs == MAX_PROCS) {
                    snprintf(g_parse_error, sizeof g_parse_error,
                             "[process] needs a [gpu] before it, at most %d in all", MAX_PROCS);
                    rc = -1;
                    break;
                }
                struct proc *p = &g_procs[g_n_procs++];
                memset(p, 0, sizeof *p);
                p->gpu = gpu;
                p->sampled = 1;
                p->gpu_instance_id = -1;
                snprintf(p->type, sizeof p->type, "compute");
                keys = PROC_KEYS, obj = p;
            } else {
                snprintf(g_parse_error, sizeof g_parse_error, "unknown section %s", s);
                rc = -1;
            }
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(g_parse_error, sizeof g_parse_error, "expected key=value");
            rc = -1;
            break;
        }
        *eq = '\0';
        rc = set_key(keys, obj, trim(s), trim(eq + 1));
    }
    fclose(f);
    if (rc == 0 && gpu)
        rc = finish_gpu(gpu);
    if (rc == 0 && g_sys.device_count >= 0 && (unsigned long long)g_sys.device_count != g_n_gpus) {
        snprintf(g_parse_error, sizeof g_parse_error, "device_count=%lld but %u [gpu] sections",
                 g_sys.device_count, g_n_gpus);
        rc = -1, lineno = 0;
    }
    for (unsigned int i = 0; rc == 0 && i < g_n_migs; i++) {
        if (!g_migs[i].bar1_total)
            g_migs[i].bar1_total = g_migs[i].parent->bar1_total;
        if (g_migs[i].memory_used > g_migs[i].memory_total) {
            snprintf(g_parse_error, sizeof g_parse_error, "MIG %s: memory_used > memory_total",
                     g_migs[i].uuid);
            rc = -1, lineno = 0;
        }
    }
    for (unsigned int i = 0; rc == 0 && i < g_n_procs; i++) {
        struct proc *p = &g_procs[i];
        int found = p->gpu_instance_id < 0;
        for (unsigned int m = 0; !found && m < p->gpu->n_migs; m++)
            found = p->gpu->migs[m]->gpu_instance_id == (unsigned long long)p->gpu_instance_id;
        if (!found || (strcmp(p->type, "compute") && strcmp(p->type, "graphics") &&
                       strcmp(p->type, "both") && strcmp(p->type, "mps"))) {
            snprintf(g_parse_error, sizeof g_parse_error,
                     "process %u: unknown gpu_instance_id or type", p->pid);
            rc = -1, lineno = 0;
        }
    }
    if (rc != 0) {
        fprintf(stderr, "fake NVML: scenario %s line %d: %s\n", path, lineno, g_parse_error);
        return NVML_ERROR_UNKNOWN;
    }
    static const struct { const char *name; nvmlReturn_t rc; } init_errors[] = {
        {"driver_not_loaded", NVML_ERROR_DRIVER_NOT_LOADED},
        {"no_permission", NVML_ERROR_NO_PERMISSION},
        {"lib_rm_version_mismatch", NVML_ERROR_LIB_RM_VERSION_MISMATCH},
        {"unknown", NVML_ERROR_UNKNOWN},
    };
    if (g_sys.init_error[0]) {
        for (size_t i = 0; i < sizeof init_errors / sizeof init_errors[0]; i++)
            if (strcmp(g_sys.init_error, init_errors[i].name) == 0)
                return init_errors[i].rc;
        fprintf(stderr, "fake NVML: unknown init_error '%s'\n", g_sys.init_error);
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/* ============================================================================================
 * Helpers shared by the entry points
 * ========================================================================================== */

static int in_list(const char *list, const char *fn)
{
    /* list is "a,b,c"; compare whole names only */
    size_t n = strlen(fn);
    for (const char *p = list; (p = strstr(p, fn)) != NULL; p += n)
        if ((p == list || p[-1] == ',' || p[-1] == ' ') &&
            (p[n] == '\0' || p[n] == ',' || p[n] == ' '))
            return 1;
    return 0;
}

/* A handle is valid when it points at one of our device records. */
static struct dev *resolve(nvmlDevice_t h)
{
    uintptr_t p = (uintptr_t)h;
    uintptr_t g0 = (uintptr_t)g_gpus, m0 = (uintptr_t)g_migs;
    if (p >= g0 && p < g0 + g_n_gpus * sizeof(struct dev) && (p - g0) % sizeof(struct dev) == 0)
        return (struct dev *)h;
    if (p >= m0 && p < m0 + g_n_migs * sizeof(struct dev) && (p - m0) % sizeof(struct dev) == 0)
        return (struct dev *)h;
    return NULL;
}

static struct dev *physical(struct dev *d) { return d->is_mig ? d->parent : d; }

/*
 * The checks every device call makes, in the order NVML makes them: initialised, valid handle
 * and output pointer, GPU not lost, function supported. Called with the lock held.
 */
static nvmlReturn_t enter_device(const char *fn, nvmlDevice_t h, const void *out, struct dev **dp)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    struct dev *d = resolve(h);
    if (!d || !out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (physical(d)->lost)
        return NVML_ERROR_GPU_IS_LOST;
    if (in_list(g_sys.missing, fn) || in_list(physical(d)->missing, fn))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (in_list(g_sys.unsupported, fn) || in_list(physical(d)->unsupported, fn))
        return NVML_ERROR_NOT_SUPPORTED;
    *dp = d;
    return NVML_SUCCESS;
}

static nvmlReturn_t enter_system(const char *fn, const void *out)
{
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (in_list(g_sys.missing, fn))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (in_list(g_sys.unsupported, fn))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* Open a device call: lock, run the common checks, and leave `d` pointing at the device. */
#define BEGIN_DEVICE(handle, out)                                                              \
    struct dev *d = NULL;                                                                      \
    lock();                                                                                    \
    {                                                                                          \
        nvmlReturn_t rc_ = enter_device(__func__, (handle), (const void *)(out), &d);          \
        if (rc_ != NVML_SUCCESS) {                                                             \
            unlock();                                                                          \
            return rc_;                                                                        \
        }                                                                                      \
    }

#define BEGIN_SYSTEM(out)                                                                      \
    lock();                                                                                    \
    {                                                                                          \
        nvmlReturn_t rc_ = enter_system(__func__, (const void *)(out));                        \
        if (rc_ != NVML_SUCCESS) {                                                             \
            unlock();                                                                          \
            return rc_;                                                                        \
        }                                                                                      \
    }

#define RETURN(x)                                                                              \
    do {                                                                                       \
        nvmlReturn_t r_ = (x);                                                                 \
        unlock();                                                                              \
        return r_;                                                                             \
    } while (0)

/* Most figures exist for the physical GPU only; MIG devices answer NOT_SUPPORTED. */
#define PHYSICAL_ONLY()                                                                        \
    if (d->is_mig)                                                                             \
    RETURN(NVML_ERROR_NOT_SUPPORTED)

static nvmlReturn_t copy_string(char *dst, unsigned int len, const char *src)
{
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

static unsigned long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

/* ============================================================================================
 * Initialisation and system queries
 * ========================================================================================== */

static void free_samples(void)
{
    while (g_samples) {
        struct nvmlGpmSample_st *next = g_samples->next;
        free(g_samples);
        g_samples = next;
    }
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing for a fake box */
    lock();
    if (g_refcount == 0) {
        nvmlReturn_t rc = load_scenario();
        if (rc != NVML_SUCCESS)
            RETURN(rc);
    }
    g_refcount++;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void)
{
    lock();
    if (g_refcount == 0)
        RETURN(NVML_ERROR_UNINITIALIZED);
    if (--g_refcount == 0)
        free_samples(); /* real NVML frees everything at the last shutdown */
    RETURN(NVML_SUCCESS);
}

API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not ready";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    BEGIN_SYSTEM(version);
    RETURN(copy_string(version, length, g_sys.driver_version));
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    BEGIN_SYSTEM(version);
    RETURN(copy_string(version, length, g_sys.nvml_version));
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    BEGIN_SYSTEM(cudaDriverVersion);
    *cudaDriverVersion = (int)g_sys.cuda_driver_version;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    BEGIN_SYSTEM(cudaDriverVersion);
    *cudaDriverVersion = (int)g_sys.cuda_driver_version;
    RETURN(NVML_SUCCESS);
}

/* ============================================================================================
 * Finding devices
 * ========================================================================================== */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    BEGIN_SYSTEM(deviceCount);
    *deviceCount = g_n_gpus;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    BEGIN_SYSTEM(device);
    if (index >= g_n_gpus)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (g_gpus[index].lost)
        RETURN(NVML_ERROR_GPU_IS_LOST);
    *device = (nvmlDevice_t)&g_gpus[index];
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    BEGIN_SYSTEM(device);
    if (!uuid)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < g_n_gpus; i++)
        if (strcmp(g_gpus[i].uuid, uuid) == 0) {
            *device = (nvmlDevice_t)&g_gpus[i];
            RETURN(g_gpus[i].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
        }
    for (unsigned int i = 0; i < g_n_migs; i++)
        if (strcmp(g_migs[i].uuid, uuid) == 0) {
            *device = (nvmlDevice_t)&g_migs[i];
            RETURN(g_migs[i].parent->lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
        }
    RETURN(NVML_ERROR_NOT_FOUND);
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    BEGIN_SYSTEM(device);
    if (!pciBusId)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < g_n_gpus; i++) {
        /* accept both the 8-digit and the legacy 4-digit domain spelling */
        const char *id = g_gpus[i].pci_bus_id;
        if (strcasecmp(id, pciBusId) == 0 ||
            (strlen(id) > 4 && strcasecmp(id + 4, pciBusId) == 0)) {
            *device = (nvmlDevice_t)&g_gpus[i];
            RETURN(g_gpus[i].lost ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS);
        }
    }
    RETURN(NVML_ERROR_NOT_FOUND);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    BEGIN_DEVICE(device, index);
    *index = d->index;
    RETURN(NVML_SUCCESS);
}

/* ============================================================================================
 * Identity
 * ========================================================================================== */

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    BEGIN_DEVICE(device, name);
    RETURN(copy_string(name, length, d->name));
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    BEGIN_DEVICE(device, uuid);
    RETURN(copy_string(uuid, length, d->uuid));
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    BEGIN_DEVICE(device, serial);
    RETURN(copy_string(serial, length, physical(d)->serial));
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    BEGIN_DEVICE(device, pci);
    struct dev *g = physical(d);
    unsigned int domain = 0, bus = 0, dev_no = 0;
    if (sscanf(g->pci_bus_id, "%x:%x:%x", &domain, &bus, &dev_no) != 3)
        RETURN(NVML_ERROR_UNKNOWN);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci_bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", domain & 0xFFFF, bus,
             dev_no);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev_no;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    RETURN(NVML_SUCCESS);
}

static unsigned int arch_code(const char *a)
{
    static const char *names[] = {"", "", "kepler", "maxwell", "pascal", "volta", "turing",
                                  "ampere", "ada", "hopper", "blackwell"};
    for (unsigned int i = 2; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(a, names[i]) == 0)
            return i;
    return 0xFFFFFFFFu; /* NVML_DEVICE_ARCH_UNKNOWN */
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    BEGIN_DEVICE(device, arch);
    *arch = arch_code(physical(d)->architecture);
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    BEGIN_DEVICE(device, major);
    if (!minor)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *major = (int)(physical(d)->cuda_cc / 10);
    *minor = (int)(physical(d)->cuda_cc % 10);
    RETURN(NVML_SUCCESS);
}

/* ============================================================================================
 * Utilisation, memory, power, temperature, clocks
 * ========================================================================================== */

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    BEGIN_DEVICE(device, utilization);
    PHYSICAL_ONLY();
    if (d->mig_mode)
        RETURN(NVML_ERROR_NOT_SUPPORTED); /* in MIG mode the GPU has no single busy figure */
    /* the lost_after countdown: reads 1..N succeed, the GPU falls off the bus on read N+1 */
    d->util_calls++;
    if (d->lost_after >= 0 && d->util_calls > (unsigned long long)d->lost_after) {
        d->lost = 1;
        RETURN(NVML_ERROR_GPU_IS_LOST);
    }
    utilization->gpu = d->gpu_util;
    utilization->memory = d->mem_util;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    BEGIN_DEVICE(device, memory);
    memory->total = d->memory_total;
    memory->used = d->memory_used;
    memory->free = d->memory_total - d->memory_used;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    BEGIN_DEVICE(device, memory);
    if (g_sys.struct_version_mismatch || memory->version != nvmlMemory_v2)
        RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    /* v2 reports the driver's reservation apart: used here excludes it */
    memory->total = d->memory_total;
    memory->reserved = d->memory_reserved;
    memory->used = d->memory_used - d->memory_reserved;
    memory->free = d->memory_total - d->memory_used;
    RETURN(NVML_SUCCESS);
}

/* BAR1 is reported for MIG devices too (nvidia-smi shows it per MIG device). */
API nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1)
{
    BEGIN_DEVICE(device, bar1);
    bar1->bar1Total = d->bar1_total;
    bar1->bar1Used = d->bar1_used;
    bar1->bar1Free = d->bar1_total - (d->bar1_used < d->bar1_total ? d->bar1_used : d->bar1_total);
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    BEGIN_DEVICE(device, power);
    PHYSICAL_ONLY();
    *power = d->power_mw;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    BEGIN_DEVICE(device, limit);
    PHYSICAL_ONLY();
    *limit = d->enforced_power_limit_mw;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    BEGIN_DEVICE(device, limit);
    PHYSICAL_ONLY();
    *limit = d->power_limit_mw;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit)
{
    BEGIN_DEVICE(device, limit);
    PHYSICAL_ONLY();
    *limit = d->power_default_limit_mw;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                              unsigned int *minLimit,
                                                              unsigned int *maxLimit)
{
    BEGIN_DEVICE(device, minLimit);
    PHYSICAL_ONLY();
    if (!maxLimit)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *minLimit = d->power_min_limit_mw;
    *maxLimit = d->power_max_limit_mw;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, int thresholdType,
                                                   unsigned int *temp)
{
    BEGIN_DEVICE(device, temp);
    PHYSICAL_ONLY();
    switch (thresholdType) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: *temp = d->temperature_shutdown; break;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: *temp = d->temperature_slowdown; break;
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX: *temp = d->temperature_mem_max; break;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: *temp = d->temperature_gpu_max; break;
    default:
        RETURN(thresholdType < 0 || thresholdType >= NVML_TEMPERATURE_THRESHOLD_COUNT
                   ? NVML_ERROR_INVALID_ARGUMENT
                   : NVML_ERROR_NOT_SUPPORTED); /* acoustic and GPS thresholds: not on this box */
    }
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType, unsigned int *temp)
{
    BEGIN_DEVICE(device, temp);
    PHYSICAL_ONLY();
    if (sensorType != NVML_TEMPERATURE_GPU)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *temp = d->temperature;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    BEGIN_DEVICE(device, speed);
    PHYSICAL_ONLY();
    if (d->fan_speed < 0)
        RETURN(NVML_ERROR_NOT_SUPPORTED); /* passively cooled data-centre boards */
    *speed = (unsigned int)d->fan_speed;
    RETURN(NVML_SUCCESS);
}

static nvmlReturn_t clock_of(struct dev *d, int type, int max, unsigned int *clock)
{
    switch (type) {
    case NVML_CLOCK_GRAPHICS: *clock = max ? d->max_graphics_clock : d->graphics_clock; break;
    case NVML_CLOCK_SM: *clock = max ? d->max_sm_clock : d->sm_clock; break;
    case NVML_CLOCK_MEM: *clock = max ? d->max_mem_clock : d->mem_clock; break;
    case NVML_CLOCK_VIDEO: *clock = max ? d->max_video_clock : d->video_clock; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock)
{
    BEGIN_DEVICE(device, clock);
    PHYSICAL_ONLY();
    RETURN(clock_of(d, type, 0, clock));
}

API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock)
{
    BEGIN_DEVICE(device, clock);
    PHYSICAL_ONLY();
    RETURN(clock_of(d, type, 1, clock));
}

#ifndef OLD_DRIVER
/* The name drivers from 535 on use; older ones only have ...ThrottleReasons. */
API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                        unsigned long long *reasons)
{
    BEGIN_DEVICE(device, reasons);
    PHYSICAL_ONLY();
    *reasons = seq_next(&d->clock_event_reasons);
    RETURN(NVML_SUCCESS);
}
#endif

API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons)
{
    BEGIN_DEVICE(device, reasons);
    PHYSICAL_ONLY();
    *reasons = seq_next(&d->clock_event_reasons);
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, unsigned int *pState)
{
    BEGIN_DEVICE(device, pState);
    PHYSICAL_ONLY();
    *pState = d->performance_state;
    RETURN(NVML_SUCCESS);
}

/* Plain unsigned figures of the physical GPU. */
#define UINT_GETTER(fn, field)                                                                 \
    API nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out)                                \
    {                                                                                          \
        BEGIN_DEVICE(device, out);                                                             \
        PHYSICAL_ONLY();                                                                       \
        *out = d->field;                                                                       \
        RETURN(NVML_SUCCESS);                                                                  \
    }
UINT_GETTER(nvmlDeviceGetPersistenceMode, persistence_mode)
UINT_GETTER(nvmlDeviceGetDisplayMode, display_mode)
UINT_GETTER(nvmlDeviceGetDisplayActive, display_active)
UINT_GETTER(nvmlDeviceGetComputeMode, compute_mode)

/* Driver models (WDDM/TCC) exist on Windows only; Linux drivers export the calls and refuse. */
API nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, unsigned int *current,
                                             unsigned int *pending)
{
    BEGIN_DEVICE(device, current);
    (void)pending;
    RETURN(NVML_ERROR_NOT_SUPPORTED);
}

API nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t device, unsigned int *current,
                                          unsigned int *pending)
{
    return nvmlDeviceGetDriverModel_v2(device, current, pending);
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                             unsigned long long *eccCounts)
{
    BEGIN_DEVICE(device, eccCounts);
    PHYSICAL_ONLY();
    if (errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->ecc_mode)
        RETURN(NVML_ERROR_NOT_SUPPORTED); /* the counts need ECC on */
    int corrected = errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED;
    if (counterType == NVML_VOLATILE_ECC)
        *eccCounts = corrected ? d->ecc_corrected_volatile : d->ecc_uncorrected_volatile;
    else
        *eccCounts = corrected ? d->ecc_corrected_aggregate : d->ecc_uncorrected_aggregate;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current,
                                      unsigned int *pending)
{
    BEGIN_DEVICE(device, current);
    PHYSICAL_ONLY();
    if (!pending)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *current = d->ecc_mode;
    *pending = d->ecc_mode_pending;
    RETURN(NVML_SUCCESS);
}

#define ARCH_AMPERE 7u /* NVML_DEVICE_ARCH_AMPERE: row remapping replaces page retirement */

static int remaps_rows(const struct dev *d)
{
    unsigned int arch = arch_code(d->architecture);
    return arch != 0xFFFFFFFFu && arch >= ARCH_AMPERE;
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                           unsigned int *uncRows, unsigned int *isPending,
                                           unsigned int *failureOccurred)
{
    BEGIN_DEVICE(device, corrRows);
    PHYSICAL_ONLY();
    if (!uncRows || !isPending || !failureOccurred)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!remaps_rows(d))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *corrRows = d->remapped_rows_corrected;
    *uncRows = d->remapped_rows_uncorrected;
    *isPending = d->remap_pending;
    *failureOccurred = d->remap_failure;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                        unsigned int *isPending)
{
    BEGIN_DEVICE(device, isPending);
    PHYSICAL_ONLY();
    if (remaps_rows(d))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *isPending = d->retired_pages_pending;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                 unsigned int *samplingPeriodUs)
{
    BEGIN_DEVICE(device, utilization);
    PHYSICAL_ONLY();
    if (!samplingPeriodUs)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *utilization = d->encoder_util;
    *samplingPeriodUs = 167000;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                 unsigned int *samplingPeriodUs)
{
    BEGIN_DEVICE(device, utilization);
    PHYSICAL_ONLY();
    if (!samplingPeriodUs)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *utilization = d->decoder_util;
    *samplingPeriodUs = 167000;
    RETURN(NVML_SUCCESS);
}

/* ============================================================================================
 * PCIe
 * ========================================================================================== */

/* Figures that may change from call to call (struct seq). */
#define SEQ_GETTER(fn, field)                                                                  \
    API nvmlReturn_t fn(nvmlDevice_t device, unsigned int *out)                                \
    {                                                                                          \
        BEGIN_DEVICE(device, out);                                                             \
        PHYSICAL_ONLY();                                                                       \
        *out = (unsigned int)seq_next(&d->field);                                              \
        RETURN(NVML_SUCCESS);                                                                  \
    }
SEQ_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
SEQ_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
/* What the GPU and the system allow together; nvmlDeviceGetGpuMaxPcieLinkGeneration: the GPU alone. */
UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_gen_max)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_width_max)
UINT_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_gen_gpu_max)

/* Grows by pcie_replays_per_call on every call, to script replays during a benchmark. */
API nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    BEGIN_DEVICE(device, value);
    PHYSICAL_ONLY();
    unsigned long long earlier = d->pcie_replays.calls;
    unsigned long long base = seq_next(&d->pcie_replays);
    *value = (unsigned int)(base + d->pcie_replays_per_call * earlier);
    RETURN(NVML_SUCCESS);
}

/* Grows by energy_mj_per_call on every call, so a test knows the energy each read adds. */
API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    BEGIN_DEVICE(device, energy);
    PHYSICAL_ONLY();
    *energy = d->energy_mj + d->energy_mj_per_call * d->energy_calls++;
    RETURN(NVML_SUCCESS);
}

/* Returns KB/s (1 KB = 1024 bytes) over the last ~20 ms, as the driver does. */
API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter, unsigned int *value)
{
    BEGIN_DEVICE(device, value);
    PHYSICAL_ONLY();
    if (counter != NVML_PCIE_UTIL_TX_BYTES && counter != NVML_PCIE_UTIL_RX_BYTES)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->pcie_throughput)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    unsigned long long bps = counter == NVML_PCIE_UTIL_TX_BYTES ? d->pcie_tx_bps : d->pcie_rx_bps;
    *value = (unsigned int)(bps / 1024);
    unsigned int delay = g_sys.pcie_throughput_delay_us;
    unlock(); /* block like the driver, without holding up other threads' calls */
    if (delay)
        usleep(delay);
    return NVML_SUCCESS;
}

#ifndef OLD_DRIVER
/*
 * Each call is one virtual second later on this device: counters are rate * virtual seconds and
 * timestamps VIRTUAL_EPOCH_US + seconds * 1e6, so any two reads give the exact rate.
 */
API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                          nvmlFieldValue_t *values)
{
    BEGIN_DEVICE(device, values);
    if (valuesCount <= 0)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long secs = ++d->field_calls;
    long long ts = VIRTUAL_EPOCH_US + (long long)secs * 1000000LL;
    struct dev *g = physical(d);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = ts;
        v->latencyUsec = 0;
        v->value.ullVal = 0;
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        if (d->is_mig)
            continue; /* the counters belong to the physical GPU */
        switch (v->fieldId) {
        case NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
        case NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
            if (!g->pcie_counters)
                break;
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->value.ullVal = secs * (v->fieldId == NVML_FI_DEV_PCIE_COUNT_TX_BYTES
                                          ? g->pcie_tx_bps
                                          : g->pcie_rx_bps);
            v->nvmlReturn = NVML_SUCCESS;
            break;
        case NVML_FI_DEV_NVLINK_LINK_COUNT:
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = g->nvlink_links;
            v->nvmlReturn = NVML_SUCCESS;
            break;
        case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
        case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
            /* an idle fabric: the KiB counters stay at zero */
            if (v->scopeId >= g->nvlink_links)
                break;
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->nvmlReturn = NVML_SUCCESS;
            break;
        default:
            break;
        }
    }
    RETURN(NVML_SUCCESS);
}
#endif

/* ============================================================================================
 * Processes
 * ========================================================================================== */

static int proc_on(const struct proc *p, struct dev *d)
{
    if (p->gpu != physical(d))
        return 0;
    return !d->is_mig || p->gpu_instance_id == (long long)d->gpu_instance_id;
}

/* The two-call pattern of the running-process queries: size first, then fill. */
static nvmlReturn_t running_processes(struct dev *d, const char *wanted, unsigned int *count,
                                      nvmlProcessInfo_t *infos)
{
    unsigned int n = 0;
    for (unsigned int i = 0; i < g_n_procs; i++) {
        const struct proc *p = &g_procs[i];
        int both = strcmp(p->type, "both") == 0 && strcmp(wanted, "mps") != 0;
        int kind = both || strcmp(p->type, wanted) == 0;
        if (!kind || !proc_on(p, d))
            continue;
        if (infos && n < *count) {
            infos[n].pid = p->pid;
            infos[n].usedGpuMemory = p->used_memory;
            int in_mig = p->gpu_instance_id >= 0;
            /* outside MIG the driver reports both instance ids as "not available" */
            infos[n].gpuInstanceId =
                in_mig ? (unsigned int)p->gpu_instance_id : NVML_VALUE_NOT_AVAILABLE_UINT;
            infos[n].computeInstanceId =
                in_mig ? p->compute_instance_id : NVML_VALUE_NOT_AVAILABLE_UINT;
        }
        n++;
    }
    nvmlReturn_t rc =
        (n > *count || (n > 0 && !infos)) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return rc;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_t *infos)
{
    BEGIN_DEVICE(device, infoCount);
    RETURN(running_processes(d, "compute", infoCount, infos));
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                          unsigned int *infoCount,
                                                          nvmlProcessInfo_t *infos)
{
    BEGIN_DEVICE(device, infoCount);
    RETURN(running_processes(d, "graphics", infoCount, infos));
}

/* The clients of an MPS server: processes of type "mps". */
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    BEGIN_DEVICE(device, infoCount);
    RETURN(running_processes(d, "mps", infoCount, infos));
}

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                 nvmlProcessUtilizationSample_t *utilization,
                                                 unsigned int *processSamplesCount,
                                                 unsigned long long lastSeenTimeStamp)
{
    BEGIN_DEVICE(device, processSamplesCount);
    if (strcmp(g_sys.process_utilization, "no_permission") == 0)
        RETURN(NVML_ERROR_NO_PERMISSION);
    if (strcmp(g_sys.process_utilization, "not_supported") == 0 || d->is_mig || d->mig_mode)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    /* wall-clock microseconds, strictly increasing per device */
    unsigned long long ts = now_us();
    if (ts <= d->last_util_ts)
        ts = d->last_util_ts + 1;
    d->last_util_ts = ts;
    if (ts <= lastSeenTimeStamp)
        RETURN(NVML_ERROR_NOT_FOUND);
    unsigned int n = 0;
    for (unsigned int i = 0; i < g_n_procs; i++) {
        const struct proc *p = &g_procs[i];
        if (!p->sampled || !proc_on(p, d))
            continue;
        if (utilization && n < *processSamplesCount) {
            nvmlProcessUtilizationSample_t *s = &utilization[n];
            s->pid = p->pid;
            s->timeStamp = ts;
            s->smUtil = p->sm_util;
            s->memUtil = p->mem_util;
            s->encUtil = p->enc_util;
            s->decUtil = p->dec_util;
        }
        n++;
    }
    if (n == 0)
        RETURN(NVML_ERROR_NOT_FOUND);
    nvmlReturn_t rc = (!utilization || n > *processSamplesCount) ? NVML_ERROR_INSUFFICIENT_SIZE
                                                                 : NVML_SUCCESS;
    *processSamplesCount = n;
    RETURN(rc);
}

/* ============================================================================================
 * GPM (Hopper and newer): opaque samples, metrics over a pair of them
 * ========================================================================================== */

#ifndef OLD_DRIVER
static struct nvmlGpmSample_st *find_sample(nvmlGpmSample_t s)
{
    for (struct nvmlGpmSample_st *p = g_samples; p; p = p->next)
        if (p == s)
            return p;
    return NULL;
}

API nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    BEGIN_DEVICE(device, gpmSupport);
    if (g_sys.struct_version_mismatch || gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    gpmSupport->isSupportedDevice = physical(d)->gpm;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    BEGIN_SYSTEM(gpmSample);
    struct nvmlGpmSample_st *s = calloc(1, sizeof *s);
    if (!s)
        RETURN(NVML_ERROR_UNKNOWN);
    s->next = g_samples;
    g_samples = s;
    *gpmSample = s;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    lock();
    if (g_refcount == 0)
        RETURN(NVML_ERROR_UNINITIALIZED);
    for (struct nvmlGpmSample_st **pp = &g_samples; *pp; pp = &(*pp)->next)
        if (*pp == gpmSample) {
            *pp = gpmSample->next;
            free(gpmSample);
            RETURN(NVML_SUCCESS);
        }
    RETURN(NVML_ERROR_INVALID_ARGUMENT);
}

API nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    BEGIN_DEVICE(device, gpmSample);
    struct nvmlGpmSample_st *s = find_sample(gpmSample);
    if (!s)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (d->is_mig || !d->gpm)
        RETURN(NVML_ERROR_NOT_SUPPORTED); /* MIG devices need nvmlGpmMigSampleGet */
    s->dev = d;
    s->seq = ++d->gpm_seq;
    RETURN(NVML_SUCCESS);
}

/* GPM of one MIG instance, named by its GPU instance id on the parent GPU. */
API nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                     nvmlGpmSample_t gpmSample)
{
    BEGIN_DEVICE(device, gpmSample);
    struct nvmlGpmSample_st *s = find_sample(gpmSample);
    if (!s || d->is_mig)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->gpm)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    for (unsigned int i = 0; i < d->n_migs; i++)
        if (d->migs[i]->gpu_instance_id == gpuInstanceId) {
            s->dev = d->migs[i];
            s->seq = ++d->migs[i]->gpm_seq;
            RETURN(NVML_SUCCESS);
        }
    RETURN(NVML_ERROR_NOT_FOUND);
}

static void metric_info(nvmlGpmMetric_t *m, const char *shortName, const char *longName,
                        const char *unit)
{
    m->metricInfo.shortName = shortName;
    m->metricInfo.longName = longName;
    m->metricInfo.unit = unit;
}

API nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    BEGIN_SYSTEM(metricsGet);
    if (g_sys.struct_version_mismatch || metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    struct nvmlGpmSample_st *s1 = find_sample(metricsGet->sample1);
    struct nvmlGpmSample_st *s2 = find_sample(metricsGet->sample2);
    /* both samples taken, on the same GPU, sample2 the newer one */
    if (!s1 || !s2 || !s1->dev || s1->dev != s2->dev || s2->seq <= s1->seq ||
        metricsGet->numMetrics > NVML_GPM_METRIC_MAX)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    struct dev *d = s1->dev;
    if (d->lost)
        RETURN(NVML_ERROR_GPU_IS_LOST);
    if (in_list(d->unsupported, __func__))
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    const double mib = 1024.0 * 1024.0;
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        m->nvmlReturn = NVML_SUCCESS;
        switch (m->metricId) {
        case NVML_GPM_METRIC_GRAPHICS_UTIL:
            m->value = d->gpu_util;
            metric_info(m, "GR_UTIL", "Graphics Utilization", "%");
            break;
        case NVML_GPM_METRIC_SM_UTIL:
            m->value = d->sm_active;
            metric_info(m, "SM_UTIL", "SM Utilization", "%");
            break;
        case NVML_GPM_METRIC_SM_OCCUPANCY:
            m->value = d->sm_occupancy;
            metric_info(m, "SM_OCCUPANCY", "SM Occupancy", "%");
            break;
        case NVML_GPM_METRIC_PCIE_TX_PER_SEC:
            m->value = (double)d->pcie_tx_bps / mib;
            metric_info(m, "PCIE_TX", "PCIe Transmit Bandwidth", "MiB/s");
            break;
        case NVML_GPM_METRIC_PCIE_RX_PER_SEC:
            m->value = (double)d->pcie_rx_bps / mib;
            metric_info(m, "PCIE_RX", "PCIe Receive Bandwidth", "MiB/s");
            break;
        default:
            m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            m->value = 0.0;
            metric_info(m, NULL, NULL, NULL);
            break;
        }
    }
    RETURN(NVML_SUCCESS);
}
#endif /* OLD_DRIVER */

/* ============================================================================================
 * MIG
 * ========================================================================================== */

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                      unsigned int *pendingMode)
{
    BEGIN_DEVICE(device, currentMode);
    if (!pendingMode || d->is_mig)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->mig_capable)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *currentMode = *pendingMode = d->mig_mode;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    BEGIN_DEVICE(device, count);
    if (d->is_mig)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    /* zero when MIG is not supported or not enabled, as documented */
    *count = (d->mig_capable && d->mig_mode) ? d->max_mig_devices : 0;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                     nvmlDevice_t *migDevice)
{
    BEGIN_DEVICE(device, migDevice);
    if (d->is_mig)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->mig_capable)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (index >= d->n_migs)
        RETURN(NVML_ERROR_NOT_FOUND); /* an empty slot */
    *migDevice = (nvmlDevice_t)d->migs[index];
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    BEGIN_DEVICE(device, isMigDevice);
    *isMigDevice = (unsigned int)d->is_mig;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    BEGIN_DEVICE(device, id);
    if (!d->is_mig)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *id = d->gpu_instance_id;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    BEGIN_DEVICE(device, id);
    if (!d->is_mig)
        RETURN(NVML_ERROR_NOT_SUPPORTED);
    *id = d->compute_instance_id;
    RETURN(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                              nvmlDevice_t *device)
{
    BEGIN_DEVICE(migDevice, device);
    if (!d->is_mig)
        RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *device = (nvmlDevice_t)d->parent;
    RETURN(NVML_SUCCESS);
}
