//! Runs bindings/python/benchmarks/bench.py against the library built in target/release.

use std::collections::BTreeMap;

use crate::Bench;

/// The numbers of the JSON object bench.py prints, or `None` (said on stderr) when it
/// could not run.
pub(crate) fn run(
    bench: &Bench,
    py: &str,
    workload: &str,
    threads: usize,
) -> Option<BTreeMap<String, f64>> {
    let root = env!("CARGO_MANIFEST_DIR");
    let lib = format!("{root}/target/release/libredlease.so");
    let out = std::process::Command::new(py)
        .arg(format!("{root}/bindings/python/benchmarks/bench.py"))
        .args([
            workload,
            &bench.url,
            &bench.cfg.duration.as_secs_f64().to_string(),
            &threads.to_string(),
        ])
        .env("REDLEASE_LIB", &lib)
        .env("PYTHONPATH", format!("{root}/bindings/python"))
        .output();
    let out = match out {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => {
            eprintln!(
                "python bench failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        Err(e) => {
            eprintln!("python bench not run: {e}");
            return None;
        }
    };
    Some(
        out.trim()
            .trim_matches(['{', '}'])
            .split(',')
            .filter_map(|kv| {
                let (k, v) = kv.split_once(':')?;
                Some((
                    k.trim().trim_matches('"').to_owned(),
                    v.trim().parse().ok()?,
                ))
            })
            .collect(),
    )
}
