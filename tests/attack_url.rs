//! Attack: passwords in URLs people paste, shown in error messages.

mod support;

use std::time::Duration;

use redlease::{Client, ClientOptions};

fn shown(url: &str) -> String {
    let options = ClientOptions::default()
        .io_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200));
    match Client::with_options(url, options) {
        Ok(client) => {
            let err = client.ping().unwrap_err();
            format!("{err} | {err:?} | {client:?} | {}", client.url())
        }
        Err(err) => format!("{err} | {err:?}"),
    }
}

/// Unix-socket URLs with the credentials in the user-info part, as go-redis documents them
/// (`unix://user:password@/path/to/redis.sock`) and people paste them: no error may show
/// the password (the parser once quoted everything before `?` as the socket path).
#[test]
fn unix_urls_with_user_info_never_leak_the_password() {
    let secret = "Sup3rS3cretZZ9";
    let mut leaks = Vec::new();
    for url in [
        format!("redis+unix://:{secret}@/tmp/redis.sock"),
        format!("unix://alice:{secret}@/tmp/redis.sock?db=1"),
        format!("redis+unix://alice:{secret}@/tmp/redis.sock"),
    ] {
        let text = shown(&url);
        if text.contains(secret) {
            leaks.push(text);
        }
    }
    assert!(
        leaks.is_empty(),
        "the password is shown:\n{}",
        leaks.join("\n")
    );
}
