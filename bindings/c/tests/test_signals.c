/*
 * Signals and cancellation through the C ABI, against a real redis-server (started by
 * tests/abi/c_programs.rs, which runs this program under ASan+UBSan and under valgrind):
 *
 * - a signal never ends a call: waits and acquire/release cycles under SIGUSR1 storms,
 *   with and without SA_RESTART;
 * - cancel handles (lock_cancel_new, lock_cancel, lock_cancel_free);
 * - lock_cancel_all from a SIGTERM handler, and lock_cancel_reset;
 * - the on_interrupt callback of lock_acquire_options_t.
 *
 * Environment: REDIS_URL, REDIS_HOST, REDIS_PORT; REDLEASE_TEST_SLOW (timing bounds are
 * multiplied by it, under the sanitizers and valgrind); REDLEASE_TEST_STORM_CYCLES (acquire/release cycles of
 * the signal storm, default 2000). Prints "N passed, M failed" and exits non-zero on
 * failure.
 */
#define _XOPEN_SOURCE 700 /* SA_RESTART */

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "test_harness.h"

/* What a library output holds when the library did not write it. */
#define UNTOUCHED ((lock_t)0x5ca1ab1eULL)

/* ---- signal handlers ------------------------------------------------------------------ */

/* SIGUSR1 is sent to one thread at a time; the main thread reads the count after joining
 * that thread (or the acquiring thread reads it in its on_interrupt callback). */
static volatile sig_atomic_t usr1_handled;
static volatile sig_atomic_t term_handled;

static void on_usr1(int sig) {
    (void)sig;
    usr1_handled = usr1_handled + 1;
}

/* A daemon's SIGTERM handler: lock_cancel_all is async-signal-safe. */
static void on_term(int sig) {
    int saved_errno = errno;
    (void)sig;
    lock_cancel_all();
    term_handled = 1;
    errno = saved_errno;
}

static void install(int sig, void (*handler)(int), int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = flags;
    if (sigaction(sig, &sa, NULL) != 0) {
        perror("sigaction");
        exit(2);
    }
}

/* ---- a flag other threads can wait for ------------------------------------------------- */

struct flag {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int set;
};

static void flag_init(struct flag *f) {
    pthread_mutex_init(&f->mutex, NULL);
    pthread_cond_init(&f->cond, NULL);
    f->set = 0;
}

static void flag_destroy(struct flag *f) {
    pthread_mutex_destroy(&f->mutex);
    pthread_cond_destroy(&f->cond);
}

static void flag_set(struct flag *f) {
    pthread_mutex_lock(&f->mutex);
    f->set = 1;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->mutex);
}

static int flag_get(struct flag *f) {
    int set;
    pthread_mutex_lock(&f->mutex);
    set = f->set;
    pthread_mutex_unlock(&f->mutex);
    return set;
}

/* Waits up to timeout_ms for the flag; returns whether it is set. */
static int flag_wait(struct flag *f, long timeout_ms) {
    struct timespec until;
    int set;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&f->mutex);
    while (!f->set) {
        if (pthread_cond_timedwait(&f->cond, &f->mutex, &until) == ETIMEDOUT) break;
    }
    set = f->set;
    pthread_mutex_unlock(&f->mutex);
    return set;
}

/* ---- a thread blocked in lock_acquire -------------------------------------------------- */

struct waiter {
    lock_client_t client;
    const char *key;
    uint64_t ttl_ms, wait_ms;
    const lock_acquire_options_t *opts; /* NULL: lock_acquire */
    pthread_t thread;
    /* Results, read after `done`. */
    int32_t status, release_status;
    lock_t lock; /* UNTOUCHED unless the acquire wrote it */
    double started, ended;
    char error[256];
    struct flag started_flag; /* set just before the acquire is called */
    struct flag done;
};

static void *waiter_main(void *arg) {
    struct waiter *w = arg;
    lock_t lock = UNTOUCHED;
    int32_t status;

    w->started = now_ms();
    flag_set(&w->started_flag);
    status = w->opts ? lock_acquire_opts(w->client, w->key, w->ttl_ms, w->wait_ms, w->opts,
                                         &lock)
                     : lock_acquire(w->client, w->key, w->ttl_ms, w->wait_ms, &lock);
    w->ended = now_ms();
    snprintf(w->error, sizeof w->error, "%s", lock_last_error());
    w->status = status;
    w->lock = lock;
    w->release_status = status == LOCK_OK ? lock_release(lock) : LOCK_OK;
    flag_set(&w->done);
    return NULL;
}

