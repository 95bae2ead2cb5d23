//! `foresight`: the Foresight CLI.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use foresight_operator::local::{self, RunOptions};

#[derive(Parser, Debug)]
#[command(version, about = "Foresight: asynchronous distributed training with delay-compensated SGD")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a TrainingJob YAML on this machine: one parameter server and its workers as local
    /// processes, with the environment the operator would give their pods.
    Run {
        /// The TrainingJob YAML (the same file `kubectl apply -f` takes).
        job: PathBuf,
        /// Output directory: model-final.safetensors, summary.json, plot.png, logs/, checkpoints/.
        #[arg(long, default_value = "out/run")]
        out: PathBuf,
        /// foresight-ps binary (default: next to this executable).
        #[arg(long, env = "FORESIGHT_PS_BIN")]
        ps_bin: Option<PathBuf>,
        /// foresight-worker binary (default: next to this executable).
        #[arg(long, env = "FORESIGHT_WORKER_BIN")]
        worker_bin: Option<PathBuf>,
        /// libtorch threads per worker (default: cores / workers).
        #[arg(long)]
        torch_threads: Option<usize>,
        /// Slow worker N down by factor F (straggler experiments), as N=F.
        #[arg(long, value_parser = parse_slowdown)]
        slow_worker: Vec<(usize, f64)>,
        /// No progress bar.
        #[arg(long)]
        no_progress: bool,
        /// Continue from the checkpoints an interrupted run left in --out.
        #[arg(long)]
        resume: bool,
    },
    /// Print the TrainingJob CustomResourceDefinition as YAML.
    Crd,
}

fn parse_slowdown(s: &str) -> Result<(usize, f64), String> {
    let (w, f) = s.split_once('=').ok_or("expected WORKER=FACTOR, e.g. 2=3")?;
    let w = w.parse().map_err(|_| format!("bad worker index {w:?}"))?;
    let f: f64 = f.parse().map_err(|_| format!("bad factor {f:?}"))?;
    if !(f.is_finite() && f >= 1.0) {
        return Err(format!("the factor must be ≥ 1, got {f}"));
    }
    Ok((w, f))
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Cmd::Crd => {
            print!("{}", foresight_operator::api::crd_yaml());
        }
        Cmd::Run { job, out, ps_bin, worker_bin, torch_threads, slow_worker, no_progress, resume } => {
            let mut opts = RunOptions::beside_current_exe(out);
            opts.ps_bin = ps_bin.unwrap_or(opts.ps_bin);
            opts.worker_bin = worker_bin.unwrap_or(opts.worker_bin);
            opts.torch_threads = torch_threads;
            opts.progress = !no_progress;
            opts.resume = resume;
            opts.worker_overrides = slow_worker
                .into_iter()
                .map(|(w, f)| (w, "FORESIGHT_SLOWDOWN".into(), f.to_string()))
                .collect();
            let result = match local::load_job(&job) {
                Ok(j) => local::run(&j, &opts).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(s) => {
                    let acc = s.accuracy.map_or("-".into(), |a| format!("{:.2}%", a * 100.0));
                    println!(
                        "{}: {} on {} workers, {:.1}s, {} updates, held-out accuracy {acc}, staleness p50 {} p99 {}",
                        s.job,
                        s.algorithm,
                        s.workers,
                        s.seconds,
                        s.updates,
                        s.staleness["p50"],
                        s.staleness["p99"]
                    );
                    println!(
                        "outputs in {}: summary.json, plot.png, model-final.safetensors",
                        opts.out.display()
                    );
                }
                Err(e) => {
                    eprintln!("foresight run: {e}");
                    std::process::exit(e.exit_code());
                }
            }
        }
    }
}
