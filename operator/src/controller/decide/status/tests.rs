use super::*;

fn observed() -> Observed {
    Observed {
        generation: Some(3),
        replicas: 4,
        worker_selector: "foresight.dev/job=mnist,app.kubernetes.io/component=worker".into(),
        min_replicas: None,
        backoff_limit: Some(2),
        suspend: false,
        admission: Admission::NotQueued,
        workers: Some(WorkerJob::default()),
        ps_ready: false,
        ps_shards: None,
        placement: Placement::Scheduled,
        trouble: None,
        trouble_bound: TroubleBound::Within,
        deferred: Vec::new(),
        deadline_exceeded: None,
        finalize: Finalize::NotYet,
        model_place: ModelPlace::EmptyDir,
        default_images: None,
        progress: None,
        ps_process: None,
        has_run: false,
    }
}

fn with_workers(f: impl FnOnce(&mut WorkerJob)) -> Observed {
    let mut o = observed();
    f(o.workers.as_mut().unwrap());
    o
}

fn t(s: &str) -> Time {
    Time(s.parse().unwrap())
}

#[test]
fn each_observation_leads_to_its_phase() {
    let running = |o: &mut WorkerJob| {
        o.active = 4;
        o.ready = 4;
    };
    let cases: Vec<(Observed, Phase, &str)> = vec![
        (Observed { workers: None, ..observed() }, Phase::Created, "Creating"),
        (observed(), Phase::Created, "Starting"),
        (
            Observed { placement: Placement::Unschedulable("0/1 nodes".into()), ..observed() },
            Phase::Created,
            "Unschedulable",
        ),
        (Observed { ps_ready: true, ..with_workers(running) }, Phase::Running, "WorkersRunning"),
        // A claim still being provisioned is not a scheduling failure (no Warning)...
        (
            Observed { placement: Placement::WaitingForClaims("claim c".into()), ..observed() },
            Phase::Created,
            "WaitingForVolumes",
        ),
        // ...and once the job ran, the phase says what is not ready.
        (
            Observed {
                placement: Placement::WaitingForClaims("claim c".into()),
                has_run: true,
                ..with_workers(running)
            },
            Phase::Restarting,
            "ParameterServerNotReady",
        ),
        // Workers up before the PS at the start: still starting.
        (with_workers(running), Phase::Created, "ParameterServerNotReady"),
        // Workers up, the PS gone after the job ran: not healthy.
        (Observed { has_run: true, ..with_workers(running) }, Phase::Restarting, "ParameterServerNotReady"),
        // Seen on a real node: finished workers' pods stop being ready before the Job counts
        // them; a job that ran never goes back to Created.
        (
            Observed {
                ps_ready: true,
                has_run: true,
                ..with_workers(|w| {
                    w.active = 2;
                    w.ready = 0;
                    w.succeeded = 2;
                })
            },
            Phase::Running,
            "WorkersNotAllReady",
        ),
        (
            Observed {
                ps_ready: true,
                ..with_workers(|w| {
                    w.active = 4;
                    w.ready = 3;
                    w.failed = 1;
                })
            },
            Phase::Restarting,
            "WorkerFailed",
        ),
        // Finished workers no longer need to be ready.
        (
            Observed {
                ps_ready: true,
                ..with_workers(|w| {
                    w.active = 1;
                    w.ready = 1;
                    w.succeeded = 3;
                })
            },
            Phase::Running,
            "WorkersRunning",
        ),
        // Suspended once the Job is suspended and its pods are gone, not when the spec says so.
        (
            Observed { suspend: true, ps_ready: true, has_run: true, ..with_workers(running) },
            Phase::Running,
            "Suspending",
        ),
        (Observed { suspend: true, ..with_workers(|w| w.active = 2) }, Phase::Created, "Suspending"),
        (
            Observed { suspend: true, ps_ready: true, ..with_workers(|w| w.stopped = true) },
            Phase::Suspended,
            "Suspended",
        ),
        // Waiting for Kueue: Queued once no worker runs (an evicted job stops its workers first).
        (
            Observed {
                admission: Admission::Pending("no quota".into()),
                ..with_workers(|w| w.stopped = true)
            },
            Phase::Queued,
            "Queued",
        ),
        (
            Observed {
                admission: Admission::Pending("evicted".into()),
                ps_ready: true,
                has_run: true,
                ..with_workers(running)
            },
            Phase::Running,
            "Requeuing",
        ),
        (
            Observed {
                admission: Admission::Admitted(Default::default()),
                ps_ready: true,
                ..with_workers(running)
            },
            Phase::Running,
            "WorkersRunning",
        ),
        (
            with_workers(|w| w.failed_condition = Some(("BackoffLimitExceeded".into(), "too many".into()))),
            Phase::Failed,
            "BackoffLimitExceeded",
        ),
        // A failed Job fails the job even while suspended or unschedulable.
        (
            Observed {
                suspend: true,
                placement: Placement::Unschedulable("x".into()),
                ..with_workers(|w| w.failed_condition = Some(("DeadlineExceeded".into(), "late".into())))
            },
            Phase::Failed,
            "DeadlineExceeded",
        ),
        (with_workers(|w| w.complete = true), Phase::Running, "Finalizing"),
        (
            Observed {
                finalize: Finalize::Failed("connection refused".into()),
                ..with_workers(|w| w.complete = true)
            },
            Phase::Running,
            "Finalizing",
        ),
        (
            Observed {
                finalize: Finalize::Done { version: 9, path: None, earlier: None },
                ..with_workers(|w| w.complete = true)
            },
            Phase::Succeeded,
            "Completed",
        ),
        (
            Observed { finalize: Finalize::GaveUp("gone".into()), ..with_workers(|w| w.complete = true) },
            Phase::Failed,
            "FinalModelNotWritten",
        ),
    ];
    for (o, phase, reason) in cases {
        let s = decide(&o);
        assert_eq!((s.phase, s.reason.as_str()), (phase, reason), "{o:?} -> {s:?}");
    }
}

