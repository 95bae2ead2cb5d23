//! Kueue (sigs.k8s.io/kueue, built from Go modules by `tools/build-kueue.sh`) installed into the
//! test control plane and its manager running on loopback, under `tools/kueue.sh`: the
//! supervisor lives as long as the write end of its stdin, held here (the same scheme as the
//! control plane's; see `support`'s module docs).

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};

use super::{ControlPlane, built, free_ports, repo_root};

pub struct Kueue {
    supervisor: Child,
    stdin: Option<ChildStdin>,
    _dir: tempfile::TempDir,
}

impl Kueue {
    /// Installs Kueue into `cp` and starts its manager (panics with its log when it cannot).
    pub fn start(cp: &ControlPlane) -> Self {
        let bin = built("build-kueue.sh").unwrap_or_else(|e| panic!("building Kueue: {e}"));
        let dir = tempfile::Builder::new().prefix("foresight-kueue.").tempdir().unwrap();
        let ports = free_ports(3);
        let mut supervisor = Command::new("bash")
            .arg(repo_root().join("tools/kueue.sh"))
            .env("BIN", &bin)
            .env("KUBECTL", cp.bin.join("kubectl"))
            .env("KUBECONFIG", &cp.kubeconfig)
            .env("WORK", dir.path())
            .env("WEBHOOK_PORT", ports[0].to_string())
            .env("HEALTH_PORT", ports[1].to_string())
            .env("METRICS_PORT", ports[2].to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("bash tools/kueue.sh starts");
        let stdin = supervisor.stdin.take();
        let mut line = String::new();
        BufReader::new(supervisor.stdout.take().unwrap()).read_line(&mut line).expect("kueue.sh stdout");
        assert_eq!(line.trim(), "READY", "Kueue did not start; its log is above");
        Self { supervisor, stdin, _dir: dir }
    }
}

impl Drop for Kueue {
    fn drop(&mut self) {
        drop(self.stdin.take()); // EOF: the supervisor stops the manager
        let _ = self.supervisor.wait();
    }
}
