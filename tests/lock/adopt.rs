//! Adopting a held lock: a guard for a lock another process holds under a token it handed
//! over, checked on the server, with its fencing token and lease; either holder's release
//! ends the lock for both, and the other learns it as a loss.

use std::time::Duration;

use redlease::{Client, ErrorKind, LostReason};

use crate::support::RedisServer;

#[test]
fn an_adopted_lock_is_an_ordinary_guard_with_the_holders_fencing_token() {
    let server = RedisServer::start();
    let scheduler = Client::open(&server.url()).unwrap();
    let worker = Client::open(&server.url()).unwrap();
    let held = scheduler
        .lock("job")
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .unwrap();
    let lost = held.lost();

    let adopted = worker
        .lock("job")
        .ttl(Duration::from_secs(1))
        .adopt(held.token())
        .unwrap();
    assert_eq!(adopted.token(), held.token());
    assert_eq!(adopted.fencing_token(), held.fencing_token());
    assert!(adopted.is_held());
    let left = adopted.remaining();
    assert!(
        left > Duration::from_secs(8) && left <= Duration::from_secs(10),
        "{left:?}"
    );

    // The worker renews it (to its own ttl) and extends it.
    adopted.extend(Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(1500)); // past the adopter's ttl: renewed
    assert!(adopted.is_held());
    assert_eq!(server.cmd::<String>(&["GET", "job"]), held.token());

    // The worker's release ends it; the scheduler learns of it as a loss.
    adopted.release().unwrap();
    assert!(!server.cmd::<bool>(&["EXISTS", "job"]));
    let err = held.extend(Duration::from_secs(10)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    assert_eq!(
        lost.recv_timeout(Duration::from_secs(2)).unwrap(),
        LostReason::NotHeld
    );
}

#[test]
fn a_token_that_does_not_hold_the_lock_is_not_adopted() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let err = client.adopt("free", "no-such-token").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    let held = client.lock("taken").try_acquire().unwrap();
    assert_eq!(
        client.adopt("taken", "another-token").unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    // Bad input is refused before anything is sent.
    for bad in ["", &"t".repeat(redlease::MAX_TOKEN_LEN + 1)] {
        assert_eq!(
            client.adopt("taken", bad).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }
    let reentrant = client
        .lock("re")
        .reentrant_as("owner")
        .try_acquire()
        .unwrap();
    assert_eq!(
        client.adopt("re", reentrant.token()).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        client
            .semaphore("taken", 2)
            .adopt(held.token())
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    // A name held as another kind: refused clearly, not a server's WRONGTYPE.
    let permit = client.semaphore("sem", 2).try_acquire().unwrap();
    let err = client.adopt("sem", permit.token()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    permit.release().unwrap();
    held.release().unwrap();
    reentrant.release().unwrap();
}

#[test]
fn an_abandoned_lock_keeps_its_key_until_its_lease_ends_and_can_be_adopted() {
    let server = RedisServer::start();
    let client = Client::open(&server.url()).unwrap();
    let held = client
        .lock("handed")
        .ttl(Duration::from_millis(800))
        .try_acquire()
        .unwrap();
    let token = held.token().to_owned();
    held.abandon(); // stops renewing, sends nothing
    assert_eq!(server.cmd::<String>(&["GET", "handed"]), token);
    let adopted = client
        .lock("handed")
        .ttl(Duration::from_secs(2))
        .adopt(&token)
        .unwrap();
    std::thread::sleep(Duration::from_millis(1200)); // renewed by the adopter
    assert!(adopted.is_held());
    adopted.release().unwrap();

    let held = client
        .lock("left")
        .ttl(Duration::from_millis(400))
        .try_acquire()
        .unwrap();
    held.abandon();
    assert!(
        client.lock("left").try_acquire().is_err(),
        "still held until its lease ends"
    );
    std::thread::sleep(Duration::from_millis(700));
    client
        .lock("left")
        .try_acquire()
        .unwrap()
        .release()
        .unwrap();
}
