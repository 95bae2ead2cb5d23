//! Kueue's ResourceFlavors as the operator last read them (a cache with a minute's lifetime).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::api::Api;

use super::{ResourceFlavor, ResourceFlavorSpec};
use crate::controller::error::Result;

/// ResourceFlavors as last read, for a minute: every reconcile of an admitted job places its
/// pods by them, and a GET per flavor each time would be most of what such a reconcile asks
/// the API server. (A watch would need `list` and `watch` on a cluster-scoped kind; the chart
/// grants `get` only.) A flavor changed meanwhile places pods made after the minute.
#[derive(Default)]
pub(crate) struct Flavors(std::sync::Mutex<HashMap<String, (Instant, ResourceFlavorSpec)>>);

const FLAVOR_TTL: Duration = Duration::from_secs(60);

impl Flavors {
    pub(crate) async fn spec(&self, client: &kube::Client, name: &str) -> Result<ResourceFlavorSpec> {
        let fresh = |(read, _): &(Instant, ResourceFlavorSpec)| read.elapsed() < FLAVOR_TTL;
        if let Some((_, spec)) = self.lock().get(name).filter(|e| fresh(e)) {
            return Ok(spec.clone());
        }
        let spec = Api::<ResourceFlavor>::all(client.clone()).get(name).await?.spec;
        let mut cached = self.lock();
        cached.retain(|_, e| fresh(e));
        cached.insert(name.to_string(), (Instant::now(), spec.clone()));
        Ok(spec)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, ResourceFlavorSpec)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