#[test]
fn a_failing_worker_is_named_with_how_it_ended() {
    let oom = Some("pod mnist-workers-2-x, container worker: OOMKilled (exit code 137)".to_string());
    let failing = Observed {
        ps_ready: true,
        ..with_workers(|w| {
            (w.active, w.ready, w.failed) = (4, 3, 1);
            w.last_failure = oom.clone();
        })
    };
    let s = decide(&failing);
    assert_eq!(
        s.message,
        "1 worker pod(s) failed so far, replacing them; backoffLimit 2; the last failed worker: \
         pod mnist-workers-2-x, container worker: OOMKilled (exit code 137)"
    );
    let failed = with_workers(|w| {
        w.failed_condition =
            Some(("BackoffLimitExceeded".into(), "Job has reached the specified backoff limit".into()));
        w.last_failure = oom.clone();
    });
    let s = decide(&failed);
    assert_eq!(s.reason, "BackoffLimitExceeded");
    assert!(s.message.ends_with("backoff limit; the last failed worker: pod mnist-workers-2-x, container worker: OOMKilled (exit code 137)"), "{}", s.message);
}

#[test]
fn condition_times_move_only_when_their_status_changes() {
    let running = Observed {
        ps_ready: true,
        progress: Some(Progress { step: 5, ..Default::default() }),
        ..with_workers(|w| {
            w.active = 4;
            w.ready = 4;
        })
    };
    let s1 = next_status(
        &TrainingJobStatus::default(),
        &observed(),
        &decide(&observed()),
        &t("2026-01-01T00:00:00Z"),
    );
    assert_eq!(s1.phase, Some(Phase::Created));
    let types: Vec<&str> = s1.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        ["Created", "Running", "Reconciling", "SpecApplied"],
        "only conditions that have been true, Running, kstatus's Reconciling, and SpecApplied once there are children"
    );
    assert_eq!(
        s1.conditions[2].status, "True",
        "a job not yet running is still on its way (kstatus: InProgress)"
    );
    assert_eq!(s1.start_time, Some(t("2026-01-01T00:00:00Z")));
    assert_eq!(s1.observed_generation, Some(3));

    let s2 = next_status(&s1, &running, &decide(&running), &t("2026-01-01T00:01:00Z"));
    let c = |s: &TrainingJobStatus, ty: &str| s.conditions.iter().find(|c| c.type_ == ty).cloned().unwrap();
    assert_eq!(c(&s2, "Created").last_transition_time, t("2026-01-01T00:00:00Z"), "still true");
    assert_eq!(c(&s2, "Running").status, "True");
    assert_eq!(c(&s2, "Running").last_transition_time, t("2026-01-01T00:01:00Z"));
    assert_eq!(c(&s2, "Reconciling").status, "False", "running: kstatus's Current");
    assert_eq!(s2.progress.as_ref().unwrap().step, 5);
    assert_eq!(s2.start_time, s1.start_time, "start time kept");
    assert_eq!(s2.completion_time, None);

    // No fresh progress: the last one stays.
    let quiet = Observed { progress: None, ..running.clone() };
    let s3 = next_status(&s2, &quiet, &decide(&quiet), &t("2026-01-01T00:02:00Z"));
    assert_eq!(s3.progress.as_ref().unwrap().step, 5);
    assert_eq!(c(&s3, "Running").last_transition_time, t("2026-01-01T00:01:00Z"));

    let failed = with_workers(|w| w.failed_condition = Some(("DeadlineExceeded".into(), "late".into())));
    let s4 = next_status(&s3, &failed, &decide(&failed), &t("2026-01-01T00:03:00Z"));
    assert_eq!(s4.phase, Some(Phase::Failed));
    assert_eq!(c(&s4, "Running").status, "False");
    assert_eq!(c(&s4, "Running").reason, "DeadlineExceeded");
    assert_eq!(c(&s4, "Failed").status, "True");
    // kstatus reads Stalled as Failed (before, a failed job was "Current": Flux passed it).
    assert_eq!(
        (c(&s4, "Stalled").status.as_str(), c(&s4, "Stalled").reason.as_str()),
        ("True", "DeadlineExceeded")
    );
    assert_eq!(c(&s4, "Reconciling").status, "False");
    assert_eq!(s4.reason.as_deref(), Some("DeadlineExceeded"), "the phase's reason, for the column");
    assert_eq!(s4.completion_time, Some(t("2026-01-01T00:03:00Z")));
    assert!(s4.conditions.iter().all(|c| c.type_ != "Complete"), "never true, not shown");

    // Success sets Succeeded and its batch-Job name Complete, both true, with the same reason.
    let done = Observed {
        finalize: Finalize::Done { version: 9, path: None, earlier: None },
        ..with_workers(|w| w.complete = true)
    };
    let s5 = next_status(&s3, &done, &decide(&done), &t("2026-01-01T00:04:00Z"));
    for ty in ["Succeeded", "Complete"] {
        assert_eq!((c(&s5, ty).status.as_str(), c(&s5, ty).reason.as_str()), ("True", "Completed"), "{ty}");
    }
    assert_eq!(s5.reason.as_deref(), Some("Completed"));
    assert!(s5.conditions.iter().all(|c| c.type_ != "Stalled"), "never failed, never stalled");
}

