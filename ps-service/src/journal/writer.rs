//! The journal's writer: a thread of its own, fed through a bounded channel, so that the
//! store's locks never wait on the disk.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use super::{INITIAL_FILE, JOURNAL_FILE, Line, Mode, PAYLOADS_FILE, now_ms};
use crate::store::Store;
use crate::store::checkpoint::{self, CheckpointError};
use crate::store::journal::{Entry, JournalSink, Start};

/// Rotated files kept beside the current one.
const ROTATED_KEPT: u32 = 4;

enum Msg {
    Entry(Entry, Option<Vec<f32>>),
    /// Flush and fsync everything sent before, then answer.
    Sync(SyncSender<io::Result<()>>),
}

/// Appends the store's entries to `journal.jsonl` in its directory (see [`super`]).
pub struct Writer {
    tx: SyncSender<Msg>,
    capture: bool,
    dir: PathBuf,
    /// Entries not queued because the queue was full (the disk fell behind); see [`Writer::sink`].
    overflow: Arc<AtomicU64>,
}

impl Writer {
    /// Opens (creating) the journal in `dir` for shard `shard`; rotated past `max_bytes` (between
    /// batches: a batch is written whole into one file) unless `mode` captures payloads. `None`
    /// for [`Mode::Off`].
    pub fn open(dir: &Path, shard: usize, mode: Mode, max_bytes: u64) -> io::Result<Option<Self>> {
        if mode == Mode::Off {
            return Ok(None);
        }
        let capture = mode == Mode::Capture;
        let overflow = Arc::new(AtomicU64::new(0));
        let files = Files::open(dir, shard, capture, max_bytes, overflow.clone())?;
        // A captured entry holds a model-sized gradient while it waits: few of them.
        let (tx, rx) = sync_channel(if capture { 4 } else { 4096 });
        std::thread::Builder::new().name("journal".into()).spawn(move || files.run(rx))?;
        Ok(Some(Self { tx, capture, dir: dir.to_path_buf(), overflow }))
    }

    /// The store's sink: entries go to the writer in the order it is called. It is called under
    /// the store's locks, so training never waits on the disk: with 4,096 entries queued an
    /// entry is counted as missing (the journal marks the gap) instead. Only a capture, whose
    /// replay needs every entry, waits for room.
    pub fn sink(&self) -> JournalSink {
        let queue = self.queue();
        Box::new(move |entry, payload| queue.send(entry, payload))
    }

    /// An entry from outside the store.
    pub fn record(&self, entry: Entry, payload: Option<&[f32]>) {
        self.queue().send(entry, payload);
    }

    fn queue(&self) -> Queue {
        Queue { tx: self.tx.clone(), capture: self.capture, overflow: self.overflow.clone() }
    }

    /// The first entries for a model that a process installed as `how`. A registered model is
    /// where a replay begins: with payloads captured, its state is written beside the journal
    /// ([`INITIAL_FILE`]); a worker's copy that seeded the model goes into the payloads.
    pub fn begin(&self, store: &Store, how: Start) -> Result<(), CheckpointError> {
        let version = store.version();
        if how == Start::Registered && self.capture {
            let data = store.checkpoint();
            let path = self.dir.join(INITIAL_FILE);
            checkpoint::write_atomic(&path, |f| {
                checkpoint::encode_to(f, store.layout(), store.hyper(), &data)
            })?;
        }
        self.record(Entry::Started { version, how }, None);
        if how == Start::Seeded {
            self.record(Entry::Reseeded { version, payload: None }, Some(store.snapshot_now().params()));
        }
        Ok(())
    }

