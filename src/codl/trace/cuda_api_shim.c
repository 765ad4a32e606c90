/*
 * CoDL's CUPTI callback shim: the cheapest per-call latency of CUDA runtime/driver API calls.
 *
 * CUPTI calls codl_cupti_callback on entry and exit of each API call that
 * codl.trace.cuda_api enabled (launches, memcpy/memset, synchronisations). Entry stores a
 * CLOCK_MONOTONIC timestamp in the per-call slot CUPTI shares between entry and exit; exit
 * claims one record in a preallocated buffer with a single atomic add (no lock, no allocation,
 * no syscall after a thread's first call) and writes start, end, thread id and call id.
 * No activity buffers, no kernel records, no PyTorch op recording: that is what makes this
 * cheaper than Kineto. Python subscribes to CUPTI through ctypes and reads the buffer after
 * the run, so this file needs no CUDA or CUPTI headers and builds with any C compiler.
 *
 * With scheduling evidence on (codl_set_sched, trace.cuda_api_sched), entry and exit also read
 * the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), its voluntary and involuntary
 * context-switch counts (getrusage(RUSAGE_THREAD)) and its CPU (sched_getcpu), and the record
 * keeps the differences: how long the thread was off CPU during the call, and why it left.
 * Those are syscalls (two per end; sched_getcpu is rseq/vDSO), read outside the two
 * CLOCK_MONOTONIC stamps so that the recorded latency does not include them.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Mirrors CUpti_CallbackData of cupti_callbacks.h (layout unchanged since CUPTI 4.1). */
typedef struct {
    int32_t callback_site; /* 0 = API entry, 1 = API exit */
    const char *function_name;
    const void *function_params;
    void *function_return_value;
    const char *symbol_name;
    void *context;
    uint32_t context_uid;
    uint64_t *correlation_data;
    uint32_t correlation_id;
} codl_callback_data;

enum { CODL_DOMAIN_DRIVER = 1, CODL_DOMAIN_RUNTIME = 2, CODL_API_EXIT = 1 };

typedef struct {
    int64_t start_ns;
    int64_t end_ns;
    int32_t tid;
    uint32_t domain;
    uint32_t cbid;
    uint32_t correlation;
    /* Scheduling evidence (all -1 when off or unavailable): differences exit - entry. */
    int64_t thread_cpu_ns;
    int32_t voluntary;
    int32_t involuntary;
    int16_t cpu_entry;
    int16_t cpu_exit;
    int32_t pad_; /* explicit, so that Python's dtype and this struct agree byte for byte */
} codl_record;

/* What entry saw, until exit: CUPTI's correlation slot holds only the start stamp. */
typedef struct {
    int64_t thread_cpu_ns;
    int64_t voluntary;
    int64_t involuntary;
    int32_t cpu;
    int32_t valid;
} codl_entry;

/* Recorded calls nest only as runtime -> runtime in principle (driver launches inside a
 * runtime call are dropped); deeper nesting than this keeps latency but loses evidence. */
enum { CODL_MAX_DEPTH = 8 };

static codl_record *records;
static uint64_t capacity;
static _Atomic uint64_t claimed;
static _Atomic uint64_t written;
static _Atomic int armed;
static _Atomic int sched_on;
/* A driver launch issued from inside a runtime call is the same launch seen twice. */
static __thread int runtime_depth;
static __thread int32_t cached_tid;
static __thread codl_entry entries[CODL_MAX_DEPTH];

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Thread CPU time is exact to the call (the kernel folds in the running slice), unlike
 * getrusage's ru_utime/ru_stime, which lag by up to a tick and have microsecond resolution. */
static inline int64_t thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void read_sched(codl_entry *e) {
    struct rusage ru;
    e->valid = getrusage(RUSAGE_THREAD, &ru) == 0;
    e->voluntary = ru.ru_nvcsw;
    e->involuntary = ru.ru_nivcsw;
    e->thread_cpu_ns = thread_cpu_ns();
    e->valid = e->valid && e->thread_cpu_ns >= 0;
    e->cpu = sched_getcpu();
}