#[test]
fn a_transition_is_a_change_of_phase_or_reason() {
    let now = t("2026-01-01T00:00:00Z");
    let o = observed();
    let state = decide(&o);
    assert!(transition(&TrainingJobStatus::default(), &state).is_some());
    let s = next_status(&TrainingJobStatus::default(), &o, &state, &now);
    assert!(transition(&s, &state).is_none(), "same phase and reason");
    let unschedulable = decide(&Observed { placement: Placement::Unschedulable("no GPU".into()), ..o });
    assert_eq!(unschedulable.phase, Phase::Created);
    let t2 = transition(&s, &unschedulable).expect("same phase, new reason");
    assert!(t2.is_warning());
}

#[test]
fn a_succeeded_job_shows_the_final_models_version_as_its_step() {
    let old = TrainingJobStatus {
        progress: Some(Progress { step: 588, epoch: 3, ..Default::default() }),
        ..Default::default()
    };
    let o = Observed {
        finalize: Finalize::Done { version: 640, path: None, earlier: None },
        ..with_workers(|w| w.complete = true)
    };
    let st = next_status(&old, &o, &decide(&o), &t("2026-01-01T00:00:00Z"));
    let p = st.progress.unwrap();
    assert_eq!((p.step, p.epoch), (640, 3), "the step follows the final model; the rest is kept");
}

