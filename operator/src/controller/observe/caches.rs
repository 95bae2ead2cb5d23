//! The children as the operator's watches last saw them. The watches that wake the controller
//! on its Deployments, Jobs, Services, claims and pods also fill these caches (kube-runtime
//! reflectors fed to `owns_stream`/`watches_stream`; the pods go to an index by job,
//! `pod_index`), so a reconcile reads its children without asking the API
//! server: 7.5 requests per reconcile of a running job before, 4.0–4.5 after (0.5 once
//! `applied` skips the writes that would change nothing; the lifecycle test
//! in `operator/tests/controller.rs` prints it).

use std::sync::Arc;

use futures_util::TryStreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::pod_index::PodsByJob;
use crate::api::TrainingJob;
use crate::controller::kueue::Workload;
use crate::controller::names::{LABEL_JOB, MANAGED};

/// The caches of every watched scope.
pub(crate) struct Caches {
    scopes: Vec<ScopeCaches>,
    /// Set once every cache has held its first full list. Reconciles wait on this cell, not on
    /// the stores: a store's readiness signal (a oneshot receiver) wakes only the last of several
    /// tasks waiting on it at once — seen as a job never reconciled while another one was.
    ready: tokio::sync::OnceCell<()>,
}

/// One scope's caches.
struct ScopeCaches {
    deployments: Store<Deployment>,
    disruption_budgets: Store<PodDisruptionBudget>,
    jobs: Store<Job>,
    services: Store<Service>,
    claims: Store<PersistentVolumeClaim>,
    pods: Arc<PodsByJob>,
    /// Kueue's Workloads, when Kueue admits jobs (`--kueue`).
    workloads: Option<Store<Workload>>,
    /// The jobs' NetworkPolicies, when the operator writes them (`--ps-network-policy`).
    network_policies: Option<Store<NetworkPolicy>>,
}

impl Caches {
    /// One controller per scope (`None`: every namespace), woken by the children it owns, and
    /// the caches those same watches fill.
    pub(crate) fn with_controllers(
        client: &Client,
        scopes: &[Option<String>],
        kueue: bool,
        network_policies: bool,
        concurrency: u16,
    ) -> (Self, Vec<Controller<TrainingJob>>) {
        let (scopes, controllers): (_, Vec<_>) =
            scopes.iter().map(|scope| controller_for(client, scope, kueue, network_policies)).unzip();
        let bounded = kube::runtime::controller::Config::default().concurrency(concurrency);
        let controllers = controllers.into_iter().map(|c| c.with_config(bounded.clone())).collect();
        (Self { scopes, ready: Default::default() }, controllers)
    }

    /// Waits until every cache holds its first full list: before that, a child missing from a
    /// cache may exist. One task waits on the stores; every other waits on the cell.
    pub(crate) async fn ready(&self) {
        self.ready
            .get_or_init(|| async {
                for c in &self.scopes {
                    // Errors only when the writer is gone, i.e. the operator is stopping.
                    let _ = c.deployments.wait_until_ready().await;
                    let _ = c.disruption_budgets.wait_until_ready().await;
                    let _ = c.jobs.wait_until_ready().await;
                    let _ = c.services.wait_until_ready().await;
                    let _ = c.claims.wait_until_ready().await;
                    let _ = c.pods.wait_until_ready().await;
                    if let Some(w) = &c.workloads {
                        let _ = w.wait_until_ready().await;
                    }
                    if let Some(n) = &c.network_policies {
                        let _ = n.wait_until_ready().await;
                    }
                }
            })
            .await;
    }

    pub(crate) fn deployment(&self, namespace: &str, name: &str) -> Option<Deployment> {
        self.get(|c| Some(&c.deployments), namespace, name)
    }

    pub(crate) fn disruption_budget(&self, namespace: &str, name: &str) -> Option<PodDisruptionBudget> {
        self.get(|c| Some(&c.disruption_budgets), namespace, name)
    }

    pub(crate) fn job(&self, namespace: &str, name: &str) -> Option<Job> {
        self.get(|c| Some(&c.jobs), namespace, name)
    }

    pub(crate) fn service(&self, namespace: &str, name: &str) -> Option<Service> {
        self.get(|c| Some(&c.services), namespace, name)
    }

