//! Packaging: the committed header is the generated one, its version macros are the
//! library's, and the library's log records reach a C log callback (through the C ABI, as a
//! C program would set it).

use std::ffi::{CStr, c_char, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redlease::ffi::*;

use crate::support::{self, RedisServer};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The header build.rs generated for this very build.
const GENERATED_HEADER: &str = include_str!(concat!(env!("OUT_DIR"), "/redlease.h"));

#[test]
fn the_committed_header_is_the_generated_one() {
    let committed = std::fs::read_to_string(format!("{ROOT}/include/redlease.h"))
        .expect("read include/redlease.h");
    assert!(
        committed == GENERATED_HEADER,
        "include/redlease.h differs from the header build.rs generates from src/ffi: run \
         scripts/header.sh and commit include/redlease.h"
    );
}

/// The value of `#define NAME value` in the header.
fn define(name: &str) -> String {
    GENERATED_HEADER
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix("#define ")?.strip_prefix(name)?;
            rest.starts_with(' ').then(|| rest.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no #define {name} in the header"))
}

#[test]
fn the_version_macros_match_lock_version_and_the_crate() {
    let major = define("REDLEASE_VERSION_MAJOR");
    let minor = define("REDLEASE_VERSION_MINOR");
    let patch = define("REDLEASE_VERSION_PATCH");
    let joined = format!("{major}.{minor}.{patch}");
    assert_eq!(joined, env!("CARGO_PKG_VERSION"));
    assert_eq!(define("REDLEASE_VERSION_STRING"), format!("\"{joined}\""));
    let number: u32 = define("REDLEASE_VERSION_NUMBER").parse().unwrap();
    let parts: Vec<u32> = [&major, &minor, &patch]
        .iter()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(number, parts[0] * 10000 + parts[1] * 100 + parts[2]);
    // SAFETY: lock_version returns a static NUL-terminated string.
    let library = unsafe { CStr::from_ptr(lock_version()) };
    assert_eq!(library.to_str().unwrap(), joined);
    assert_eq!(define("REDLEASE_SOVERSION"), "0");
}

#[test]
fn the_log_levels_are_in_the_header_in_order() {
    let levels = [
        ("LOCK_LOG_ERROR", LOCK_LOG_ERROR),
        ("LOCK_LOG_WARN", LOCK_LOG_WARN),
        ("LOCK_LOG_INFO", LOCK_LOG_INFO),
        ("LOCK_LOG_DEBUG", LOCK_LOG_DEBUG),
        ("LOCK_LOG_TRACE", LOCK_LOG_TRACE),
    ];
    for (i, (name, value)) in levels.iter().enumerate() {
        assert_eq!(define(name), value.to_string());
        assert_eq!(*value, i as i32 + 1);
    }
    assert!(GENERATED_HEADER.contains(
        "int32_t lock_set_log_callback(int32_t min_level, lock_log_cb callback, void *user_data);"
    ));
}

/// One record as the callback saw it.
#[derive(Debug, Clone)]
struct Seen {
    level: i32,
    target: String,
    message: String,
    thread: std::thread::ThreadId,
}

unsafe extern "C" fn collect(
    level: i32,
    target: *const c_char,
    message: *const c_char,
    user_data: *mut c_void,
) {
    // SAFETY: user_data is the &'static Mutex given to lock_set_log_callback below.
    let records = unsafe { &*user_data.cast::<Mutex<Vec<Seen>>>() };
    // SAFETY: the library passes NUL-terminated strings valid during the call.
    let (target, message) = unsafe { (CStr::from_ptr(target), CStr::from_ptr(message)) };
    records.lock().unwrap().push(Seen {
        level,
        target: target.to_string_lossy().into_owned(),
        message: message.to_string_lossy().into_owned(),
        thread: std::thread::current().id(),
    });
}

unsafe extern "C" fn reenter(_: i32, _: *const c_char, _: *const c_char, user_data: *mut c_void) {
    // SAFETY: user_data is the &'static Mutex<Option<i32>> given below.
    let status = unsafe { &*user_data.cast::<Mutex<Option<i32>>>() };
    // SAFETY: a NULL callback; the call is refused from inside a callback.
    let rc = unsafe { lock_set_log_callback(LOCK_LOG_WARN, None, std::ptr::null_mut()) };
    status.lock().unwrap().get_or_insert(rc);
}

fn records_of(records: &'static Mutex<Vec<Seen>>) -> Vec<Seen> {
    records.lock().unwrap().clone()
}

fn wait_for(records: &'static Mutex<Vec<Seen>>, what: impl Fn(&Seen) -> bool) -> bool {
    support::eventually(Duration::from_secs(10), || {
        records.lock().unwrap().iter().any(&what)
    })
}

fn open(server: &RedisServer) -> lock_client_t {
    let url = std::ffi::CString::new(server.url()).unwrap();
    let mut opts = std::mem::MaybeUninit::<lock_client_options_t>::uninit();
    let mut client: lock_client_t = 0;
    // SAFETY: a local struct of the right size, a NUL-terminated URL and an out-pointer.
    unsafe {
        assert_eq!(
            lock_client_options_init(
                opts.as_mut_ptr(),
                std::mem::size_of::<lock_client_options_t>()
            ),
            LOCK_OK
        );
        let mut opts = opts.assume_init();
        // Short, yet long enough for every acquire on a loaded host.
        opts.io_timeout_ms = 500;
        opts.connect_timeout_ms = 1000;
        assert_eq!(
            lock_client_open_opts(url.as_ptr(), &opts, &mut client),
            LOCK_OK
        );
    }
    client
}

fn acquire(client: lock_client_t, key: &str, ttl_ms: u64) -> lock_t {
    let key = std::ffi::CString::new(key).unwrap();
    let mut lock: lock_t = 0;
    // SAFETY: a NUL-terminated key and an out-pointer.
    let rc = unsafe { lock_acquire(client, key.as_ptr(), ttl_ms, 0, &mut lock) };
    assert_eq!(rc, LOCK_OK);
    lock
}

fn held(lock: lock_t) -> bool {
    let mut held = false;
    // SAFETY: an out-pointer to a local.
    assert_eq!(unsafe { lock_is_held(lock, &mut held) }, LOCK_OK);
    held
}

/// Logging is process-wide: every step that sets a callback is in this one test.
#[test]
fn log_records_reach_a_c_callback_from_renewal_threads() {
    let _one = crate::log_callback::one_at_a_time();
    static RECORDS: Mutex<Vec<Seen>> = Mutex::new(Vec::new());
    let user_data = (&raw const RECORDS).cast_mut().cast::<c_void>();
    let set = |level: i32, cb: lock_log_cb, data: *mut c_void| {
        // SAFETY: `collect`/`reenter` are callable from any thread; their user_data are
        // statics.
        unsafe { lock_set_log_callback(level, cb, data) }
    };

    // Arguments.
    assert_eq!(set(0, Some(collect), user_data), LOCK_ERR_ARGUMENT);
    assert_eq!(set(6, Some(collect), user_data), LOCK_ERR_ARGUMENT);
    assert_eq!(
        set(42, None, std::ptr::null_mut()),
        LOCK_OK,
        "NULL ignores the level"
    );

    let server = RedisServer::start();
    let client = open(&server);
    assert_eq!(set(LOCK_LOG_WARN, Some(collect), user_data), LOCK_OK);

    // 1. The key is deleted under a renewed lock: the renewal thread finds it gone and,
    // with nobody else told (no on_lost callback), warns that the lock was lost.
    let main = std::thread::current().id();
    let lock = acquire(client, "packaging:deleted", 300);
    let _: i64 = server.cmd(&["DEL", "packaging:deleted"]);
    assert!(
        wait_for(&RECORDS, |r| r.level == LOCK_LOG_WARN
            && r.message.contains("packaging:deleted")
            && r.message.contains("lost")),
        "no warning about the lost lock: {:?}",
        records_of(&RECORDS)
    );
    assert!(!held(lock));
    assert_eq!(lock_release(lock), LOCK_NOT_HELD);

    // 2. The server stops answering: renewals time out and are retried, with warnings
    // logged on the renewal thread, until the lease runs out. (The first renewal, 1 s in,
    // times out half a second later, well before the deadline.)
    let lock = acquire(client, "packaging:paused", 3000);
    server.pause();
    let warned = wait_for(&RECORDS, |r| {
        r.level == LOCK_LOG_WARN
            && r.target.starts_with("redlease::")
            && r.message
                .contains("renewing lock \"packaging:paused\" failed")
    });
    let lost = support::eventually(Duration::from_secs(10), || !held(lock));
    // Keep it stopped until the lock is given up, so no queued renewal extends it again.
    let gave_up = wait_for(&RECORDS, |r| {
        r.message.contains("packaging:paused") && r.message.contains("lost")
    });
    server.resume();
    let seen = records_of(&RECORDS);
    assert!(warned, "no renewal warning: {seen:?}");
    assert!(lost && gave_up, "the lock was not lost: {seen:?}");
    let renewal = seen
        .iter()
        .find(|r| r.message.contains("renewing lock"))
        .unwrap();
    assert_ne!(
        renewal.thread, main,
        "renewals are logged on renewal threads"
    );
    assert!(
        seen.iter().all(|r| r.level <= LOCK_LOG_WARN),
        "records below the level asked for: {seen:?}"
    );
    let _ = lock_release(lock);

    // 3. LOCK_LOG_ERROR: the same warnings are no longer delivered.
    RECORDS.lock().unwrap().clear();
    assert_eq!(set(LOCK_LOG_ERROR, Some(collect), user_data), LOCK_OK);
    let lock = acquire(client, "packaging:quiet", 300);
    let _: i64 = server.cmd(&["DEL", "packaging:quiet"]);
    assert!(support::eventually(Duration::from_secs(10), || !held(lock)));
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        records_of(&RECORDS).is_empty(),
        "{:?}",
        records_of(&RECORDS)
    );
    let _ = lock_release(lock);

    // 4. A callback may not set the callback (refused, not a deadlock).
    static REENTERED: Mutex<Option<i32>> = Mutex::new(None);
    let reenter_data = (&raw const REENTERED).cast_mut().cast::<c_void>();
    assert_eq!(set(LOCK_LOG_WARN, Some(reenter), reenter_data), LOCK_OK);
    let lock = acquire(client, "packaging:reenter", 300);
    let _: i64 = server.cmd(&["DEL", "packaging:reenter"]);
    assert!(support::eventually(Duration::from_secs(10), || REENTERED
        .lock()
        .unwrap()
        .is_some()));
    assert_eq!(*REENTERED.lock().unwrap(), Some(LOCK_ERR_ARGUMENT));
    let _ = lock_release(lock);

    // 5. NULL turns logging off: once the call returns, nothing more arrives.
    assert_eq!(set(LOCK_LOG_WARN, Some(collect), user_data), LOCK_OK);
    assert_eq!(set(LOCK_LOG_WARN, None, std::ptr::null_mut()), LOCK_OK);
    RECORDS.lock().unwrap().clear();
    let lock = acquire(client, "packaging:off", 300);
    let _: i64 = server.cmd(&["DEL", "packaging:off"]);
    let started = Instant::now();
    assert!(support::eventually(Duration::from_secs(10), || !held(lock)));
    std::thread::sleep(Duration::from_millis(100).saturating_sub(started.elapsed()));
    assert!(
        records_of(&RECORDS).is_empty(),
        "{:?}",
        records_of(&RECORDS)
    );
    let _ = lock_release(lock);
    assert_eq!(lock_client_close(client), LOCK_OK);
}
