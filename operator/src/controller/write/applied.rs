//! What the operator last wrote to each child, so that a reconcile whose intent has not changed
//! sends nothing. A running job is reconciled every `--progress-seconds`; without this memo each
//! of those reconciles re-sent every child (a server-side apply per Service, Deployment, Job and
//! claim, and a POST of the token Secret answered 409): about 4 requests that changed nothing.
//!
//! An apply is skipped only when the child the caches hold is the very object the last apply
//! returned (same UID and resourceVersion) and the operator's intent for it is the same. Any
//! change by anyone (an edit by hand, a controller's status write) gives the object a new
//! resourceVersion, and the next reconcile applies again, which takes back what was changed by
//! hand as before.
//!
//! The memo lives in memory; each child also carries the digest of the intent it was last
//! written with (`foresight.dev/intent`). A new operator process (a restart, a failover), which
//! knows nothing of a child, writes it only when that digest is not its own intent's: without
//! it, a failover re-applied every child of every job at once. The one thing given up: an edit
//! by hand made while no operator remembered the child (before the restart) stays until the
//! intent changes or the child changes again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ring::digest::{Context as Digest, SHA256};

/// Entries not looked at for this long are dropped (children of jobs deleted while running).
/// Every live job is reconciled at least once a minute, and a dropped entry costs one apply.
const KEEP: Duration = Duration::from_secs(3600);

/// A child, by kind, namespace and name.
pub(crate) type Key = (String, String, String);

/// The memo, shared by every reconcile.
#[derive(Default)]
pub(crate) struct Applied {
    entries: Mutex<HashMap<Key, Entry>>,
}

struct Entry {
    fingerprint: Fingerprint,
    used: Instant,
}

/// A digest of what identifies one write's result: the object's UID and resourceVersion and
/// the operator's intent.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Of `parts`, each length-prefixed so that no two lists of parts run together alike.
    pub(crate) fn of(parts: &[&[u8]]) -> Self {
        let mut d = Digest::new(&SHA256);
        for p in parts {
            d.update(&(p.len() as u64).to_le_bytes());
            d.update(p);
        }
        let mut out = [0; 32];
        out.copy_from_slice(d.finish().as_ref());
        Self(out)
    }
}

impl Applied {
    /// Whether the last write recorded for `key` had this fingerprint.
    pub(crate) fn holds(&self, key: &Key, fingerprint: Fingerprint) -> bool {
        self.current(key, fingerprint, false)
    }

    /// Whether child `key`, seen with `fingerprint`, needs no write: its last recorded write
    /// had this fingerprint, or, none being recorded (a new process), the child carries the
    /// digest of the same intent (`carries_intent`), which is then recorded.
    pub(crate) fn current(&self, key: &Key, fingerprint: Fingerprint, carries_intent: bool) -> bool {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match entries.get_mut(key) {
            Some(e) if e.fingerprint == fingerprint => {
                e.used = Instant::now();
                true
            }
            Some(_) => false,
            None if carries_intent => {
                entries.insert(key.clone(), Entry { fingerprint, used: Instant::now() });
                true
            }
            None => false,
        }
    }

    pub(crate) fn record(&self, key: Key, fingerprint: Fingerprint) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        entries.retain(|_, e| now.duration_since(e.used) < KEEP);
        entries.insert(key, Entry { fingerprint, used: now });
    }

    pub(crate) fn forget(&self, key: &Key) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        ("Service".into(), "ns".into(), name.into())
    }

    #[test]
    fn a_write_is_known_only_by_its_own_fingerprint_until_forgotten() {
        let memo = Applied::default();
        let a = Fingerprint::of(&[b"uid", b"7", b"{}"]);
        assert!(!memo.holds(&key("x"), a), "nothing recorded yet");
        memo.record(key("x"), a);
        assert!(memo.holds(&key("x"), a));
        assert!(!memo.holds(&key("y"), a), "another child");
        // A new resourceVersion, another UID or another intent each miss.
        for other in [[b"uid" as &[u8], b"8", b"{}"], [b"uie", b"7", b"{}"], [b"uid", b"7", b"{\"a\":1}"]] {
            assert!(!memo.holds(&key("x"), Fingerprint::of(&other)));
        }
        // Parts do not run together: ("ab", "c") is not ("a", "bc").
        assert_ne!(Fingerprint::of(&[b"ab", b"c"]), Fingerprint::of(&[b"a", b"bc"]));
        memo.forget(&key("x"));
        assert!(!memo.holds(&key("x"), a));
    }

    #[test]
    fn a_child_carrying_the_intent_is_current_only_when_nothing_is_recorded_for_it() {
        let memo = Applied::default();
        let (a, b) = (Fingerprint::of(&[b"uid", b"7", b"{}"]), Fingerprint::of(&[b"uid", b"8", b"{}"]));
        assert!(!memo.current(&key("x"), a, false), "unknown, and not carrying the intent");
        assert!(memo.current(&key("x"), a, true), "unknown, carrying it: a new process");
        assert!(memo.holds(&key("x"), a), "recorded");
        // Changed since (an edit by hand): the digest it carries no longer settles it.
        assert!(!memo.current(&key("x"), b, true));
        assert!(memo.current(&key("x"), a, false), "the recorded write");
    }
}