    pub(crate) fn claim(&self, namespace: &str, name: &str) -> Option<PersistentVolumeClaim> {
        self.get(|c| Some(&c.claims), namespace, name)
    }

    pub(crate) fn workload(&self, namespace: &str, name: &str) -> Option<Workload> {
        self.get(|c| c.workloads.as_ref(), namespace, name)
    }

    pub(crate) fn network_policy(&self, namespace: &str, name: &str) -> Option<NetworkPolicy> {
        self.get(|c| c.network_policies.as_ref(), namespace, name)
    }

    /// Object `namespace/name` from whichever scope's `store` holds it.
    fn get<K>(
        &self,
        store: impl Fn(&ScopeCaches) -> Option<&Store<K>>,
        namespace: &str,
        name: &str,
    ) -> Option<K>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let key = ObjectRef::new(name).within(namespace);
        self.scopes.iter().find_map(|c| store(c)?.get(&key)).map(|o| (*o).clone())
    }

    /// The pods the operator's children made for the TrainingJob `job`.
    pub(crate) fn pods(&self, namespace: &str, job: &str) -> Vec<Arc<Pod>> {
        self.scopes.iter().flat_map(|c| c.pods.of(namespace, job)).collect()
    }
}

fn controller_for(
    client: &Client,
    scope: &Option<String>,
    kueue: bool,
    network_policies: bool,
) -> (ScopeCaches, Controller<TrainingJob>) {
    let (deployments, deployments_writer) = reflector::store();
    let (disruption_budgets, disruption_budgets_writer) = reflector::store();
    let (jobs, jobs_writer) = reflector::store();
    let (services, services_writer) = reflector::store();
    let (claims, claims_writer) = reflector::store();
    let pods = Arc::new(PodsByJob::default());
    let index = pods.clone();
    let controller = Controller::new(scoped::<TrainingJob>(client, scope), watcher::Config::default())
        .owns_stream(cached_watch(scoped::<Deployment>(client, scope), deployments_writer))
        .owns_stream(cached_watch(scoped::<PodDisruptionBudget>(client, scope), disruption_budgets_writer))
        .owns_stream(cached_watch(scoped::<Job>(client, scope), jobs_writer))
        .owns_stream(cached_watch(scoped::<Service>(client, scope), services_writer))
        .owns_stream(cached_watch(scoped::<PersistentVolumeClaim>(client, scope), claims_writer))
        .watches_stream(indexed_pod_watch(scoped::<Pod>(client, scope), index), |pod: Pod| {
            let job = pod.labels().get(LABEL_JOB)?.clone();
            Some(ObjectRef::<TrainingJob>::new(&job).within(pod.namespace().as_deref()?))
        });
    let (workloads, controller) = if kueue {
        let (store, writer) = reflector::store();
        (Some(store), controller.owns_stream(cached_watch(scoped::<Workload>(client, scope), writer)))
    } else {
        (None, controller)
    };
    let (network_policies, controller) = if network_policies {
        let (store, writer) = reflector::store();
        (Some(store), controller.owns_stream(cached_watch(scoped::<NetworkPolicy>(client, scope), writer)))
    } else {
        (None, controller)
    };
    (
        ScopeCaches {
            deployments,
            disruption_budgets,
            jobs,
            services,
            claims,
            pods,
            workloads,
            network_policies,
        },
        controller,
    )
}

/// A watch of the objects this operator labelled, written into `writer`'s cache as it goes.
fn cached_watch<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
) -> impl futures_util::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    managed_watch(api).reflect(writer).touched_objects()
}

/// The watch of the operator's pods, kept in `index` by job as it goes.
fn indexed_pod_watch(
    api: Api<Pod>,
    index: Arc<PodsByJob>,
) -> impl futures_util::Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    managed_watch(api).inspect_ok(move |event| index.apply(event)).touched_objects()
}

/// The events of the objects this operator labelled, without their managedFields, which
/// nothing here reads and which make up much of a pod's or a Deployment's size (the caches hold
/// every child of every job).
fn managed_watch<K>(
    api: Api<K>,
) -> impl futures_util::Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let managed = watcher::Config::default().labels(MANAGED);
    watcher(api, managed).default_backoff().modify(|o| o.meta_mut().managed_fields = None)
}

/// The API of `K` in `namespace`, or in every namespace for `None` (a cluster-wide watch).
pub(crate) fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}
