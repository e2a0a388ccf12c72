/*
 * Tests of the other kinds of lock through the C ABI, against a real redis-server (started
 * by tests/abi/c_programs.rs): reentrant locks (lock_acquire_options_t.reentrant), counting
 * semaphores (lock_semaphore_acquire), read-write locks (lock_rwlock_acquire) and locks over
 * several names (lock_acquire_all). Their
 * holds are ordinary lock_t handles, so every lock_t function is checked on them too.
 *
 * Environment: REDIS_URL, REDIS_HOST, REDIS_PORT; REDLEASE_TEST_SLOW (timing bounds are
 * multiplied by it). Prints "N passed, M failed" and exits non-zero on failure. Shared
 * helpers (CHECK, raw_command, ...) are in test_harness.h.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "test_harness.h"

/* A blocking acquire run on a thread of its own: what it returned and how long it took. */
struct waiter {
    lock_client_t client;
    const char *name;
    int32_t side;     /* LOCK_RW_READ or LOCK_RW_WRITE; 0 for a semaphore permit */
    uint32_t permits; /* for a semaphore */
    uint64_t wait_ms;
    lock_cancel_t cancel; /* 0: none */
    int32_t status;
    lock_t lock;
    double waited_ms;
    double ended; /* now_ms() when the acquire returned */
};

static void *run_waiter(void *arg) {
    struct waiter *w = arg;
    lock_acquire_options_t opts;
    double started = now_ms();
    w->status = lock_acquire_options_init(&opts, sizeof opts);
    if (w->status != LOCK_OK) return NULL;
    opts.cancel = w->cancel;
    if (w->side == 0) {
        w->status = lock_semaphore_acquire(w->client, w->name, w->permits, 10000, w->wait_ms,
                                           &opts, &w->lock);
    } else {
        w->status = lock_rwlock_acquire(w->client, w->name, w->side, 10000, w->wait_ms, &opts,
                                        &w->lock);
    }
    w->ended = now_ms();
    w->waited_ms = w->ended - started;
    return NULL;
}

