//! The journal's writer: a thread of its own, fed through a bounded channel, so that the
//! store's locks never wait on the disk.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

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
}

impl Writer {
    /// Opens (creating) the journal in `dir` for shard `shard`; rotated past `max_bytes` unless
    /// `mode` captures payloads. `None` for [`Mode::Off`].
    pub fn open(dir: &Path, shard: usize, mode: Mode, max_bytes: u64) -> io::Result<Option<Self>> {
        if mode == Mode::Off {
            return Ok(None);
        }
        let capture = mode == Mode::Capture;
        let files = Files::open(dir, shard, capture, max_bytes)?;
        // A captured entry holds a model-sized gradient while it waits: few of them.
        let (tx, rx) = sync_channel(if capture { 4 } else { 4096 });
        std::thread::Builder::new().name("journal".into()).spawn(move || files.run(rx))?;
        Ok(Some(Self { tx, capture, dir: dir.to_path_buf() }))
    }

    /// Whether payloads are captured (and [`super::replay`] possible).
    pub fn captures(&self) -> bool {
        self.capture
    }

    /// The store's sink: entries go to the writer in the order it is called.
    pub fn sink(&self) -> JournalSink {
        let (tx, capture) = (self.tx.clone(), self.capture);
        Box::new(move |entry, payload| {
            let payload = payload.filter(|_| capture).map(<[f32]>::to_vec);
            // The writer is gone only if its thread died: its error was logged there.
            let _ = tx.send(Msg::Entry(entry, payload));
        })
    }

    /// An entry from outside the store.
    pub fn record(&self, entry: Entry, payload: Option<&[f32]>) {
        (self.sink())(entry, payload);
    }

    /// The first entries for a model that a process installed as `how`. A registered model is
    /// where a replay begins: with payloads captured, its state is written beside the journal
    /// ([`INITIAL_FILE`]); a worker's copy that seeded the model goes into the payloads.
    pub fn begin(&self, store: &Store, how: Start) -> Result<(), CheckpointError> {
        let version = store.version();
        if how == Start::Registered && self.capture {
            let data = store.checkpoint();
            let path = self.dir.join(INITIAL_FILE);
            checkpoint::write_atomic(&path, |f| checkpoint::encode_to(f, store.layout(), store.hyper(), &data))?;
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

struct Files {
    dir: PathBuf,
    shard: usize,
    lines: BufWriter<File>,
    written: u64,
    payloads: Option<(BufWriter<File>, u64)>,
    max_bytes: Option<u64>,
}

impl Files {
    fn open(dir: &Path, shard: usize, capture: bool, max_bytes: u64) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let (lines, written) = open_lines(&dir.join(JOURNAL_FILE))?;
        let payloads = if capture {
            let file = OpenOptions::new().create(true).append(true).open(dir.join(PAYLOADS_FILE))?;
            let len = file.metadata()?.len();
            Some((BufWriter::with_capacity(1 << 20, file), len))
        } else {
            None
        };
        let max_bytes = (!capture).then_some(max_bytes.max(1));
        Ok(Self { dir: dir.to_path_buf(), shard, lines, written, payloads, max_bytes })
    }

    fn run(mut self, rx: Receiver<Msg>) {
        while let Ok(first) = rx.recv() {
            let mut next = Some(first);
            let mut result = Ok(());
            // A batch: whatever is queued, then one flush.
            while let Some(msg) = next.take() {
                result = result.and_then(|()| self.handle(msg));
                next = rx.try_recv().ok();
            }
            if let Err(error) = result.and_then(|()| self.flush()) {
                tracing::error!(dir = %self.dir.display(), %error, "the update journal cannot be written: it stops here");
                return;
            }
        }
    }

    fn handle(&mut self, msg: Msg) -> io::Result<()> {
        match msg {
            Msg::Entry(entry, payload) => self.append(entry, payload),
            Msg::Sync(reply) => {
                let synced = self.flush().and_then(|()| self.sync_all());
                let _ = reply.send(synced);
                Ok(())
            }
        }
    }

    fn append(&mut self, mut entry: Entry, payload: Option<Vec<f32>>) -> io::Result<()> {
        if let (Some(values), Some((file, len)), Some(at)) = (payload, self.payloads.as_mut(), entry.payload_mut()) {
            file.write_all(bytemuck::cast_slice(&values))?;
            *at = Some(*len);
            *len += 4 * values.len() as u64;
        }
        let mut line = serde_json::to_vec(&Line { t_ms: now_ms(), shard: self.shard, entry })?;
        line.push(b'\n');
        if self.max_bytes.is_some_and(|max| self.written + line.len() as u64 > max) && self.written > 0 {
            self.rotate()?;
        }
        self.lines.write_all(&line)?;
        self.written += line.len() as u64;
        Ok(())
    }

    /// Payloads first: a line on disk never points past them.
    fn flush(&mut self) -> io::Result<()> {
        if let Some((file, _)) = &mut self.payloads {
            file.flush()?;
        }
        self.lines.flush()
    }

    fn sync_all(&mut self) -> io::Result<()> {
        if let Some((file, _)) = &mut self.payloads {
            file.get_ref().sync_data()?;
        }
        self.lines.get_ref().sync_data()
    }

    /// `journal.jsonl` becomes `.1`, `.1` becomes `.2`, …; the oldest past [`ROTATED_KEPT`] goes.
    fn rotate(&mut self) -> io::Result<()> {
        self.flush()?;
        self.lines.get_ref().sync_data()?;
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
fn open_lines(path: &Path) -> io::Result<(BufWriter<File>, u64)> {
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
    Ok((BufWriter::with_capacity(1 << 16, file), kept))
}
