/*
 * Tests of the operators' views through the C ABI, against a real redis-server (started
 * by tests/abi/c_programs.rs): lock_inspect, lock_list, lock_info_free, lock_break,
 * lock_check, lock_server_check_free and lock_renewal_stats. Run under ASan and valgrind,
 * which also check that every result is freed completely.
 *
 * Environment: REDIS_URL, REDIS_HOST, REDIS_PORT; REDLEASE_TEST_SLOW. Prints
 * "N passed, M failed" and exits non-zero on failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "test_harness.h"

struct stats_waiter {
    lock_client_t client;
    int32_t status;
    lock_t lock;
};

static void *stats_wait(void *arg) {
    struct stats_waiter *w = arg;
    w->status = lock_acquire(w->client, "c:st", 10000, 5000 * (uint64_t)slack, &w->lock);
    return NULL;
}

static void test_inspect_shows_the_holder_its_lease_and_fencing_token(void) {
    lock_client_t client = open_client();
    lock_t lock = 0;
    lock_info_t *info = NULL;
    char token[LOCK_TOKEN_MAX];
    uint64_t fence = 0;

    CHECK_STATUS(lock_inspect(client, "c:insp", &info), LOCK_OK);
    CHECK(info != NULL && info->holder == NULL && info->remaining_ms == LOCK_NO_EXPIRY);
    CHECK(info != NULL && strcmp(info->key, "c:insp") == 0 && info->next == NULL);
    CHECK_STATUS(lock_info_free(info), LOCK_OK);

    CHECK_STATUS(lock_acquire(client, "c:insp", 10000, 0, &lock), LOCK_OK);
    CHECK_STATUS(lock_token(lock, token, sizeof token), LOCK_OK);
    CHECK_STATUS(lock_fencing_token(lock, &fence), LOCK_OK);
    info = NULL;
    CHECK_STATUS(lock_inspect(client, "c:insp", &info), LOCK_OK);
    CHECK(info != NULL && info->holder != NULL && strcmp(info->holder, token) == 0);
    CHECK(info != NULL && info->remaining_ms > 5000 && info->remaining_ms <= 10000);
    CHECK(info != NULL && info->fencing_token == fence && info->waiters == 0);
    CHECK(info != NULL && info->owner == NULL && info->holds == 0);
    CHECK(info != NULL && info->held_as == LOCK_HELD_MUTEX && info->count == 0);
    CHECK_STATUS(lock_info_free(info), LOCK_OK);
    CHECK_STATUS(lock_release(lock), LOCK_OK);
    CHECK_STATUS(lock_info_free(NULL), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_a_reentrant_lock_shows_its_owner_and_holds(void) {
    lock_client_t client = open_client();
    lock_acquire_options_t opts;
    lock_t first = 0, second = 0;
    lock_info_t *info = NULL;

    CHECK_STATUS(lock_acquire_options_init(&opts, sizeof opts), LOCK_OK);
    opts.reentrant = true;
    opts.owner = "c-owner";
    CHECK_STATUS(lock_acquire_opts(client, "c:insp-re", 10000, 0, &opts, &first), LOCK_OK);
    CHECK_STATUS(lock_acquire_opts(client, "c:insp-re", 10000, 0, &opts, &second), LOCK_OK);
    CHECK_STATUS(lock_inspect(client, "c:insp-re", &info), LOCK_OK);
    CHECK(info != NULL && info->owner != NULL && strcmp(info->owner, "c-owner") == 0);
    CHECK(info != NULL && info->holds == 2);
    CHECK_STATUS(lock_info_free(info), LOCK_OK);
    CHECK_STATUS(lock_release(second), LOCK_OK);
    CHECK_STATUS(lock_release(first), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_inspect_tells_the_kind_that_holds_a_name(void) {
    lock_client_t client = open_client();
    lock_t p1 = 0, p2 = 0, r1 = 0, w = 0;
    lock_info_t *info = NULL;
    char token[LOCK_TOKEN_MAX];

    CHECK_STATUS(lock_semaphore_acquire(client, "c:kind-sem", 5, 10000, 0, NULL, &p1), LOCK_OK);
    CHECK_STATUS(lock_semaphore_acquire(client, "c:kind-sem", 5, 10000, 0, NULL, &p2), LOCK_OK);
    CHECK_STATUS(lock_inspect(client, "c:kind-sem", &info), LOCK_OK);
    CHECK(info != NULL && info->held_as == LOCK_HELD_SEMAPHORE && info->count == 2);
    CHECK(info != NULL && info->holder == NULL && info->remaining_ms <= 10000);
    CHECK_STATUS(lock_info_free(info), LOCK_OK);

    CHECK_STATUS(lock_rwlock_acquire(client, "c:kind-rw", LOCK_RW_READ, 10000, 0, NULL, &r1), LOCK_OK);
    CHECK_STATUS(lock_inspect(client, "c:kind-rw", &info), LOCK_OK);
    CHECK(info != NULL && info->held_as == LOCK_HELD_RWLOCK && info->count == 1 && info->holder == NULL);
    CHECK_STATUS(lock_info_free(info), LOCK_OK);
    CHECK_STATUS(lock_release(r1), LOCK_OK);

    CHECK_STATUS(lock_rwlock_acquire(client, "c:kind-rw", LOCK_RW_WRITE, 10000, 0, NULL, &w), LOCK_OK);
    CHECK_STATUS(lock_token(w, token, sizeof token), LOCK_OK);
    CHECK_STATUS(lock_inspect(client, "c:kind-rw", &info), LOCK_OK);
    CHECK(info != NULL && info->held_as == LOCK_HELD_RWLOCK && info->count == 0);
    CHECK(info != NULL && info->holder != NULL && strcmp(info->holder, token) == 0);
    CHECK_STATUS(lock_info_free(info), LOCK_OK);
    CHECK_STATUS(lock_release(w), LOCK_OK);

    CHECK_STATUS(lock_inspect(client, "c:kind-rw", &info), LOCK_OK);
    CHECK(info != NULL && info->held_as == LOCK_HELD_NONE);
    CHECK_STATUS(lock_info_free(info), LOCK_OK);
    CHECK_STATUS(lock_release(p1), LOCK_OK);
    CHECK_STATUS(lock_release(p2), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_list_links_every_held_lock_that_matches(void) {
    lock_client_t client = open_client();
    lock_t a = 0, b = 0, c = 0;
    lock_info_t *list = NULL, *node;
    size_t count = 99, seen = 0;
    bool found_a = false, found_b = false;

    CHECK_STATUS(lock_acquire(client, "c:list:a", 10000, 0, &a), LOCK_OK);
    CHECK_STATUS(lock_acquire(client, "c:list:b", 10000, 0, &b), LOCK_OK);
    CHECK_STATUS(lock_acquire(client, "c:other", 10000, 0, &c), LOCK_OK);
    CHECK_STATUS(lock_list(client, "c:list:*", 100, &list, &count), LOCK_OK);
    CHECK(count == 2);
    for (node = list; node != NULL; node = node->next) {
        seen++;
        found_a = found_a || strcmp(node->key, "c:list:a") == 0;
        found_b = found_b || strcmp(node->key, "c:list:b") == 0;
        CHECK(node->holder != NULL && node->fencing_token > 0);
    }
    CHECK(seen == 2 && found_a && found_b);
    CHECK_STATUS(lock_info_free(list), LOCK_OK);

    list = NULL;
    CHECK_STATUS(lock_list(client, "c:list:*", 1, &list, &count), LOCK_OK);
    CHECK(count == 1 && list != NULL && list->next == NULL);
    CHECK_STATUS(lock_info_free(list), LOCK_OK);

    list = (lock_info_t *)1; /* written only on LOCK_OK */
    CHECK_STATUS(lock_list(client, "c:list:*", 0, &list, &count), LOCK_ERR_ARGUMENT);
    CHECK(list == (lock_info_t *)1);
    list = NULL;
    CHECK_STATUS(lock_list(client, "c:none:*", 10, &list, &count), LOCK_OK);
    CHECK(list == NULL && count == 0);

    CHECK_STATUS(lock_release(a), LOCK_OK);
    CHECK_STATUS(lock_release(b), LOCK_OK);
    CHECK_STATUS(lock_release(c), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_break_deletes_only_the_holder_shown(void) {
    lock_client_t client = open_client();
    lock_t lock = 0;
    char token[LOCK_TOKEN_MAX];
    bool held = true, locked = true;

    CHECK_STATUS(lock_acquire(client, "c:brk", 10000, 0, &lock), LOCK_OK);
    CHECK_STATUS(lock_token(lock, token, sizeof token), LOCK_OK);
    CHECK_STATUS(lock_break(client, "c:brk", "someone-else"), LOCK_NOT_HELD);
    CHECK_STATUS(lock_is_locked(client, "c:brk", &locked), LOCK_OK);
    CHECK(locked);
    CHECK_STATUS(lock_break(client, "c:brk", token), LOCK_OK);
    CHECK_STATUS(lock_is_locked(client, "c:brk", &locked), LOCK_OK);
    CHECK(!locked);
    /* The holder finds out at its next extend. */
    CHECK_STATUS(lock_extend(lock, 10000), LOCK_NOT_HELD);
    CHECK_STATUS(lock_is_held(lock, &held), LOCK_OK);
    CHECK(!held);
    CHECK_STATUS(lock_release(lock), LOCK_NOT_HELD);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_check_reports_the_server(void) {
    lock_client_t client = open_client();
    lock_server_check_t *check = NULL;

    CHECK_STATUS(lock_check(client, &check), LOCK_OK);
    CHECK(check != NULL && strlen(check->version) > 0);
    CHECK(check != NULL && check->maxmemory_policy != NULL);
    /* The test server runs with --save "" and no AOF: a restart loses everything. */
    CHECK(check != NULL && check->loses_data_on_restart == 1);
    CHECK(check != NULL && check->round_trip_count >= 1 && check->round_trips_us != NULL);
    CHECK_STATUS(lock_server_check_free(check), LOCK_OK);
    CHECK_STATUS(lock_server_check_free(NULL), LOCK_OK);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_renewal_stats_count_renewals(void) {
    lock_client_t client = open_client();
    lock_renewal_stats_t before, after;
    lock_t lock = 0;

    CHECK_STATUS(lock_renewal_stats(&before, sizeof before), LOCK_OK);
    CHECK(before.size == sizeof before);
    CHECK_STATUS(lock_acquire(client, "c:stats", 300, 0, &lock), LOCK_OK);
    sleep_ms(700 * slack); /* renewed every 100 ms */
    CHECK_STATUS(lock_renewal_stats(&after, sizeof after), LOCK_OK);
    CHECK(after.renewals >= before.renewals + 2);
    CHECK(after.lateness_p50_us <= after.lateness_p99_us);
    CHECK(after.lateness_p99_us <= after.lateness_p999_us);
    CHECK(after.lateness_p999_us <= after.max_lateness_us);
    CHECK_STATUS(lock_release(lock), LOCK_OK);
    CHECK_STATUS(lock_renewal_stats(NULL, sizeof after), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_renewal_stats(&after, 3), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

static void test_stats_count_acquisitions_waits_handoffs_and_losses(void) {
    lock_client_t client = open_client(), other = open_client();
    lock_stats_t before, after, interval;
    lock_t a = 0, busy = 0, doomed = 0;
    struct stats_waiter w = {other, -99, 0};
    pthread_t thread;
    const char *del[] = {"DEL", "c:st-lost"};
    char reply[4096];

    CHECK_STATUS(lock_stats(&before, sizeof before), LOCK_OK);
    CHECK_STATUS(lock_acquire(client, "c:st", 10000, 0, &a), LOCK_OK);
    CHECK_STATUS(lock_acquire(other, "c:st", 10000, 0, &busy), LOCK_BUSY);
    CHECK(pthread_create(&thread, NULL, stats_wait, &w) == 0);
    sleep_ms(300 * slack); /* the waiter registers and blocks */
    CHECK_STATUS(lock_release(a), LOCK_OK); /* handed to the waiter */
    pthread_join(thread, NULL);
    CHECK_STATUS(w.status, LOCK_OK);
    CHECK_STATUS(lock_release(w.lock), LOCK_OK);
    CHECK_STATUS(lock_acquire(client, "c:st-lost", 300, 0, &doomed), LOCK_OK);
    CHECK(raw_command(reply, sizeof reply, 2, del) == 0);
    sleep_ms(600 * slack); /* the next renewal finds the key gone */
    CHECK_STATUS(lock_stats(&after, sizeof after), LOCK_OK);
    CHECK_STATUS(lock_stats_since(&after, &before, &interval, sizeof interval), LOCK_OK);
    CHECK(interval.acquisitions == 3 && interval.busy == 1 && interval.cancelled == 0);
    CHECK(interval.waits == 1 && interval.handoffs == 1 && interval.lost_not_held == 1);
    CHECK(interval.wait_p50_us >= 250000 && interval.wait_p50_us <= interval.max_wait_us);
    CHECK(interval.wait_p99_us <= interval.max_wait_us && interval.max_wait_us == after.max_wait_us);
    CHECK(interval.lateness_p99_us <= interval.max_lateness_us);
    CHECK(after.acquisitions == before.acquisitions + 3);
    CHECK_STATUS(lock_release(doomed), LOCK_NOT_HELD);

    /* Bad input. */
    CHECK_STATUS(lock_stats(NULL, sizeof after), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_stats(&after, 7), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_stats_since(NULL, &before, &interval, sizeof interval), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_stats_since(&after, &before, NULL, sizeof interval), LOCK_ERR_ARGUMENT);
    before.size = 3;
    CHECK_STATUS(lock_stats_since(&after, &before, &interval, sizeof interval), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
    CHECK_STATUS(lock_client_close(other), LOCK_OK);
}

static void test_bad_arguments(void) {
    lock_client_t client = open_client();
    lock_info_t *info = NULL;
    lock_server_check_t *check = NULL;
    size_t count = 0;

    CHECK_STATUS(lock_inspect(client, NULL, &info), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_inspect(client, "", &info), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_inspect(client, "c:x", NULL), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_inspect(0, "c:x", &info), LOCK_ERR_HANDLE);
    CHECK_STATUS(lock_list(client, NULL, 10, &info, &count), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_list(client, "*", 10, NULL, &count), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_list(client, "*", 10, &info, NULL), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_break(client, "c:x", NULL), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_break(client, NULL, "t"), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_check(client, NULL), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_check(0, &check), LOCK_ERR_HANDLE);
    CHECK(info == NULL && check == NULL);
    CHECK_STATUS(lock_client_close(client), LOCK_OK);
}

int main(void) {
    if (harness_init() != 0) return 2;

    test_bad_arguments();
    test_inspect_shows_the_holder_its_lease_and_fencing_token();
    test_a_reentrant_lock_shows_its_owner_and_holds();
    test_inspect_tells_the_kind_that_holds_a_name();
    test_list_links_every_held_lock_that_matches();
    test_break_deletes_only_the_holder_shown();
    test_check_reports_the_server();
    test_renewal_stats_count_renewals();
    test_stats_count_acquisitions_waits_handoffs_and_losses();

    return harness_report();
}