static void test_a_semaphore_of_two_admits_two_and_a_release_frees_a_permit(void) {
    lock_client_t client = open_client();
    lock_t a = 0, b = 0, c = 0;
    uint64_t fence_a = 0, fence_b = 0, fence_c = 0;
    bool locked = false;
    struct waiter w;
    pthread_t thread;
    double released;

    CHECK_STATUS(lock_semaphore_acquire(client, "c:sem", 2, 10000, 0, NULL, &a), LOCK_OK);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:sem", 2, 10000, 0, NULL, &b), LOCK_OK);
    CHECK(a != 0 && b != 0 && a != b);
    CHECK(raw_integer("ZCARD", "c:sem") == 2);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:sem", 2, 10000, 0, NULL, &c), LOCK_BUSY);
    CHECK(c == 0); /* outputs are written only on LOCK_OK */
    CHECK(strlen(lock_last_error()) > 0);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:sem", 2, 10000, 200, NULL, &c), LOCK_BUSY);
    CHECK(c == 0);
    CHECK_STATUS(lock_is_locked(client, "c:sem", &locked), LOCK_OK);
    CHECK(locked);
    CHECK_STATUS(lock_fencing_token(a, &fence_a), LOCK_OK);
    CHECK_STATUS(lock_fencing_token(b, &fence_b), LOCK_OK);
    CHECK(fence_a > 0 && fence_b > fence_a);

    /* A release frees a permit: the next try gets it. */
    CHECK_STATUS(lock_release(a), LOCK_OK);
    CHECK(raw_integer("ZCARD", "c:sem") == 1);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:sem", 2, 10000, 0, NULL, &c), LOCK_OK);
    CHECK_STATUS(lock_fencing_token(c, &fence_c), LOCK_OK);
    CHECK(fence_c > fence_b);

    /* A blocked waiter is woken by a release (not by running out its 10 s wait): it gets
     * the permit after the release, not before (however late its thread started). */
    memset(&w, 0, sizeof w);
    w.client = client;
    w.name = "c:sem";
    w.permits = 2;
    w.wait_ms = 10000;
    pthread_create(&thread, NULL, run_waiter, &w);
    sleep_ms(300);
    released = now_ms();
    CHECK_STATUS(lock_release(b), LOCK_OK);
    pthread_join(thread, NULL);
    CHECK_STATUS(w.status, LOCK_OK);
    CHECK(w.ended >= released && w.ended - released < 3000.0 * (double)slack);
    CHECK(raw_integer("ZCARD", "c:sem") == 2);
    CHECK_STATUS(lock_release(w.lock), LOCK_OK);
    CHECK_STATUS(lock_release(c), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:sem") == 0);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

struct lost_record {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int calls;
    int32_t reason;
    lock_t lock;
};

static void on_lost(lock_t lock, int32_t reason, void *user_data) {
    struct lost_record *rec = user_data;
    pthread_mutex_lock(&rec->mutex);
    rec->calls++;
    rec->reason = reason;
    rec->lock = lock;
    pthread_cond_signal(&rec->cond);
    pthread_mutex_unlock(&rec->mutex);
}

static void test_a_permit_is_an_ordinary_lock_handle(void) {
    lock_client_t client = open_client();
    lock_acquire_options_t opts;
    struct lost_record rec;
    struct timespec until;
    lock_t permit = 0, other = 0;
    bool held = false;
    uint64_t fence = 0, remaining = 0;
    char token[LOCK_TOKEN_MAX], score[64];
    const char *zscore[3] = {"ZSCORE", "c:permit", NULL};
    const char *zrem[3] = {"ZREM", "c:permit", NULL};

    CHECK_STATUS(lock_semaphore_acquire(client, "c:permit", 3, 10000, 0, NULL, &permit),
                 LOCK_OK);
    CHECK_STATUS(lock_is_held(permit, &held), LOCK_OK);
    CHECK(held);
    CHECK_STATUS(lock_fencing_token(permit, &fence), LOCK_OK);
    CHECK(fence > 0);
    /* The token is the permit's member of the semaphore's sorted set. */
    CHECK_STATUS(lock_token(permit, token, sizeof token), LOCK_OK);
    CHECK(strlen(token) > 36);
    zscore[2] = token;
    CHECK(raw_command(score, sizeof score, 3, zscore) == 0 && strcmp(score, "(nil)") != 0);
    CHECK_STATUS(lock_extend(permit, 60000), LOCK_OK);
    CHECK_STATUS(lock_remaining_ms(permit, &remaining), LOCK_OK);
    CHECK(remaining > 30000 && remaining <= 60000);
    CHECK(raw_integer("PTTL", "c:permit") > 30000);
    CHECK_STATUS(lock_extend(permit, 9), LOCK_ERR_ARGUMENT); /* the same ttl floor */
    CHECK_STATUS(lock_release(permit), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:permit") == 0);

    /* A released permit handle is spent, for every function that takes a lock_t. */
    CHECK_STATUS(lock_release(permit), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_extend(permit, 1000), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_is_held(permit, &held), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_fencing_token(permit, &fence), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_token(permit, token, sizeof token), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_remaining_ms(permit, &remaining), LOCK_ERR_HANDLE);

    /* A fixed lease (renew off) frees the permit after its ttl, by the server's clock: the
     * late release says LOCK_NOT_HELD. 150 ms, times slack: a slow run may take longer than
     * 150 ms to confirm the grant, and then rightly holds nothing. */
    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.renew = false;
    CHECK_STATUS(lock_semaphore_acquire(client, "c:permit", 1, (uint64_t)(150 * slack), 0, &opts,
                                        &permit),
                 LOCK_OK);
    sleep_ms(400 * slack);
    CHECK_STATUS(lock_is_held(permit, &held), LOCK_OK);
    CHECK(!held);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:permit", 1, 10000, 0, NULL, &other), LOCK_OK);
    CHECK_STATUS(lock_extend(permit, 1000), LOCK_NOT_HELD);
    CHECK_STATUS(lock_release(permit), LOCK_NOT_HELD);
    CHECK(raw_integer("ZCARD", "c:permit") == 1); /* the new holder's permit is untouched */
    CHECK_STATUS(lock_release(other), LOCK_OK);

    /* The lost-lock callback: a permit taken away behind its back is reported by renewal,
     * with the permit's own handle. A renewed lease of 300 ms (times slack): renewal must
     * find the permit gone (NOT_HELD), not come too late and find the lease over. */
    memset(&rec, 0, sizeof rec);
    pthread_mutex_init(&rec.mutex, NULL);
    pthread_cond_init(&rec.cond, NULL);
    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.on_lost = on_lost;
    opts.user_data = &rec;
    CHECK_STATUS(lock_semaphore_acquire(client, "c:permit", 2, (uint64_t)(300 * slack), 0, &opts,
                                        &permit),
                 LOCK_OK);
    CHECK_STATUS(lock_token(permit, token, sizeof token), LOCK_OK);
    zrem[2] = token;
    CHECK(raw_command(score, sizeof score, 3, zrem) == 0 && strcmp(score, "1") == 0);
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5 * slack;
    pthread_mutex_lock(&rec.mutex);
    while (rec.calls == 0) {
        if (pthread_cond_timedwait(&rec.cond, &rec.mutex, &until) != 0) break;
    }
    pthread_mutex_unlock(&rec.mutex);
    CHECK(rec.calls == 1);
    CHECK(rec.reason == LOCK_LOST_NOT_HELD);
    CHECK(rec.lock == permit);
    CHECK_STATUS(lock_is_held(permit, &held), LOCK_OK);
    CHECK(!held);
    CHECK_STATUS(lock_release(permit), LOCK_NOT_HELD);
    pthread_mutex_destroy(&rec.mutex);
    pthread_cond_destroy(&rec.cond);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_read_write_locks_share_reads_and_exclude_writes(void) {
    lock_client_t client = open_client();
    lock_t r1 = 0, r2 = 0, w = 0, other = 0;
    uint64_t fence_r1 = 0, fence_r2 = 0, fence_w = 0, remaining = 0;
    bool held = false;
    char token[LOCK_TOKEN_MAX];

    /* Readers overlap; a writer is busy while one holds. */
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw", LOCK_RW_READ, 10000, 0, NULL, &r1), LOCK_OK);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw", LOCK_RW_READ, 10000, 0, NULL, &r2), LOCK_OK);
    CHECK(r1 != 0 && r2 != 0 && r1 != r2);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw", LOCK_RW_WRITE, 10000, 0, NULL, &other),
                 LOCK_BUSY);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw", LOCK_RW_WRITE, 10000, 200, NULL, &other),
                 LOCK_BUSY);
    CHECK(other == 0);
    CHECK_STATUS(lock_fencing_token(r1, &fence_r1), LOCK_OK);
    CHECK_STATUS(lock_fencing_token(r2, &fence_r2), LOCK_OK);
    CHECK(fence_r1 > 0 && fence_r2 > fence_r1);
    CHECK_STATUS(lock_is_held(r2, &held), LOCK_OK);
    CHECK(held);
    CHECK_STATUS(lock_extend(r2, 60000), LOCK_OK);
    CHECK_STATUS(lock_remaining_ms(r2, &remaining), LOCK_OK);
    CHECK(remaining > 30000);
    CHECK_STATUS(lock_token(r1, token, sizeof token), LOCK_OK);
    CHECK_STATUS(lock_release(r1), LOCK_OK);
    /* One reader left: still busy for a writer. */
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw", LOCK_RW_WRITE, 10000, 0, NULL, &other),
                 LOCK_BUSY);
    CHECK_STATUS(lock_release(r2), LOCK_OK);
    CHECK_STATUS(lock_release(r2), LOCK_ERR_HANDLE);

    /* A writer excludes readers and other writers. */
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw", LOCK_RW_WRITE, 10000, 0, NULL, &w), LOCK_OK);
    CHECK_STATUS(lock_fencing_token(w, &fence_w), LOCK_OK);
    CHECK(fence_w > fence_r2);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw", LOCK_RW_READ, 10000, 0, NULL, &other),
                 LOCK_BUSY);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw", LOCK_RW_WRITE, 10000, 0, NULL, &other),
                 LOCK_BUSY);
    CHECK(other == 0);
    CHECK_STATUS(lock_is_held(w, &held), LOCK_OK);
    CHECK(held);
    CHECK_STATUS(lock_extend(w, 20000), LOCK_OK);
    CHECK_STATUS(lock_release(w), LOCK_OK);
    CHECK_STATUS(lock_is_held(w, &held), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_fencing_token(w, &fence_w), LOCK_ERR_HANDLE);
    CHECK(raw_integer("EXISTS", "c:rw") == 0);

    /* Free again: a reader gets in at once. */
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw", LOCK_RW_READ, 10000, 0, NULL, &r1), LOCK_OK);
    CHECK_STATUS(lock_release(r1), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_a_waiting_writer_keeps_new_readers_out(void) {
    lock_client_t client = open_client();
    lock_t reader = 0, late = 0;
    struct waiter w;
    pthread_t thread;
    int32_t status = LOCK_OK;
    double deadline;

    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw-wait", LOCK_RW_READ, 10000, 0, NULL, &reader),
                 LOCK_OK);
    memset(&w, 0, sizeof w);
    w.client = client;
    w.name = "c:rw-wait";
    w.side = LOCK_RW_WRITE;
    w.wait_ms = 10000;
    pthread_create(&thread, NULL, run_waiter, &w);

    /* Once the writer waits, a new reader is busy although only a reader holds. Before it
     * waits, a new reader may still get in: give that hold back and look again. */
    deadline = now_ms() + 5000.0 * (double)slack;
    while (now_ms() < deadline) {
        late = 0;
        status = lock_rwlock_acquire(client, "c:rw-wait", LOCK_RW_READ, 10000, 0, NULL, &late);
        if (status != LOCK_OK) break;
        lock_release(late);
        sleep_ms(20);
    }
    CHECK_STATUS(status, LOCK_BUSY);
    CHECK(late == 0);

    /* The reader leaves: the writer gets in, and new readers stay out while it holds. */
    CHECK_STATUS(lock_release(reader), LOCK_OK);
    pthread_join(thread, NULL);
    CHECK_STATUS(w.status, LOCK_OK);
    CHECK(w.waited_ms < 5000.0 * (double)slack);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw-wait", LOCK_RW_READ, 10000, 0, NULL, &late),
                 LOCK_BUSY);
    CHECK_STATUS(lock_release(w.lock), LOCK_OK);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:rw-wait", LOCK_RW_READ, 10000, 0, NULL, &late),
                 LOCK_OK);
    CHECK_STATUS(lock_release(late), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_a_name_in_use_by_another_kind_is_refused_clearly(void) {
    lock_client_t client = open_client();
    lock_t mutex = 0, permit = 0, other = 0;
    bool held = false;

    CHECK_STATUS(lock_acquire(client, "c:kind", 10000, 0, &mutex), LOCK_OK);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:kind", 2, 10000, 0, NULL, &other),
                 LOCK_ERR_REDIS);
    CHECK(strstr(lock_last_error(), "another kind") != NULL);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:kind", LOCK_RW_READ, 10000, 0, NULL, &other),
                 LOCK_ERR_REDIS);
    CHECK(strstr(lock_last_error(), "another kind") != NULL);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:kind", LOCK_RW_WRITE, 10000, 0, NULL, &other),
                 LOCK_ERR_REDIS);
    CHECK(strstr(lock_last_error(), "another kind") != NULL);
    CHECK(other == 0);
    CHECK_STATUS(lock_is_held(mutex, &held), LOCK_OK);
    CHECK(held); /* the mutex is untouched */
    CHECK_STATUS(lock_release(mutex), LOCK_OK);

    /* And the other way round. */
    CHECK_STATUS(lock_semaphore_acquire(client, "c:kind", 2, 10000, 0, NULL, &permit), LOCK_OK);
    CHECK_STATUS(lock_acquire(client, "c:kind", 10000, 0, &other), LOCK_ERR_REDIS);
    CHECK(strstr(lock_last_error(), "another kind") != NULL);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:kind", LOCK_RW_WRITE, 10000, 0, NULL, &other),
                 LOCK_ERR_REDIS);
    CHECK(strstr(lock_last_error(), "another kind") != NULL);
    CHECK(other == 0);
    CHECK_STATUS(lock_release(permit), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:kind") == 0);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_bad_arguments_and_null_pointers(void) {
    lock_client_t client = open_client(), redlock = 0;
    lock_acquire_options_t opts;
    lock_t lock = 0;
    const lock_t untouched = 0x5ca1ab1eULL;
    const int32_t bad_sides[] = {0, 3, -1, 0x7fffffff};
    long keys_before = raw_integer("DBSIZE", NULL);
    const char *urls[1];
    size_t i;

    /* permits 0, a bad side: refused, output untouched. */
    lock = untouched;
    CHECK_STATUS(lock_semaphore_acquire(client, "c:args", 0, 10000, 0, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "permit") != NULL);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:args", 0, 10000, 1000, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    for (i = 0; i < sizeof bad_sides / sizeof bad_sides[0]; i++) {
        CHECK_STATUS(lock_rwlock_acquire(client, "c:args", bad_sides[i], 10000, 0, NULL, &lock),
                     LOCK_ERR_ARGUMENT);
        CHECK(strstr(lock_last_error(), "side") != NULL);
    }
    CHECK(lock == untouched);

    /* NULL pointers, each in its turn. */
    CHECK_STATUS(lock_semaphore_acquire(client, NULL, 2, 10000, 0, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "name") != NULL);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:args", 2, 10000, 0, NULL, NULL),
                 LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "out_lock") != NULL);
    CHECK_STATUS(lock_semaphore_acquire(client, NULL, 2, 10000, 0, NULL, NULL),
                 LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_rwlock_acquire(client, NULL, LOCK_RW_READ, 10000, 0, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:args", LOCK_RW_WRITE, 10000, 0, NULL, NULL),
                 LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_rwlock_acquire(client, NULL, 0, 10000, 0, NULL, NULL), LOCK_ERR_ARGUMENT);
    CHECK(lock == untouched);

    /* The same checks of the name, ttl and options as lock_acquire_opts. */
    CHECK_STATUS(lock_semaphore_acquire(client, "", 2, 10000, 0, NULL, &lock), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_semaphore_acquire(client, "bad\xff\xfe", 2, 10000, 0, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "UTF-8") != NULL);
    CHECK_STATUS(lock_semaphore_acquire(client, "redlease:x", 2, 10000, 0, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:args", 2, 0, 0, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:args", LOCK_RW_READ, 9, 0, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_rwlock_acquire(client, "", LOCK_RW_WRITE, 10000, 0, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.size = sizeof opts + 8;
    CHECK_STATUS(lock_semaphore_acquire(client, "c:args", 2, 10000, 0, &opts, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:args", LOCK_RW_READ, 10000, 0, &opts, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "size") != NULL);
    CHECK(lock == untouched);
    CHECK(raw_integer("DBSIZE", NULL) == keys_before); /* nothing was sent */

    /* Zero, forged and mixed-up handles. */
    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.cancel = 12345;
    CHECK_STATUS(lock_semaphore_acquire(client, "c:args", 2, 10000, 0, &opts, &lock),
                 LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:args", LOCK_RW_READ, 10000, 0, &opts, &lock),
                 LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_semaphore_acquire(0, "c:args", 2, 10000, 0, NULL, &lock), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_rwlock_acquire(0, "c:args", LOCK_RW_READ, 10000, 0, NULL, &lock),
                 LOCK_ERR_HANDLE);
    CHECK(lock == untouched);

    /* A Redlock client takes mutexes only. */
    urls[0] = url;
    CHECK_STATUS(lock_client_open_redlock(urls, 1, NULL, &redlock), LOCK_OK);
    CHECK_STATUS(lock_semaphore_acquire(redlock, "c:args", 2, 10000, 0, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK(strstr(lock_last_error(), "Redlock") != NULL);
    CHECK_STATUS(lock_rwlock_acquire(redlock, "c:args", LOCK_RW_WRITE, 10000, 0, NULL, &lock),
                 LOCK_ERR_ARGUMENT);
    CHECK(lock == untouched);
    CHECK_STATUS(lock_client_close(redlock), LOCK_OK);

    /* A closed client. */
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:args", 2, 10000, 0, NULL, &lock),
                 LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:args", LOCK_RW_READ, 10000, 0, NULL, &lock),
                 LOCK_ERR_HANDLE);
    CHECK(lock == untouched);
    CHECK(raw_integer("DBSIZE", NULL) == keys_before);
}

static void test_cancel_handles_end_blocked_waits_of_every_kind(void) {
    lock_client_t client = open_client();
    lock_cancel_t cancel = 0;
    lock_t permit = 0, writer = 0;
    struct waiter sem, reader;
    pthread_t threads[2];

    CHECK_STATUS(lock_cancel_new(&cancel), LOCK_OK);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:cancel-sem", 1, 10000, 0, NULL, &permit),
                 LOCK_OK);
    CHECK_STATUS(lock_rwlock_acquire(client, "c:cancel-rw", LOCK_RW_WRITE, 10000, 0, NULL,
                                     &writer),
                 LOCK_OK);
    memset(&sem, 0, sizeof sem);
    sem.client = client;
    sem.name = "c:cancel-sem";
    sem.permits = 1;
    sem.wait_ms = UINT64_MAX; /* as long as it takes */
    sem.cancel = cancel;
    reader = sem;
    reader.name = "c:cancel-rw";
    reader.side = LOCK_RW_READ;
    pthread_create(&threads[0], NULL, run_waiter, &sem);
    pthread_create(&threads[1], NULL, run_waiter, &reader);
    sleep_ms(300);
    CHECK_STATUS(lock_cancel(cancel), LOCK_OK);
    pthread_join(threads[0], NULL);
    pthread_join(threads[1], NULL);
    CHECK_STATUS(sem.status, LOCK_CANCELLED);
    CHECK_STATUS(reader.status, LOCK_CANCELLED);
    CHECK(sem.lock == 0 && reader.lock == 0);
    CHECK(raw_integer("ZCARD", "c:cancel-sem") == 1); /* nothing taken by the waiter */
    CHECK_STATUS(lock_cancel_free(cancel), LOCK_OK);

    /* Closing the client releases its permits and holds, as its mutexes. */
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
    CHECK(raw_integer("EXISTS", "c:cancel-sem") == 0);
    CHECK(raw_integer("EXISTS", "c:cancel-rw") == 0);
    CHECK_STATUS(lock_release(permit), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_release(writer), LOCK_ERR_HANDLE);
}

/* Another thread's attempts on a reentrant lock: an acquire for that thread, and a release
 * of a hold the main thread owns. */
struct stranger {
    lock_client_t client;
    lock_t held_by_main;
    int32_t acquired;
    int32_t released;
};

static void *run_stranger(void *arg) {
    struct stranger *s = arg;
    lock_acquire_options_t opts;
    lock_t lock = 0;
    if (lock_acquire_options_init(&opts, sizeof opts) != LOCK_OK) return NULL;
    opts.reentrant = true;
    s->acquired = lock_acquire_opts(s->client, "c:reentrant", 10000, 0, &opts, &lock);
    if (s->acquired == LOCK_OK) lock_release(lock);
    s->released = lock_release(s->held_by_main);
    return NULL;
}

static void test_a_reentrant_lock_is_its_owner_threads_only(void) {
    lock_client_t client = open_client();
    lock_acquire_options_t opts;
    lock_t holds[100] = {0};
    char token[128], again[128];
    uint64_t fence = 0, fence_again = 0;
    bool held = false, locked = false;
    struct stranger s;
    pthread_t thread;
    int i;

    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.reentrant = true;
    for (i = 0; i < 100; i++) {
        CHECK_STATUS(lock_acquire_opts(client, "c:reentrant", 10000, 0, &opts, &holds[i]),
                     LOCK_OK);
    }
    CHECK(holds[0] != holds[99]);
    CHECK_STATUS(lock_token(holds[0], token, sizeof token), LOCK_OK);
    CHECK_STATUS(lock_token(holds[99], again, sizeof again), LOCK_OK);
    CHECK(strcmp(token, again) == 0);
    CHECK_STATUS(lock_fencing_token(holds[0], &fence), LOCK_OK);
    CHECK_STATUS(lock_fencing_token(holds[99], &fence_again), LOCK_OK);
    CHECK(fence == fence_again);

    /* Another thread is another owner: refused; and it may not release our hold. */
    s.client = client;
    s.held_by_main = holds[50];
    s.acquired = s.released = -100;
    CHECK(pthread_create(&thread, NULL, run_stranger, &s) == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK_STATUS(s.acquired, LOCK_BUSY);
    CHECK_STATUS(s.released, LOCK_NOT_HELD);
    CHECK_STATUS(lock_is_held(holds[50], &held), LOCK_OK);
    CHECK(held);

    /* Released with the last hold, not before. */
    for (i = 0; i < 99; i++) CHECK_STATUS(lock_release(holds[i]), LOCK_OK);
    CHECK_STATUS(lock_is_locked(client, "c:reentrant", &locked), LOCK_OK);
    CHECK(locked);
    CHECK_STATUS(lock_release(holds[99]), LOCK_OK);
    CHECK_STATUS(lock_is_locked(client, "c:reentrant", &locked), LOCK_OK);
    CHECK(!locked);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_a_named_owner_holds_across_clients(void) {
    lock_client_t a = open_client(), b = open_client();
    lock_acquire_options_t opts;
    lock_t first = 0, second = 0, other = 0;
    bool locked = false;
    const char bad_utf8[] = {'\xff', 'x', 0};

    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.reentrant = true;
    opts.owner = "job-2c4f7d0e-8a1b-4c55-b3f2-6e9a0d1c7b35";
    CHECK_STATUS(lock_acquire_opts(a, "c:job", 10000, 0, &opts, &first), LOCK_OK);
    CHECK_STATUS(lock_acquire_opts(b, "c:job", 10000, 0, &opts, &second), LOCK_OK);
    opts.owner = "someone-else";
    CHECK_STATUS(lock_acquire_opts(b, "c:job", 10000, 0, &opts, &other), LOCK_BUSY);
    CHECK_STATUS(lock_release(first), LOCK_OK);
    CHECK_STATUS(lock_is_locked(a, "c:job", &locked), LOCK_OK);
    CHECK(locked);
    CHECK_STATUS(lock_release(second), LOCK_OK);
    CHECK_STATUS(lock_is_locked(a, "c:job", &locked), LOCK_OK);
    CHECK(!locked);

    /* Bad owners, and kinds that cannot be reentrant: refused, nothing held. */
    opts.owner = "";
    CHECK_STATUS(lock_acquire_opts(a, "c:job", 10000, 0, &opts, &other), LOCK_ERR_ARGUMENT);
    opts.owner = bad_utf8;
    CHECK_STATUS(lock_acquire_opts(a, "c:job", 10000, 0, &opts, &other), LOCK_ERR_ARGUMENT);
    opts.owner = NULL;
    CHECK_STATUS(lock_semaphore_acquire(a, "c:job-sem", 2, 10000, 0, &opts, &other),
                 LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_rwlock_acquire(a, "c:job-rw", LOCK_RW_READ, 10000, 0, &opts, &other),
                 LOCK_ERR_ARGUMENT);
    CHECK(other == 0);
    CHECK_STATUS(lock_client_close(a), LOCK_OK);
    CHECK_STATUS(lock_client_close(b), LOCK_OK);
}

static int all_lost_calls;
static lock_t all_lost_handle;
static void on_all_lost(lock_t lock, int32_t reason, void *user_data) {
    (void)reason;
    (void)user_data;
    all_lost_calls++;
    all_lost_handle = lock;
}

static void test_a_lock_over_several_names_is_all_or_none(void) {
    lock_client_t client = open_client();
    const char *names[] = {"c:all:c", "c:all:a", "c:all:b"};
    const char *twice[] = {"c:all:a", "c:all:a"};
    lock_t locks[3] = {0, 0, 0}, single = 0;
    lock_acquire_options_t opts;
    char token[LOCK_TOKEN_MAX], stored[4096];
    const char *get[] = {"GET", "c:all:c"};
    const char *del[] = {"DEL", "c:all:b"};
    uint64_t fence = 0;
    bool locked = true;

    /* A busy name: nothing held after. */
    CHECK_STATUS(lock_acquire(client, "c:all:b", 10000, 0, &single), LOCK_OK);
    CHECK_STATUS(lock_acquire_all(client, names, 3, 10000, 0, NULL, locks), LOCK_BUSY);
    CHECK(locks[0] == 0 && locks[1] == 0 && locks[2] == 0);
    CHECK_STATUS(lock_is_locked(client, "c:all:a", &locked), LOCK_OK);
    CHECK(!locked);
    CHECK_STATUS(lock_release(single), LOCK_OK);

    /* All taken: one ordinary handle per name, in the caller's order. */
    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.on_lost = on_all_lost;
    CHECK_STATUS(lock_acquire_all(client, names, 3, 300, 0, &opts, locks), LOCK_OK);
    CHECK(locks[0] != 0 && locks[1] != 0 && locks[2] != 0);
    CHECK_STATUS(lock_token(locks[0], token, sizeof token), LOCK_OK);
    CHECK(raw_command(stored, sizeof stored, 2, get) == 0 && strcmp(stored, token) == 0);
    CHECK_STATUS(lock_fencing_token(locks[1], &fence), LOCK_OK);
    CHECK(fence > 0);
    /* One name lost: the callback is called once, with that name's handle. */
    CHECK(raw_command(stored, sizeof stored, 2, del) == 0);
    sleep_ms(700 * slack);
    CHECK(all_lost_calls == 1 && all_lost_handle == locks[2]);
    CHECK_STATUS(lock_release(locks[0]), LOCK_OK);
    CHECK_STATUS(lock_release(locks[1]), LOCK_OK);
    CHECK_STATUS(lock_release(locks[2]), LOCK_NOT_HELD);

    /* Bad input: nothing sent, nothing written. */
    CHECK_STATUS(lock_acquire_all(client, names, 0, 10000, 0, NULL, locks), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire_all(client, twice, 2, 10000, 0, NULL, locks), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire_all(client, NULL, 2, 10000, 0, NULL, locks), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_acquire_all(client, names, 3, 10000, 0, NULL, NULL), LOCK_ERR_ARGUMENT);
    opts.on_lost = NULL;
    opts.reentrant = true;
    CHECK_STATUS(lock_acquire_all(client, names, 3, 10000, 0, &opts, locks), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

int main(void) {
    if (harness_init() != 0) return 2;

    /* First, while the server has no keys that could expire meanwhile: it checks with
     * DBSIZE that nothing was sent. */
    test_bad_arguments_and_null_pointers();
    test_a_semaphore_of_two_admits_two_and_a_release_frees_a_permit();
    test_a_permit_is_an_ordinary_lock_handle();
    test_read_write_locks_share_reads_and_exclude_writes();
    test_a_waiting_writer_keeps_new_readers_out();
    test_a_name_in_use_by_another_kind_is_refused_clearly();
    test_cancel_handles_end_blocked_waits_of_every_kind();
    test_a_reentrant_lock_is_its_owner_threads_only();
    test_a_named_owner_holds_across_clients();
    test_a_lock_over_several_names_is_all_or_none();

    return harness_report();
}