#[test]
fn a_new_parameter_server_process_is_a_restart_with_a_condition_and_one_event() {
    let process = |incarnation: &str, restored_version| PsProcess {
        incarnation: incarnation.into(),
        started_at: t("2026-01-01T00:00:00Z"),
        restored_version,
        algorithm: Some("asgd".into()),
    };
    let running = with_workers(|w| {
        w.active = 4;
        w.ready = 4;
    });
    let seen = |p: Option<PsProcess>| Observed { ps_ready: true, ps_process: p, ..running.clone() };
    let step = |old: &TrainingJobStatus, o: &Observed, at: &str| next_status(old, o, &decide(o), &t(at));

    // The first process seen is not a restart.
    let s1 = step(&TrainingJobStatus::default(), &seen(Some(process("a", None))), "2026-01-01T00:01:00Z");
    let ps = s1.parameter_server.clone().unwrap();
    assert_eq!((ps.restarts, ps.incarnation.as_deref()), (0, Some("a")));
    assert_eq!(ps.algorithm.as_deref(), Some("asgd"), "the rule the PS says it applies");
    assert!(s1.conditions.iter().all(|c| c.type_ != PS_RESTARTED));
    assert_eq!(ps_restart_event(&TrainingJobStatus::default(), &s1), None);

    // Read again, or not read at all: nothing changes.
    let s2 = step(&s1, &seen(Some(process("a", None))), "2026-01-01T00:02:00Z");
    let s2 = step(&s2, &seen(None), "2026-01-01T00:03:00Z");
    assert_eq!(s2.parameter_server, s1.parameter_server.map(|p| ParameterServerStatus { ready: true, ..p }));

    // Another process answers: a restart, said once, with what it started from.
    let s3 = step(&s2, &seen(Some(process("b", Some(1200)))), "2026-01-01T00:04:00Z");
    assert_eq!(s3.parameter_server.as_ref().unwrap().restarts, 1);
    let cond = s3.conditions.iter().find(|c| c.type_ == PS_RESTARTED).unwrap();
    assert_eq!((cond.status.as_str(), cond.reason.as_str()), ("True", "RestoredCheckpoint"));
    assert!(cond.message.contains("version 1200"), "{}", cond.message);
    assert!(ps_restart_event(&s2, &s3).unwrap().contains("version 1200"));
    let s4 = step(&s3, &seen(Some(process("b", Some(1200)))), "2026-01-01T00:05:00Z");
    assert_eq!(ps_restart_event(&s3, &s4), None, "the same process again is not another restart");
    assert_eq!(s4.conditions.iter().find(|c| c.type_ == PS_RESTARTED), Some(cond), "the condition stays");

    // One without a checkpoint says the workers re-seed it.
    let s5 = step(&s4, &seen(Some(process("c", None))), "2026-01-01T00:06:00Z");
    assert_eq!(s5.parameter_server.as_ref().unwrap().restarts, 2);
    let cond = s5.conditions.iter().find(|c| c.type_ == PS_RESTARTED).unwrap();
    assert_eq!(cond.reason, "StartedWithoutCheckpoint");
    assert_eq!(cond.last_transition_time, t("2026-01-01T00:06:00Z"));
    assert!(ps_restart_event(&s4, &s5).unwrap().contains("re-seed"));

    // The first process seen restored the job's checkpoint: its predecessor died before anyone
    // recorded it (e.g. while the operator itself was being replaced), so it is a restart too.
    let late =
        step(&TrainingJobStatus::default(), &seen(Some(process("d", Some(31)))), "2026-01-01T00:07:00Z");
    assert_eq!(late.parameter_server.as_ref().unwrap().restarts, 1);
    let cond = late.conditions.iter().find(|c| c.type_ == PS_RESTARTED).unwrap();
    assert_eq!(cond.reason, "RestoredCheckpoint");
    assert!(ps_restart_event(&TrainingJobStatus::default(), &late).unwrap().contains("version 31"));
}

