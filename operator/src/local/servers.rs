//! The job's parameter server under `foresight run`: one process, or one per shard
//! (`parameterServer.replicas`), each started again on its own address when it dies, with its
//! own checkpoints. Shard 0 knows the others (`FORESIGHT_PS_PEERS`): finalizing it finalizes
//! them and writes the whole model's final file, as an unsharded PS would have.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use foresight_ps::client::PsClient;
use futures_util::future::{join_all, select_all};
use tokio::process::Child;

use super::{Inherited, Proc, Program, RunError, failed_status, port_of, setup, spawn, wait_ready};

/// One PS process.
struct Server {
    proc_: Proc,
    child: Child,
    env: Vec<(String, String)>,
    log: PathBuf,
    url: String,
    /// Held for the whole run and inherited by every start of this shard.
    listener: TcpListener,
}

pub(super) struct Servers {
    bin: PathBuf,
    servers: Vec<Server>,
    /// Shards: `servers.len()` once all started.
    count: usize,
    /// Shard 0's: the one the workers report progress to, and that finalizes the job.
    client: PsClient,
}

impl Servers {
    /// Starts one PS per listener with `env` and each one's address and checkpoint directory
    /// (`ckpt_dir`, or its `shard-<i>/`), and waits until each is ready. Shard 0 writes the
    /// final model into `out`; the others their final slices beside their checkpoints.
    pub(super) async fn start(
        bin: &Path,
        env: Vec<(String, String)>,
        listeners: Vec<TcpListener>,
        token: &str,
        ckpt_dir: &Path,
        out: &Path,
    ) -> Result<Self, RunError> {
        let n = listeners.len();
        check_earlier_checkpoints(ckpt_dir, n)?;
        let urls: Vec<String> =
            listeners.iter().map(|l| format!("http://127.0.0.1:{}", port_of(l))).collect();
        let client = PsClient::new(&urls[0], Some(token.to_string())).map_err(setup)?;
        let mut s = Self { bin: bin.to_path_buf(), servers: Vec::new(), count: n, client };
        for (i, listener) in listeners.into_iter().enumerate() {
            let (ckpt, log) = match n {
                1 => (ckpt_dir.to_path_buf(), out.join("logs/ps.log")),
                _ => (ckpt_dir.join(format!("shard-{i}")), out.join(format!("logs/ps-{i}.log"))),
            };
            let mut env = env.clone();
            env.extend([
                ("FORESIGHT_PS_LISTEN".into(), format!("127.0.0.1:{}", port_of(&listener))),
                ("FORESIGHT_CHECKPOINT_DIR".into(), ckpt.display().to_string()),
                ("FORESIGHT_PS_SHARD".into(), i.to_string()),
            ]);
            if i == 0 {
                env.push(("FORESIGHT_OUTPUT_DIR".into(), out.display().to_string()));
                if n > 1 {
                    env.push(("FORESIGHT_PS_PEERS".into(), urls[1..].join(",")));
                }
            }
            let server = s.spawn(i, env, log, urls[i].clone(), listener).await?;
            s.servers.push(server);
        }
        Ok(s)
    }

    async fn spawn(
        &self,
        i: usize,
        env: Vec<(String, String)>,
        log: PathBuf,
        url: String,
        listener: TcpListener,
    ) -> Result<Server, RunError> {
        let inherited = Inherited::new("FORESIGHT_PS_LISTEN_FD", &listener);
        let program = Program::bare(&self.bin);
        let (proc_, mut child) =
            spawn(&self.name(i), &program, &env, log.clone(), Stdio::null(), Some(inherited))?;
        wait_ready(&url, &mut child, &proc_).await?;
        Ok(Server { proc_, child, env, log, url, listener })
    }

    /// "parameter server", or "parameter server shard i" when there are several.
    pub(super) fn name(&self, i: usize) -> String {
        match self.count {
            1 => "parameter server".into(),
            _ => format!("parameter server shard {i}"),
        }
    }

    /// The shards' URLs in shard order, separated by commas: the workers' `FORESIGHT_PS_URL`.
    pub(super) fn urls(&self) -> String {
        self.servers.iter().map(|s| s.url.as_str()).collect::<Vec<_>>().join(",")
    }

