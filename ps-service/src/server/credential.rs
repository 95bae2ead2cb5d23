//! Per-incarnation worker credentials. Every worker pod holds the same workers' token, so the
//! token alone cannot tell worker 1 from worker 3: without more, any of them could pull as
//! another (taking over its delay-compensation backup and its int8 copy), send its heartbeats
//! or end its training with `leave`. A join answers a credential for that worker and generation
//! (an HMAC of them under the job's control token, which workers never hold), and every later
//! call that acts for a worker must carry the credential of that worker (and, where the call
//! names one, that generation). Acting for another worker then takes a join as that worker:
//! a new generation, journaled as `started`, that turns the worker's own process away.
//!
//! The MAC covers the shard too, so a credential of one shard is worth nothing on another. It
//! needs no state: a restarted shard (the same control token) still accepts the credentials it
//! issued before. Without a control token (a PS run by hand) nothing is checked.

use axum::http::{HeaderMap, StatusCode};
use ring::hmac;

use super::{ApiError, auth};
use crate::wire::protocol::{CREDENTIAL_HEADER, reason};

/// What a credential says its holder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incarnation {
    pub worker: usize,
    pub generation: u64,
}

pub struct Credentials {
    /// `None`: no control token, nothing is issued or checked.
    key: Option<hmac::Key>,
    /// Its holder (the operator, `foresight run`) may act for any worker.
    control_token: Option<String>,
    shard: usize,
}

impl Credentials {
    pub fn new(control_token: Option<&str>, shard: usize) -> Self {
        let key = control_token.map(|t| hmac::Key::new(hmac::HMAC_SHA256, t.as_bytes()));
        Self { key, control_token: control_token.map(str::to_string), shard }
    }

    fn message(&self, i: Incarnation) -> String {
        format!(
            "foresight worker credential/shard {}/worker {}/generation {}",
            self.shard, i.worker, i.generation
        )
    }

    /// The credential a join of `i` answers; `None` when none are checked.
    pub fn issue(&self, i: Incarnation) -> Option<String> {
        let key = self.key.as_ref()?;
        let mac = hmac::sign(key, self.message(i).as_bytes());
        Some(format!("{}.{}.{}", i.worker, i.generation, hex(mac.as_ref())))
    }

    /// Checks that the call's credential is `worker`'s (and `generation`'s, when the call names
    /// one). Answers the credential's generation (`generation` itself when none are checked, or
    /// the call carries the control token).
    pub fn check(
        &self,
        headers: &HeaderMap,
        worker: usize,
        generation: Option<u64>,
    ) -> Result<Option<u64>, ApiError> {
        let Some(key) = &self.key else { return Ok(generation) };
        if auth::same(auth::bearer(headers), self.control_token.as_ref()) {
            return Ok(generation);
        }
        let given = headers.get(CREDENTIAL_HEADER).and_then(|v| v.to_str().ok());
        let Some((held, mac)) = given.and_then(parse) else {
            return Err(refused(worker, "no credential"));
        };
        if hmac::verify(key, self.message(held).as_bytes(), &mac).is_err() {
            return Err(refused(worker, "a credential this parameter server did not issue"));
        }
        if held.worker != worker || generation.is_some_and(|g| g != held.generation) {
            let what = format!("the credential of worker {}, generation {}", held.worker, held.generation);
            return Err(refused(worker, &what));
        }
        Ok(Some(held.generation))
    }
}

fn refused(worker: usize, carried: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        reason::CREDENTIAL_REFUSED,
        format!(
            "this call acts for worker {worker} but carries {carried}: each worker process sends the \
             credential its join answered ({CREDENTIAL_HEADER})"
        ),
    )
}

fn parse(text: &str) -> Option<(Incarnation, Vec<u8>)> {
    let mut parts = text.splitn(3, '.');
    let worker = parts.next()?.parse().ok()?;
    let generation = parts.next()?.parse().ok()?;
    let mac = unhex(parts.next()?)?;
    Some((Incarnation { worker, generation }, mac))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carrying(credential: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CREDENTIAL_HEADER, credential.parse().unwrap());
        h
    }

    #[test]
    fn a_credential_acts_for_its_own_worker_and_generation_only() {
        let c = Credentials::new(Some("control"), 0);
        let mine = c.issue(Incarnation { worker: 1, generation: 4 }).unwrap();
        assert_eq!(c.check(&carrying(&mine), 1, Some(4)).unwrap(), Some(4));
        assert_eq!(c.check(&carrying(&mine), 1, None).unwrap(), Some(4));
        for (worker, generation) in [(3, None), (1, Some(3)), (1, Some(5))] {
            let e = c.check(&carrying(&mine), worker, generation).unwrap_err();
            assert_eq!(e.reason, "credential_refused");
            assert!(e.message.contains("worker 1, generation 4"), "{}", e.message);
        }
        assert!(c.check(&HeaderMap::new(), 1, Some(4)).unwrap_err().message.contains("no credential"));
    }

    #[test]
    fn a_forged_or_another_shards_credential_is_refused() {
        let shard0 = Credentials::new(Some("control"), 0);
        let other_shard = Credentials::new(Some("control"), 1);
        let other_key = Credentials::new(Some("workers-token"), 0);
        let mine = shard0.issue(Incarnation { worker: 2, generation: 1 }).unwrap();
        // The same incarnation claimed with another MAC, or the MAC kept and the claim changed.
        let relabelled = mine.replacen("2.1.", "3.1.", 1);
        let forged = other_key.issue(Incarnation { worker: 2, generation: 1 }).unwrap();
        for (checker, given) in [(&other_shard, &mine), (&shard0, &relabelled), (&shard0, &forged)] {
            let worker = if given == &relabelled { 3 } else { 2 };
            let e = checker.check(&carrying(given), worker, None).unwrap_err();
            assert!(e.message.contains("did not issue"), "{}", e.message);
        }
        for garbage in ["", "2.1", "2.1.zz", "x.1.00", &mine[..mine.len() - 1]] {
            assert!(shard0.check(&carrying(garbage), 2, None).is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn the_control_token_acts_for_any_worker() {
        let c = Credentials::new(Some("control"), 0);
        let mut h = HeaderMap::new();
        h.insert(axum::http::header::AUTHORIZATION, "Bearer control".parse().unwrap());
        assert_eq!(c.check(&h, 3, Some(2)).unwrap(), Some(2));
        h.insert(axum::http::header::AUTHORIZATION, "Bearer workers".parse().unwrap());
        assert!(c.check(&h, 3, Some(2)).is_err());
    }

    #[test]
    fn without_a_control_token_nothing_is_issued_or_checked() {
        let c = Credentials::new(None, 0);
        assert_eq!(c.issue(Incarnation { worker: 0, generation: 1 }), None);
        assert_eq!(c.check(&HeaderMap::new(), 0, Some(7)).unwrap(), Some(7));
        assert_eq!(c.check(&HeaderMap::new(), 0, None).unwrap(), None);
    }
}
