//! The worker image cannot be built here (no Docker engine, no registry), so its Dockerfile is
//! linted with hadolint and checked against the rest of the repository.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn dockerfile() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")
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

fn lint(path: &Path) -> (bool, String) {
    let out = Command::new(hadolint())
        .arg("--no-color")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("running hadolint on {}: {e}", path.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn hadolint_passes_on_the_worker_dockerfile() {
    let (ok, text) = lint(&dockerfile());
    assert!(ok, "hadolint found problems in worker-image/Dockerfile:\n{text}");
}

#[test]
fn hadolint_does_flag_a_bad_dockerfile() {
    // Guards against a lint that passes everything (a wrong binary, a config that ignores all).
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("Dockerfile");
    std::fs::write(&bad, "FROM ubuntu\nRUN apt-get install -y curl\n").unwrap();
    let (ok, text) = lint(&bad);
    assert!(
        !ok && text.contains("DL3006") && text.contains("DL3008"),
        "hadolint passed a bad Dockerfile:\n{text}"
    );
}

/// The value of `NAME=value` on the first line that starts with `prefix`.
fn assignment(text: &str, prefix: &str) -> String {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?}"))
        .trim()
        .trim_matches('"')
        .to_string()
}

#[test]
fn the_image_carries_the_torch_and_numpy_that_tests_use() {
    let docker = read(&dockerfile());
    let setup = read(&repo().join("scripts/setup-torch.sh"));
    for name in ["TORCH_VERSION", "NUMPY_VERSION"] {
        assert_eq!(
            assignment(&docker, &format!("ARG {name}=")),
            assignment(&setup, &format!("{name}=")),
            "worker-image/Dockerfile and scripts/setup-torch.sh pin different {name}s"
        );
    }
}

#[test]
fn the_builder_copies_every_workspace_member() {
    // cargo refuses a workspace whose members are missing, so a member added to Cargo.toml but
    // not copied would break the image build, which nothing here can run.
    let manifest = read(&repo().join("Cargo.toml"));
    let members = manifest
        .split_once("members")
        .and_then(|(_, rest)| rest.split_once('['))
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("a members list in the workspace Cargo.toml");
    let docker = read(&dockerfile());
    let copies: Vec<&str> =
        docker.lines().filter(|l| l.starts_with("COPY ") && !l.contains("--from")).collect();
    let mut n = 0;
    for member in members.split(',').map(|m| m.trim().trim_matches('"')).filter(|m| !m.is_empty()) {
        n += 1;
        assert!(
            copies.iter().any(|l| l.split_whitespace().nth(1) == Some(member)),
            "workspace member {member} is not copied into the builder: {copies:?}"
        );
    }
    assert!(n >= 2, "parsed {n} workspace members from {members:?}");
    for file in ["Cargo.toml", "Cargo.lock", "rust-toolchain.toml"] {
        assert!(repo().join(file).is_file());
        assert!(copies.iter().any(|l| l.split_whitespace().any(|w| w == file)), "{file} is not copied");
    }
}

#[test]
fn the_runtime_stage_runs_the_worker_as_a_numeric_non_root_user() {
    let docker = read(&dockerfile());
    let stages: Vec<&str> = docker.split("\nFROM ").skip(1).collect();
    assert_eq!(stages.len(), 3, "a builder, the runtime's base and the runtime stage");
    // tools/build-images.sh replaces the base with one of its own (Debian bookworm's python3.11
    // made with mmdebstrap): the Dockerfile's base must be the same Debian and Python.
    assert!(
        stages[1].starts_with("debian:bookworm") && stages[1].contains("python3.11"),
        "the runtime's base is Debian bookworm with python3.11: {}",
        &stages[1][..60]
    );
    let runtime = stages[2];
    assert!(runtime.starts_with("runtime-base\n"), "the runtime stage is on runtime-base");
    assert!(runtime.contains("PYTHONPATH=/opt/site-packages"), "python finds torch and foresight");
    assert!(runtime.contains("NVIDIA_DRIVER_CAPABILITIES="), "the NVIDIA toolkit mounts the driver");
    let user = assignment(runtime, "USER ");
    let uid: u32 =
        user.split(':').next().unwrap().parse().unwrap_or_else(|_| panic!("USER {user} is not numeric"));
    assert_ne!(uid, 0, "the worker must not run as root");
    assert!(
        runtime.contains("\nENTRYPOINT [\"/usr/local/bin/foresight-worker\"]"),
        "the binary is the entrypoint"
    );
    assert!(runtime.contains("\nEXPOSE 9090"), "the metrics port is exposed");
    assert!(runtime.contains("LD_LIBRARY_PATH="), "libtorch is found at run time");
}
