//! Per-role pod settings: what a platform adds to the parameter server's and the workers' pods
//! (placement, identity, priority, configuration, extra volumes). The shape is Kubeflow Trainer
//! v2's `podTemplateOverrides`: named, typed fields merged into the pod the operator builds,
//! rather than TFJob's whole pod `template` (docs/architecture.md says why).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvFromSource, EnvVar, LocalObjectReference, Toleration, TopologySpreadConstraint,
    Volume, VolumeMount,
};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Prefix of the environment variables the operator sets.
pub const RESERVED_ENV_PREFIX: &str = "FORESIGHT_";
/// Names of the volumes the operator gives its pods.
pub const RESERVED_VOLUMES: [&str; 6] = ["tmp", "dataset", "checkpoints", "output", "ps-tls", "ps-ca"];
/// Where the operator mounts them (and `dataset.path`, the dataset's mount).
pub const RESERVED_PATHS: [&str; 5] =
    ["/tmp", "/checkpoints", "/output", "/etc/foresight/tls", "/etc/foresight/ps-ca"];
/// The names of the operator's own containers.
pub const RESERVED_CONTAINERS: [&str; 2] = ["worker", "parameter-server"];
/// The label keys the operator sets on every pod: its selectors, the Services and the
/// PodMonitor use them.
pub const RESERVED_LABELS: [&str; 6] = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "foresight.dev/job",
    "foresight.dev/ps-shard",
];

/// The messages refusing a reserved name, the same from the CRD's rules and `api::validate`.
pub mod reserved {
    use std::sync::LazyLock;

    use super::*;

    pub static LABELS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{} are set by the operator (its selectors and the PodMonitor use them)",
            RESERVED_LABELS.join(", ")
        )
    });
    pub static VOLUMES: LazyLock<String> =
        LazyLock::new(|| format!("{} are the operator's volume names", RESERVED_VOLUMES.join(", ")));
    pub static PATHS: LazyLock<String> =
        LazyLock::new(|| format!("{} are mounted by the operator", RESERVED_PATHS.join(", ")));
    pub static CONTAINERS: LazyLock<String> =
        LazyLock::new(|| format!("{} are the operator's container names", RESERVED_CONTAINERS.join(", ")));
}

/// `items` as a CEL list of strings.
fn cel_list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    format!("[{}]", quoted.join(", "))
}

/// Settings added to a role's pods. Everything else in the pod (its container, probes,
/// security context, the operator's variables, volumes and labels) is the operator's.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.env) || self.env.all(e, !e.name.startsWith('FORESIGHT_'))").message("names starting with FORESIGHT_ are set by the operator").field_path(".env"))]
#[x_kube(validation = Rule::new(format!("!has(self.labels) || {}.all(k, !(k in self.labels))", cel_list(&RESERVED_LABELS))).message(reserved::LABELS.as_str()).field_path(".labels"))]
#[x_kube(validation = Rule::new(format!("!has(self.volumes) || self.volumes.all(v, !(v.name in {}))", cel_list(&RESERVED_VOLUMES))).message(reserved::VOLUMES.as_str()).field_path(".volumes"))]
#[x_kube(validation = Rule::new("!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name))").message("each volume mount must name a volume of this pod block's volumes").field_path(".volumeMounts"))]
#[x_kube(validation = Rule::new(format!("!has(self.volumeMounts) || self.volumeMounts.all(m, !(m.mountPath in {}))", cel_list(&RESERVED_PATHS))).message(reserved::PATHS.as_str()).field_path(".volumeMounts"))]
#[x_kube(validation = Rule::new("!has(self.initContainers) || self.initContainers.all(c, has(c.image) && size(c.image) > 0)").message("each init container needs an image").field_path(".initContainers"))]
#[x_kube(validation = Rule::new(format!("!has(self.initContainers) || self.initContainers.all(c, !(c.name in {}))", cel_list(&RESERVED_CONTAINERS))).message(reserved::CONTAINERS.as_str()).field_path(".initContainers"))]
#[x_kube(validation = Rule::new("!has(self.initContainers) || self.initContainers.all(c, !has(c.restartPolicy) || c.restartPolicy == 'Always')").message("an init container's restartPolicy may only be Always (a sidecar)").field_path(".initContainers"))]
#[serde(rename_all = "camelCase")]
pub struct PodSettings {
    /// Labels added to the pods (not the operator's own keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations added to the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Node labels the pods' node must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub tolerations: Option<Vec<Toleration>>,
    /// Node and pod affinity and anti-affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// PriorityClass of the pods (it must exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("must be a PriorityClass name (lowercase letters, digits, '-' and '.')"))]
    pub priority_class_name: Option<String>,
    /// ServiceAccount the pods run as (it must exist; default: the namespace's `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("must be a ServiceAccount name (lowercase letters, digits, '-' and '.')"))]
    pub service_account_name: Option<String>,
    /// Mount the ServiceAccount's API token in the pods (default false: the training code needs
    /// no Kubernetes API; set true for workload identity, e.g. to read a data bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automount_service_account_token: Option<bool>,
    /// Secrets to pull the images with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Environment variables added to the container (names not starting with FORESIGHT_).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub env: Option<Vec<EnvVar>>,
    /// Sources of environment variables added to the container; the operator's own variables
    /// take precedence over them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub env_from: Option<Vec<EnvFromSource>>,
    /// Volumes added to the pods (not named tmp, dataset, checkpoints or output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub volumes: Option<Vec<Volume>>,
    /// Where the container mounts those volumes (not /tmp, /checkpoints, /output or the dataset's
    /// path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub volume_mounts: Option<Vec<VolumeMount>>,
    /// How the pods spread over zones or nodes (e.g. workers one per node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// RuntimeClass of the pods (it must exist), e.g. a sandboxed or a GPU runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("must be a RuntimeClass name (lowercase letters, digits, '-' and '.')"))]
    pub runtime_class_name: Option<String>,
    /// The scheduler that places the pods (default: the cluster's default scheduler), e.g. a
    /// gang or topology-aware one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("must be a scheduler name (lowercase letters, digits, '-' and '.')"))]
    pub scheduler_name: Option<String>,
    /// Which user and groups the pods run as, for data on shared filesystems whose files belong
    /// to a user or group (NFS). The rest of the security context stays the operator's: non-root,
    /// no privilege escalation, no capabilities, a read-only root filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodIdentity>,
    /// Size limit of the pods' `/tmp` (an emptyDir), a quantity > 0 such as `2Gi`; default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))").message("must be a quantity > 0, e.g. 2Gi"))]
    pub tmp_size_limit: Option<String>,
    /// Containers that run in the pods before the role's own, each to its end and in order (to
    /// fetch data into `/tmp`, wait for a service), or, with `restartPolicy: Always`, beside it
    /// for the pod's whole life: a native sidecar (a log shipper, a storage proxy), which the
    /// kubelet stops once the worker has ended, so the workers' Job still completes. Mounts may
    /// name this block's volumes, `tmp`, the workers' `dataset` and the PS's `checkpoints`. A
    /// container without a `securityContext` gets the operator's (non-root, no privilege
    /// escalation, no capabilities, read-only root filesystem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub init_containers: Option<Vec<Container>>,
}

