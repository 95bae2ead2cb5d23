//! The operator's and the parameter server's images cannot be built here (no Docker engine, no
//! registry), so their Dockerfiles (operator/Dockerfile, ps-service/Dockerfile) are linted with
//! hadolint and checked against the rest of the repository, as worker-image/tests/dockerfile.rs
//! does for the worker's.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// hadolint from PATH (`make` puts .venv/bin first), else the venv's.
fn hadolint() -> PathBuf {
    let venv = repo().join(".venv/bin/hadolint");
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("hadolint"))
        .find(|p| p.is_file())
        .or_else(|| venv.is_file().then(|| venv.clone()))
        .unwrap_or_else(|| panic!("hadolint is not on PATH nor at {}: run `make setup`", venv.display()))
}

/// The images: Dockerfile, binary, the crate it comes from, the port it serves.
const IMAGES: &[(&str, &str, &str, u16)] = &[
    ("operator/Dockerfile", "foresight", "foresight-operator", 8080),
    ("ps-service/Dockerfile", "foresight-ps", "foresight-ps", 8080),
];

#[test]
fn hadolint_passes_on_the_operator_and_ps_dockerfiles() {
    for (file, ..) in IMAGES {
        let path = repo().join(file);
        let out = Command::new(hadolint())
            .arg("--no-color")
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("running hadolint on {}: {e}", path.display()));
        assert!(
            out.status.success(),
            "hadolint found problems in {file}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_builders_copy_every_workspace_member() {
    // cargo refuses a workspace whose members are missing, so a member added to Cargo.toml but
    // not copied would break the image builds, which nothing here can run.
    let manifest = read(&repo().join("Cargo.toml"));
    let members: Vec<String> = manifest
        .split_once("members")
        .and_then(|(_, rest)| rest.split_once('['))
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("a members list in the workspace Cargo.toml")
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect();
    assert!(members.len() >= 2, "parsed {members:?}");
    for (file, ..) in IMAGES {
        let docker = read(&repo().join(file));
        let copies: Vec<&str> =
            docker.lines().filter(|l| l.starts_with("COPY ") && !l.contains("--from")).collect();
        for member in &members {
            assert!(
                copies.iter().any(|l| l.split_whitespace().nth(1) == Some(member.as_str())),
                "{file}: workspace member {member} is not copied into the builder: {copies:?}"
            );
        }
        for f in ["Cargo.toml", "Cargo.lock", "rust-toolchain.toml"] {
            assert!(copies.iter().any(|l| l.split_whitespace().any(|w| w == f)), "{file}: {f} is not copied");
        }
    }
}

#[test]
fn each_image_builds_its_binary_and_runs_it_as_a_numeric_non_root_user() {
    let toolchain = read(&repo().join("rust-toolchain.toml"));
    let channel = toolchain
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .map(|v| v.trim_start_matches([' ', '=']).trim().trim_matches('"').to_string())
        .expect("rust-toolchain.toml names a channel");
    for (file, bin, krate, port) in IMAGES {
        let docker = read(&repo().join(file));
        let stages: Vec<&str> = docker.split("\nFROM ").skip(1).collect();
        assert_eq!(stages.len(), 2, "{file}: a builder and a runtime stage");
        let (builder, runtime) = (stages[0], stages[1]);
        assert!(
            builder.starts_with(&format!("rust:{channel}-")),
            "{file}: the builder uses the toolchain of rust-toolchain.toml ({channel})"
        );
        assert!(
            builder.contains(&format!("cargo build --release --locked -p {krate} --bin {bin}")),
            "{file}: the builder builds {bin} of {krate}"
        );
        assert!(!runtime.contains("torch"), "{file}: the runtime carries no libtorch");
        let user = runtime
            .lines()
            .find_map(|l| l.strip_prefix("USER "))
            .unwrap_or_else(|| panic!("{file}: no USER in the runtime stage"));
        let uid: u32 =
            user.split(':').next().unwrap().trim().parse().unwrap_or_else(|_| panic!("USER {user}"));
        assert_eq!(uid, 10001, "{file}: the numeric non-root user the chart's securityContext names");
        assert!(runtime.contains(&format!("\nEXPOSE {port}")), "{file}: port {port} is exposed");
        let entrypoint = if *bin == "foresight" {
            "ENTRYPOINT [\"/usr/local/bin/foresight\", \"operator\"]".to_string()
        } else {
            format!("ENTRYPOINT [\"/usr/local/bin/{bin}\"]")
        };
        assert!(runtime.contains(&format!("\n{entrypoint}")), "{file}: {entrypoint}");
    }
}
