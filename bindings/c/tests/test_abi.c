/*
 * Tests of the C ABI against a real redis-server (started by tests/abi/c_programs.rs).
 *
 * Environment: REDIS_URL, REDIS_HOST, REDIS_PORT, REDIS_PID (the last test pauses the
 * server with SIGSTOP); REDLEASE_TEST_ROUNDS (per thread in the contention test, default
 * 200). Prints "N passed, M failed" and exits non-zero on failure.
 * Shared helpers (CHECK, raw_command, ...) are in test_harness.h; signals and cancellation
 * are tested by test_signals.c.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "test_harness.h"

static void test_acquire_busy_extend_release(void) {
    lock_client_t client = open_client();
    lock_t a = 0, b = 0;
    bool held = false, locked = false;
    uint64_t fence1 = 0, fence2 = 0, remaining = 0;
    char token[LOCK_TOKEN_MAX], stored[LOCK_TOKEN_MAX], small[8];
    const char *get[2] = {"GET", "c:basic"};

    CHECK_STATUS(lock_acquire(client, "c:basic", 10000, 0, &a), LOCK_OK);
    CHECK(a != 0);
    CHECK_STATUS(lock_acquire(client, "c:basic", 10000, 0, &b), LOCK_BUSY);
    CHECK(b == 0); /* outputs are written only on LOCK_OK */
    CHECK(strlen(lock_last_error()) > 0);
    CHECK_STATUS(lock_acquire(client, "c:basic", 10000, 200, &b), LOCK_BUSY);
    CHECK_STATUS(lock_is_held(a, &held), LOCK_OK);
    CHECK(held);
    CHECK(strlen(lock_last_error()) == 0);
    CHECK_STATUS(lock_is_locked(client, "c:basic", &locked), LOCK_OK);
    CHECK(locked);
    CHECK_STATUS(lock_fencing_token(a, &fence1), LOCK_OK);
    CHECK(fence1 > 0);
    CHECK_STATUS(lock_token(a, token, sizeof token), LOCK_OK);
    CHECK(strlen(token) > 36);
    CHECK(raw_command(stored, sizeof stored, 2, get) == 0 && strcmp(stored, token) == 0);
    memset(small, 'x', sizeof small);
    CHECK_STATUS(lock_token(a, small, sizeof small), LOCK_ERR_ARGUMENT);
    CHECK(small[0] == 'x');
    CHECK_STATUS(lock_extend(a, 60000), LOCK_OK);
    CHECK(raw_integer("PTTL", "c:basic") > 30000);
    CHECK_STATUS(lock_remaining_ms(a, &remaining), LOCK_OK);
    CHECK(remaining > 30000 && remaining <= 60000);
    CHECK_STATUS(lock_release(a), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:basic") == 0);
    CHECK_STATUS(lock_release(a), LOCK_ERR_HANDLE); /* double release */
    CHECK_STATUS(lock_is_held(a, &held), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_extend(a, 1000), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_acquire(client, "c:basic", 10000, 0, &b), LOCK_OK);
    CHECK(b != a); /* a reused slot gets a new generation */
    CHECK_STATUS(lock_fencing_token(b, &fence2), LOCK_OK);
    CHECK(fence2 > fence1);
    CHECK_STATUS(lock_release(b), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_expired_lease_does_not_touch_next_holder(void) {
    lock_client_t client = open_client();
    lock_acquire_options_t fixed;
    lock_t a = 0, b = 0;
    bool held = true;
    char token_b[LOCK_TOKEN_MAX], stored[LOCK_TOKEN_MAX];
    const char *get[2] = {"GET", "c:timeline"};

    CHECK_STATUS(lock_acquire_options_init(&fixed, sizeof fixed), LOCK_OK);
    fixed.renew = false;
    /* A fixed lease of 150 ms (times slack: a slow run may take longer than 150 ms to
     * confirm the grant, and then rightly holds nothing), over after the sleep. */
    CHECK_STATUS(lock_acquire_opts(client, "c:timeline", (uint64_t)(150 * slack), 0, &fixed,
                                   &a),
                 LOCK_OK);
    sleep_ms(400 * slack);
    CHECK_STATUS(lock_is_held(a, &held), LOCK_OK);
    CHECK(!held);
    CHECK_STATUS(lock_acquire(client, "c:timeline", 60000, 0, &b), LOCK_OK);
    CHECK_STATUS(lock_extend(a, 100), LOCK_NOT_HELD);
    CHECK_STATUS(lock_release(a), LOCK_NOT_HELD);
    CHECK_STATUS(lock_token(b, token_b, sizeof token_b), LOCK_OK);
    CHECK(raw_command(stored, sizeof stored, 2, get) == 0 && strcmp(stored, token_b) == 0);
    CHECK(raw_integer("PTTL", "c:timeline") > 50000);
    CHECK_STATUS(lock_release(b), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

struct lost_record {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int calls;
    int32_t reason;
    int32_t release_status;
    lock_t lock;
};

static void on_lost(lock_t lock, int32_t reason, void *user_data) {
    struct lost_record *rec = user_data;
    /* Releasing from inside the callback is allowed; the lock is gone, so NOT_HELD. */
    int32_t status = lock_release(lock);
    pthread_mutex_lock(&rec->mutex);
    rec->calls++;
    rec->reason = reason;
    rec->lock = lock;
    rec->release_status = status;
    pthread_cond_signal(&rec->cond);
    pthread_mutex_unlock(&rec->mutex);
}

static void test_lost_callback(void) {
    lock_client_t client = open_client();
    lock_acquire_options_t opts;
    struct lost_record rec;
    struct timespec until;
    lock_t lock = 0;
    bool held = true;
    const char *del[2] = {"DEL", "c:lost"};
    char reply[64];

    memset(&rec, 0, sizeof rec);
    pthread_mutex_init(&rec.mutex, NULL);
    pthread_cond_init(&rec.cond, NULL);
    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.on_lost = on_lost;
    opts.user_data = &rec;
    /* A renewed lease of 300 ms (times slack): renewal must find the key gone (NOT_HELD),
     * not come too late and find the lease over (UNREACHABLE). */
    CHECK_STATUS(lock_acquire_opts(client, "c:lost", (uint64_t)(300 * slack), 0, &opts, &lock),
                 LOCK_OK);
    CHECK_STATUS(lock_is_held(lock, &held), LOCK_OK);
    CHECK(held);
    CHECK(raw_command(reply, sizeof reply, 2, del) == 0);

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&rec.mutex);
    while (rec.calls == 0) {
        if (pthread_cond_timedwait(&rec.cond, &rec.mutex, &until) != 0) break;
    }
    pthread_mutex_unlock(&rec.mutex);
    CHECK(rec.calls == 1);
    CHECK(rec.reason == LOCK_LOST_NOT_HELD);
    CHECK(rec.lock == lock);
    CHECK(rec.release_status == LOCK_NOT_HELD);
    CHECK_STATUS(lock_is_held(lock, &held), LOCK_ERR_HANDLE); /* spent by the callback */
    sleep_ms(300);
    CHECK(rec.calls == 1);
    pthread_mutex_destroy(&rec.mutex);
    pthread_cond_destroy(&rec.cond);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

/* What the library did with one user_data: on_lost calls, whether one is running, and
 * user_data_free calls (and whether one came while on_lost was running). */
struct tracked {
    pthread_mutex_t mutex;
    int lost_calls, in_lost, freed, freed_in_use;
    long lost_sleep_ms;
};

static void tracked_lost(lock_t lock, int32_t reason, void *user_data) {
    struct tracked *t = user_data;
    (void)lock;
    (void)reason;
    pthread_mutex_lock(&t->mutex);
    t->lost_calls++;
    t->in_lost = 1;
    pthread_mutex_unlock(&t->mutex);
    sleep_ms(t->lost_sleep_ms);
    pthread_mutex_lock(&t->mutex);
    t->in_lost = 0;
    pthread_mutex_unlock(&t->mutex);
}

static void tracked_free(void *user_data) {
    struct tracked *t = user_data;
    pthread_mutex_lock(&t->mutex);
    t->freed++;
    t->freed_in_use |= t->in_lost;
    pthread_mutex_unlock(&t->mutex);
}

static int tracked_get(struct tracked *t, const int *field) {
    int value;
    pthread_mutex_lock(&t->mutex);
    value = *field;
    pthread_mutex_unlock(&t->mutex);
    return value;
}

static void tracked_opts(lock_acquire_options_t *opts, struct tracked *t) {
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mutex, NULL);
    CHECK_STATUS(lock_acquire_options_init(opts, sizeof *opts), LOCK_OK);
    opts->on_lost = tracked_lost;
    opts->user_data = t;
    opts->user_data_free = tracked_free;
}

/* Waits up to 5 s for *field to reach want. */
static int tracked_wait(struct tracked *t, const int *field, int want) {
    int i;
    for (i = 0; i < 500 && tracked_get(t, field) < want; i++) sleep_ms(10);
    return tracked_get(t, field);
}

static void test_user_data_is_given_back_once_the_library_is_done_with_it(void) {
    lock_client_t client = open_client();
    lock_acquire_options_t opts;
    struct tracked a, b, busy;
    lock_t first = 0, second = 0, other = 0;
    const char *del[2] = {"DEL", "c:user-data"};
    char reply[64];
    /* The renewed leases below, held until the DEL: 300 ms, longer on a slow run. */
    const uint64_t lease = (uint64_t)(300 * slack);

    /* A plain hold: given back during its release, not before. */
    tracked_opts(&opts, &a);
    CHECK_STATUS(lock_acquire_opts(client, "c:user-data", 10000, 0, &opts, &first), LOCK_OK);
    CHECK(tracked_get(&a, &a.freed) == 0);
    CHECK_STATUS(lock_release(first), LOCK_OK);
    CHECK(tracked_get(&a, &a.freed) == 1);

    /* A failed acquire gives it back before it returns. */
    CHECK_STATUS(lock_acquire(client, "c:user-data", 10000, 0, &other), LOCK_OK);
    tracked_opts(&opts, &busy);
    CHECK_STATUS(lock_acquire_opts(client, "c:user-data", 10000, 0, &opts, &first), LOCK_BUSY);
    CHECK(tracked_get(&busy, &busy.freed) == 1 && busy.lost_calls == 0);
    CHECK_STATUS(lock_release(other), LOCK_OK);

    /* Two holds of a reentrant lock: the released one is never told of the later loss, and
     * gets its user_data back at its release; the other is told once, and gets it back
     * only after its slow on_lost has returned. */
    tracked_opts(&opts, &a);
    a.lost_sleep_ms = 300;
    opts.reentrant = true;
    CHECK_STATUS(lock_acquire_opts(client, "c:user-data", lease, 0, &opts, &first), LOCK_OK);
    tracked_opts(&opts, &b);
    opts.reentrant = true;
    CHECK_STATUS(lock_acquire_opts(client, "c:user-data", lease, 0, &opts, &second), LOCK_OK);
    CHECK_STATUS(lock_release(second), LOCK_OK);
    CHECK(tracked_get(&b, &b.freed) == 1);
    CHECK(raw_command(reply, sizeof reply, 2, del) == 0);
    CHECK(tracked_wait(&a, &a.lost_calls, 1) == 1);
    /* Released while its on_lost runs: the release does not wait for it ... */
    CHECK_STATUS(lock_release(first), LOCK_NOT_HELD);
    /* ... and user_data comes back once it has returned, not before. */
    CHECK(tracked_wait(&a, &a.freed, 1) == 1);
    sleep_ms(300);
    CHECK(tracked_get(&a, &a.freed) == 1 && tracked_get(&a, &a.freed_in_use) == 0);
    CHECK(tracked_get(&a, &a.lost_calls) == 1);
    CHECK(tracked_get(&b, &b.lost_calls) == 0 && tracked_get(&b, &b.freed) == 1);
    pthread_mutex_destroy(&a.mutex);
    pthread_mutex_destroy(&b.mutex);

    /* A hold released while the loss report is running another hold's slow on_lost is not
     * called after its release either (the report once took every hold's callback at its
     * start). */
    tracked_opts(&opts, &a);
    a.lost_sleep_ms = 1000; /* time enough for the release below, even under valgrind */
    opts.reentrant = true;
    CHECK_STATUS(lock_acquire_opts(client, "c:user-data", lease, 0, &opts, &first), LOCK_OK);
    tracked_opts(&opts, &b);
    opts.reentrant = true;
    CHECK_STATUS(lock_acquire_opts(client, "c:user-data", lease, 0, &opts, &second), LOCK_OK);
    CHECK(raw_command(reply, sizeof reply, 2, del) == 0);
    CHECK(tracked_wait(&a, &a.in_lost, 1) == 1);
    CHECK_STATUS(lock_release(second), LOCK_NOT_HELD);
    CHECK(tracked_get(&b, &b.freed) == 1);
    CHECK(tracked_wait(&a, &a.freed, 1) == 1);
    sleep_ms(200);
    CHECK(tracked_get(&b, &b.lost_calls) == 0);
    CHECK_STATUS(lock_release(first), LOCK_NOT_HELD);
    CHECK(tracked_get(&a, &a.freed) == 1 && tracked_get(&a, &a.freed_in_use) == 0);
    pthread_mutex_destroy(&a.mutex);
    pthread_mutex_destroy(&b.mutex);

    /* Every failed acquire gives user_data back before it returns, whatever the error. */
    {
        lock_client_t closed = open_client();
        int i;
        int32_t status[6];
        struct tracked each[6];
        CHECK_STATUS(lock_client_close(closed), LOCK_OK);
        for (i = 0; i < 6; i++) tracked_opts(&opts, &each[i]); /* opts: the last one's */
        opts.user_data = &each[0];
        status[0] = lock_acquire_opts((lock_client_t)0xdead, "c:user-data", 1000, 0, &opts, &first);
        opts.user_data = &each[1];
        status[1] = lock_acquire_opts(closed, "c:user-data", 1000, 0, &opts, &first);
        opts.user_data = &each[2];
        status[2] = lock_acquire_opts(client, NULL, 1000, 0, &opts, &first);
        opts.user_data = &each[3];
        opts.cancel = (lock_cancel_t)0x12345678;
        status[3] = lock_acquire_opts(client, "c:user-data", 1000, 0, &opts, &first);
        opts.cancel = 0;
        opts.user_data = &each[4];
        status[4] = lock_rwlock_acquire(client, "c:user-data-rw", 7, 1000, 0, &opts, &first);
        opts.user_data = &each[5];
        status[5] = lock_acquire_opts(client, "c:user-data", 1000, 0, &opts, NULL);
        for (i = 0; i < 6; i++) {
            CHECK(status[i] == LOCK_ERR_HANDLE || status[i] == LOCK_ERR_ARGUMENT);
            CHECK(tracked_get(&each[i], &each[i].freed) == 1);
            pthread_mutex_destroy(&each[i].mutex);
        }
    }
    pthread_mutex_destroy(&busy.mutex);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_bad_input(void) {
    lock_client_t client = open_client(), other = 0;
    lock_client_options_t opts;
    lock_t lock = 0;
    bool flag = false;
    uint64_t value = 0;
    char long_key[1100], pw_url[256];
    long keys_before = raw_integer("DBSIZE", NULL);
    int32_t status;

    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';

    CHECK_STATUS(lock_client_open(NULL, &other), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_open(url, NULL), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_open("http://127.0.0.1:1", &other), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_open("redis://127.0.0.1:1/notadb", &other), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_open("redis://\xff\xfe", &other), LOCK_ERR_ARGUMENT);
    CHECK(other == 0);
    CHECK_STATUS(lock_client_options_init(NULL, sizeof(lock_client_options_t)), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_options_init(&opts, sizeof opts), LOCK_OK);
    CHECK_STATUS(lock_client_open_opts(url, NULL, &other), LOCK_ERR_ARGUMENT);
    opts.io_timeout_ms = 0;
    CHECK_STATUS(lock_client_open_opts(url, &opts, &other), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_options_init(&opts, sizeof opts), LOCK_OK);
    opts.pool_size = 0;
    CHECK_STATUS(lock_client_open_opts(url, &opts, &other), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_options_init(&opts, sizeof opts), LOCK_OK);
    opts.tls_ca_cert_file = "/nonexistent/ca.pem";
    CHECK_STATUS(lock_client_open_opts(url, &opts, &other), LOCK_ERR_ARGUMENT);

    CHECK_STATUS(lock_acquire(client, NULL, 1000, 0, &lock), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire(client, "", 1000, 0, &lock), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire(client, long_key, 1000, 0, &lock), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire(client, "bad\xff\xfe", 1000, 0, &lock), LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "UTF-8") != NULL);
    CHECK_STATUS(lock_acquire(client, "c:bad", 0, 0, &lock), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire(client, "c:bad", UINT64_MAX, 0, &lock), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire(client, "c:bad", 1000, 0, NULL), LOCK_ERR_ARGUMENT);
    CHECK(lock == 0);
    CHECK(raw_integer("DBSIZE", NULL) == keys_before); /* nothing was sent */

    /* Zero, forged and mixed-up handles. */
    CHECK_STATUS(lock_acquire(0, "c:bad", 1000, 0, &lock), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_acquire(12345, "c:bad", 1000, 0, &lock), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_release(0), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_release(0xdeadbeefcafef00dULL), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_release(client), LOCK_ERR_HANDLE); /* a client is not a lock */
    CHECK_STATUS(lock_is_held(42, &flag), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_fencing_token(42, &value), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_client_close(0), LOCK_ERR_HANDLE);

    CHECK_STATUS(lock_acquire(client, "c:bad-out", 1000, 0, &lock), LOCK_OK);
    CHECK_STATUS(lock_client_close(lock), LOCK_ERR_HANDLE); /* a lock is not a client */
    CHECK_STATUS(lock_is_held(lock, NULL), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_fencing_token(lock, NULL), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_remaining_ms(lock, NULL), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_token(lock, NULL, 100), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_extend(lock, 0), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_is_locked(client, NULL, &flag), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_release(lock), LOCK_OK);
    CHECK_STATUS(lock_wait_for_background_withdrawals(0, NULL), LOCK_ERR_ARGUMENT);
    flag = false; /* nothing in flight: done at once, also with no limit */
    CHECK_STATUS(lock_wait_for_background_withdrawals(UINT64_MAX, &flag), LOCK_OK);
    CHECK(flag);

    /* A password never appears in a message. */
    snprintf(pw_url, sizeof pw_url, "redis://:sup3r-secret-pw@%s:%d/0", host, port);
    CHECK_STATUS(lock_client_open(pw_url, &other), LOCK_OK);
    status = lock_acquire(other, "c:pw", 1000, 0, &lock);
    CHECK(status == LOCK_ERR_REDIS);
    CHECK(strlen(lock_last_error()) > 0 && strstr(lock_last_error(), "sup3r-secret-pw") == NULL);
    CHECK_STATUS(lock_client_close(other), LOCK_OK);
    snprintf(pw_url, sizeof pw_url, "redis://:sup3r-secret-pw@%s:%d/nodb", host, port);
    CHECK_STATUS(lock_client_open(pw_url, &other), LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "sup3r-secret-pw") == NULL);

    /* Closed clients. */
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_acquire(client, "c:bad", 1000, 0, &lock), LOCK_ERR_HANDLE);

    CHECK(strcmp(lock_status_name(LOCK_BUSY), "LOCK_BUSY") == 0);
    CHECK(strcmp(lock_status_name(LOCK_ERR_INTERNAL), "LOCK_ERR_INTERNAL") == 0);
    CHECK(lock_status_name(99) != NULL);
    CHECK(lock_last_error() != NULL);
    CHECK(strlen(lock_version()) > 0);
}

static void test_close_releases_held_locks(void) {
    lock_client_t client = open_client();
    lock_t a = 0, b = 0;
    bool held;
    CHECK_STATUS(lock_acquire(client, "c:close-a", 30000, 0, &a), LOCK_OK);
    CHECK_STATUS(lock_acquire(client, "c:close-b", 30000, 0, &b), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:close-a") == 1);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:close-a") == 0);
    CHECK(raw_integer("EXISTS", "c:close-b") == 0);
    CHECK_STATUS(lock_is_held(a, &held), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_release(b), LOCK_ERR_HANDLE);
}