/// The user and groups of a role's pods. Never root: the operator's containers run as non-root,
/// so 0 is refused here rather than by the kubelet at the pods' start.
#[derive(Clone, Debug, Default, Deserialize, Serialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodIdentity {
    /// The user the containers run as (default 10001), ≥ 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub run_as_user: Option<i64>,
    /// The primary group (default 10001), ≥ 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub run_as_group: Option<i64>,
    /// The group that owns the pods' volumes (default 10001), ≥ 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2147483647))]
    pub fs_group: Option<i64>,
    /// More groups of the containers' processes (an NFS share's group), each ≥ 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.all(g, g >= 1 && g <= 2147483647)").message("each group must be in 1..2147483647 (never root's)"))]
    pub supplemental_groups: Option<Vec<i64>>,
}

/// The fields of `PodSettings` whose schema is a Kubernetes type's.
pub(super) const UPSTREAM_FIELDS: [&str; 9] = [
    "tolerations",
    "affinity",
    "imagePullSecrets",
    "env",
    "envFrom",
    "volumes",
    "volumeMounts",
    "topologySpreadConstraints",
    "initContainers",
];

/// Shapes the generated schema of a `pod` block (its `properties`) for the API server. The
/// Kubernetes types inside lose their upstream descriptions (`kubectl explain pod.spec` has
/// them): with them the CRD was 586 KB, past the 256 KiB annotation in which a client-side
/// `kubectl apply` keeps what it applied (the init containers alone added 94 kB of JSON). Init
/// containers are keyed by name as in a pod: the API server refuses two of one name. Volume and
/// mount names get Kubernetes' own bound (a
/// DNS label, 63 bytes) and mount paths Linux's (4096), without which the API server estimates
/// the cost of the rules comparing them from unbounded strings and refuses the CRD.
pub(super) fn trim_schema(properties: &mut serde_json::Value) {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("description");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    for field in UPSTREAM_FIELDS {
        let Some(schema) = properties.get_mut(field).and_then(|f| f.as_object_mut()) else { continue };
        for (key, v) in schema.iter_mut() {
            if key != "description" {
                strip(v);
            }
        }
    }
    for list in ["volumes", "volumeMounts"] {
        properties[list]["items"]["properties"]["name"]["maxLength"] = 63.into();
    }
    properties["initContainers"]["x-kubernetes-list-type"] = "map".into();
    properties["initContainers"]["x-kubernetes-list-map-keys"] = serde_json::json!(["name"]);
    // Linux's PATH_MAX: the rule comparing mounts with `dataset.path` needs a bound too.
    properties["volumeMounts"]["items"]["properties"]["mountPath"]["maxLength"] = 4096.into();
}
