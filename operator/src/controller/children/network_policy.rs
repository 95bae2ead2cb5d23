//! The job's NetworkPolicy (`--ps-network-policy`): its parameter servers accept connections on
//! their port only from the job's own worker pods and from the peers the operator was given
//! (the chart passes the operator's pods and whoever scrapes metrics). The PS holds the model
//! and takes gradients from anyone holding the job's token; with the policy, a pod of another
//! job or tenant cannot even open a connection to it.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{COMPONENT_PS, COMPONENT_WORKER, LABEL_COMPONENT, LABEL_JOB, Owner, PS_PORT, ps_name};

impl Owner<'_> {
    /// The NetworkPolicy `<job>-ps`: ingress to every shard's PS pods only from the job's
    /// workers and `peers`, only on the PS port. Egress is not restricted.
    pub fn ps_network_policy(&self, peers: &[NetworkPolicyPeer]) -> NetworkPolicy {
        let select = |component: &str| LabelSelector {
            match_labels: Some(BTreeMap::from([
                (LABEL_JOB.into(), self.name.clone()),
                (LABEL_COMPONENT.into(), component.into()),
            ])),
            ..Default::default()
        };
        let port = NetworkPolicyPort {
            port: Some(IntOrString::Int(PS_PORT)),
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        // A peer with only a pod selector means pods of the job's own namespace.
        let workers =
            NetworkPolicyPeer { pod_selector: Some(select(COMPONENT_WORKER)), ..Default::default() };
        let from = std::iter::once(workers).chain(peers.iter().cloned()).collect();
        NetworkPolicy {
            metadata: self.meta(ps_name(&self.name), COMPONENT_PS),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(select(COMPONENT_PS)),
                policy_types: Some(vec!["Ingress".into()]),
                ingress: Some(vec![NetworkPolicyIngressRule { from: Some(from), ports: Some(vec![port]) }]),
                ..Default::default()
            }),
        }
    }
}