static void start_waiter(struct waiter *w, lock_client_t client, const char *key,
                         uint64_t wait_ms, const lock_acquire_options_t *opts) {
    memset(w, 0, sizeof *w);
    w->client = client;
    w->key = key;
    w->ttl_ms = 10000;
    w->wait_ms = wait_ms;
    w->opts = opts;
    w->status = 99;
    w->lock = UNTOUCHED;
    flag_init(&w->started_flag);
    flag_init(&w->done);
    if (pthread_create(&w->thread, NULL, waiter_main, w) != 0) {
        perror("pthread_create");
        exit(2);
    }
    /* The caller's sleeps then count from the acquire's start, however slow the thread
     * was to start. */
    if (!flag_wait(&w->started_flag, 10000)) {
        fprintf(stderr, "a waiter thread did not start\n");
        exit(2);
    }
}

static void join_waiter(struct waiter *w) {
    pthread_join(w->thread, NULL);
    flag_destroy(&w->started_flag);
    flag_destroy(&w->done);
    if (w->status != LOCK_OK && w->status != LOCK_BUSY && w->status != LOCK_CANCELLED) {
        fprintf(stderr, "waiter on %s: %s: %s\n", w->key, lock_status_name(w->status),
                w->error);
    }
}

/* ---- a thread that sends a signal to another, again and again --------------------------- */

struct killer {
    pthread_t target;
    int sig;
    long interval_us;
    struct flag *stop; /* the target's "done": the target is not joined before the killer */
    pthread_t thread;
    long sent;
};

static void *killer_main(void *arg) {
    struct killer *k = arg;
    struct timespec pause;
    pause.tv_sec = 0;
    pause.tv_nsec = k->interval_us * 1000L;
    while (!flag_get(k->stop)) {
        if (pthread_kill(k->target, k->sig) == 0) k->sent++;
        nanosleep(&pause, NULL);
    }
    return NULL;
}

static void start_killer(struct killer *k, pthread_t target, int sig, long interval_us,
                         struct flag *stop) {
    memset(k, 0, sizeof *k);
    k->target = target;
    k->sig = sig;
    k->interval_us = interval_us;
    k->stop = stop;
    if (pthread_create(&k->thread, NULL, killer_main, k) != 0) {
        perror("pthread_create");
        exit(2);
    }
}

/* ---- 1. signals never become failures ---------------------------------------------------- */

/* A wait of up to 3 s for a lock held for 1 s, with SIGUSR1 every 20 ms on the waiting
 * thread: LOCK_OK at the release, never LOCK_ERR_CONNECTION. */