struct contention {
    lock_client_t client;
    int rounds;
    long counter; /* deliberately not atomic: only the lock protects it */
    uint64_t last_fence;
    int errors;
    pthread_mutex_t errors_mutex;
};

static void *contend(void *arg) {
    struct contention *c = arg;
    int i;
    for (i = 0; i < c->rounds; i++) {
        lock_t lock = 0;
        uint64_t fence = 0;
        long n;
        if (lock_acquire(c->client, "c:counter", 10000, 60000, &lock) != LOCK_OK ||
            lock_fencing_token(lock, &fence) != LOCK_OK) {
            pthread_mutex_lock(&c->errors_mutex);
            c->errors++;
            fprintf(stderr, "contention: %s\n", lock_last_error());
            pthread_mutex_unlock(&c->errors_mutex);
            continue;
        }
        if (fence <= c->last_fence) c->errors++;
        c->last_fence = fence;
        n = c->counter;
        sched_yield();
        c->counter = n + 1;
        if (lock_release(lock) != LOCK_OK) c->errors++;
    }
    return NULL;
}

static void test_threads_keep_an_exact_counter(void) {
    enum { THREADS = 8 };
    pthread_t threads[THREADS];
    struct contention c;
    const char *rounds = getenv("REDLEASE_TEST_ROUNDS");
    int i;

    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.errors_mutex, NULL);
    c.client = open_client();
    c.rounds = rounds ? atoi(rounds) : 200;
    for (i = 0; i < THREADS; i++) pthread_create(&threads[i], NULL, contend, &c);
    for (i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    CHECK(c.errors == 0);
    CHECK(c.counter == (long)THREADS * c.rounds);
    pthread_mutex_destroy(&c.errors_mutex);
    CHECK_STATUS(lock_client_close(c.client), LOCK_OK);
}

