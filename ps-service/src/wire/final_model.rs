//! Where the final model was written, as the PS answers it (`POST /v1/finalize`, and the last
//! worker's `POST /v1/leave`) and as that worker records it in its container's termination
//! message: Kubernetes shows the message to the operator even when the operator cannot reach
//! the PS (a default-deny NetworkPolicy, a PS gone at the end), and a job whose model was never
//! written must not be reported as succeeded.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The environment variable naming the file a worker records the final model in (tests, or a
/// container whose `terminationMessagePath` is not the default).
pub const TERMINATION_MESSAGE_ENV: &str = "FORESIGHT_TERMINATION_MESSAGE";
/// Kubernetes' default `terminationMessagePath`: the kubelet creates it in every container, so
/// the record needs no change to the pod template (a running job's worker Job keeps its own
/// template across an operator upgrade). Written only where it already exists.
pub const DEFAULT_TERMINATION_MESSAGE: &str = "/dev/termination-log";

/// Where this process records the final model: [`TERMINATION_MESSAGE_ENV`]'s file, else
/// Kubernetes' default path when it exists (in a container); `None` outside a pod.
pub fn termination_message_file() -> Option<std::path::PathBuf> {
    match std::env::var_os(TERMINATION_MESSAGE_ENV) {
        Some(f) => Some(f.into()),
        None => Some(std::path::PathBuf::from(DEFAULT_TERMINATION_MESSAGE)).filter(|p| p.is_file()),
    }
}

/// Kubernetes reads at most this many bytes of a termination message.
const TERMINATION_MESSAGE_LIMIT: usize = 4096;

/// The model version the final file holds, and the file's path in the PS's filesystem (`None`:
/// the PS has nowhere to write it and keeps it in memory only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalModel {
    pub version: u64,
    pub path: Option<String>,
    /// Where an earlier run's final model, found in `path`'s place, was kept
    /// (`checkpoint::keep_earlier_final_model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earlier: Option<String>,
}

/// A worker's termination message: `{"finalModel": {...}}`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TerminationMessage {
    final_model: FinalModel,
}

impl FinalModel {
    /// Writes the termination message to `file`.
    pub fn record(&self, file: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string(&TerminationMessage { final_model: self.clone() })?;
        if text.len() > TERMINATION_MESSAGE_LIMIT {
            return Err(std::io::Error::other(format!(
                "the final model's record is {} bytes, more than the {TERMINATION_MESSAGE_LIMIT} Kubernetes keeps",
                text.len()
            )));
        }
        std::fs::write(file, text)
    }

    /// The final model a termination message records; `None` for any other message (a
    /// container's own words, a truncated or hand-made record).
    pub fn from_termination_message(message: &str) -> Option<Self> {
        serde_json::from_str::<TerminationMessage>(message.trim()).ok().map(|m| m.final_model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_final_model_reads_back_and_nothing_else_reads_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("termination-log");
        let m = FinalModel {
            version: 812,
            path: Some("/models/job/model-final.safetensors".into()),
            earlier: None,
        };
        m.record(&file).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(FinalModel::from_termination_message(&text), Some(m.clone()));
        // An earlier run's model kept aside is part of the record; a record without the field
        // (an older worker's) reads as none kept.
        let kept =
            FinalModel { earlier: Some("/models/job/model-final.before-1.safetensors".into()), ..m.clone() };
        kept.record(&file).unwrap();
        assert_eq!(
            FinalModel::from_termination_message(&std::fs::read_to_string(&file).unwrap()),
            Some(kept)
        );
        let older = r#"{"finalModel": {"version": 812, "path": "/models/job/model-final.safetensors"}}"#;
        assert_eq!(FinalModel::from_termination_message(older), Some(m.clone()));
        let memory_only = FinalModel { version: 3, path: None, earlier: None };
        memory_only.record(&file).unwrap();
        assert_eq!(
            FinalModel::from_termination_message(&std::fs::read_to_string(&file).unwrap()),
            Some(memory_only)
        );
        for other in [
            "",
            "done",
            "{}",
            r#"{"finalModel": {"version": -1}}"#,
            r#"{"finalModel": {"version": 1, "path": null}, "x": 1}"#,
        ] {
            assert_eq!(FinalModel::from_termination_message(other), None, "{other}");
        }
        let long = FinalModel { version: 1, path: Some("x".repeat(5000)), earlier: None };
        assert!(long.record(&file).is_err(), "a record Kubernetes would cut is refused");
    }
}
