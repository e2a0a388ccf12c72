//! Test fixtures shared with the integration tests: real `redis-server` processes of the
//! test's own and a fault-injecting proxy (`tests/support`, compiled here too so that unit
//! tests can run the crate's internals against real servers).

#[path = "../tests/support/mod.rs"]
pub(crate) mod support;

#[cfg(test)]
mod layout {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// Every `.rs` file under `dir`, as its module path (`backend::node`) and its text
    /// without test modules and comments.
    fn modules(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            let name = path
                .file_stem()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if path.is_dir() {
                modules(&path, &format!("{prefix}{name}::"), out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let module = match name {
                "lib" => "crate".to_owned(),
                "mod" => prefix.trim_end_matches("::").to_owned(),
                _ => format!("{prefix}{name}"),
            };
            let text = std::fs::read_to_string(&path).expect("a source file is readable");
            let code: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap_or_default()
                .lines()
                .map(|l| l.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            out.insert(module, code);
        }
    }

    /// The modules `code` names through `crate::` paths (`crate::a::{b, c::D}` names
    /// `a::b` and `a::c` when those are modules, else `a`).
    fn imports(code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
        let resolve = |segments: &[&str]| -> Option<String> {
            (1..=segments.len())
                .rev()
                .map(|n| segments[..n].join("::"))
                .find(|m| known.contains(m))
        };
        let mut found = BTreeSet::new();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            let base: Vec<&str> = rest[..end].split("::").filter(|s| !s.is_empty()).collect();
            let mut paths = vec![base.clone()];
            if rest[end..].starts_with('{') {
                let group = &rest[end + 1..rest[end..].find('}').map_or(end, |c| end + c)];
                paths = group
                    .split(',')
                    .map(|item| item.split(" as ").next().unwrap_or_default().trim())
                    .filter(|item| !item.is_empty())
                    .map(|item| {
                        let mut path = base.clone();
                        path.extend(item.split("::").filter(|s| !s.is_empty() && *s != "self"));
                        path
                    })
                    .collect();
            }
            found.extend(paths.iter().filter_map(|p| resolve(p)));
        }
        found
    }

    /// The issue that cut the protocol core asked for modules that import one another in
    /// one direction only: a circle (`client` ↔ `lock`, `batch` ↔ `node`) means neither
    /// can be read, tested or changed without the other.
    #[test]
    fn the_crates_modules_import_one_another_without_a_circle() {
        let mut code = BTreeMap::new();
        modules(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            "",
            &mut code,
        );
        let known: BTreeSet<String> = code.keys().cloned().collect();
        let edges: BTreeMap<&str, BTreeSet<String>> = code
            .iter()
            .map(|(m, text)| {
                let mut to = imports(text, &known);
                to.remove(m);
                (m.as_str(), to)
            })
            .collect();
        assert!(
            edges["lease"].contains("core::lease"),
            "the checker reads imports"
        );
        // Depth-first search for a back edge.
        fn visit<'a>(
            m: &'a str,
            edges: &'a BTreeMap<&str, BTreeSet<String>>,
            path: &mut Vec<&'a str>,
            done: &mut BTreeSet<&'a str>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|p| *p == m) {
                let mut circle: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
                circle.push(m.to_owned());
                return Some(circle);
            }
            if !done.insert(m) {
                return None;
            }
            path.push(m);
            for to in &edges[m] {
                if let Some(circle) = visit(to, edges, path, done) {
                    return Some(circle);
                }
            }
            path.pop();
            None
        }
        let mut done = BTreeSet::new();
        for m in edges.keys() {
            if let Some(circle) = visit(m, &edges, &mut Vec::new(), &mut done) {
                panic!(
                    "modules import one another in a circle: {}",
                    circle.join(" -> ")
                );
            }
        }
    }
}
