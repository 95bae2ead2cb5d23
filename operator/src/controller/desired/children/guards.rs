//! What guards a job's parameter servers, the one place its model lives while it trains.
//!
//! The NetworkPolicy (`--ps-network-policy`): the PS pods accept connections on their port only
//! from the job's own worker pods, its own PS pods (shard 0 calls the other shards to finalize,
//! to assemble a pull and to pass on a rescale) and the peers the operator was given (the chart
//! passes the operator's pods and whoever scrapes metrics). The PS takes gradients from anyone holding
//! the job's token; with the policy, a pod of another job or tenant cannot even open a
//! connection to it.
//!
//! The PodDisruptionBudget (`parameterServer.disruptionBudget`): no eviction takes a ready PS.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::Owner;
use crate::controller::names::{
    COMPONENT_PS, COMPONENT_WORKER, LABEL_COMPONENT, LABEL_JOB, PS_PORT, ps_name,
};

impl Owner<'_> {
    /// The NetworkPolicy `<job>-ps`: ingress to every shard's PS pods only from the job's
    /// workers, its PS pods and `peers`, only on the PS port. Egress is not restricted.
    pub fn ps_network_policy(&self, peers: &[NetworkPolicyPeer]) -> NetworkPolicy {
        let port = NetworkPolicyPort {
            port: Some(IntOrString::Int(PS_PORT)),
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        // A peer with only a pod selector means pods of the job's own namespace.
        let own = |component| NetworkPolicyPeer {
            pod_selector: Some(self.role_selector(component)),
            ..Default::default()
        };
        let from =
            [own(COMPONENT_WORKER), own(COMPONENT_PS)].into_iter().chain(peers.iter().cloned()).collect();
        NetworkPolicy {
            metadata: self.meta(ps_name(&self.name), COMPONENT_PS),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(self.role_selector(COMPONENT_PS)),
                policy_types: Some(vec!["Ingress".into()]),
                ingress: Some(vec![NetworkPolicyIngressRule { from: Some(from), ports: Some(vec![port]) }]),
                ..Default::default()
            }),
        }
    }

    /// The PodDisruptionBudget `<job>-ps`: no ready PS pod of the job (any shard) may be
    /// evicted (`maxUnavailable: 0`); an unready one may (`unhealthyPodEvictionPolicy:
    /// AlwaysAllow`), so that a PS stuck restarting never blocks a drain.
    pub fn ps_disruption_budget(&self) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: self.meta(ps_name(&self.name), COMPONENT_PS),
            spec: Some(PodDisruptionBudgetSpec {
                max_unavailable: Some(IntOrString::Int(0)),
                selector: Some(self.role_selector(COMPONENT_PS)),
                unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The pods of one role of the job (every shard's, for the PS).
    fn role_selector(&self, component: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([
                (LABEL_JOB.into(), self.name.clone()),
                (LABEL_COMPONENT.into(), component.into()),
            ])),
            ..Default::default()
        }
    }
}