#[test]
fn the_status_says_where_the_final_model_is_and_whether_it_outlives_the_job() {
    let done = |place: ModelPlace, path: &str| {
        let o = Observed {
            finalize: Finalize::Done { version: 640, path: Some(path.into()), earlier: None },
            model_place: place,
            ..with_workers(|w| w.complete = true)
        };
        let state = decide(&o);
        (
            state.message.clone(),
            next_status(&TrainingJobStatus::default(), &o, &state, &t("2026-01-01T00:00:00Z")),
        )
    };
    let output = ModelPlace::Output { claim: "models".into(), dir: "runs/mnist".into() };
    assert_eq!(output.ps_dir(), "/output/runs/mnist");
    let (msg, st) = done(output, "/output/runs/mnist/model-final.safetensors");
    let m = st.final_model.unwrap();
    assert_eq!(
        (m.version, m.claim_name.as_deref(), m.path.as_str(), m.kept),
        (640, Some("models"), "runs/mnist/model-final.safetensors", true)
    );
    assert!(msg.contains("claim models") && msg.contains("outlives the job"), "{msg}");

    let (msg, st) = done(
        ModelPlace::CheckpointClaim { claim: "mnist-ps-checkpoints".into() },
        "/checkpoints/model-final.safetensors",
    );
    let m = st.final_model.unwrap();
    assert_eq!(
        (m.claim_name.as_deref(), m.path.as_str(), m.kept),
        (Some("mnist-ps-checkpoints"), "model-final.safetensors", false)
    );
    assert!(msg.contains("deleted with the job") && msg.contains("spec.output"), "{msg}");

    // An emptyDir goes with the PS: no location is claimed, and the message says so.
    let (msg, st) = done(ModelPlace::EmptyDir, "/checkpoints/model-final.safetensors");
    assert_eq!(st.final_model, None);
    assert!(msg.contains("emptyDir, which is removed with it"), "{msg}");

    // A job made again under the same name: the earlier run's model, found in the output
    // directory, was kept under another name, and the status says where.
    let o = Observed {
        finalize: Finalize::Done {
            version: 7,
            path: Some("/output/mnist/model-final.safetensors".into()),
            earlier: Some("/output/mnist/model-final.before-1764780000.safetensors".into()),
        },
        model_place: ModelPlace::Output { claim: "models".into(), dir: "mnist".into() },
        ..with_workers(|w| w.complete = true)
    };
    let msg = decide(&o).message;
    assert!(
        msg.contains("an earlier run's model-final.safetensors was there and is kept as mnist/model-final.before-1764780000.safetensors"),
        "{msg}"
    );
}

