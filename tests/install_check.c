/*
 * Built by tests/install_check.sh against an installed redlease, through pkg-config
 * (shared and static), and run against a redis-server of the script's own.
 *
 * Checks: the header's version macros match lock_version(); a lock can be taken and
 * released; and the log callback: a renewal that fails (the script's server is stopped
 * with SIGSTOP) reaches the callback as a warning from a renewal thread, the lock is then
 * lost, and a NULL callback turns logging off.
 *
 * Environment: REDIS_URL (the server), REDIS_PID (its pid, for SIGSTOP/SIGCONT).
 * Prints "install_check: N passed, M failed".
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "redlease.h"

static int passed, failed;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (cond) {                                               \
            passed++;                                             \
        } else {                                                  \
            failed++;                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                         \
            fprintf(stderr, "\n");                                \
        }                                                         \
    } while (0)

/* What the log callback saw. */
struct seen {
    pthread_mutex_t mutex;
    int records;
    int renewal_warnings; /* LOCK_LOG_WARN about a renewal, from the library */
    int lost_warnings;    /* LOCK_LOG_WARN saying a lock was lost */
    int above_level;      /* records less severe than asked for (must stay 0) */
    int other_thread;     /* records logged on a thread other than main's */
    pthread_t main_thread;
    char first_warning[512];
};

static struct seen seen = {.mutex = PTHREAD_MUTEX_INITIALIZER};
static volatile int max_level_asked = LOCK_LOG_WARN;