int codl_init(uint64_t n) {
    free(records);
    records = malloc(n * sizeof(codl_record));
    if (records == NULL) return -1;
    capacity = n;
    atomic_store(&claimed, 0);
    atomic_store(&written, 0);
    return 0;
}

void codl_arm(int on) { atomic_store(&armed, on); }

void codl_set_sched(int on) { atomic_store(&sched_on, on); }

uint64_t codl_claimed(void) { return atomic_load(&claimed); }

/* Records fully written; equals min(claimed, capacity) once no callback is in flight. */
uint64_t codl_written(void) { return atomic_load(&written); }

const codl_record *codl_records(void) { return records; }

uint64_t codl_record_size(void) { return sizeof(codl_record); }

void codl_free(void) {
    atomic_store(&armed, 0);
    free(records);
    records = NULL;
    capacity = 0;
}

void codl_cupti_callback(void *userdata, int32_t domain, uint32_t cbid, const void *data) {
    const codl_callback_data *cb = (const codl_callback_data *)data;
    (void)userdata;
    if (domain == CODL_DOMAIN_RUNTIME) {
        if (cb->callback_site != CODL_API_EXIT) {
            runtime_depth++;
        } else if (runtime_depth > 0) {
            runtime_depth--; /* an exit whose entry predates the subscription is not counted */
        }
    } else if (runtime_depth > 0) {
        return;
    }
    /* Disarmed: the cost left is CUPTI's own dispatch (launch_api_cost.py's callbacks-idle). */
    if (!atomic_load_explicit(&armed, memory_order_relaxed)) return;
    /* Runtime calls occupy slots 1.. by depth; a driver launch outside any runtime call, 0. */
    int depth = domain == CODL_DOMAIN_RUNTIME ? runtime_depth + (cb->callback_site == CODL_API_EXIT)
                                              : 0;
    codl_entry *slot = depth < CODL_MAX_DEPTH ? &entries[depth] : NULL;
    int sched = atomic_load_explicit(&sched_on, memory_order_relaxed);
    if (cb->callback_site != CODL_API_EXIT) {
        if (slot != NULL) {
            slot->valid = 0;
            if (sched) read_sched(slot);
        }
        *cb->correlation_data = (uint64_t)now_ns(); /* last: the latency excludes read_sched */
        return;
    }
    int64_t end = now_ns(); /* first, for the same reason */
    codl_entry at_exit = {0};
    int have = sched && slot != NULL && slot->valid;
    if (have) read_sched(&at_exit);
    have = have && at_exit.valid;
    uint64_t i = atomic_fetch_add_explicit(&claimed, 1, memory_order_relaxed);
    if (i >= capacity) return; /* counted as dropped: claimed - capacity */
    if (cached_tid == 0) cached_tid = (int32_t)syscall(SYS_gettid);
    codl_record *r = &records[i];
    r->start_ns = (int64_t)*cb->correlation_data;
    r->end_ns = end;
    r->tid = cached_tid;
    r->domain = (uint32_t)domain;
    r->cbid = cbid;
    r->correlation = cb->correlation_id;
    r->thread_cpu_ns = have ? at_exit.thread_cpu_ns - slot->thread_cpu_ns : -1;
    r->voluntary = have ? (int32_t)(at_exit.voluntary - slot->voluntary) : -1;
    r->involuntary = have ? (int32_t)(at_exit.involuntary - slot->involuntary) : -1;
    r->cpu_entry = (int16_t)(have ? slot->cpu : -1);
    r->cpu_exit = (int16_t)(have ? at_exit.cpu : -1);
    r->pad_ = 0;
    if (slot != NULL) slot->valid = 0; /* an exit without a fresh entry must not reuse it */
    atomic_fetch_add_explicit(&written, 1, memory_order_release);
}