#[test]
fn an_asynchronous_job_with_min_replicas_runs_on_part_of_its_workers() {
    let ready = |n: u32, min: Option<u32>| {
        let o = Observed {
            ps_ready: true,
            min_replicas: min,
            ..with_workers(|w| {
                w.active = 4;
                w.ready = n;
            })
        };
        let state = decide(&o);
        let st = next_status(&TrainingJobStatus::default(), &o, &state, &t("2026-01-01T00:00:00Z"));
        let w = st.workers.unwrap();
        (state.phase, (w.ready, w.desired))
    };
    assert_eq!(ready(2, None), (Phase::Created, (2, 4)), "all four are needed by default");
    assert_eq!(ready(2, Some(2)), (Phase::Running, (2, 4)));
    assert_eq!(ready(1, Some(2)), (Phase::Created, (1, 4)));
    assert_eq!(ready(4, Some(2)), (Phase::Running, (4, 4)));
}

#[test]
fn a_failed_reconcile_shows_as_a_condition_until_one_succeeds() {
    let o = with_workers(|w| {
        w.active = 4;
        w.ready = 4;
    });
    let o = Observed { ps_ready: true, ..o };
    let ok = next_status(&TrainingJobStatus::default(), &o, &decide(&o), &t("2026-01-01T00:00:00Z"));
    assert!(ok.conditions.iter().all(|c| c.type_ != RECONCILE_FAILED), "absent until a failure");

    let quota = "persistentvolumeclaims \"j-ps-checkpoints\" is forbidden: exceeded quota";
    let failed = with_reconcile_failure(&ok, "Forbidden", quota, Some(3), &t("2026-01-01T00:01:00Z"));
    let c = failed.conditions.iter().find(|c| c.type_ == RECONCILE_FAILED).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str(), c.message.as_str()), ("True", "Forbidden", quota));
    assert_eq!(failed.phase, ok.phase, "the phase is what was last reached");
    // The same failure again changes nothing (no status write, no wake-up loop).
    let again = with_reconcile_failure(&failed, "Forbidden", quota, Some(3), &t("2026-01-01T00:02:00Z"));
    assert_eq!(again, failed);

    let recovered = next_status(&again, &o, &decide(&o), &t("2026-01-01T00:03:00Z"));
    let c = recovered.conditions.iter().find(|c| c.type_ == RECONCILE_FAILED).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Reconciled"));
    assert!(c.message.contains("exceeded quota"), "{}", c.message);
    assert_eq!(c.last_transition_time, t("2026-01-01T00:03:00Z"));
    let later = next_status(&recovered, &o, &decide(&o), &t("2026-01-01T00:04:00Z"));
    assert_eq!(later.conditions, recovered.conditions, "stays False, unchanged");
}

#[test]
fn an_unschedulable_pod_waits_for_its_claims_unless_something_else_keeps_it_out() {
    let pod = "parameter server pod p";
    let unbound = "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found";
    assert_eq!(
        unschedulable_pod(pod, unbound, &["out"]),
        Placement::WaitingForClaims("parameter server pod p waits for claim(s) out to be bound".into())
    );
    // Bound since the scheduler looked: it tries again, the job is not Unschedulable.
    assert!(
        matches!(unschedulable_pod(pod, unbound, &[]), Placement::WaitingForClaims(m) if m.contains("try again"))
    );
    let gpus = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.";
    assert_eq!(
        unschedulable_pod(pod, gpus, &[]),
        Placement::Unschedulable(format!("parameter server pod p: {gpus}"))
    );
    assert!(matches!(unschedulable_pod(pod, gpus, &["out"]), Placement::WaitingForClaims(_)), "claims first");
}