    /// Returns once everything recorded before is on disk.
    pub fn sync(&self) -> io::Result<()> {
        let (tx, rx) = sync_channel(1);
        let gone = || io::Error::other("the journal's writer has stopped");
        self.tx.send(Msg::Sync(tx)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}

/// The writer's end of the queue, as the store's sink holds it.
struct Queue {
    tx: SyncSender<Msg>,
    capture: bool,
    overflow: Arc<AtomicU64>,
}

impl Queue {
    fn send(&self, entry: Entry, payload: Option<&[f32]>) {
        if self.capture {
            // The writer is gone only if its thread panicked.
            let _ = self.tx.send(Msg::Entry(entry, payload.map(<[f32]>::to_vec)));
        } else if let Err(TrySendError::Full(_)) = self.tx.try_send(Msg::Entry(entry, None)) {
            self.overflow.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Files {
    dir: PathBuf,
    shard: usize,
    lines: File,
    /// Bytes of `lines` known whole: a failed write is cut back to it.
    written: u64,
    /// The batch's lines, written at once when it ends.
    batch: Vec<u8>,
    batch_entries: u64,
    /// Entries lost to failed writes since the last that succeeded: the next batch says so.
    dropped: u64,
    payloads: Option<Payloads>,
    max_bytes: Option<u64>,
    overflow: Arc<AtomicU64>,
}

struct Payloads {
    file: File,
    /// Bytes known whole, and bytes written so far (this batch's included).
    good: u64,
    len: u64,
}

impl Files {
    fn open(
        dir: &Path,
        shard: usize,
        capture: bool,
        max_bytes: u64,
        overflow: Arc<AtomicU64>,
    ) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let (lines, written) = open_lines(&dir.join(JOURNAL_FILE))?;
        let payloads = if capture {
            let file =
                OpenOptions::new().create(true).write(true).truncate(false).open(dir.join(PAYLOADS_FILE))?;
            let len = file.metadata()?.len();
            Some(Payloads { file, good: len, len })
        } else {
            None
        };
        let max_bytes = (!capture).then_some(max_bytes.max(1));
        let (batch, batch_entries, dropped) = (Vec::new(), 0, 0);
        Ok(Self {
            dir: dir.to_path_buf(),
            shard,
            lines,
            written,
            batch,
            batch_entries,
            dropped,
            payloads,
            max_bytes,
            overflow,
        })
    }

    /// Takes batches until every sender is gone. A batch that cannot be written (a full disk)
    /// is cut back out of the files, counted, and logged; the next one that can be says how
    /// many entries are missing before it (a `gap` entry), and training never waits on it.
    fn run(mut self, rx: Receiver<Msg>) {
        while let Ok(first) = rx.recv() {
            let mut next = Some(first);
            let mut syncs = Vec::new();
            while let Some(msg) = next.take() {
                match msg {
                    Msg::Entry(entry, payload) => self.append(entry, payload),
                    Msg::Sync(reply) => syncs.push(reply),
                }
                next = rx.try_recv().ok();
            }
            let mut result = self.end_batch();
            if !syncs.is_empty() {
                result = result.and_then(|()| self.sync_all());
            }
            if let Err(error) = &result {
                tracing::error!(dir = %self.dir.display(), %error, dropped = self.dropped, "the update journal could not be written: its entries are missing until it can");
            }
            for reply in syncs {
                let _ = reply
                    .send(result.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string())));
            }
        }
    }

    fn append(&mut self, mut entry: Entry, payload: Option<Vec<f32>>) {
        self.batch_entries += 1;
        if let (Some(values), Some(p), Some(at)) = (payload, self.payloads.as_mut(), entry.payload_mut()) {
            let bytes: &[u8] = bytemuck::cast_slice(&values);
            // A failed write is found (and cut back) when the batch ends.
            if p.file.write_all_at(bytes, p.len).is_ok() {
                *at = Some(p.len);
            }
            p.len += bytes.len() as u64;
        }
        let line = Line { t_ms: now_ms(), shard: self.shard, entry };
        serde_json::to_writer(&mut self.batch, &line).expect("entries serialize");
        self.batch.push(b'\n');
    }

    /// Writes the batch: payloads first, so that a line on disk never points past them.
    fn end_batch(&mut self) -> io::Result<()> {
        self.dropped += self.overflow.swap(0, Ordering::Relaxed);
        let entries = std::mem::take(&mut self.batch_entries);
        let mut batch = std::mem::take(&mut self.batch);
        if entries == 0 {
            return Ok(());
        }
        let result = self.write_batch(&mut batch);
        if result.is_err() {
            self.dropped += entries;
            let _ = self.lines.set_len(self.written);
            if let Some(p) = &mut self.payloads {
                let _ = p.file.set_len(p.good);
                p.len = p.good;
            }
        }
        batch.clear();
        self.batch = batch;
        result
    }

    fn write_batch(&mut self, batch: &mut Vec<u8>) -> io::Result<()> {
        if let Some(p) = &mut self.payloads {
            let written = p.file.metadata()?.len();
            if written < p.len {
                return Err(io::Error::new(io::ErrorKind::StorageFull, "a payload was not written whole"));
            }
            p.good = p.len;
        }
        if self.dropped > 0 {
            let mut gap = serde_json::to_vec(&Line {
                t_ms: now_ms(),
                shard: self.shard,
                entry: Entry::Gap { entries: self.dropped },
            })?;
            gap.push(b'\n');
            batch.splice(0..0, gap);
        }
        if self.max_bytes.is_some_and(|max| self.written + batch.len() as u64 > max) && self.written > 0 {
            self.rotate()?;
        }
        self.lines.write_all(batch)?;
        self.written += batch.len() as u64;
        self.dropped = 0;
        Ok(())
    }

    fn sync_all(&mut self) -> io::Result<()> {
        if let Some(p) = &self.payloads {
            p.file.sync_data()?;
        }
        self.lines.sync_data()
    }

    /// `journal.jsonl` becomes `.1`, `.1` becomes `.2`, …; the oldest past [`ROTATED_KEPT`] goes.
    fn rotate(&mut self) -> io::Result<()> {
        self.lines.sync_data()?;
        let name = |n: u32| self.dir.join(format!("{JOURNAL_FILE}.{n}"));
        let _ = fs::remove_file(name(ROTATED_KEPT));
        for n in (1..ROTATED_KEPT).rev() {
            if name(n).exists() {
                fs::rename(name(n), name(n + 1))?;
            }
        }
        let current = self.dir.join(JOURNAL_FILE);
        fs::rename(&current, name(1))?;
        (self.lines, self.written) = open_lines(&current)?;
        Ok(())
    }
}

/// Opens the journal for appending, first cutting a line a crash left without its newline.
fn open_lines(path: &Path) -> io::Result<(File, u64)> {
    let mut file = OpenOptions::new().create(true).read(true).append(true).open(path)?;
    let len = file.metadata()?.len();
    let mut kept = len;
    if len > 0 {
        let mut tail = vec![0u8; len.min(1 << 20) as usize];
        file.seek(SeekFrom::Start(len - tail.len() as u64))?;
        file.read_exact(&mut tail)?;
        if tail.last() != Some(&b'\n') {
            let cut = tail.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            kept = len - (tail.len() - cut) as u64;
            file.set_len(kept)?;
            tracing::warn!(path = %path.display(), dropped = len - kept, "dropped the journal's last line, cut short by a crash");
        }
    }
    Ok((file, kept))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::journal::Start;

    /// The disk falls behind: the store's sink never waits, it counts each entry that finds
    /// the queue full, and the next batch written opens with a `gap` entry saying how many.
    #[test]
    fn a_full_queue_counts_what_it_drops_and_the_next_batch_marks_the_gap() {
        let dir = tempfile::tempdir().unwrap();
        let overflow = Arc::new(AtomicU64::new(0));
        let files = Files::open(dir.path(), 0, false, u64::MAX, overflow.clone()).unwrap();
        // A queue of one that nothing drains yet: the writer is "behind".
        let (tx, rx) = sync_channel(1);
        let queue = Queue { tx, capture: false, overflow: overflow.clone() };
        for version in 0..3 {
            queue.send(Entry::Started { version, how: Start::Restored }, None);
        }
        assert_eq!(overflow.load(Ordering::Relaxed), 2, "one queued, two dropped, none waited for");
        drop(queue);
        files.run(rx);
        let lines = crate::journal::read(dir.path()).unwrap();
        let entries: Vec<_> = lines.into_iter().map(|l| l.entry).collect();
        assert_eq!(entries, [Entry::Gap { entries: 2 }, Entry::Started { version: 0, how: Start::Restored }]);
        assert_eq!(overflow.load(Ordering::Relaxed), 0, "counted once");
    }
}
