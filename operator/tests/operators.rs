//! Several operators in one cluster (`controller/leadership/scope.rs`), each the real binary against a real
//! control plane of this test binary's own: a cluster-wide operator here would take every other
//! test's jobs.

mod support;

use std::process::Command;

use serde_json::{Value, json};
use support::operator::*;
use support::{ControlPlane, control_plane, wait_for};

const LEASE: [&str; 3] = ["--leader-elect=true", "--lease-duration-seconds", "3"];

fn operator(cp: &ControlPlane, watch: Option<&str>, lease_ns: &str, lease: &str, spawn: bool) -> Operator {
    let args = [&LEASE[..], &["--lease-name", lease, "--identity", lease]].concat();
    if spawn {
        Operator::spawn(&cp.kubeconfig, watch, lease_ns, &args)
    } else {
        Operator::start_with(&cp.kubeconfig, watch, lease_ns, &args)
    }
}

fn leads(cp: &ControlPlane, ns: &str, lease: &str) {
    wait_for(&format!("{lease} to lead"), LONG, || {
        let l = cp.get_json(ns, &format!("lease/{lease}"))?;
        (l["spec"]["holderIdentity"] == lease).then_some(())
    });
}

/// Who reported the job's events (`reportingInstance`: the operator's identity).
fn reporters(cp: &ControlPlane, ns: &str, name: &str) -> Vec<String> {
    let selector = format!("regarding.name={name}");
    let list = cp.kubectl_ok(
        &["get", "events.events.k8s.io", "-n", ns, "--field-selector", &selector, "-o", "json"],
        None,
    );
    let list: Value = serde_json::from_str(&list).unwrap();
    let mut who: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reportingInstance"].as_str().unwrap_or("").into())
        .collect();
    who.sort();
    who.dedup();
    who
}