#[test]
fn a_sharded_parameter_server_reports_its_ready_shards() {
    let running = with_workers(|w| {
        w.active = 2;
        w.ready = 2;
    });
    let at = |o: &Observed| {
        let s = next_status(&TrainingJobStatus::default(), o, &decide(o), &t("2026-01-01T00:01:00Z"));
        s.parameter_server.unwrap()
    };
    let one_of_two = Observed { ps_shards: Some(ShardsReady { count: 2, ready: 1 }), ..running.clone() };
    let ps = at(&one_of_two);
    assert_eq!((ps.ready, ps.shards, ps.ready_shards), (false, Some(2), Some(1)));
    let both =
        Observed { ps_ready: true, ps_shards: Some(ShardsReady { count: 2, ready: 2 }), ..running.clone() };
    let ps = at(&both);
    assert_eq!((ps.ready, ps.shards, ps.ready_shards), (true, Some(2), Some(2)));
    // One process: the status has no shard fields, as before sharding.
    let ps = at(&Observed { ps_ready: true, ..running });
    assert_eq!((ps.shards, ps.ready_shards), (None, None));
    let json = serde_json::to_value(&ps).unwrap();
    assert!(json.get("shards").is_none() && json.get("readyShards").is_none(), "{json}");
}

#[test]
fn pods_that_cannot_run_are_named_blamed_on_their_role_and_fail_the_job_after_the_bound() {
    use crate::controller::decide::trouble::{Role, Trouble};
    let oom = Trouble {
        role: Role::ParameterServer,
        reason: "OOMKilled".into(),
        message: "parameter server: ...".into(),
    };
    let failed_workers = |w: &mut WorkerJob| {
        w.active = 4;
        w.failed = 3;
    };
    // A PS killed for memory while workers fail for want of it: the PS is named, not WorkerFailed.
    let o = Observed { trouble: Some(oom.clone()), has_run: true, ..with_workers(failed_workers) };
    let s = decide(&o);
    assert_eq!((s.phase, s.reason.as_str()), (Phase::Restarting, "OOMKilled"));
    assert!(s.is_warning());
    let now = t("2026-01-01T00:00:00Z");
    let st = next_status(&TrainingJobStatus::default(), &o, &s, &now);
    let c = st.conditions.iter().find(|c| c.type_ == PODS_FAILING).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str(), &c.last_transition_time), ("True", "OOMKilled", &now));
    // Still failing later: the condition keeps the time it started; past the bound, Failed.
    let later = next_status(&st, &o, &s, &t("2026-01-01T00:05:00Z"));
    let c = later.conditions.iter().find(|c| c.type_ == PODS_FAILING).unwrap();
    assert_eq!(c.last_transition_time, now);
    let s = decide(&Observed { trouble_bound: TroubleBound::TimedOut, ..o.clone() });
    assert_eq!((s.phase, s.reason.as_str()), (Phase::Failed, "OOMKilled"));
    // Once the pods run, the condition turns False.
    let well = Observed { ps_ready: true, ..with_workers(|w| (w.active, w.ready) = (4, 4)) };
    let s = decide(&well);
    assert_eq!(s.reason, "WorkersRunning");
    let healed = next_status(&later, &well, &s, &t("2026-01-01T00:06:00Z"));
    let c = healed.conditions.iter().find(|c| c.type_ == PODS_FAILING).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "PodsRunning"));
    // A job that trains without one worker (a stuck pull on a new node) keeps training.
    let stuck =
        Trouble { role: Role::Workers, reason: "ImagePullBackOff".into(), message: "workers: ...".into() };
    let o = Observed {
        min_replicas: Some(2),
        trouble: Some(stuck),
        trouble_bound: TroubleBound::TimedOut,
        ..with_workers(|w| (w.active, w.ready) = (4, 3))
    };
    assert_eq!(decide(&Observed { ps_ready: true, ..o }).phase, Phase::Running);
    // A PS that restarted more often than backoffLimit fails the job, even in a moment when it
    // runs and the job trains (its crash loop ended the condition above every time).
    let looping = Trouble {
        role: Role::ParameterServer,
        reason: "OOMKilled".into(),
        message:
            "parameter server: pod p, container c restarted 7 times, more than runPolicy.backoffLimit (6)"
                .into(),
    };
    let o = Observed {
        ps_ready: true,
        trouble: Some(looping),
        trouble_bound: TroubleBound::RestartsExhausted,
        ..with_workers(|w| (w.active, w.ready) = (4, 4))
    };
    let s = decide(&o);
    assert_eq!((s.phase, s.reason.as_str()), (Phase::Failed, "OOMKilled"));
    assert!(s.message.ends_with("backoffLimit (6)"), "no word of the stuck-pods timeout: {}", s.message);
    // Workers waiting for a node do not keep it waiting either.
    let s = decide(&Observed { placement: Placement::Unschedulable("0/1 nodes".into()), ..o });
    assert_eq!((s.phase, s.reason.as_str()), (Phase::Failed, "OOMKilled"));
}

