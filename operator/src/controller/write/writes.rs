//! The operator's writes to a job's children: each one only on an object that is the job's
//! (`ownership`). A child the caches have not seen is created (POST: it fails on any object
//! that already has the name, whoever made it), never adopted by a server-side apply; one that
//! is the job's is applied and deleted with its UID as a precondition, so that an object made
//! again under the same name by someone else in between is refused by the API server.

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::applied::{Fingerprint, Key};
use crate::controller::context::Context;
use crate::controller::desired::ownership::Mark;
use crate::controller::error::{Error, Result, is_status};
use crate::controller::names::{self, MANAGER};

/// A namespaced object the operator writes.
pub(crate) trait Child:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Serialize
    + DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> Child for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug
{
}

/// Makes the API server's copy of child `obj` what the operator built, given the object the
/// caches hold under its name (`seen`; `None`: none of the operator's labelled objects).
/// Returns the object as the API server has it. Sends nothing when `seen` is what the last
/// write of the same intent returned (`applied`).
pub(crate) async fn apply<K: Child>(ctx: &Context, mut obj: K, seen: Option<K>, mark: Mark<'_>) -> Result<K> {
    let api: Api<K> =
        Api::namespaced(ctx.client.clone(), obj.meta().namespace.as_deref().unwrap_or_default());
    let name = obj.meta().name.clone().ok_or(Error::Incomplete)?;
    let key = key_of(&obj);
    let intent = serde_json::to_vec(&obj).expect("Kubernetes objects serialize");
    let digest = names::digest(&intent);
    obj.meta_mut().annotations.get_or_insert_default().insert(names::INTENT.into(), digest.clone());
    let seen = match seen {
        Some(seen) => seen,
        None => match api
            .create(&PostParams { field_manager: Some(MANAGER.into()), ..Default::default() }, &obj)
            .await
        {
            Ok(made) => {
                ctx.applied.record(key, result_of(&made, &intent));
                return Ok(made);
            }
            // Made by an earlier reconcile the caches have not caught up with, or by someone else.
            Err(e) if is_status(&e, 409) => api.get(&name).await?,
            Err(e) => return Err(e.into()),
        },
    };
    let uid = crate::controller::observe::ours(&seen, mark)?;
    let carries_intent = seen.annotations().get(names::INTENT) == Some(&digest);
    if ctx.applied.current(&key, result_of(&seen, &intent), carries_intent) {
        return Ok(seen);
    }
    let mut value = serde_json::to_value(&obj).expect("Kubernetes objects serialize");
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    // A UID the object no longer has (deleted and made again) makes the API server refuse.
    value["metadata"]["uid"] = uid.into();
    // `force`: the operator owns every field it sets, and takes back what was changed by hand.
    let applied = api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(value)).await?;
    ctx.applied.record(key, result_of(&applied, &intent));
    Ok(applied)
}

fn key_of<K: Child>(obj: &K) -> Key {
    let meta = obj.meta();
    (
        K::kind(&()).into_owned(),
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// What identifies `obj` as the result of writing `intent`.
fn result_of<K: Child>(obj: &K, intent: &[u8]) -> Fingerprint {
    let meta = obj.meta();
    let (uid, version) = (meta.uid.as_deref().unwrap_or_default(), meta.resource_version.as_deref());
    Fingerprint::of(&[uid.as_bytes(), version.unwrap_or_default().as_bytes(), intent])
}

/// Creates the object `make` builds, named `name` in `namespace`, once and never writes it
/// again: an object of that name, whoever made it, is left as it is. For the job's Secrets,
/// which the operator may create but not read or patch; their names carry the job's UID, so
/// only an earlier reconcile can have made them. `make` runs only when the object is not known
/// to exist (the PS's certificates take signatures to build).
pub(crate) async fn create_once<K: Child>(
    ctx: &Context,
    namespace: &str,
    name: &str,
    make: impl FnOnce() -> Result<K>,
) -> Result<()> {
    let (key, created) = (
        (K::kind(&()).into_owned(), namespace.to_string(), name.to_string()),
        Fingerprint::of(&[b"created"]),
    );
    if ctx.applied.holds(&key, created) {
        return Ok(());
    }
    let obj = make()?;
    debug_assert_eq!(key_of(&obj), key, "make builds the object named");
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    match api.create(&PostParams { field_manager: Some(MANAGER.into()), ..Default::default() }, &obj).await {
        Ok(_) => {}
        Err(e) if is_status(&e, 409) => {}
        Err(e) => return Err(e.into()),
    }
    ctx.applied.record(key, created);
    Ok(())
}

/// Deletes the job's child `obj` (as the caches saw it) if it is still that object. One that is
/// someone else's is left alone (the apply that would need it reports the conflict), one
/// already gone is no error.
pub(crate) async fn delete<K: Child>(ctx: &Context, obj: &K, mark: Mark<'_>) -> Result<()> {
    let Ok(uid) = crate::controller::observe::ours(obj, mark) else { return Ok(()) };
    let api: Api<K> =
        Api::namespaced(ctx.client.clone(), obj.meta().namespace.as_deref().unwrap_or_default());
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
        ..DeleteParams::background()
    };
    ctx.applied.forget(&key_of(obj));
    match api.delete(&obj.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
