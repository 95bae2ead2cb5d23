//! One client per job for the operator's calls to its parameter server.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use foresight_ps::client::{ClientError, ClientTls, PsClient};

/// One client per job (by UID) for every call the operator makes to its PS: one HTTP/2
/// connection per job rather than a new client, TLS setup and connection per call, each with
/// small windows (`PsClient::for_control`) so that no PS makes the operator hold much unread.
/// A client is made anew when the job's URL, TLS or token changes; one unused for [`IDLE`]
/// (a job that ended or was deleted) is dropped when another is made.
#[derive(Default)]
pub(crate) struct PsClients(Mutex<ByJob>);

#[derive(Default)]
struct ByJob {
    clients: HashMap<String, Cached>,
    /// Clients made so far.
    made: u64,
}

/// Longer than any job's period between two reads of its PS (`--progress-every`, 60 s at most
/// in practice; a job that is not running is read on each of its reconciles).
const IDLE: Duration = Duration::from_secs(600);

struct Cached {
    url: String,
    tls: bool,
    token: String,
    client: PsClient,
    used: Instant,
}

impl PsClients {
    /// Job `uid`'s client for its PS at `url` (trusting `tls`), calling with `token`.
    pub(crate) fn get(
        &self,
        uid: &str,
        url: &str,
        tls: Option<&ClientTls>,
        token: String,
    ) -> Result<PsClient, ClientError> {
        self.get_at(uid, url, tls, token, Instant::now())
    }

    fn get_at(
        &self,
        uid: &str,
        url: &str,
        tls: Option<&ClientTls>,
        token: String,
        now: Instant,
    ) -> Result<PsClient, ClientError> {
        let mut jobs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let same = |c: &Cached| c.url == url && c.tls == tls.is_some() && c.token == token;
        if let Some(c) = jobs.clients.get_mut(uid).filter(|c| same(c)) {
            c.used = now;
            return Ok(c.client.clone());
        }
        jobs.clients.retain(|_, c| now.saturating_duration_since(c.used) < IDLE);
        let client = PsClient::for_control(url, Some(token.clone()), tls)?;
        let cached = Cached { url: url.into(), tls: tls.is_some(), token, client: client.clone(), used: now };
        jobs.clients.insert(uid.into(), cached);
        jobs.made += 1;
        Ok(client)
    }

    /// Drops the clients of jobs not in `live` (UIDs): deleted jobs' connections close now.
    pub(crate) fn retain(&self, live: &HashSet<&str>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clients.retain(|uid, _| live.contains(uid.as_str()));
    }

    #[cfg(test)]
    fn counts(&self) -> (usize, u64) {
        let jobs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (jobs.clients.len(), jobs.made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_job_keeps_one_client_until_it_changes_or_idles() {
        let (clients, t0) = (PsClients::default(), Instant::now());
        let get = |uid: &str, url: &str, token: &str, at: Duration| {
            clients.get_at(uid, url, None, token.into(), t0 + at).map(|_| clients.counts())
        };
        let (a, b, c) = ("http://a-ps.ns:8080", "http://b-ps.ns:8080", "http://c-ps.ns:8080");
        let s = Duration::from_secs;
        get("uid-a", a, "t", s(0)).unwrap();
        assert_eq!(get("uid-a", a, "t", s(30)).unwrap(), (1, 1), "the job's second call reuses its client");
        assert_eq!(
            get("uid-a", a, "other", s(31)).unwrap(),
            (1, 2),
            "a new token, a new client in its place"
        );
        assert_eq!(get("uid-b", b, "t", s(40)).unwrap(), (2, 3));
        // Long after a's last call (its job gone), making c drops a's client; b's stays in use.
        get("uid-b", b, "t", IDLE).unwrap();
        assert_eq!(get("uid-c", c, "t", IDLE + s(32)).unwrap(), (2, 4));
        assert!(get("uid-d", "ftp://d", "t", IDLE + s(33)).is_err(), "a bad URL makes none");
        assert_eq!(clients.counts(), (2, 4));
        clients.retain(&HashSet::from(["uid-c"]));
        assert_eq!(clients.counts(), (1, 4), "a deleted job's client goes at once");
        assert_eq!(get("uid-c", c, "t", IDLE + s(34)).unwrap(), (1, 4), "a live one's stays");
    }
}