    /// host:port of each shard, for Prometheus.
    pub(super) fn targets(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.url.trim_start_matches("http://").to_string()).collect()
    }

    /// CPU seconds (user and system) the PS processes running now have used, from /proc: a
    /// shard started again counts from its restart. `None` where /proc cannot say (not Linux).
    pub(super) fn cpu_seconds(&self) -> Option<f64> {
        self.servers
            .iter()
            .map(|s| cpu_seconds_of(&std::fs::read_to_string(format!("/proc/{}/stat", s.proc_.pid)).ok()?))
            .sum()
    }

    /// Shard 0's client.
    pub(super) fn first(&self) -> &PsClient {
        &self.client
    }

    /// Waits until a shard's process exits: which one, and how.
    pub(super) async fn exited(&mut self) -> (usize, ExitStatus) {
        let waits = self.servers.iter_mut().map(|s| Box::pin(s.child.wait()));
        let (status, i, _) = select_all(waits).await;
        (i, status.unwrap_or_else(|_| failed_status()))
    }

    /// Starts shard `i` again on its socket; it restores its newest checkpoint, or the
    /// workers re-seed it with their copies of its slice.
    pub(super) async fn restart(&mut self, i: usize) -> Result<(), RunError> {
        let s = &self.servers[i];
        let listener =
            s.listener.try_clone().map_err(|e| setup(format!("the {}'s socket: {e}", self.name(i))))?;
        let again = self.spawn(i, s.env.clone(), s.log.clone(), s.url.clone(), listener).await?;
        self.servers[i] = again;
        Ok(())
    }

    pub(super) fn failed(&self, i: usize, status: ExitStatus) -> RunError {
        self.servers[i].proc_.failed(status)
    }

    /// SIGTERM to every shard (each writes its last checkpoint), then up to `limit` for their
    /// exits: the first that failed or did not stop, as an error.
    pub(super) async fn stop(&mut self, limit: Duration) -> Result<(), RunError> {
        for s in &self.servers {
            s.proc_.signal("TERM");
        }
        let exits =
            join_all(self.servers.iter_mut().map(|s| tokio::time::timeout(limit, s.child.wait()))).await;
        for (i, exit) in exits.into_iter().enumerate() {
            match exit {
                Ok(Ok(s)) if s.success() => {}
                Ok(Ok(s)) => return Err(self.failed(i, s)),
                _ => {
                    return Err(setup(format!(
                        "the {} did not stop within {limit:?} of SIGTERM",
                        self.name(i)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Finalizes the job (shard 0 finalizes the others): the final model's file.
    pub(super) async fn finalize(&self) -> Result<Option<PathBuf>, RunError> {
        let answer = self.client.finalize().await.map_err(|e| setup(format!("finalizing the job: {e}")))?;
        Ok(answer.path.map(PathBuf::from))
    }
}

/// `--resume` with another shard count would restore slices that are not this run's: refused.
/// (Unsharded checkpoints lie in the directory itself, a sharded run's in `shard-<i>/`.)
fn check_earlier_checkpoints(dir: &Path, n: usize) -> Result<(), RunError> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    let names: Vec<String> =
        entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    let shard_dirs = names.iter().filter(|n| n.starts_with("shard-")).count();
    let unsharded = names.iter().any(|n| n.starts_with("ckpt-"));
    let earlier = match (unsharded, shard_dirs) {
        (false, 0) => return Ok(()),
        (true, _) => 1,
        (false, k) => k,
    };
    if earlier != n {
        return Err(setup(format!(
            "{} holds the checkpoints of a run with {earlier} parameter server shard(s), this job has {n}: \
             parameterServer.replicas cannot change for a job; choose another --out",
            dir.display()
        )));
    }
    Ok(())
}

/// User plus system CPU seconds from a `/proc/<pid>/stat` line (fields 14 and 15, counted in
/// USER_HZ, 100 per second in Linux's ABI). The command name, in parentheses, may hold spaces:
/// the fields are counted from after its closing parenthesis.
fn cpu_seconds_of(stat: &str) -> Option<f64> {
    const USER_HZ: f64 = 100.0;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    // After the name come state (field 3), ppid (4)…: utime (14) is the 12th, stime the 13th.
    Some((ticks(11)? + ticks(12)?) as f64 / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::cpu_seconds_of;

    #[test]
    fn cpu_seconds_are_read_past_a_command_name_with_spaces() {
        let stat = "4242 (foresight ps) S 1 4242 4242 0 -1 4194560 9000 0 12 0 1234 56 0 0 20 0 9 0 77 1 2";
        assert_eq!(cpu_seconds_of(stat), Some(12.9));
        assert_eq!(cpu_seconds_of("4242 (cut) S 1"), None);
        assert_eq!(cpu_seconds_of("no parenthesis"), None);
    }
}