static void test_signals_never_end_a_wait(int sa_flags, const char *key) {
    lock_client_t client = open_client();
    struct waiter w;
    struct killer k;
    lock_t holder = 0;
    double released;

    install(SIGUSR1, on_usr1, sa_flags);
    usr1_handled = 0;
    CHECK_STATUS(lock_acquire(client, key, 10000, 0, &holder), LOCK_OK);
    start_waiter(&w, client, key, 3000, NULL);
    start_killer(&k, w.thread, SIGUSR1, 20000, &w.done);
    sleep_ms(1000);
    released = now_ms();
    CHECK_STATUS(lock_release(holder), LOCK_OK);
    CHECK(flag_wait(&w.done, 5000 * slack));
    pthread_join(k.thread, NULL);
    join_waiter(&w);

    CHECK_STATUS(w.status, LOCK_OK);
    CHECK_STATUS(w.release_status, LOCK_OK);
    CHECK(w.ended >= released);                         /* never while held */
    CHECK(w.ended - released < 500.0 * (double)slack); /* at the release */
    CHECK(w.ended - w.started > 800);
    CHECK(k.sent >= 10);
    CHECK(usr1_handled >= 5); /* the signals did reach the waiting thread */
    printf("wait under signals (%s): %.0f ms, %ld signals sent, %d handled\n",
           sa_flags & SA_RESTART ? "SA_RESTART" : "no SA_RESTART", w.ended - w.started,
           k.sent, (int)usr1_handled);
    CHECK(raw_integer("EXISTS", key) == 0);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

struct storm {
    lock_client_t client;
    long cycles;
    long failed_acquires, not_held, release_errors;
    char first_error[300];
    struct flag done;
    pthread_t thread;
};

static void *storm_main(void *arg) {
    struct storm *st = arg;
    long i;
    for (i = 0; i < st->cycles; i++) {
        lock_t lock = 0;
        int32_t status = lock_acquire(st->client, "c:storm", 10000, 0, &lock);
        if (status != LOCK_OK) {
            st->failed_acquires++;
            if (!st->first_error[0]) {
                snprintf(st->first_error, sizeof st->first_error, "acquire %ld: %s: %s", i,
                         lock_status_name(status), lock_last_error());
            }
            continue;
        }
        status = lock_release(lock);
        if (status == LOCK_NOT_HELD) {
            st->not_held++;
        } else if (status != LOCK_OK) {
            st->release_errors++;
        }
        if (status != LOCK_OK && !st->first_error[0]) {
            snprintf(st->first_error, sizeof st->first_error, "release %ld: %s: %s", i,
                     lock_status_name(status), lock_last_error());
        }
    }
    flag_set(&st->done);
    return NULL;
}

/* SIGUSR1 every ~1 ms on a thread doing try-once acquire/release cycles on a free key. */
static void test_signal_storm_during_acquire_release_cycles(void) {
    struct storm st;
    struct killer k;
    double started;

    install(SIGUSR1, on_usr1, 0);
    usr1_handled = 0;
    memset(&st, 0, sizeof st);
    st.client = open_client();
    st.cycles = env_long("REDLEASE_TEST_STORM_CYCLES", 2000);
    flag_init(&st.done);
    started = now_ms();
    if (pthread_create(&st.thread, NULL, storm_main, &st) != 0) {
        perror("pthread_create");
        exit(2);
    }
    start_killer(&k, st.thread, SIGUSR1, 1000, &st.done);
    CHECK(flag_wait(&st.done, 100000));
    pthread_join(k.thread, NULL);
    pthread_join(st.thread, NULL);
    flag_destroy(&st.done);

    if (st.first_error[0]) fprintf(stderr, "storm: %s\n", st.first_error);
    CHECK(st.failed_acquires == 0);
    CHECK(st.not_held == 0);
    CHECK(st.release_errors == 0);
    CHECK(usr1_handled >= 20);
    printf("signal storm: %ld cycles in %.0f ms, %ld signals sent, %d handled\n", st.cycles,
           now_ms() - started, k.sent, (int)usr1_handled);
    CHECK(raw_integer("EXISTS", "c:storm") == 0);
    CHECK_STATUS(lock_client_close(st.client), LOCK_OK);
}

/* ---- 2. cancel handles ------------------------------------------------------------------ */

static void test_cancel_handle_ends_blocked_acquires(void) {
    lock_client_t client = open_client();
    lock_acquire_options_t opts;
    lock_cancel_t cancel = 0;
    struct waiter a, b;
    lock_t holder = 0, lock;
    double cancelled, started;

    CHECK_STATUS(lock_acquire(client, "c:cancel", 10000, 0, &holder), LOCK_OK);
    CHECK_STATUS(lock_cancel_new(&cancel), LOCK_OK);
    CHECK(cancel != 0);
    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.cancel = cancel;

    /* Two acquires blocked with the same handle; one lock_cancel ends both. */
    start_waiter(&a, client, "c:cancel", 10000, &opts);
    start_waiter(&b, client, "c:cancel", 10000, &opts);
    sleep_ms(300);
    cancelled = now_ms();
    CHECK_STATUS(lock_cancel(cancel), LOCK_OK);
    if (!flag_wait(&a.done, 3000 * slack) || !flag_wait(&b.done, 3000 * slack)) {
        CHECK(!"a cancelled acquire did not return");
        lock_release(holder); /* lets them end */
        holder = 0;
    }
    join_waiter(&a);
    join_waiter(&b);
    CHECK_STATUS(a.status, LOCK_CANCELLED);
    CHECK_STATUS(b.status, LOCK_CANCELLED);
    CHECK(a.lock == UNTOUCHED && b.lock == UNTOUCHED);
    CHECK(a.ended >= cancelled && b.ended >= cancelled); /* they waited until then */
    CHECK(a.ended - cancelled < 500.0 * (double)slack);
    CHECK(b.ended - cancelled < 500.0 * (double)slack);
    printf("lock_cancel: waiters returned %.0f and %.0f ms after it\n", a.ended - cancelled,
           b.ended - cancelled);

    /* A cancelled handle stays cancelled: an acquire that would wait returns at once. */
    lock = UNTOUCHED;
    started = now_ms();
    CHECK_STATUS(lock_acquire_opts(client, "c:cancel", 10000, 5000, &opts, &lock),
                 LOCK_CANCELLED);
    CHECK(now_ms() - started < 500.0 * (double)slack);
    CHECK(lock == UNTOUCHED);

    /* Nothing is held by the cancelled waiters, and no grant waits for them: the holder's
     * release deletes the key. */
    if (holder) CHECK_STATUS(lock_release(holder), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:cancel") == 0);
    lock = 0;
    CHECK_STATUS(lock_acquire(client, "c:cancel", 10000, 0, &lock), LOCK_OK);
    CHECK_STATUS(lock_release(lock), LOCK_OK);

    /* Freed twice, used after free, unknown, zero, or a handle of another kind. */
    CHECK_STATUS(lock_cancel_free(cancel), LOCK_OK);
    CHECK_STATUS(lock_cancel_free(cancel), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_cancel(cancel), LOCK_ERR_HANDLE);
    lock = UNTOUCHED;
    CHECK_STATUS(lock_acquire_opts(client, "c:cancel", 10000, 0, &opts, &lock),
                 LOCK_ERR_HANDLE);
    CHECK(lock == UNTOUCHED);
    opts.cancel = 0x0123456789abcdefULL;
    CHECK_STATUS(lock_acquire_opts(client, "c:cancel", 10000, 1000, &opts, &lock),
                 LOCK_ERR_HANDLE);
    opts.cancel = client;
    CHECK_STATUS(lock_acquire_opts(client, "c:cancel", 10000, 0, &opts, &lock),
                 LOCK_ERR_HANDLE);
    CHECK(lock == UNTOUCHED);
    CHECK(raw_integer("EXISTS", "c:cancel") == 0);
    CHECK_STATUS(lock_cancel(0), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_cancel_free(0), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_cancel(client), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_cancel_new(NULL), LOCK_ERR_ARGUMENT);

    /* A handle freed while an acquire uses it: that acquire keeps working. */
    CHECK_STATUS(lock_cancel_new(&cancel), LOCK_OK);
    opts.cancel = cancel;
    CHECK_STATUS(lock_acquire(client, "c:cancel", 10000, 0, &holder), LOCK_OK);
    start_waiter(&a, client, "c:cancel", 5000, &opts);
    sleep_ms(200);
    CHECK_STATUS(lock_cancel_free(cancel), LOCK_OK);
    sleep_ms(100);
    CHECK_STATUS(lock_release(holder), LOCK_OK);
    CHECK(flag_wait(&a.done, 6000 * slack));
    join_waiter(&a);
    CHECK_STATUS(a.status, LOCK_OK);
    CHECK_STATUS(a.release_status, LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:cancel") == 0);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

/* ---- 3. lock_cancel_all from a SIGTERM handler ------------------------------------------ */

static void test_cancel_all_from_a_sigterm_handler(void) {
    lock_client_t client = open_client();
    struct waiter a, b, c;
    lock_t holder_a = 0, holder_b = 0, lock;
    double signalled, started, released;

    install(SIGTERM, on_term, SA_RESTART);
    term_handled = 0;
    CHECK_STATUS(lock_acquire(client, "c:all-a", 10000, 0, &holder_a), LOCK_OK);
    CHECK_STATUS(lock_acquire(client, "c:all-b", 10000, 0, &holder_b), LOCK_OK);
    start_waiter(&a, client, "c:all-a", UINT64_MAX, NULL);
    start_waiter(&b, client, "c:all-b", UINT64_MAX, NULL);
    sleep_ms(300);
    signalled = now_ms();
    kill(getpid(), SIGTERM);
    if (!flag_wait(&a.done, 3000 * slack) || !flag_wait(&b.done, 3000 * slack)) {
        CHECK(!"lock_cancel_all did not end a wait");
        /* Rescue: the releases let the endless waits end. */
        lock_release(holder_a);
        lock_release(holder_b);
        holder_a = holder_b = 0;
    }
    join_waiter(&a);
    join_waiter(&b);
    CHECK(term_handled == 1);
    CHECK_STATUS(a.status, LOCK_CANCELLED);
    CHECK_STATUS(b.status, LOCK_CANCELLED);
    CHECK(a.lock == UNTOUCHED && b.lock == UNTOUCHED);
    CHECK(a.ended >= signalled && b.ended >= signalled);
    CHECK(a.ended - signalled < 500.0 * (double)slack);
    CHECK(b.ended - signalled < 500.0 * (double)slack);
    printf("lock_cancel_all from SIGTERM: waiters returned %.0f and %.0f ms after it\n",
           a.ended - signalled, b.ended - signalled);

    /* While cancel-all is set: a try-once acquire still works (and still says BUSY)... */
    lock = 0;
    CHECK_STATUS(lock_acquire(client, "c:all-free", 10000, 0, &lock), LOCK_OK);
    CHECK_STATUS(lock_release(lock), LOCK_OK);
    if (holder_a) {
        lock = UNTOUCHED;
        CHECK_STATUS(lock_acquire(client, "c:all-a", 10000, 0, &lock), LOCK_BUSY);
        CHECK(lock == UNTOUCHED);
    }
    /* ...and acquires that would wait, started later, are cancelled promptly. */
    lock = UNTOUCHED;
    started = now_ms();
    CHECK_STATUS(lock_acquire(client, "c:all-free", 10000, 1000, &lock), LOCK_CANCELLED);
    CHECK_STATUS(lock_acquire(client, "c:all-b", 10000, UINT64_MAX, &lock), LOCK_CANCELLED);
    CHECK(now_ms() - started < 500.0 * (double)slack);
    CHECK(lock == UNTOUCHED);
    CHECK(raw_integer("EXISTS", "c:all-free") == 0);

    /* After lock_cancel_reset, blocking acquires wait again. */
    CHECK_STATUS(lock_cancel_reset(), LOCK_OK);
    if (!holder_a) CHECK_STATUS(lock_acquire(client, "c:all-a", 10000, 0, &holder_a), LOCK_OK);
    start_waiter(&c, client, "c:all-a", 5000, NULL);
    sleep_ms(300);
    released = now_ms();
    CHECK_STATUS(lock_release(holder_a), LOCK_OK);
    CHECK(flag_wait(&c.done, 7000 * slack));
    join_waiter(&c);
    CHECK_STATUS(c.status, LOCK_OK);
    CHECK_STATUS(c.release_status, LOCK_OK);
    CHECK(c.ended >= released);
    CHECK(c.ended - released < 500.0 * (double)slack);

    /* The cancelled waiters hold nothing: the releases delete the keys. */
    if (holder_b) CHECK_STATUS(lock_release(holder_b), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:all-a") == 0);
    CHECK(raw_integer("EXISTS", "c:all-b") == 0);
    install(SIGTERM, SIG_DFL, 0);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

/* ---- 4. the on_interrupt callback -------------------------------------------------------- */

struct interrupt_record {
    bool cancel_after_signal; /* return true once a SIGUSR1 was handled; else false */
    int calls;
    pthread_t thread; /* the thread of the first call */
    bool other_thread;  /* a later call came from another thread */
};

/* Runs on the acquiring thread, outside the signal handler; calls nothing of the library. */
static int32_t on_interrupt(void *user_data) {
    struct interrupt_record *r = user_data;
    pthread_t self = pthread_self();
    if (r->calls == 0) {
        r->thread = self;
    } else if (!pthread_equal(self, r->thread)) {
        r->other_thread = true;
    }
    r->calls++;
    return (r->cancel_after_signal && usr1_handled > 0) ? 1 : 0;
}

static void test_on_interrupt_can_cancel_a_wait(void) {
    lock_client_t client = open_client();
    lock_acquire_options_t opts;
    struct interrupt_record rec;
    struct waiter w;
    lock_t holder = 0;
    double signalled;

    install(SIGUSR1, on_usr1, SA_RESTART);
    usr1_handled = 0;
    memset(&rec, 0, sizeof rec);
    rec.cancel_after_signal = true;
    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.on_interrupt = on_interrupt;
    opts.interrupt_user_data = &rec;

    CHECK_STATUS(lock_acquire(client, "c:interrupt", 10000, 0, &holder), LOCK_OK);
    start_waiter(&w, client, "c:interrupt", 5000, &opts);
    sleep_ms(600); /* the callback is called (at least every 200 ms) and says "go on" */
    signalled = now_ms();
    pthread_kill(w.thread, SIGUSR1);
    if (!flag_wait(&w.done, 3000 * slack)) {
        CHECK(!"the interrupt callback did not end the wait");
        lock_release(holder);
        holder = 0;
    }
    join_waiter(&w);
    CHECK_STATUS(w.status, LOCK_CANCELLED);
    CHECK(w.lock == UNTOUCHED);
    CHECK(w.ended >= signalled); /* the callback's "go on" answers kept it waiting */
    CHECK(w.ended - signalled < 500.0 * (double)slack);
    CHECK(rec.calls >= 1);
    CHECK(pthread_equal(rec.thread, w.thread));
    CHECK(!rec.other_thread);
    printf("on_interrupt: cancelled %.0f ms after SIGUSR1, %d calls\n", w.ended - signalled,
           rec.calls);
    if (holder) CHECK_STATUS(lock_release(holder), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:interrupt") == 0); /* the waiter holds nothing */
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

/* A callback that says "go on" under a SIGUSR1 every 20 ms: the wait goes on to its end. */
static void test_on_interrupt_returning_false_lets_the_wait_go_on(void) {
    lock_client_t client = open_client();
    lock_acquire_options_t opts;
    struct interrupt_record rec;
    struct waiter w;
    struct killer k;
    lock_t holder = 0;
    double waited, released;

    install(SIGUSR1, on_usr1, 0);
    usr1_handled = 0;
    memset(&rec, 0, sizeof rec);
    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.on_interrupt = on_interrupt;
    opts.interrupt_user_data = &rec;
    CHECK_STATUS(lock_acquire(client, "c:no-interrupt", 10000, 0, &holder), LOCK_OK);

    /* Still held at the deadline: LOCK_BUSY after the full second. */
    start_waiter(&w, client, "c:no-interrupt", 1000, &opts);
    start_killer(&k, w.thread, SIGUSR1, 20000, &w.done);
    CHECK(flag_wait(&w.done, 5000 * slack));
    pthread_join(k.thread, NULL);
    join_waiter(&w);
    waited = w.ended - w.started;
    CHECK_STATUS(w.status, LOCK_BUSY);
    CHECK(w.lock == UNTOUCHED);
    CHECK(waited >= 950 && waited < 1000.0 + 1000.0 * (double)slack);
    CHECK(rec.calls >= 3);
    CHECK(pthread_equal(rec.thread, w.thread));
    CHECK(!rec.other_thread);
    CHECK(usr1_handled >= 5);
    printf("on_interrupt returning false: LOCK_BUSY after %.0f ms, %d calls, %d signals\n",
           waited, rec.calls, (int)usr1_handled);

    /* Released during the wait: LOCK_OK. */
    memset(&rec, 0, sizeof rec);
    start_waiter(&w, client, "c:no-interrupt", 3000, &opts);
    start_killer(&k, w.thread, SIGUSR1, 20000, &w.done);
    sleep_ms(500);
    released = now_ms();
    CHECK_STATUS(lock_release(holder), LOCK_OK);
    CHECK(flag_wait(&w.done, 5000 * slack));
    pthread_join(k.thread, NULL);
    join_waiter(&w);
    CHECK_STATUS(w.status, LOCK_OK);
    CHECK_STATUS(w.release_status, LOCK_OK);
    CHECK(w.ended >= released && w.ended - released < 500.0 * (double)slack);
    CHECK(rec.calls >= 1);
    CHECK(pthread_equal(rec.thread, w.thread));
    CHECK(!rec.other_thread);
    CHECK(raw_integer("EXISTS", "c:no-interrupt") == 0);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

int main(void) {
    if (harness_init() != 0) return 2;
    /* Every wait below is bounded; this bounds the program too, should one not be. */
    alarm((unsigned)(120 * slack));

    test_signals_never_end_a_wait(SA_RESTART, "c:sig-wait-restart");
    test_signals_never_end_a_wait(0, "c:sig-wait");
    test_signal_storm_during_acquire_release_cycles();
    test_cancel_handle_ends_blocked_acquires();
    test_cancel_all_from_a_sigterm_handler();
    test_on_interrupt_can_cancel_a_wait();
    test_on_interrupt_returning_false_lets_the_wait_go_on();

    return harness_report();
}