#[test]
fn spec_applied_says_whether_the_children_have_the_current_generation() {
    let now = t("2026-01-01T00:00:00Z");
    let o = observed();
    let st = next_status(&TrainingJobStatus::default(), &o, &decide(&o), &now);
    let c = st.conditions.iter().find(|c| c.type_ == SPEC_APPLIED).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str(), c.observed_generation), ("True", "Applied", Some(3)));
    let waiting =
        Observed { deferred: vec!["the running worker Job keeps its pod template".into()], ..observed() };
    let later = next_status(&st, &waiting, &decide(&waiting), &t("2026-01-01T00:01:00Z"));
    let c = later.conditions.iter().find(|c| c.type_ == SPEC_APPLIED).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "ChangeDeferred"));
    assert_eq!(c.message, "the running worker Job keeps its pod template");
    assert_eq!(later.observed_generation, Some(3), "seen, though not applied");
    // No children yet (an invalid spec): no claim either way.
    let none = Observed { workers: None, ..observed() };
    let st = next_status(&TrainingJobStatus::default(), &none, &decide(&none), &now);
    assert!(st.conditions.iter().all(|c| c.type_ != SPEC_APPLIED));
}

#[test]
fn the_deadline_counts_from_the_start_or_the_latest_resumption_and_bounds_finalizing_too() {
    let cond = |type_: &str, status: &str, at: &str| Condition {
        type_: type_.into(),
        status: status.into(),
        reason: "r".into(),
        message: String::new(),
        last_transition_time: t(at),
        observed_generation: None,
    };
    let mut old = TrainingJobStatus { start_time: Some(t("2026-01-01T00:00:00Z")), ..Default::default() };
    assert_eq!(active_since(&TrainingJobStatus::default()), None, "not started");
    assert_eq!(active_since(&old), Some(t("2026-01-01T00:00:00Z")));
    old.conditions = vec![
        cond("Queued", "False", "2026-01-01T00:10:00Z"),
        cond("Suspended", "False", "2026-01-01T00:05:00Z"),
    ];
    assert_eq!(active_since(&old), Some(t("2026-01-01T00:10:00Z")), "admitted by Kueue at 00:10");
    old.conditions[1] = cond("Suspended", "True", "2026-01-01T00:20:00Z");
    assert_eq!(active_since(&old), None, "no deadline while suspended");

    // Past it: Failed, even while the final model is still being written...
    let finishing = |w: &mut WorkerJob| w.complete = true;
    let o = Observed {
        deadline_exceeded: Some(60),
        finalize: Finalize::Failed("refused".into()),
        ..with_workers(finishing)
    };
    let s = decide(&o);
    assert_eq!((s.phase, s.reason.as_str()), (Phase::Failed, "DeadlineExceeded"));
    assert!(s.message.contains("activeDeadlineSeconds (60 s)"), "{}", s.message);
    // ... but not once it is written.
    let done = Observed { finalize: Finalize::Done { version: 9, path: None, earlier: None }, ..o };
    assert_eq!(decide(&done).phase, Phase::Succeeded);
}
