//! The client and the server do not import each other's vocabulary: `client/` never names
//! `crate::server`, and in `server/` only `peers.rs` (shard 0 calling its peer shards) names
//! `crate::client`. The names both sides use are in `wire::protocol`.

use std::path::{Path, PathBuf};

fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// `file:line: line` for each line of the files under `dir` (but `except`) that names `path`
/// outside a comment.
fn naming(dir: &str, path: &str, except: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut found = Vec::new();
    for file in sources(&root) {
        let name = file.strip_prefix(&root).expect("below its folder").display().to_string();
        if except.contains(&name.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a source file");
        for (n, line) in text.lines().enumerate() {
            if !line.trim_start().starts_with("//") && line.contains(path) {
                found.push(format!("{dir}/{name}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn the_client_never_uses_the_server() {
    let found = naming("client", "crate::server", &[]);
    assert!(
        found.is_empty(),
        "client/ uses the server (name it in wire::protocol instead):\n{}",
        found.join("\n")
    );
}

#[test]
fn only_the_peer_calls_use_the_client() {
    let found = naming("server", "crate::client", &["peers.rs"]);
    assert!(found.is_empty(), "server/ uses the client outside peers.rs:\n{}", found.join("\n"));
    assert!(!naming("server", "crate::client", &[]).is_empty(), "peers.rs is where shard 0 calls its peers");
}
