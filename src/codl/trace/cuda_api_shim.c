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
 * With scheduling evidence on (codl_set_sched, trace.cuda_api_sched), the record also keeps,
 * between entry and exit, the calling thread's voluntary and involuntary context switches
 * (getrusage(RUSAGE_THREAD)), its CPU time (CLOCK_THREAD_CPUTIME_ID) and its CPU at both ends
 * (sched_getcpu, rseq/vDSO): how long the thread was off CPU during the call, and why it left.
 *
 * The CPU clock is the expensive read (a syscall that locks the run queue: ~0.8 us in a VM,
 * against ~0.45 us for getrusage), so it is read only when a switch happened. A thread that did
 * not switch out was on CPU the whole time, so its CPU time over any switch-free interval equals
 * the wall time: each thread keeps a baseline (CPU clock, monotonic time, switch counts) and
 * while the counts have not moved, CPU time at any instant is baseline CPU + elapsed wall time.
 * Per call that is one getrusage at entry and one at exit; the CPU clock (once or twice) only
 * for calls that switched or follow a switch, or when the baseline is older than max_age_ns.
 * (Interrupts and hypervisor steal are not switches: counted as on-CPU time.) The reads lie
 * outside the two CLOCK_MONOTONIC stamps, so the recorded latency does not include them.
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

/* A moment of a thread: switch counts, and its CPU time at monotonic time `mono_ns`. */
typedef struct {
    int64_t thread_cpu_ns;
    int64_t mono_ns;
    int64_t voluntary;
    int64_t involuntary;
    int32_t valid;
} codl_moment;

/* What entry saw, until exit: CUPTI's correlation slot holds only the start stamp. */
typedef struct {
    codl_moment base; /* the thread's baseline at entry: CPU time there + wall time since */
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
/* Last moment the CPU clock was read; valid while the switch counts have not moved since. */
static __thread codl_moment baseline;

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

static inline int read_switches(int64_t *voluntary, int64_t *involuntary) {
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
    *voluntary = ru.ru_nvcsw;
    *involuntary = ru.ru_nivcsw;
    return 1;
}

/* The thread's baseline is carried forward only while recent, because interrupt and hypervisor
 * steal time are wall time that the thread clock does not count (IRQ_TIME_ACCOUNTING, paravirt
 * steal), and carrying counts them as CPU time: a baseline at most max_age_ns old bounds that
 * error by the interrupt and steal time of max_age_ns. 1 ms: one extra clock read per ms and
 * thread (< 0.1 % of a CPU); in a busy 2-vCPU VM, steal reached ~130 us over 2 ms, on bare
 * metal interrupts take ~0.1-1 % of a CPU (1-10 us per ms). */
static _Atomic int64_t max_age_ns = 1000000;

void codl_set_baseline_age(int64_t ns) { atomic_store(&max_age_ns, ns); }

/* Reads the CPU clock: the baseline is now, with these switch counts. */
static inline int take_baseline(int64_t voluntary, int64_t involuntary) {
    baseline.thread_cpu_ns = thread_cpu_ns();
    baseline.mono_ns = now_ns();
    baseline.voluntary = voluntary;
    baseline.involuntary = involuntary;
    baseline.valid = baseline.thread_cpu_ns >= 0;
    return baseline.valid;
}

/* Makes the baseline current: carried when no switch happened since it and it is recent,
 * read afresh otherwise. */
static inline int refresh_baseline(int64_t voluntary, int64_t involuntary) {
    if (baseline.valid && baseline.voluntary == voluntary && baseline.involuntary == involuntary &&
        now_ns() - baseline.mono_ns < atomic_load_explicit(&max_age_ns, memory_order_relaxed))
        return 1;
    return take_baseline(voluntary, involuntary);
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
            int64_t v, iv;
            slot->valid = sched && read_switches(&v, &iv) && refresh_baseline(v, iv);
            slot->base = baseline;
            slot->cpu = sched_getcpu();
        }
        *cb->correlation_data = (uint64_t)now_ns(); /* last: the latency excludes the reads */
        return;
    }
    int64_t end = now_ns(); /* first, for the same reason */
    int64_t start = (int64_t)*cb->correlation_data;
    int64_t call_cpu = -1, voluntary = -1, involuntary = -1;
    int32_t cpu_exit = -1;
    if (sched && slot != NULL && slot->valid && read_switches(&voluntary, &involuntary)) {
        voluntary -= slot->base.voluntary;
        involuntary -= slot->base.involuntary;
        /* Entry's baseline had the entry counts: nothing moved between it and `start`. */
        int64_t cpu_at_start = slot->base.thread_cpu_ns + (start - slot->base.mono_ns);
        if (voluntary == 0 && involuntary == 0) {
            call_cpu = end - start; /* never switched out: on CPU throughout */
        } else if (take_baseline(voluntary + slot->base.voluntary,
                                 involuntary + slot->base.involuntary)) {
            /* Always a fresh read here: a nested call may have left a baseline with these very
             * counts, but from its own exit, before the rest of this call ran. */
            /* Steal or interrupts carried into cpu_at_start can make this negative; the
             * record's -1 means "not measured", so a physical floor of 0 it is. */
            call_cpu = baseline.thread_cpu_ns - cpu_at_start;
            if (call_cpu < 0) call_cpu = 0;
        } else {
            voluntary = involuntary = -1;
        }
        cpu_exit = sched_getcpu();
    }
    uint64_t i = atomic_fetch_add_explicit(&claimed, 1, memory_order_relaxed);
    if (i >= capacity) return; /* counted as dropped: claimed - capacity */
    if (cached_tid == 0) cached_tid = (int32_t)syscall(SYS_gettid);
    codl_record *r = &records[i];
    r->start_ns = start;
    r->end_ns = end;
    r->tid = cached_tid;
    r->domain = (uint32_t)domain;
    r->cbid = cbid;
    r->correlation = cb->correlation_id;
    r->thread_cpu_ns = voluntary >= 0 ? call_cpu : -1;
    r->voluntary = (int32_t)voluntary;
    r->involuntary = (int32_t)involuntary;
    r->cpu_entry = (int16_t)(voluntary >= 0 ? slot->cpu : -1);
    r->cpu_exit = (int16_t)(voluntary >= 0 ? cpu_exit : -1);
    r->pad_ = 0;
    if (slot != NULL) slot->valid = 0; /* an exit without a fresh entry must not reuse it */
    atomic_fetch_add_explicit(&written, 1, memory_order_release);
}
