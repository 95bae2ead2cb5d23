//! One PS process owns a checkpoint directory at a time.
//!
//! When a PS pod is deleted, its Deployment starts the replacement at once while the old process
//! still writes its last checkpoint (SIGTERM, a grace period of 60 s). Without an owner the new
//! process restored the checkpoint before that one and removed the old process's temporary file
//! as a leftover, so every update since the last periodic checkpoint was lost (seen on the real
//! node: version 6 at the delete, version 1 restored). The process holds an exclusive `flock` on
//! `<dir>/.lock` for its whole life; the kernel releases it when the process exits, however it
//! exits, and the next one restores only then. (On NFS, Linux maps `flock` to the server's locks.)

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Instant;

/// Takes `dir`'s lock, waiting for a process that holds it to exit. The lock lasts as long as
/// the returned file is open.
pub fn own(dir: &Path) -> std::io::Result<File> {
    fs::create_dir_all(dir)?;
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(".lock"))?;
    if flock(&file, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
        return Ok(file);
    }
    tracing::warn!(dir = %dir.display(), "another PS process holds the checkpoint directory \
        (a replaced pod writing its last checkpoint?): waiting for it to exit before restoring");
    let waiting = Instant::now();
    flock(&file, libc::LOCK_EX)?;
    tracing::info!(dir = %dir.display(), seconds = waiting.elapsed().as_secs_f64(), "checkpoint directory free");
    Ok(file)
}

fn flock(file: &File, op: libc::c_int) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor this function's caller keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_owner_waits_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = own(dir.path()).unwrap();
        let path = dir.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        let second = std::thread::spawn(move || {
            let held = own(&path).unwrap();
            tx.send(()).unwrap();
            held
        });
        assert!(rx.recv_timeout(std::time::Duration::from_millis(300)).is_err(), "both own the directory");
        drop(first);
        rx.recv_timeout(std::time::Duration::from_secs(5)).expect("the second never got the directory");
        drop(second.join().unwrap());
        drop(own(dir.path()).unwrap());
    }
}
