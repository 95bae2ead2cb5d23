//! Argo CD's health check for a TrainingJob (`charts/foresight/files/argocd-health.lua`, which
//! users put in `argocd-cm`), run here with Lua 5.1 (Argo CD's gopher-lua speaks 5.1) against
//! statuses as the operator writes them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use mlua::{Lua, LuaSerdeExt, Table};

use crate::api::{Phase, TrainingJobStatus};

const SCRIPT: &str = include_str!("../../../../charts/foresight/files/argocd-health.lua");

/// (hs.status, hs.message) for an object with `status` at `generation`.
fn health(generation: i64, status: Option<&TrainingJobStatus>) -> (String, String) {
    let obj = serde_json::json!({
        "apiVersion": "foresight.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j", "generation": generation},
        "status": status,
    });
    let lua = Lua::new();
    // JSON's nulls as nil, as Argo CD hands over an object without the fields.
    let options =
        mlua::serde::SerializeOptions::new().serialize_none_to_null(false).serialize_unit_to_null(false);
    let value = lua.to_value_with(&obj, options).unwrap();
    lua.globals().set("obj", value).unwrap();
    let hs: Table = lua.load(SCRIPT).eval().unwrap();
    (hs.get("status").unwrap(), hs.get("message").unwrap())
}

fn status(phase: Phase, reason: &str, message: &str, observed: i64) -> TrainingJobStatus {
    let condition = Condition {
        type_: format!("{phase:?}"),
        status: "True".into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    };
    TrainingJobStatus {
        phase: Some(phase),
        reason: Some(reason.into()),
        conditions: vec![condition],
        observed_generation: Some(observed),
        ..Default::default()
    }
}

#[test]
fn each_phase_has_the_health_argo_cd_gives_a_batch_job() {
    let cases = [
        (Phase::Created, "Progressing"),
        (Phase::Queued, "Progressing"),
        (Phase::Running, "Progressing"),
        (Phase::Restarting, "Progressing"),
        (Phase::Succeeded, "Healthy"),
        (Phase::Failed, "Degraded"),
        (Phase::Suspended, "Suspended"),
    ];
    for (phase, expected) in cases {
        let (health, message) = health(3, Some(&status(phase, "Why", "what happened", 3)));
        assert_eq!(health, expected, "{phase:?}");
        assert_eq!(message, format!("{phase:?} (Why): what happened"), "{phase:?}");
    }
}

#[test]
fn a_status_the_operator_has_not_written_yet_is_progressing() {
    assert_eq!(health(1, None).0, "Progressing");
    assert_eq!(health(1, Some(&TrainingJobStatus::default())).0, "Progressing");
    // A failed job whose spec changed since: the operator has not acted on the change.
    let (health, message) = health(4, Some(&status(Phase::Failed, "BackoffLimitExceeded", "", 3)));
    assert_eq!(
        (health.as_str(), message.as_str()),
        ("Progressing", "Waiting for the operator to act on generation 4")
    );
}