/* lock_acquire_options_t as an older header declared it: the fields up to user_data. */
typedef struct old_acquire_options_t {
    size_t size;
    bool renew;
    lock_lost_cb on_lost;
    void *user_data;
} old_acquire_options_t;

/* lock_client_options_t as an older header declared it: the fields up to pool_wait_ms. */
typedef struct old_client_options_t {
    size_t size;
    uint64_t connect_timeout_ms;
    uint64_t io_timeout_ms;
    uint32_t pool_size;
    uint64_t pool_wait_ms;
} old_client_options_t;

/* A copy of `len` bytes of `old` in a heap block of `block` bytes whose rest is garbage
 * (0xA5): exactly `len` bytes when block == len, so that reading past them is an error
 * under ASan and valgrind; a larger block makes a library that reads the fields past `size`
 * see a garbage cancel handle, callback or string pointer. */
static void *old_struct_copy(const void *old, size_t len, size_t block) {
    unsigned char *copy = malloc(block);
    if (!copy) abort();
    memset(copy, 0xA5, block);
    memcpy(copy, old, len);
    return copy;
}

static void test_old_acquire_options_still_work(void) {
    lock_client_t client = open_client();
    old_acquire_options_t old;
    lock_acquire_options_t fixed;
    lock_client_options_t client_fixed;
    void *exact, *garbage_tail;
    lock_t lock = 0, holder = 0;
    bool held = true;
    double holder_asked, started, ended;

    CHECK(offsetof(old_acquire_options_t, renew) == offsetof(lock_acquire_options_t, renew));
    CHECK(offsetof(old_acquire_options_t, on_lost) == offsetof(lock_acquire_options_t, on_lost));
    CHECK(offsetof(old_acquire_options_t, user_data) ==
          offsetof(lock_acquire_options_t, user_data));
    CHECK(sizeof(old_acquire_options_t) < sizeof(lock_acquire_options_t));
    CHECK_STATUS(lock_acquire_options_init(&fixed, sizeof fixed), LOCK_OK);
    CHECK(fixed.size == sizeof(lock_acquire_options_t));
    CHECK(fixed.cancel == 0 && fixed.on_interrupt == NULL);

    memset(&old, 0, sizeof old);
    old.size = sizeof old;
    old.renew = false;
    old.on_lost = NULL;
    old.user_data = NULL;

    /* A program built against the old header fills its struct with the new library's
     * init: only the old struct's bytes are written (on the heap at its exact size, so a
     * write past it shows under ASan and valgrind), with the old defaults. */
    exact = malloc(sizeof old);
    CHECK(exact != NULL);
    CHECK_STATUS(lock_acquire_options_init((lock_acquire_options_t *)exact, sizeof old), LOCK_OK);
    CHECK(((old_acquire_options_t *)exact)->size == sizeof old);
    CHECK(((old_acquire_options_t *)exact)->renew == true);
    CHECK(((old_acquire_options_t *)exact)->on_lost == NULL);
    free(exact);
    /* A size no version of the struct ever had is refused; a larger one is named for what
     * it most likely is, a program built against a newer header. */
    CHECK_STATUS(lock_acquire_options_init(&fixed, sizeof fixed + 8), LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "newer redlease.h") != NULL);
    CHECK_STATUS(lock_client_options_init(&client_fixed, sizeof client_fixed + 8),
                 LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "newer redlease.h") != NULL);
    CHECK_STATUS(lock_acquire_options_init(&fixed, 12), LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "not the size of any version") != NULL);

    /* Exactly the old struct's bytes: the library reads no further, and takes renew=false
     * from it (the 150 ms lease, times slack, is not renewed). */
    exact = old_struct_copy(&old, sizeof old, sizeof old);
    CHECK_STATUS(lock_acquire_opts(client, "c:old-opts", (uint64_t)(150 * slack), 0,
                                   (const lock_acquire_options_t *)exact, &lock),
                 LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:old-opts") == 1);
    sleep_ms(400 * slack);
    CHECK_STATUS(lock_is_held(lock, &held), LOCK_OK);
    CHECK(!held);
    CHECK(raw_integer("EXISTS", "c:old-opts") == 0);
    CHECK_STATUS(lock_release(lock), LOCK_NOT_HELD);
    free(exact);

    /* Garbage past the old size: the fields there take their defaults (no cancel handle, no
     * interrupt callback), also through a wait of several 200 ms slices, during which an
     * interrupt callback would be called. The holder's fixed 300 ms lease (times slack) ends
     * the wait: not before it is over, counted from before the holder asked for it (the
     * server starts the lease later). */
    fixed.renew = false;
    holder_asked = now_ms();
    CHECK_STATUS(lock_acquire_opts(client, "c:old-opts-wait", (uint64_t)(300 * slack), 0, &fixed,
                                   &holder),
                 LOCK_OK);
    garbage_tail = old_struct_copy(&old, sizeof old, sizeof(lock_acquire_options_t));
    lock = 0;
    started = now_ms();
    CHECK_STATUS(lock_acquire_opts(client, "c:old-opts-wait", 10000, 5000,
                                   (const lock_acquire_options_t *)garbage_tail, &lock),
                 LOCK_OK);
    ended = now_ms();
    /* Less 10 ms: the server's expiry is by its own clock, to the millisecond. */
    CHECK(ended - holder_asked >= 300.0 * (double)slack - 10.0);
    CHECK(ended - started < 3000.0 * (double)slack);
    CHECK(lock != 0);
    CHECK(raw_integer("PTTL", "c:old-opts-wait") > 5000);
    CHECK_STATUS(lock_release(lock), LOCK_OK);
    CHECK_STATUS(lock_release(holder), LOCK_NOT_HELD);
    CHECK(raw_integer("EXISTS", "c:old-opts-wait") == 0);
    free(garbage_tail);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

/* Opens a client with an old options struct laid out in `block` bytes, takes and releases
 * one lock, and checks the defaults of the fields past the old size: no key prefix, owner
 * label host/pid. */
static void check_old_client_options(const old_client_options_t *old, size_t block) {
    void *copy = old_struct_copy(old, sizeof *old, block);
    lock_client_t client = 0;
    lock_t lock = 0;
    char token[LOCK_TOKEN_MAX];
    const char *slash;

    CHECK_STATUS(lock_client_open_opts(url, (const lock_client_options_t *)copy, &client),
                 LOCK_OK);
    free(copy);
    CHECK_STATUS(lock_acquire(client, "c:old-client", 10000, 0, &lock), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:old-client") == 1); /* no key prefix */
    CHECK_STATUS(lock_token(lock, token, sizeof token), LOCK_OK);
    slash = strrchr(token, '/');
    CHECK(slash != NULL && atol(slash + 1) == (long)getpid()); /* ...:host/pid */
    CHECK_STATUS(lock_release(lock), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:old-client") == 0);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_old_client_options_still_work(void) {
    old_client_options_t old;
    lock_client_options_t opts;
    lock_client_t client = 0;
    lock_t lock = 0;

    CHECK(offsetof(old_client_options_t, pool_size) ==
          offsetof(lock_client_options_t, pool_size));
    CHECK(offsetof(old_client_options_t, pool_wait_ms) ==
          offsetof(lock_client_options_t, pool_wait_ms));
    CHECK(sizeof(old_client_options_t) < sizeof(lock_client_options_t));
    CHECK_STATUS(lock_client_options_init(&opts, sizeof opts), LOCK_OK);
    CHECK(opts.size == sizeof(lock_client_options_t));

    memset(&old, 0, sizeof old);
    old.size = sizeof old;
    old.connect_timeout_ms = 2000;
    old.io_timeout_ms = 2000;
    old.pool_size = 4;
    old.pool_wait_ms = 0; /* valid: take a free connection or fail at once */
    check_old_client_options(&old, sizeof old);
    check_old_client_options(&old, sizeof(lock_client_options_t));

    /* pool_wait_ms 0 with today's struct too. */
    opts.pool_wait_ms = 0;
    CHECK_STATUS(lock_client_open_opts(url, &opts, &client), LOCK_OK);
    CHECK_STATUS(lock_acquire(client, "c:pool-wait-0", 10000, 0, &lock), LOCK_OK);
    CHECK_STATUS(lock_release(lock), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

/* Options big enough for any `size` the tests claim. */
struct roomy_options {
    union {
        lock_acquire_options_t acquire;
        lock_client_options_t client;
    } u;
    unsigned char more[64];
};

static void test_options_size_is_checked(void) {
    lock_client_t client = open_client(), other = 0;
    struct roomy_options roomy;
    lock_t lock = 0;
    const lock_t untouched = 0x5ca1ab1eULL;
    /* Unset, too small to hold the size itself, larger than this library's struct (a newer
     * header), garbage. */
    const size_t sizes[] = {0, sizeof(size_t) - 1, sizeof(lock_acquire_options_t) + 1,
                            sizeof(lock_acquire_options_t) + 8, (size_t)-1};
    const size_t client_sizes[] = {0, sizeof(size_t) - 1, sizeof(lock_client_options_t) + 1,
                                   sizeof(lock_client_options_t) + 8, (size_t)-1};
    size_t i;

    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        memset(&roomy, 0, sizeof roomy);
        CHECK_STATUS(lock_acquire_options_init(&roomy.u.acquire, sizeof roomy.u.acquire), LOCK_OK);
        roomy.u.acquire.size = sizes[i];
        lock = untouched;
        CHECK_STATUS(lock_acquire_opts(client, "c:size", 10000, 0, &roomy.u.acquire, &lock),
                     LOCK_ERR_ARGUMENT);
        CHECK(lock == untouched);
        CHECK(strstr(lock_last_error(), "size") != NULL);
        if (sizes[i] > sizeof roomy.u.acquire && sizes[i] <= sizeof roomy.u.acquire + 8) {
            CHECK(strstr(lock_last_error(), "newer redlease.h") != NULL);
        }
    }
    CHECK(raw_integer("EXISTS", "c:size") == 0); /* nothing was sent */

    for (i = 0; i < sizeof client_sizes / sizeof client_sizes[0]; i++) {
        memset(&roomy, 0, sizeof roomy);
        CHECK_STATUS(lock_client_options_init(&roomy.u.client, sizeof roomy.u.client), LOCK_OK);
        roomy.u.client.size = client_sizes[i];
        other = (lock_client_t)untouched;
        CHECK_STATUS(lock_client_open_opts(url, &roomy.u.client, &other), LOCK_ERR_ARGUMENT);
        CHECK(other == (lock_client_t)untouched);
    }

    /* The real size works, of course. */
    CHECK_STATUS(lock_acquire_options_init(&roomy.u.acquire, sizeof roomy.u.acquire), LOCK_OK);
    lock = 0;
    CHECK_STATUS(lock_acquire_opts(client, "c:size", 10000, 0, &roomy.u.acquire, &lock),
                 LOCK_OK);
    CHECK_STATUS(lock_release(lock), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_new_statuses_ttl_floor_and_reserved_names(void) {
    lock_client_t client = open_client();
    lock_acquire_options_t fixed;
    lock_t lock = 0;
    int32_t status;

    CHECK(LOCK_CANCELLED == 3);
    CHECK(LOCK_ERR_REPLICATION == -6);
    CHECK(strcmp(lock_status_name(LOCK_CANCELLED), "LOCK_CANCELLED") == 0);
    CHECK(strcmp(lock_status_name(LOCK_ERR_REPLICATION), "LOCK_ERR_REPLICATION") == 0);
    CHECK(strcmp(lock_status_name(LOCK_OK), "LOCK_OK") == 0);
    CHECK(strcmp(lock_status_name(LOCK_NOT_HELD), "LOCK_NOT_HELD") == 0);

    /* The shortest ttl is 10 ms. */
    CHECK_STATUS(lock_acquire(client, "c:ttl-floor", 9, 0, &lock), LOCK_ERR_ARGUMENT);
    CHECK(lock == 0);
    CHECK_STATUS(lock_acquire_options_init(&fixed, sizeof fixed), LOCK_OK);
    fixed.renew = false;
    /* Granted; unless the 10 ms lease ran out before the grant could be confirmed (a slow
     * run, under valgrind), which ends a wait of 0 as busy, and says why. */
    status = lock_acquire_opts(client, "c:ttl-floor", 10, 0, &fixed, &lock);
    if (status == LOCK_OK) {
        status = lock_release(lock); /* the 10 ms lease may be over already */
        CHECK(status == LOCK_OK || status == LOCK_NOT_HELD);
    } else {
        CHECK_STATUS(status, LOCK_BUSY);
        CHECK(strstr(lock_last_error(), "lease ran out") != NULL);
    }
    /* The same floor for extends. */
    CHECK_STATUS(lock_acquire(client, "c:ttl-floor", 10000, 0, &lock), LOCK_OK);
    CHECK_STATUS(lock_extend(lock, 9), LOCK_ERR_ARGUMENT);
    CHECK(raw_integer("PTTL", "c:ttl-floor") > 5000); /* untouched */
    CHECK_STATUS(lock_extend(lock, 20000), LOCK_OK);
    CHECK(raw_integer("PTTL", "c:ttl-floor") > 15000);
    CHECK_STATUS(lock_release(lock), LOCK_OK);

    /* Names in the library's own namespace are refused, and nothing is sent. */
    lock = 0;
    CHECK_STATUS(lock_acquire(client, "redlease:x", 1000, 0, &lock), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire(client, "redlease:", 1000, 0, &lock), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire(client, "redlease:fence:{c:x}", 1000, 0, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "reserved") != NULL);
    CHECK(lock == 0);
    CHECK(raw_integer("EXISTS", "redlease:x") == 0);
    /* Only that exact prefix: Redis keys are case-sensitive. */
    CHECK_STATUS(lock_acquire(client, "Redlease:x", 1000, 0, &lock), LOCK_OK);
    CHECK_STATUS(lock_release(lock), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_an_abandoned_lock_keeps_its_key_until_its_lease_ends(void) {
    lock_client_t client = open_client();
    lock_t lock = 0, other = 0;
    char token[LOCK_TOKEN_MAX], stored[4096];
    const char *get[] = {"GET", "c:abandon"};

    CHECK_STATUS(lock_acquire(client, "c:abandon", 400 * (uint64_t)slack, 0, &lock), LOCK_OK);
    CHECK_STATUS(lock_token(lock, token, sizeof token), LOCK_OK);
    CHECK_STATUS(lock_abandon(lock), LOCK_OK);
    CHECK_STATUS(lock_release(lock), LOCK_ERR_HANDLE); /* the handle is spent */
    CHECK_STATUS(lock_abandon(lock), LOCK_ERR_HANDLE);
    CHECK(raw_command(stored, sizeof stored, 2, get) == 0 && strcmp(stored, token) == 0);
    CHECK_STATUS(lock_acquire(client, "c:abandon", 10000, 0, &other), LOCK_BUSY);
    sleep_ms(700 * slack); /* not renewed: the lease ends */
    CHECK_STATUS(lock_acquire(client, "c:abandon", 10000, 0, &other), LOCK_OK);
    CHECK_STATUS(lock_release(other), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_a_lock_handed_over_is_adopted_by_its_token(void) {
    lock_client_t scheduler = open_client(), worker = open_client();
    lock_t held = 0, adopted = 0, nothing = 0;
    char token[LOCK_TOKEN_MAX], adopted_token[LOCK_TOKEN_MAX];
    uint64_t fence = 0, adopted_fence = 0, left = 0;
    bool is_held = false;

    CHECK_STATUS(lock_acquire(scheduler, "c:handed", 10000, 0, &held), LOCK_OK);
    CHECK_STATUS(lock_token(held, token, sizeof token), LOCK_OK);
    CHECK_STATUS(lock_fencing_token(held, &fence), LOCK_OK);
    CHECK_STATUS(lock_adopt(worker, "c:handed", token, 10000, NULL, &adopted), LOCK_OK);
    CHECK_STATUS(lock_token(adopted, adopted_token, sizeof adopted_token), LOCK_OK);
    CHECK(strcmp(token, adopted_token) == 0);
    CHECK_STATUS(lock_fencing_token(adopted, &adopted_fence), LOCK_OK);
    CHECK(adopted_fence == fence);
    CHECK_STATUS(lock_remaining_ms(adopted, &left), LOCK_OK);
    CHECK(left > 5000 && left <= 10000);
    CHECK_STATUS(lock_extend(adopted, 20000), LOCK_OK);
    CHECK_STATUS(lock_release(adopted), LOCK_OK); /* ends it for both */
    CHECK_STATUS(lock_extend(held, 10000), LOCK_NOT_HELD);
    CHECK_STATUS(lock_is_held(held, &is_held), LOCK_OK);
    CHECK(!is_held);
    CHECK_STATUS(lock_release(held), LOCK_NOT_HELD);

    CHECK_STATUS(lock_adopt(worker, "c:handed", token, 10000, NULL, &nothing), LOCK_NOT_HELD);
    CHECK_STATUS(lock_adopt(worker, "c:handed", NULL, 10000, NULL, &nothing), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_adopt(worker, "c:handed", "", 10000, NULL, &nothing), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_adopt(worker, "c:handed", token, 10000, NULL, NULL), LOCK_ERR_ARGUMENT);
    CHECK(nothing == 0);
    CHECK_STATUS(lock_client_close(scheduler), LOCK_OK);
    CHECK_STATUS(lock_client_close(worker), LOCK_OK);
}

/* A TCP port on 127.0.0.1 that nobody listens on (bound, read, closed). */
static int unused_port(void) {
    struct sockaddr_in addr;
    socklen_t len = sizeof addr;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
        getsockname(fd, (struct sockaddr *)&addr, &len) == 0) {
        port = ntohs(addr.sin_port);
    }
    if (fd >= 0) close(fd);
    return port;
}

/* Last: it pauses the server. */
static void test_last_error_info_tells_a_timeout_from_a_refused_connection(void) {
    lock_error_info_t info;
    lock_client_options_t copts;
    lock_client_t refused = 0, client = 0;
    lock_t lock = 0;
    char nowhere[64];
    const char *pid_text = getenv("REDIS_PID");
    pid_t pid = pid_text ? (pid_t)atol(pid_text) : 0;

    /* Nothing listens: refused, and nothing was sent. */
    snprintf(nowhere, sizeof nowhere, "redis://127.0.0.1:%d/0", unused_port());
    CHECK_STATUS(lock_client_open(nowhere, &refused), LOCK_OK);
    CHECK_STATUS(lock_acquire(refused, "c:info", 10000, 0, &lock), LOCK_ERR_CONNECTION);
    memset(&info, 0xff, sizeof info);
    CHECK_STATUS(lock_last_error_info(&info, sizeof info), LOCK_OK);
    CHECK(info.size == sizeof info && info.status == LOCK_ERR_CONNECTION);
    CHECK(info.cause == LOCK_CAUSE_CONNECTION && !info.outcome_unknown);
    /* It reports the last call other than itself: asking again says the same. */
    CHECK_STATUS(lock_last_error_info(&info, sizeof info), LOCK_OK);
    CHECK(info.status == LOCK_ERR_CONNECTION);
    CHECK_STATUS(lock_client_close(refused), LOCK_OK);
    CHECK_STATUS(lock_last_error_info(&info, sizeof info), LOCK_OK);
    CHECK(info.status == LOCK_OK && info.cause == LOCK_CAUSE_NONE && !info.outcome_unknown);

    CHECK_STATUS(lock_last_error_info(NULL, sizeof info), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_last_error_info(&info, 3), LOCK_ERR_ARGUMENT);

    /* A paused server: the acquire goes out and no reply comes in time. */
    CHECK(pid > 0);
    if (pid <= 0) return;
    CHECK_STATUS(lock_client_options_init(&copts, sizeof copts), LOCK_OK);
    copts.io_timeout_ms = 300 * (uint64_t)slack;
    CHECK_STATUS(lock_client_open_opts(url, &copts, &client), LOCK_OK);
    CHECK_STATUS(lock_acquire(client, "c:info-warm", 10000, 0, &lock), LOCK_OK);
    CHECK_STATUS(lock_release(lock), LOCK_OK);
    kill(pid, SIGSTOP);
    CHECK_STATUS(lock_acquire(client, "c:info", 10000, 0, &lock), LOCK_ERR_CONNECTION);
    CHECK_STATUS(lock_last_error_info(&info, sizeof info), LOCK_OK);
    kill(pid, SIGCONT);
    CHECK(info.status == LOCK_ERR_CONNECTION && info.cause == LOCK_CAUSE_TIMEOUT);
    CHECK(info.outcome_unknown);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

int main(void) {
    if (harness_init() != 0) return 2;

    test_acquire_busy_extend_release();
    test_expired_lease_does_not_touch_next_holder();
    test_lost_callback();
    test_bad_input();
    test_close_releases_held_locks();
    test_threads_keep_an_exact_counter();
    test_old_acquire_options_still_work();
    test_old_client_options_still_work();
    test_options_size_is_checked();
    test_new_statuses_ttl_floor_and_reserved_names();
    test_user_data_is_given_back_once_the_library_is_done_with_it();
    test_an_abandoned_lock_keeps_its_key_until_its_lease_ends();
    test_a_lock_handed_over_is_adopted_by_its_token();
    test_last_error_info_tells_a_timeout_from_a_refused_connection();

    return harness_report();
}
