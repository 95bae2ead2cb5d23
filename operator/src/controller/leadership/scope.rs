//! Two operators must never reconcile the same TrainingJob: each would undo the other's writes.
//! That happens with two cluster-wide releases, two releases that name a shared namespace, or a
//! team's release inside the platform's cluster-wide one. So each leader marks its Lease with
//! what it watches ([`LEASE_LABEL`], [`SCOPE_ANNOTATION`]) and surveys the marked Leases it may
//! list, at the start and every [`survey_every`]:
//!
//! - A release refuses to run while an older live Lease watches an overlapping scope of the same
//!   breadth (both every namespace, or both a list): the one that came second stops with the
//!   reason, whichever order their surveys ran in (the order is the Leases' acquire times).
//! - A cluster-wide release yields the namespaces a live namespaced release watches: the more
//!   specific claim wins, whichever started first, and its other namespaces go on.
//!
//! A marked Lease is believed only for what its place vouches for (issue #48: the survey took any
//! labelled Lease at its word, so a tenant who may create Leases could stop the platform's
//! operator with a fake `*`, or make it leave any namespace): "every namespace" only from a
//! Lease in a trusted namespace ([`LeaseConfig::trusted`], the operators' own), a list of
//! namespaces only for the one the Lease or claim lives in. A namespaced release writes a claim
//! in each namespace it watches, so its whole list is vouched for; a tenant's fake one can at
//! most take its own namespace.
//!
//! What a release can list bounds what it sees: a cluster-wide release lists Leases in every
//! namespace (its ClusterRole), a namespaced one in its own namespace and the ones it watches
//! (a Role in each). So that two namespaced releases installed in different namespaces that
//! watch a shared one see each other, each also writes a claim in the namespaces it watches
//! ([`super::claims`]), which counts as its Lease. A new namespaced leader waits before it
//! reconciles anything and surveys again ([`settle`]), for what its first survey could not see
//! yet. Without leader election there is no Lease, and no survey.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams};

use super::{CLAIM_OF_ANNOTATION, LEASE_LABEL, LeaseConfig, SCOPE_ANNOTATION, claims, survey_every};
use crate::controller::watch::Watch;

/// Another operator's live Lease.
#[derive(Clone, Debug, PartialEq)]
pub struct Peer {
    /// `namespace/name` of its Lease.
    pub lease: String,
    pub watch: Watch,
    /// When its current holder took it: of two rivals, the earlier keeps running.
    pub since: Timestamp,
    /// Its Lease's duration: a cluster-wide operator surveys every four of them.
    pub lease_duration: Duration,
}

/// What the survey decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Run, leaving the jobs of these namespaces to the operator of the Lease each maps to.
    Run { yielded: BTreeMap<String, String> },
    /// Stop: another operator already watches part of this one's scope.
    Refuse(String),
}

