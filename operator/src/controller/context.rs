//! What every reconcile shares: the operator's settings and the handles on the cluster (the
//! client, the caches, the record of what was written), given to the observe and write steps.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use kube::Client;
use kube::runtime::events::Recorder;

use crate::controller::desired::children::ChildDefaults;
use crate::controller::desired::token::TokenKey;
use crate::controller::leadership::{LeaseConfig, scope};
use crate::controller::observe::caches::Caches;
use crate::controller::reconcile::backoff;
use crate::controller::telemetry::metrics::Metrics;
use crate::controller::watch::Watch;
use crate::controller::write::applied;

/// The operator's settings (`foresight operator --help`).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Which namespaces' TrainingJobs to handle.
    pub watch: Watch,
    pub defaults: ChildDefaults,
    pub token_key: TokenKey,
    /// The key `token_key` replaced: jobs created before the rotation hold its tokens.
    pub previous_token_key: Option<TokenKey>,
    /// URL of a job's parameter server as the operator reaches it; `{name}` and `{namespace}`
    /// are replaced.
    pub ps_url: String,
    /// How often a running job's progress is read from its parameter server.
    pub progress_every: Duration,
    /// How long to retry `/v1/finalize` after the workers finished before giving up.
    pub finalize_grace: Duration,
    /// How long a job's pods may fail to start or keep failing (`trouble`) before the job fails.
    pub stuck_pods_timeout: Duration,
    /// Jobs reconciled at once, per watched scope.
    pub max_concurrent_reconciles: u16,
    /// Whether Kueue admits the jobs labelled for one of its queues (`kueue`).
    pub kueue: bool,
    /// With `kueue`: a job without the queue label (and no LocalQueue `default` in its
    /// namespace) waits instead of running outside Kueue's quota, as Kueue's own
    /// `manageJobsWithoutQueueName` holds its integrations' jobs.
    pub kueue_required: bool,
    /// `Some`: each job gets a NetworkPolicy letting only its workers and these peers reach its
    /// parameter servers (`desired/children/guards.rs`).
    pub ps_ingress_from: Option<Vec<NetworkPolicyPeer>>,
    /// `None`: no leader election (one replica).
    pub lease: Option<LeaseConfig>,
}

/// What `reconcile` shares.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    /// When each job's progress was last read (by UID). Writing fresh progress changes the
    /// status, which wakes the controller again; reading it at most every `progress_every`
    /// keeps that from becoming a loop.
    pub(crate) progress_read: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// Per job (by UID), whether its PS holds the previous token key's control token (a job
    /// created before a key rotation): learnt once, since a job's Secret is written once.
    pub(crate) previous_key: std::sync::Mutex<std::collections::HashMap<String, bool>>,
    /// Per job, the client of its parameter server.
    pub(crate) ps_clients: Arc<crate::controller::observe::ps_clients::PsClients>,
    /// Per job, when to retry after failed reconciles.
    pub(crate) backoffs: backoff::Backoffs,
    /// The children as the watches last saw them.
    pub(crate) caches: Caches,
    /// What the operator last wrote to each child (writes that would change nothing are skipped).
    pub(crate) applied: applied::Applied,
    /// Kueue's ResourceFlavors as last read.
    pub(crate) flavors: crate::controller::kueue::flavors::Flavors,
    /// The namespaces whose jobs another operator handles (`scope`).
    pub(crate) yields: Arc<scope::Yields>,
}

impl Context {
    /// Whether the job's progress is due to be read now (and if so, marks it read).
    pub(crate) fn progress_due(&self, uid: &str) -> bool {
        let mut read = self.progress_read.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        // A requeue comes back a little early or late; 0.9 keeps one read per period.
        let period = self.settings.progress_every.mul_f64(0.9);
        match read.get(uid) {
            Some(t) if now.duration_since(*t) < period => false,
            _ => {
                // Jobs deleted while running never come back to be forgotten: drop stale entries.
                read.retain(|_, t| now.duration_since(*t) < self.settings.progress_every * 10);
                read.insert(uid.to_string(), now);
                true
            }
        }
    }

    pub(crate) fn forget_progress(&self, uid: &str) {
        self.progress_read.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }

    /// Forgets what is kept per job for the jobs not in `live` (UIDs): a job deleted while it
    /// ran is never reconciled again, so nothing else would drop its entries.
    pub(crate) fn forget_gone(&self, live: &std::collections::HashSet<&str>) {
        let alive = |uid: &String| live.contains(uid.as_str());
        self.progress_read.lock().unwrap_or_else(|e| e.into_inner()).retain(|uid, _| alive(uid));
        self.previous_key.lock().unwrap_or_else(|e| e.into_inner()).retain(|uid, _| alive(uid));
        self.backoffs.retain(live);
        self.ps_clients.retain(live);
    }
}