/// How many jobs the operator counts as its own (`foresight_operator_jobs`, all phases).
fn managed(op: &Operator) -> f64 {
    let text = op.metrics_text();
    text.lines()
        .filter(|l| l.starts_with("foresight_operator_jobs{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn refusal(op: &mut Operator) -> String {
    let status = wait_for("the second operator to stop", LONG, || op.exited());
    assert!(!status.success(), "it stopped with {status}");
    op.log()
}

/// The claim an operator older than every other (Lease `elsewhere/omega`, taken in 2026's first
/// second) writes in `ns` when it watches it: what such an operator's claim looks like the
/// moment it lands.
fn older_claim(ns: &str) -> String {
    let claim = ("foresight.dev/claim-of".to_string(), "elsewhere/omega".to_string());
    older_lease("foresight-claim.elsewhere.omega", &format!("elsewhere,{ns}"), Some(claim))
}

/// A marked, live Lease `name` taken in 2026's first second that says it watches `watch`.
fn older_lease(name: &str, watch: &str, extra: Option<(String, String)>) -> String {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use k8s_openapi::jiff::Timestamp;
    let annotations =
        std::iter::once(("foresight.dev/watch-namespaces".to_string(), watch.to_string())).chain(extra);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("foresight.dev/operator-lease".to_string(), "true".to_string())].into()),
            annotations: Some(annotations.collect()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("omega".into()),
            lease_duration_seconds: Some(60),
            acquire_time: Some(MicroTime("2026-01-01T00:00:00Z".parse().unwrap())),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    let mut value = serde_json::to_value(lease).unwrap();
    value["apiVersion"] = json!("coordination.k8s.io/v1");
    value["kind"] = json!("Lease");
    value.to_string()
}

#[test]
fn a_second_operator_over_the_same_namespaces_refuses_and_a_cluster_wide_one_leaves_a_namespaced_ones_namespace_to_it()
 {
    let cp = control_plane();

    // Two namespaced operators that start at once: the older one's claim lands just after the
    // younger one's first survey. The younger waits (its renew deadline: 10 s with 15 s leases)
    // and surveys again before it reconciles anything, so it stops without touching the job.
    let (delta, contested) = (cp.namespace("delta"), cp.namespace("contested"));
    cp.kubectl_ok(&["apply", "-n", &contested, "-f", "-"], Some(&job("early", json!({}))));
    let args = ["--leader-elect=true", "--lease-duration-seconds", "15", "--lease-name", "delta"];
    let args = [&args[..], &["--identity", "delta"]].concat();
    let mut delta_op = Operator::spawn(&cp.kubeconfig, Some(&format!("{delta},{contested}")), &delta, &args);
    let delta_claim = format!("lease/foresight-claim.{delta}.delta");
    wait_for("delta's claim", LONG, || cp.get_json(&contested, &delta_claim));
    cp.kubectl_ok(&["apply", "-n", &contested, "-f", "-"], Some(&older_claim(&contested)));
    let log = refusal(&mut delta_op);
    assert!(
        log.contains(&format!("Lease elsewhere/omega already watches namespace(s) {contested}")),
        "{log}"
    );
    assert!(cp.get_json(&contested, "job/early-workers").is_none(), "delta created the job's workers");
    assert!(reporters(cp, &contested, "early").is_empty(), "delta reconciled the job");
    cp.kubectl_ok(&["delete", "-n", &contested, "lease/foresight-claim.elsewhere.omega"], None);
    cp.kubectl_ok(&["delete", "-n", &contested, "tj/early"], None);
    let ops = cp.namespace("ops");
    let team = cp.namespace("team");
    let other = cp.namespace("other");

    // The platform's operator watches every namespace and says so on its Lease.
    let platform = operator(cp, None, &ops, "platform", false);
    leads(cp, &ops, "platform");
    let lease = cp.get_json(&ops, "lease/platform").unwrap();
    assert_eq!(lease["metadata"]["annotations"]["foresight.dev/watch-namespaces"], "*");
    assert_eq!(lease["metadata"]["labels"]["foresight.dev/operator-lease"], "true");

    // A second cluster-wide release (another Lease) stops, naming the first.
    let mut second = operator(cp, None, &ops, "second", true);
    let log = refusal(&mut second);
    assert!(
        log.contains("refusing to run beside another operator")
            && log.contains(&format!("Lease {ops}/platform already watches every namespace")),
        "{log}"
    );
    let released = cp.get_json(&ops, "lease/second").unwrap();
    assert!(
        released["spec"]["holderIdentity"].is_null(),
        "the refused operator let its Lease go: {released}"
    );

    // A team's own operator, in and for its namespace, runs beside it: the platform's operator
    // leaves that namespace's jobs to it at its next survey, and goes on with the others.
    let mut team_op = operator(cp, Some(&team), &team, "team", false);
    leads(cp, &team, "team");
    wait_for("the platform's operator to yield the team's namespace", LONG, || {
        (sample(&platform.metrics_text(), "foresight_operator_yielded_namespaces") == Some(1.0)).then_some(())
    });
    cp.kubectl_ok(&["apply", "-n", &team, "-f", "-"], Some(&job("mine", json!({}))));
    cp.kubectl_ok(&["apply", "-n", &other, "-f", "-"], Some(&job("theirs", json!({}))));
    wait_for("the team's job reconciled", LONG, || cp.get_json(&team, "job/mine-workers"));
    wait_for("the other job reconciled", LONG, || cp.get_json(&other, "job/theirs-workers"));
    wait_for("events of both jobs", LONG, || {
        (!reporters(cp, &team, "mine").is_empty() && !reporters(cp, &other, "theirs").is_empty())
            .then_some(())
    });
    assert_eq!(reporters(cp, &team, "mine"), ["team"]);
    assert_eq!(reporters(cp, &other, "theirs"), ["platform"]);
    assert_eq!((managed(&platform), managed(&team_op)), (1.0, 1.0), "each counts only its own job");

    // A second operator for the team's namespace, installed beside the first, stops.
    let mut again = operator(cp, Some(&team), &team, "team-again", true);
    let log = refusal(&mut again);
    assert!(log.contains(&format!("Lease {team}/team already watches namespace(s) {team}")), "{log}");

    // The team's operator goes (SIGTERM: it lets its Lease go): the platform's takes the
    // namespace back at its next survey.
    Command::new("kill").args(["-TERM", &team_op.pid().to_string()]).status().unwrap();
    wait_for("the team's operator to stop", LONG, || team_op.exited());
    wait_for("the platform's operator to take the namespace back", LONG, || {
        (sample(&platform.metrics_text(), "foresight_operator_yielded_namespaces") == Some(0.0)).then_some(())
    });
    cp.kubectl_ok(&["apply", "-n", &team, "-f", "-"], Some(&job("later", json!({}))));
    wait_for("the later job reconciled", LONG, || cp.get_json(&team, "job/later-workers"));
    wait_for("its events", LONG, || (!reporters(cp, &team, "later").is_empty()).then_some(()));
    assert_eq!(reporters(cp, &team, "later"), ["platform"]);

    // Two teams' operators, each installed in its own namespace, that both watch a shared one:
    // neither may list the other's namespace, so each writes a claim in the namespaces it
    // watches (claims.rs), and the second stops, naming the first's Lease.
    let (alpha, beta, shared) = (cp.namespace("alpha"), cp.namespace("beta"), cp.namespace("shared"));
    let alpha_op = operator(cp, Some(&format!("{alpha},{shared}")), &alpha, "alpha", false);
    leads(cp, &alpha, "alpha");
    let claim = format!("lease/foresight-claim.{alpha}.alpha");
    let staked = wait_for("alpha's claim in the shared namespace", LONG, || cp.get_json(&shared, &claim));
    assert_eq!(staked["metadata"]["annotations"]["foresight.dev/claim-of"], format!("{alpha}/alpha"));
    let mut beta_op = operator(cp, Some(&format!("{beta},{shared}")), &beta, "beta", true);
    let log = refusal(&mut beta_op);
    assert!(log.contains(&format!("Lease {alpha}/alpha already watches namespace(s) {shared}")), "{log}");
    assert!(
        cp.get_json(&shared, &format!("lease/foresight-claim.{beta}.beta")).is_none(),
        "beta withdrew its claim"
    );
    // Alpha goes (SIGTERM withdraws its claim): beta, started again, runs.
    Command::new("kill").args(["-TERM", &alpha_op.pid().to_string()]).status().unwrap();
    let mut alpha_op = alpha_op;
    wait_for("alpha to stop", LONG, || alpha_op.exited());
    assert!(cp.get_json(&shared, &claim).is_none(), "alpha withdrew its claim");
    let _beta_op = operator(cp, Some(&format!("{beta},{shared}")), &beta, "beta", false);
    leads(cp, &beta, "beta");
    // The platform's operator leaves beta's two namespaces to it (from its next survey on).
    wait_for("the platform's operator to yield beta's namespaces", LONG, || {
        (sample(&platform.metrics_text(), "foresight_operator_yielded_namespaces") == Some(2.0)).then_some(())
    });
    cp.kubectl_ok(&["apply", "-n", &shared, "-f", "-"], Some(&job("common", json!({}))));
    wait_for("the shared job's events", LONG, || {
        (!reporters(cp, &shared, "common").is_empty()).then_some(())
    });
    assert_eq!(reporters(cp, &shared, "common"), ["beta"]);

    // A tenant who may create Leases (issue #48): a fake "*" Lease in their namespace, older than
    // every operator, used to make the platform's operator refuse and exit at its next survey;
    // a fake list used to take any namespaces from it. Now a Lease outside the operators'
    // namespaces speaks only for the namespace it lives in.
    let victim = cp.namespace("victim");
    cp.kubectl_ok(&["apply", "-n", &other, "-f", "-"], Some(&older_lease("fake-all", "*", None)));
    let list = format!("{other},{victim}");
    cp.kubectl_ok(&["apply", "-n", &other, "-f", "-"], Some(&older_lease("fake-list", &list, None)));
    wait_for("the platform's operator to leave the tenant its own namespace only", LONG, || {
        (sample(&platform.metrics_text(), "foresight_operator_yielded_namespaces") == Some(3.0)).then_some(())
    });
    cp.kubectl_ok(&["apply", "-n", &victim, "-f", "-"], Some(&job("kept", json!({}))));
    wait_for("the victim's job's events", LONG, || {
        (!reporters(cp, &victim, "kept").is_empty()).then_some(())
    });
    assert_eq!(reporters(cp, &victim, "kept"), ["platform"]);
    let mut platform = platform;
    assert!(platform.exited().is_none(), "the platform's operator runs on: {}", platform.log());
}
