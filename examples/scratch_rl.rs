//! scratch
use std::time::Instant;
fn main() {
    let urls: Vec<String> = (1..=3)
        .map(|i| format!("unix:///tmp/pp/m{i}.sock"))
        .collect();
    let urls: Vec<&str> = urls.iter().map(|s| s.as_str()).collect();
    let n: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let client = redlease::Client::redlock(&urls, redlease::ClientOptions::default()).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        client
            .lock("s:rl")
            .try_acquire()
            .unwrap()
            .release()
            .unwrap();
    }
    println!(
        "redlock {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