static void on_log(int32_t level, const char *target, const char *message, void *user_data) {
    struct seen *s = user_data;
    pthread_mutex_lock(&s->mutex);
    s->records++;
    if (level > max_level_asked) s->above_level++;
    if (!pthread_equal(pthread_self(), s->main_thread)) s->other_thread++;
    if (level == LOCK_LOG_WARN && strncmp(target, "redlease", 8) == 0 &&
        strstr(message, "renewing lock") != NULL) {
        if (s->renewal_warnings++ == 0) {
            snprintf(s->first_warning, sizeof s->first_warning, "%s", message);
        }
    }
    if (level == LOCK_LOG_WARN && strstr(message, "lost") != NULL) s->lost_warnings++;
    pthread_mutex_unlock(&s->mutex);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void check_version(void) {
    char expected[64];
    snprintf(expected, sizeof expected, "%d.%d.%d", REDLEASE_VERSION_MAJOR,
             REDLEASE_VERSION_MINOR, REDLEASE_VERSION_PATCH);
    CHECK(strcmp(lock_version(), expected) == 0, "lock_version() %s, header %s", lock_version(),
          expected);
    CHECK(strcmp(REDLEASE_VERSION_STRING, expected) == 0, "REDLEASE_VERSION_STRING %s",
          REDLEASE_VERSION_STRING);
    CHECK(REDLEASE_VERSION_NUMBER ==
              REDLEASE_VERSION_MAJOR * 10000 + REDLEASE_VERSION_MINOR * 100 +
                  REDLEASE_VERSION_PATCH,
          "REDLEASE_VERSION_NUMBER %d", REDLEASE_VERSION_NUMBER);
}

static void check_log_arguments(void) {
    CHECK(lock_set_log_callback(0, on_log, &seen) == LOCK_ERR_ARGUMENT, "level 0 accepted");
    CHECK(lock_set_log_callback(LOCK_LOG_TRACE + 1, on_log, &seen) == LOCK_ERR_ARGUMENT,
          "level 6 accepted");
    CHECK(lock_set_log_callback(99, NULL, NULL) == LOCK_OK, "turning logging off: %s",
          lock_last_error());
}

static void check_lock_and_renewal_failure(const char *url, pid_t server) {
    lock_client_options_t opts;
    lock_client_t client = 0;
    lock_t lock = 0;
    bool held = true;
    int i, warnings = 0;
    int32_t rc;

    CHECK(lock_client_options_init(&opts, sizeof opts) == LOCK_OK, "%s", lock_last_error());
    opts.connect_timeout_ms = 200;
    opts.io_timeout_ms = 100;
    rc = lock_client_open_opts(url, &opts, &client);
    CHECK(rc == LOCK_OK, "open %s: %s", url, lock_last_error());
    if (rc != LOCK_OK) return;

    /* A plain lock first: acquire, fencing token, release. */
    rc = lock_acquire(client, "install-check:plain", 10000, 1000, &lock);
    CHECK(rc == LOCK_OK, "acquire: %s", lock_last_error());
    if (rc == LOCK_OK) {
        uint64_t fence = 0;
        CHECK(lock_fencing_token(lock, &fence) == LOCK_OK && fence > 0, "fencing token");
        CHECK(lock_release(lock) == LOCK_OK, "release: %s", lock_last_error());
    }

    /* Logging on, warnings and errors only. */
    seen.main_thread = pthread_self();
    max_level_asked = LOCK_LOG_WARN;
    CHECK(lock_set_log_callback(LOCK_LOG_WARN, on_log, &seen) == LOCK_OK, "%s",
          lock_last_error());

    /* A 600 ms lease renewed every 200 ms, then the server stops answering. */
    rc = lock_acquire(client, "install-check:renewed", 600, 0, &lock);
    CHECK(rc == LOCK_OK, "acquire: %s", lock_last_error());
    if (rc != LOCK_OK) goto out;
    CHECK(kill(server, SIGSTOP) == 0, "SIGSTOP the server");
    for (i = 0; i < 500 && held; i++) { /* at most 5 s */
        sleep_ms(10);
        if (lock_is_held(lock, &held) != LOCK_OK) break;
    }
    CHECK(!held, "the lock was still held 5 s after the server stopped");
    /* The server stays stopped until the renewal thread has given the lock up (a warning
     * says it was lost): a renewal still queued on the server's socket could otherwise
     * extend the key again when it wakes up. */
    for (i = 0; i < 500; i++) { /* at most 5 s */
        pthread_mutex_lock(&seen.mutex);
        warnings = seen.lost_warnings;
        pthread_mutex_unlock(&seen.mutex);
        if (warnings > 0) break;
        sleep_ms(10);
    }
    CHECK(kill(server, SIGCONT) == 0, "SIGCONT the server");
    CHECK(warnings > 0, "no warning that the lock was lost reached the log callback");
    pthread_mutex_lock(&seen.mutex);
    warnings = seen.renewal_warnings;
    pthread_mutex_unlock(&seen.mutex);
    CHECK(warnings > 0, "no renewal warning reached the log callback (%d records)", seen.records);
    if (warnings > 0) {
        printf("install_check: the log callback got: %s\n", seen.first_warning);
        CHECK(strstr(seen.first_warning, "install-check:renewed") != NULL, "%s",
              seen.first_warning);
    }
    CHECK(seen.other_thread > 0, "no record came from a renewal thread");
    CHECK(seen.above_level == 0, "%d records below the level asked for", seen.above_level);
    /* LOCK_NOT_HELD, or LOCK_OK when a renewal still queued on the stopped server's socket
     * ran on SIGCONT and the key held the token again: either way the handle is spent. */
    rc = lock_release(lock);
    CHECK(rc == LOCK_NOT_HELD || rc == LOCK_OK, "release of a lost lock gave %s: %s",
          lock_status_name(rc), lock_last_error());

out:
    /* Off: nothing more is delivered once the call returns. */
    CHECK(lock_set_log_callback(LOCK_LOG_WARN, NULL, NULL) == LOCK_OK, "%s", lock_last_error());
    pthread_mutex_lock(&seen.mutex);
    i = seen.records;
    pthread_mutex_unlock(&seen.mutex);
    rc = lock_acquire(client, "install-check:unlogged", 300, 0, &lock);
    if (rc == LOCK_OK) {
        CHECK(kill(server, SIGSTOP) == 0, "SIGSTOP the server");
        sleep_ms(400); /* two failed renewals, logged to nobody */
        CHECK(kill(server, SIGCONT) == 0, "SIGCONT the server");
        lock_release(lock);
    }
    CHECK(seen.records == i, "%d records after logging was turned off", seen.records - i);
    CHECK(lock_client_close(client) == LOCK_OK, "%s", lock_last_error());
}

int main(void) {
    const char *url = getenv("REDIS_URL");
    const char *pid = getenv("REDIS_PID");

    check_version();
    check_log_arguments();
    if (url && pid) {
        check_lock_and_renewal_failure(url, (pid_t)atol(pid));
    } else {
        fprintf(stderr, "install_check: REDIS_URL or REDIS_PID not set\n");
        failed++;
    }
    printf("install_check: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