/// `namespace/name` of a Lease.
fn key(lease: &Lease) -> String {
    format!(
        "{}/{}",
        lease.metadata.namespace.as_deref().unwrap_or_default(),
        lease.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The operators behind the marked Leases among `leases` that a holder renewed lately, other
/// than `own` (a claim stands for the Lease it names), and when `own`'s holder took it (`now`
/// if it is not among them). A Lease counts as live for twice its duration after its
/// renewTime: read on this replica's clock, which may be skewed from the holder's, and a dead
/// holder only delays a survey's verdict by that much. Each peer watches what its Leases and
/// claims vouch for ([`vouched`]): one with none is no peer.
pub fn peers(leases: &[Lease], own: &str, now: Timestamp, trusted: &[String]) -> (Vec<Peer>, Timestamp) {
    let mut own_since = now;
    let mut found: Vec<Peer> = Vec::new();
    for lease in leases {
        let Some(spec) = &lease.spec else { continue };
        let since = spec.acquire_time.as_ref().or(spec.renew_time.as_ref()).map_or(now, |t| t.0);
        if key(lease) == own {
            own_since = since;
            continue;
        }
        let claim_of = lease.metadata.annotations.as_ref().and_then(|a| a.get(CLAIM_OF_ANNOTATION));
        let operator = claim_of.cloned().unwrap_or_else(|| key(lease));
        let held = spec.holder_identity.as_deref().is_some_and(|h| !h.is_empty());
        let duration_s = spec.lease_duration_seconds.unwrap_or(15).max(1);
        let ttl = SignedDuration::from_secs(2 * i64::from(duration_s));
        let renewed =
            spec.renew_time.as_ref().is_some_and(|t| t.0.checked_add(ttl).is_ok_and(|end| end >= now));
        if operator == own || !held || !renewed {
            continue;
        }
        let Some(watch) = vouched(lease, claim_of.is_some(), trusted) else { continue };
        match found.iter_mut().find(|p| p.lease == operator) {
            Some(Peer { watch: Watch::Namespaces(names), .. }) => {
                if let Watch::Namespaces(more) = watch {
                    names.extend(more);
                    names.sort();
                    names.dedup();
                }
            }
            Some(_) => {}
            None => {
                let lease_duration = Duration::from_secs(duration_s as u64);
                found.push(Peer { lease: operator, watch, since, lease_duration });
            }
        }
    }
    (found, own_since)
}

/// What a marked Lease (or a claim, `is_claim`) is believed to watch: every namespace only when
/// it is an operator's Lease in a `trusted` namespace; of a list, only the namespace it lives
/// in. `None`: nothing (unmarked, garbled, or vouching for nothing).
fn vouched(lease: &Lease, is_claim: bool, trusted: &[String]) -> Option<Watch> {
    let annotation = lease.metadata.annotations.as_ref()?.get(SCOPE_ANNOTATION)?;
    let at = lease.metadata.namespace.as_deref().unwrap_or_default();
    match Watch::from_annotation(annotation)? {
        Watch::All if !is_claim && trusted.iter().any(|t| t == at) => Some(Watch::All),
        Watch::All => {
            tracing::warn!(lease = %key(lease), "ignoring a Lease that says it watches every namespace from outside the operators' namespaces (--trusted-lease-namespaces)");
            None
        }
        Watch::Namespaces(names) => {
            names.iter().any(|n| n == at).then(|| Watch::Namespaces(vec![at.to_string()]))
        }
    }
}

/// The verdict for an operator watching `own` from Lease `lease`, taken at `since`.
pub fn judge(own: &Watch, lease: &str, since: Timestamp, peers: &[Peer]) -> Verdict {
    let older = |p: &Peer| (p.since, p.lease.as_str()) < (since, lease);
    let mut yielded = BTreeMap::new();
    for p in peers {
        match (own, &p.watch) {
            (Watch::All, Watch::All) if older(p) => {
                return Verdict::Refuse(format!(
                    "the operator of Lease {} already watches every namespace (since {}): two would both reconcile every TrainingJob; uninstall one release, or give one a list of namespaces",
                    p.lease, p.since
                ));
            }
            (Watch::All, Watch::Namespaces(theirs)) => {
                yielded.extend(theirs.iter().map(|n| (n.clone(), p.lease.clone())));
            }
            (Watch::Namespaces(mine), Watch::Namespaces(theirs)) if older(p) => {
                let shared: Vec<&str> =
                    mine.iter().filter(|n| theirs.contains(n)).map(String::as_str).collect();
                if !shared.is_empty() {
                    return Verdict::Refuse(format!(
                        "the operator of Lease {} already watches namespace(s) {} (since {}): two would both reconcile their TrainingJobs; watch other namespaces",
                        p.lease,
                        shared.join(", "),
                        p.since
                    ));
                }
            }
            _ => {}
        }
    }
    Verdict::Run { yielded }
}

/// The longest a new leader waits before its second survey, whatever its peers' Leases say
/// (a tenant may write a marked Lease with any duration in a namespace it shares).
const MAX_SETTLE: Duration = Duration::from_secs(300);

/// How long a leader that its first survey let run waits before it reconciles anything, then
/// surveys again, so that no two operators reconcile the same namespace even for a moment:
///
/// - An older namespaced operator's claims are written just *after* it takes its Lease, so a
///   namespaced operator whose first survey ran in between saw neither, and ran beside it until
///   its next survey. Any claim of an operator older than this one is written within that
///   operator's renew deadline (the bound an operator's API calls get to answer) of this one's
///   first survey, so this one waits its own renew deadline (claims are read in every namespace
///   a namespaced operator lists, its own included).
/// - A cluster-wide operator leaves a namespaced one's namespaces to it from its next survey on,
///   up to four of its lease durations away: a namespaced operator that found one waits for that
///   survey, and a renew deadline for it to answer.
///
/// A cluster-wide operator needs no wait: every Lease it could yield to or be refused by is
/// marked from the moment its holder took it, and it lists them all.
pub fn settle(cfg: &LeaseConfig, peers: &[Peer]) -> Duration {
    if cfg.watch == Watch::All {
        return Duration::ZERO;
    }
    let cluster_wide = peers.iter().filter(|p| p.watch == Watch::All);
    let next_survey = cluster_wide.map(|p| survey_every(p.lease_duration)).max().unwrap_or_default();
    (next_survey + cfg.renew_deadline).min(MAX_SETTLE)
}

/// The marked Leases in `namespace`, or in every namespace.
async fn marked(client: &kube::Client, namespace: Option<&str>) -> Result<Vec<Lease>, kube::Error> {
    let api: Api<Lease> = match namespace {
        None => Api::all(client.clone()),
        Some(ns) => Api::namespaced(client.clone(), ns),
    };
    Ok(api.list(&ListParams::default().labels(LEASE_LABEL)).await?.items)
}

/// The marked Leases this operator may list, its claims renewed on the way: every namespace's
/// for a cluster-wide one; else its own namespace's, where its Lease says since when it leads
/// (which its claims carry), then those of the namespaces it watches.
async fn survey(client: &kube::Client, cfg: &LeaseConfig) -> Result<Vec<Lease>, kube::Error> {
    if cfg.watch == Watch::All {
        return marked(client, None).await;
    }
    let mut leases = marked(client, Some(&cfg.namespace)).await?;
    let (_, since) = peers(&leases, &claims::own_lease(cfg), Timestamp::now(), &cfg.trusted);
    claims::stake(client, cfg, since).await;
    for ns in claims::claimed_namespaces(cfg) {
        leases.extend(marked(client, Some(ns)).await?);
    }
    Ok(leases)
}

/// The namespaces a cluster-wide operator leaves to namespaced ones, and to whom.
#[derive(Default)]
pub struct Yields(std::sync::RwLock<BTreeMap<String, String>>);

impl Yields {
    /// The Lease of the operator that handles `namespace`'s jobs instead of this one.
    pub fn holder(&self, namespace: &str) -> Option<String> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).get(namespace).cloned()
    }

    /// The yielded namespaces, read once (for a pass over every job).
    pub fn namespaces(&self) -> std::collections::BTreeSet<String> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    pub fn count(&self) -> usize {
        self.0.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Replaces the set, logging what changed.
    fn set(&self, yielded: BTreeMap<String, String>) {
        let mut current = self.0.write().unwrap_or_else(|e| e.into_inner());
        for (ns, lease) in &yielded {
            if current.get(ns) != Some(lease) {
                tracing::warn!(namespace = %ns, %lease, "leaving this namespace's TrainingJobs to the operator that watches it alone");
            }
        }
        for ns in current.keys().filter(|ns| !yielded.contains_key(*ns)) {
            tracing::info!(namespace = %ns, "taking this namespace's TrainingJobs back: no other operator watches it now");
        }
        *current = yielded;
    }
}

/// One survey and its verdict: the other operators found, or `Err` with the reason when this
/// operator must stop. A survey that fails (no right to list Leases, the API server away)
/// changes nothing: the operator runs on as it was.
pub async fn check(client: &kube::Client, cfg: &LeaseConfig, yields: &Yields) -> Result<Vec<Peer>, String> {
    let leases = match survey(client, cfg).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "could not list the operators' Leases: another operator watching the same namespaces would go unnoticed");
            return Ok(Vec::new());
        }
    };
    let own = claims::own_lease(cfg);
    let (found, since) = peers(&leases, &own, Timestamp::now(), &cfg.trusted);
    match judge(&cfg.watch, &own, since, &found) {
        Verdict::Run { yielded } => {
            yields.set(yielded);
            Ok(found)
        }
        Verdict::Refuse(why) => Err(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(lease: &str, watch: &str, since_s: i64) -> Peer {
        Peer {
            lease: lease.into(),
            watch: Watch::from_annotation(watch).unwrap(),
            since: Timestamp::from_second(since_s).unwrap(),
            lease_duration: Duration::from_secs(15),
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn of_two_cluster_wide_operators_the_later_refuses_whichever_surveys_first() {
        let a = peer("ops/a", "*", 100);
        let b = peer("ops/b", "*", 200);
        assert!(
            matches!(judge(&Watch::All, "ops/b", b.since, std::slice::from_ref(&a)), Verdict::Refuse(r) if r.contains("ops/a"))
        );
        assert_eq!(judge(&Watch::All, "ops/a", a.since, &[b]), Verdict::Run { yielded: BTreeMap::new() });
        // Taken in the same second: the Lease names order them.
        let c = peer("ops/c", "*", 100);
        assert!(matches!(judge(&Watch::All, "ops/c", c.since, std::slice::from_ref(&a)), Verdict::Refuse(_)));
        assert!(matches!(judge(&Watch::All, "ops/a", a.since, &[c]), Verdict::Run { .. }));
    }

    #[test]
    fn namespaced_operators_refuse_only_a_shared_namespace_and_a_cluster_wide_one_yields_theirs() {
        let team = peer("team-a/a", "team-a,shared", 100);
        let mine = Watch::parse("shared,team-b").unwrap();
        assert!(
            matches!(judge(&mine, "team-b/b", at(200), std::slice::from_ref(&team)), Verdict::Refuse(r) if r.contains("shared") && !r.contains("team-b"))
        );
        let other = Watch::parse("team-b").unwrap();
        assert!(matches!(
            judge(&other, "team-b/b", at(200), std::slice::from_ref(&team)),
            Verdict::Run { .. }
        ));
        // The cluster-wide operator yields the team's namespaces, older or not; the team's
        // operator runs beside it.
        let platform = peer("platform/p", "*", 50);
        let Verdict::Run { yielded } =
            judge(&Watch::All, "platform/p", platform.since, std::slice::from_ref(&team))
        else {
            panic!()
        };
        assert_eq!(
            yielded.into_iter().collect::<Vec<_>>(),
            [("shared".into(), "team-a/a".into()), ("team-a".into(), "team-a/a".into())]
        );
        assert!(
            matches!(judge(&team.watch, "team-a/a", team.since, &[platform]), Verdict::Run { yielded } if yielded.is_empty())
        );
    }

    #[test]
    fn a_namespaced_leader_waits_for_claims_in_flight_and_for_a_cluster_wide_operators_next_survey() {
        let cfg = |watch: &str| LeaseConfig {
            name: "op".into(),
            namespace: "team".into(),
            identity: "pod".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(3),
            watch: Watch::parse(watch).unwrap(),
            trusted: vec!["team".into()],
        };
        let s = Duration::from_secs;
        assert_eq!(settle(&cfg(""), &[peer("team/t", "team", 100)]), Duration::ZERO);
        assert_eq!(settle(&cfg("team"), &[]), s(10), "an older claim may be on its way");
        let mut platform = peer("ops/p", "*", 50);
        assert_eq!(settle(&cfg("team,shared"), &[platform.clone(), peer("x/y", "x", 1)]), s(70));
        platform.lease_duration = s(3600);
        assert_eq!(
            settle(&cfg("team"), &[platform]),
            s(300),
            "a Lease's duration cannot hold it back for long"
        );
    }

    fn lease(ns: &str, name: &str, watch: Option<&str>, holder: Option<&str>, renewed_s: i64) -> Lease {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
        Lease {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                annotations: watch.map(|w| [(SCOPE_ANNOTATION.to_string(), w.to_string())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(String::from),
                lease_duration_seconds: Some(15),
                acquire_time: Some(MicroTime(at(renewed_s - 100))),
                renew_time: Some(MicroTime(at(renewed_s))),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn only_held_renewed_and_marked_leases_of_others_are_peers() {
        let leases = [
            lease("ops", "me", Some("*"), Some("x"), 1000),
            lease("team", "live", Some("team"), Some("y"), 995),
            lease("ops", "released", Some("*"), None, 1000),
            lease("ops", "expired", Some("*"), Some("z"), 1000 - 31),
            lease("ops", "unmarked", None, Some("w"), 1000),
            lease("ops", "garbled", Some("Not A Namespace"), Some("v"), 1000),
        ];
        let (found, since) = peers(&leases, "ops/me", at(1000), &["ops".into()]);
        assert_eq!(since, at(900));
        assert_eq!(found, [peer("team/live", "team", 895)]);
    }

    #[test]
    fn a_lease_is_believed_only_for_what_its_place_vouches_for() {
        let trusted = ["ops".to_string(), "platform".to_string()];
        let leases = [
            // Another release in an operators' namespace: every namespace, believed.
            lease("platform", "other", Some("*"), Some("x"), 1000),
            // A tenant's fake "*" (issue #48: it made the platform's operator refuse and exit).
            lease("tenant", "fake-all", Some("*"), Some("y"), 1000),
            // A tenant's fake list: only its own namespace is believed, not the victims'.
            lease("tenant", "fake-list", Some("tenant,victim-a,victim-b"), Some("z"), 1000),
            // A claim saying "*" is no claim at all.
            claim_of(lease("ops", "claim-all", Some("*"), Some("w"), 1000), "elsewhere/x"),
        ];
        let (found, _) = peers(&leases, "ops/me", at(1000), &trusted);
        assert_eq!(found, [peer("platform/other", "*", 900), peer("tenant/fake-list", "tenant", 900)]);
        let Verdict::Run { yielded } = judge(&Watch::All, "ops/me", at(950), &found[1..]) else { panic!() };
        assert_eq!(yielded.into_keys().collect::<Vec<_>>(), ["tenant"], "the victims' namespaces stay");
        // The same fake "*" in a trusted namespace would be believed: trust is the platform's.
        let (found, _) = peers(&leases[1..2], "ops/me", at(1000), &["tenant".into()]);
        assert_eq!(found, [peer("tenant/fake-all", "*", 900)]);
    }

    fn claim_of(mut lease: Lease, of: &str) -> Lease {
        lease.metadata.annotations.get_or_insert_default().insert(CLAIM_OF_ANNOTATION.into(), of.into());
        lease
    }

    #[test]
    fn a_claim_counts_as_the_lease_it_names_once_and_an_operators_own_claims_not_at_all() {
        let leases = [
            lease("team-a", "me", Some("team-a,shared"), Some("x"), 1000),
            claim_of(
                lease("shared", "foresight-claim.team-a.me", Some("team-a,shared"), Some("x"), 1000),
                "team-a/me",
            ),
            lease("team-b", "op", Some("team-b,shared"), Some("y"), 990),
            claim_of(
                lease("shared", "foresight-claim.team-b.op", Some("team-b,shared"), Some("y"), 999),
                "team-b/op",
            ),
            claim_of(
                lease("data", "foresight-claim.team-c.op", Some("team-c,data"), Some("z"), 998),
                "team-c/op",
            ),
            claim_of(lease("data", "stale", Some("team-d,data"), Some("w"), 1000 - 31), "team-d/op"),
        ];
        let (found, _) = peers(&leases, "team-a/me", at(1000), &[]);
        // Each peer watches what its Lease and claims vouch for: team-b its Lease's namespace and
        // its claim's; team-c only the namespace its one claim seen here lives in.
        assert_eq!(found, [peer("team-b/op", "team-b,shared", 890), peer("team-c/op", "data", 898)]);
        // The operator that came second over `shared` stops, naming the other's Lease.
        let mine = Watch::parse("team-a,shared").unwrap();
        assert!(
            matches!(judge(&mine, "team-a/me", at(950), &found), Verdict::Refuse(r) if r.contains("team-b/op") && r.contains("shared"))
        );
    }
}
