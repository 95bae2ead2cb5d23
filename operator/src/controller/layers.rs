//! The controller's rooms import one way (the table in `mod.rs`): every `crate::controller::…`
//! and `super::…` path in `src/controller/` is read, resolved to the room it names, and checked
//! against the rooms listed before the importing one. A new import against the rule fails here
//! with its file and line, as Go's package rule or a crate boundary would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each room and the rooms it may use (besides itself). A room is a top-level module, or a file
/// named here: `kueue`'s pure half sits below `decide` and its API calls beside `write`; the
/// stores every reconcile shares (the caches, the record of writes, the Flavors, the back-off)
/// sit below `context`, which hands them to observe and write. A room listed admits its files
/// that are rooms of their own (`observe` admits `observe::caches`).
const RULES: &[(&str, &[&str])] = &[
    ("names", &[]),
    ("watch", &[]),
    ("telemetry", &[]),
    ("desired::ps_tls", &["desired::token", "names"]),
    ("desired::token", &[]),
    ("error", &["desired::ps_tls"]), // the certificate error is the TLS module's
    ("leadership", &["watch", "error"]),
    ("kueue", &["names"]),
    ("decide", &["kueue", "names"]),
    ("desired", &["decide", "kueue", "names"]),
    ("observe::pod_index", &["names"]),
    ("observe::ps_clients", &[]),
    ("observe::caches", &["observe::pod_index", "kueue", "names"]),
    ("write::applied", &[]),
    ("kueue::flavors", &["kueue", "error"]),
    ("reconcile::backoff", &[]),
    (
        "context",
        &[
            "observe::caches",
            "observe::ps_clients",
            "kueue::flavors",
            "write::applied",
            "reconcile::backoff",
            "telemetry",
            "leadership",
            "desired",
            "names",
            "watch",
        ],
    ),
    ("observe", &["context", "desired", "decide", "kueue", "telemetry", "names", "error"]),
    ("write", &["context", "observe", "desired", "decide", "kueue", "telemetry", "names", "error"]),
    ("kueue::admission", &["context", "write", "observe", "desired", "decide", "kueue", "names", "error"]),
    (
        "reconcile",
        &[
            "context",
            "write",
            "observe",
            "desired",
            "decide",
            "kueue",
            "leadership",
            "telemetry",
            "names",
            "watch",
            "error",
        ],
    ),
    (
        "run",
        &[
            "reconcile",
            "context",
            "observe",
            "write",
            "desired",
            "kueue",
            "leadership",
            "telemetry",
            "names",
            "watch",
            "error",
        ],
    ),
];

/// The room of a module path below `controller`: the longest of its prefixes that is a room
/// (`["kueue", "admission", "admit"]` → `kueue::admission`).
fn room(path: &[String]) -> Option<String> {
    (1..=path.len().min(2))
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|r| RULES.iter().any(|(name, _)| name == r))
}

/// Whether `from` may use `to`: the same room, or one its rule lists, or a file of a listed room
/// (or of its own) that is a room of its own.
fn allowed(from: &str, to: &str) -> bool {
    let within = |room: &str| to == room || to.starts_with(&format!("{room}::"));
    let rule = RULES.iter().find(|(name, _)| *name == from).map(|(_, may)| *may).unwrap_or_default();
    within(from) || rule.iter().any(|m| within(m))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the controller's sources") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a source file below `controller/` (`observe/pods.rs` → observe::pods;
/// a test file beside `x.rs` in `x/` belongs to `x`).
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// The controller paths a line names: `crate::controller::a::b` and `super::a` forms, resolved
/// against the file's own module.
fn targets(line: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for (i, _) in line.match_indices("crate::controller::") {
        let rest = &line[i + "crate::controller::".len()..];
        found.push(segments(rest));
    }
    for (i, _) in line.match_indices("super::") {
        if i > 0 && line[..i].ends_with("::") {
            continue; // super::super:: is counted by its first super
        }
        let mut rest = &line[i..];
        // Each `super` drops the module's last segment (`observe::pods` → `observe`).
        let mut base: Vec<String> = module.to_vec();
        while let Some(r) = rest.strip_prefix("super::") {
            rest = r;
            base.pop();
        }
        base.extend(segments(rest));
        found.push(base);
    }
    found
}

fn segments(rest: &str) -> Vec<String> {
    rest.split("::")
        .map_while(|s| {
            let name: String = s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            (!name.is_empty() && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())).then_some(name)
        })
        .collect()
}

#[test]
fn imports_point_one_way_and_form_no_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controller");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut against = Vec::new();
    let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(&root).expect("below controller/");
        if relative == Path::new("mod.rs") || relative == Path::new("layers.rs") {
            continue; // the module map re-exports; this file names paths in its table
        }
        let module = module_of(relative);
        let Some(from) = room(&module) else { continue };
        let text = std::fs::read_to_string(file).expect("a source file");
        // Inside an inline `mod tests { … }`, `super` is the file's own module.
        let mut inline = module.clone();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            if line.starts_with("mod ") && line.trim_end().ends_with('{') {
                inline.push("inline".into());
            }
            for target in targets(line, &inline) {
                let Some(to) = room(&target) else { continue };
                if !allowed(&from, &to) {
                    against.push(format!(
                        "{}:{}: {from} may not use {to}: {}",
                        relative.display(),
                        n + 1,
                        line.trim()
                    ));
                }
                if to != from {
                    edges.entry(from.clone()).or_default().push(to);
                }
            }
        }
    }
    assert!(against.is_empty(), "imports against the controller's layer rule:\n{}", against.join("\n"));
    // No circle between rooms either (the table could list two rooms for each other).
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                assert!(
                    next != start,
                    "a circle between the controller's rooms: {} -> {start}",
                    path.join(" -> ")
                );
                if !path.contains(next) {
                    stack.push((next.clone(), [path.clone(), vec![next.clone()]].concat()));
                }
            }
        }
    }
}

#[test]
fn the_check_sees_a_wrong_import() {
    // decide may not use write: the rule must refuse it, or the test above proves nothing.
    let decide = vec!["decide".to_string(), "status".to_string()];
    let wrong = targets("use crate::controller::write::job::publish;", &decide);
    let to = room(&wrong[0]).expect("a room");
    assert_eq!(to, "write");
    assert!(!allowed("decide", &to));
    let sibling = targets("use super::trouble::Trouble;", &decide);
    assert_eq!(room(&sibling[0]).as_deref(), Some("decide"));
    assert!(allowed("kueue::admission", "write"));
    assert!(!allowed("kueue", "write"));
}
