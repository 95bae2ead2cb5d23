//! A TrainingJob as both readers take it: the YAML file `foresight run` loads
//! (`local::load_job`: parse, apiVersion/kind check, `api::validate`), and the JSON the API
//! server hands the operator's controller (serde_json, then `api::validate`).
//!
//! Checked: no panic; a spec that validates is a valid update of itself (`validate_update`),
//! yields the PS's and a worker's environment (`ps_env`, `worker_env`), and survives the API
//! server's JSON (serialize, parse back: the same spec, still valid).
#![no_main]

use std::path::PathBuf;
use std::sync::LazyLock;

use foresight_fuzz::write_seeds_if_asked;
use foresight_operator::api::{TrainingJob, ps_env, validate, validate_update, worker_env};
use foresight_operator::local::load_job;
use libfuzzer_sys::fuzz_target;

static FILE: LazyLock<PathBuf> = LazyLock::new(|| {
    std::env::temp_dir().join(format!("foresight-fuzz-trainingjob-{}.yaml", std::process::id()))
});

const EXAMPLES: [&str; 6] = [
    include_str!("../../examples/mnist-dcasgd.yaml"),
    include_str!("../../examples/mnist-dcasgd-cluster.yaml"),
    include_str!("../../examples/python/mnist.yaml"),
    include_str!("../../examples/python/mnist-cluster.yaml"),
    include_str!("../../examples/python/charlm.yaml"),
    include_str!("../../examples/python/hf_trainer.yaml"),
];

/// Each example's TrainingJob document (a file may also hold other objects), as YAML and JSON.
fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for doc in EXAMPLES.iter().flat_map(|y| y.split("\n---\n")).filter(|d| d.contains("kind: TrainingJob")) {
        let job: TrainingJob = serde_yaml::from_str(doc).expect("an example parses");
        out.push(doc.as_bytes().to_vec());
        out.push(serde_json::to_vec(&job).expect("JSON"));
    }
    out
}

fn check_valid(job: &TrainingJob) {
    validate_update(&job.spec, &job.spec).expect("a valid spec is a valid update of itself");
    let _ = ps_env(&job.spec, "job", "default");
    let _ = worker_env(&job.spec, "job", "default", "http://job-ps:8080");
    let json = serde_json::to_vec(job).expect("a job serializes");
    let back: TrainingJob = serde_json::from_slice(&json).unwrap_or_else(|e| {
        panic!("a valid job does not survive JSON ({e}): {}", String::from_utf8_lossy(&json))
    });
    assert_eq!(back.spec, job.spec, "JSON changed the spec");
    validate(&back.spec).expect("still valid after JSON");
}

fuzz_target!(init: write_seeds_if_asked(seeds), |data: &[u8]| {
    std::fs::write(&*FILE, data).expect("write the job file");
    if let Ok(job) = load_job(&FILE) {
        check_valid(&job);
    }
    if let Ok(job) = serde_json::from_slice::<TrainingJob>(data) {
        match validate(&job.spec) {
            Ok(()) => check_valid(&job),
            Err(errs) => {
                assert!(!errs.is_empty());
                assert!(validate_update(&job.spec, &job.spec).is_err());
            }
        }
    }
});
