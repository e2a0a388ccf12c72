//! What a failure says: readable to the person who reads it, the same for the same cause,
//! and printed sensibly by `main() -> Result<(), Box<dyn Error>>` (which shows `Debug`).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use redlease::{Client, ClientOptions, ErrorKind};

/// `?` in a `main` that returns `Box<dyn Error>` prints the error's `Debug`: the kind and
/// the message, not a struct dump.
#[test]
fn an_error_returned_from_main_prints_its_kind_and_message() {
    let client = Client::open("redis://127.0.0.1:1/0").unwrap();
    let e = client.lock("x").try_acquire().unwrap_err();
    let boxed: Box<dyn std::error::Error> = Box::new(e.clone());
    let shown = format!("{boxed:?}");
    assert!(shown.starts_with(&format!("{}: ", e.kind())), "{shown}");
    assert!(shown.contains("127.0.0.1:1"), "{shown}");
    assert!(!shown.contains("kind:") && !shown.contains('{'), "{shown}");
}

/// A host that does not resolve fails with one kind, whichever thread asks and however
/// long the resolver takes to say so (with a connect timeout of 1 ms, some lookups answer
/// in time and some do not: the two used to give different kinds).
#[test]
fn an_unknown_host_fails_with_the_same_kind_every_time() {
    let options = ClientOptions::default()
        .connect_timeout(Duration::from_millis(1))
        .io_timeout(Duration::from_millis(200));
    let client = Client::with_options("redis://no-such-host.invalid:6379/0", options).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            std::thread::spawn(move || {
                (0..3)
                    .map(|_| client.lock("x").try_acquire().unwrap_err())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for t in threads {
        for e in t.join().unwrap() {
            assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
            assert!(e.message().contains("no-such-host.invalid"), "{e}");
            assert!(!e.outcome_unknown(), "nothing was sent: {e}");
        }
    }
}

/// A port where another service answers (an HTTP proxy) is reported as such, in one line,
/// not with the parser's dump of the bytes it met.
#[test]
fn a_server_that_does_not_speak_redis_is_named_as_such() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\nContent-Length: 11\r\n\r\nBad Request",
            );
        }
    });
    let options = ClientOptions::default().io_timeout(Duration::from_secs(2));
    let client = Client::with_options(&format!("redis://127.0.0.1:{port}/0"), options).unwrap();
    let e = client.lock("x").try_acquire().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(
        e.message().contains(&format!(
            "the server at 127.0.0.1:{port} did not answer as a Redis server"
        )),
        "{e}"
    );
    assert!(!e.message().contains('\n'), "one line: {e}");
}
