/*
 * Tests of the C ABI against a real redis-server (started by tests/c_abi.rs).
 *
 * Environment: REDIS_URL, REDIS_HOST, REDIS_PORT; REDLEASE_TEST_ROUNDS (per thread in the
 * contention test, default 200). Prints "N passed, M failed" and exits non-zero on failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "redlease.h"

static int passed, failed;

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (cond) {                                                                \
            passed++;                                                              \
        } else {                                                                   \
            failed++;                                                              \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, \
                    __LINE__, #cond, lock_last_error());                          \
        }                                                                          \
    } while (0)

#define CHECK_STATUS(call, expected)                                                \
    do {                                                                            \
        int32_t status_ = (call);                                                   \
        if (status_ == (expected)) {                                                \
            passed++;                                                               \
        } else {                                                                    \
            failed++;                                                               \
            fprintf(stderr, "%s:%d: %s gave %s, expected %s (last error: %s)\n",    \
                    __FILE__, __LINE__, #call, lock_status_name(status_),           \
                    lock_status_name(expected), lock_last_error());                 \
        }                                                                           \
    } while (0)

static const char *url;
static const char *host;
static int port;

static void sleep_ms(long ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

/* Sends one command (RESP) on a fresh connection and returns the first reply line in
 * reply (without CRLF); for a bulk string, the string itself. Returns 0 on success. */
static int raw_command(char *reply, size_t reply_len, int argc, const char **argv) {
    char buf[4096];
    size_t n = 0;
    int i, fd;
    ssize_t got;
    struct sockaddr_in addr;

    n += (size_t)snprintf(buf + n, sizeof buf - n, "*%d\r\n", argc);
    for (i = 0; i < argc; i++) {
        n += (size_t)snprintf(buf + n, sizeof buf - n, "$%zu\r\n%s\r\n", strlen(argv[i]),
                              argv[i]);
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &addr.sin_addr);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        write(fd, buf, n) != (ssize_t)n) {
        close(fd);
        return -1;
    }
    got = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (got <= 0) return -1;
    buf[got] = '\0';
    if (buf[0] == '$') {
        char *body = strstr(buf, "\r\n");
        if (buf[1] == '-') {
            snprintf(reply, reply_len, "(nil)");
            return 0;
        }
        if (!body) return -1;
        body += 2;
        body[strcspn(body, "\r")] = '\0';
        snprintf(reply, reply_len, "%s", body);
    } else {
        buf[strcspn(buf, "\r")] = '\0';
        snprintf(reply, reply_len, "%s", buf + 1);
    }
    return 0;
}

static long raw_integer(const char *cmd, const char *arg) {
    char reply[256];
    const char *argv[2];
    argv[0] = cmd;
    argv[1] = arg;
    if (raw_command(reply, sizeof reply, arg ? 2 : 1, argv) != 0) return -1000;
    return strtol(reply, NULL, 10);
}

static lock_client_t open_client(void) {
    lock_client_t client = 0;
    CHECK_STATUS(lock_client_open(url, &client), LOCK_OK);
    return client;
}

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

    CHECK_STATUS(lock_acquire_options_init(&fixed), LOCK_OK);
    fixed.renew = false;
    CHECK_STATUS(lock_acquire_opts(client, "c:timeline", 150, 0, &fixed, &a), LOCK_OK);
    sleep_ms(400);
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
    CHECK_STATUS(lock_acquire_options_init(&opts), LOCK_OK);
    opts.on_lost = on_lost;
    opts.user_data = &rec;
    CHECK_STATUS(lock_acquire_opts(client, "c:lost", 300, 0, &opts, &lock), LOCK_OK);
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
    CHECK_STATUS(lock_client_options_init(NULL), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_options_init(&opts), LOCK_OK);
    CHECK_STATUS(lock_client_open_opts(url, NULL, &other), LOCK_ERR_ARGUMENT);
    opts.io_timeout_ms = 0;
    CHECK_STATUS(lock_client_open_opts(url, &opts, &other), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_options_init(&opts), LOCK_OK);
    opts.pool_size = 0;
    CHECK_STATUS(lock_client_open_opts(url, &opts, &other), LOCK_ERR_ARGUMENT);
    CHECK_STATUS(lock_client_options_init(&opts), LOCK_OK);
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

int main(void) {
    const char *port_text = getenv("REDIS_PORT");
    url = getenv("REDIS_URL");
    host = getenv("REDIS_HOST");
    if (!url || !host || !port_text) {
        fprintf(stderr, "set REDIS_URL, REDIS_HOST and REDIS_PORT\n");
        return 2;
    }
    port = atoi(port_text);

    test_acquire_busy_extend_release();
    test_expired_lease_does_not_touch_next_holder();
    test_lost_callback();
    test_bad_input();
    test_close_releases_held_locks();
    test_threads_keep_an_exact_counter();

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
