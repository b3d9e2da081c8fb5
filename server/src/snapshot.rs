//! Snapshot files: the index written to `<data-dir>/index.snapshot` every
//! `snapshot_interval` and at shutdown, and read back at start.
//!
//! A write goes to `index.snapshot.tmp`, is synced to disk, then renamed over
//! the old snapshot and the directory synced: a crash at any point leaves
//! either the previous snapshot or the new one, whole. A snapshot that cannot
//! be read (truncated, damaged, another format version) is reported, renamed
//! to `index.snapshot.bad-<unix ms>` for inspection, and the server starts
//! empty; it never refuses to start because of it. The format and what a
//! restore keeps (entry ages, explicit capacities) are in
//! `prefix_index::snapshot`.

use std::fs::{self, File};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prefix_index::{Index, RestoreSummary, Snapshot, SnapshotError, WriteSummary};
use thiserror::Error;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::files::set_aside;
use crate::metrics::Metrics;
use crate::replica::Replica;

/// The snapshot's file name in the data directory.
pub const FILE: &str = "index.snapshot";

/// Why a snapshot could not be written or read.
#[derive(Debug, Error)]
pub enum SnapshotFileError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a snapshot this build can restore.
    #[error("{path}: {source}")]
    Bad {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: SnapshotError,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotFileError + '_ {
    move |source| SnapshotFileError::Io {
        path: path.into(),
        source,
    }
}

/// One save at a time in this process: the periodic task's last save may
/// still run (on the blocking pool, which cannot be cancelled) when shutdown
/// starts the final one; the final one then waits and renames last.
static SAVING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Writes `index` atomically to `<dir>/index.snapshot`.
pub fn save(index: &Index, dir: &Path, now: u64) -> Result<WriteSummary, SnapshotFileError> {
    let _one_at_a_time = SAVING.lock().unwrap_or_else(|e| e.into_inner());
    fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join(FILE);
    let tmp = dir.join(format!("{FILE}.tmp"));
    let file = File::create(&tmp).map_err(io(&tmp))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let summary = index.write_snapshot(&mut out, now).map_err(io(&tmp))?;
    let file = out.into_inner().map_err(|e| io(&tmp)(e.into_error()))?;
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    fs::rename(&tmp, &path).map_err(io(&path))?;
    // The rename is durable only once the directory is.
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(summary)
}

/// What happened to the snapshot at start.
#[derive(Debug)]
pub(crate) enum Loaded {
    /// There was none.
    Missing,
    /// It was restored.
    Restored {
        /// What the restore did.
        summary: RestoreSummary,
        /// How old the snapshot was.
        age: Duration,
    },
    /// It could not be read; it was moved aside to this path.
    SetAside {
        /// Why it was refused.
        error: SnapshotFileError,
        /// Where it is now (if the rename worked).
        moved_to: Option<PathBuf>,
    },
}

impl Loaded {
    /// Whether new snapshots may be written: not while a snapshot that could
    /// not be read is still in place (writing would destroy it).
    pub fn may_save(&self) -> bool {
        !matches!(self, Loaded::SetAside { moved_to: None, .. })
    }
}

/// What `<dir>/index.snapshot` holds, read and checked but not restored.
pub(crate) enum Found {
    /// There is none.
    Missing,
    /// A snapshot this build can restore.
    Parsed {
        /// It, parsed.
        snapshot: Snapshot,
        /// How old it is.
        age: Duration,
    },
    /// It could not be read (see [`Loaded::SetAside`]).
    SetAside {
        /// Why it was refused.
        error: SnapshotFileError,
        /// Where it is now (if the rename worked).
        moved_to: Option<PathBuf>,
    },
}

/// Reads and checks `<dir>/index.snapshot`, if there is one. A bad snapshot
/// is moved aside.
pub(crate) fn find(dir: &Path, now: u64) -> Found {
    let path = dir.join(FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Missing,
        Err(e) => {
            return Found::SetAside {
                error: io(&path)(e),
                moved_to: None,
            }
        }
    };
    let parsed = Snapshot::parse(&bytes);
    // The parsed form holds everything; free the file's bytes before the
    // replay allocates the index.
    drop(bytes);
    match parsed {
        Ok(snapshot) => Found::Parsed {
            age: Duration::from_millis(now.saturating_sub(snapshot.written_at)),
            snapshot,
        },
        Err(source) => {
            let moved_to = set_aside(&path, now);
            Found::SetAside {
                error: SnapshotFileError::Bad { path, source },
                moved_to,
            }
        }
    }
}

impl Found {
    /// Restores what was found into `index`.
    pub fn restore(self, index: &Index, now: u64) -> Loaded {
        match self {
            Found::Missing => Loaded::Missing,
            Found::Parsed { snapshot, age } => Loaded::Restored {
                summary: snapshot.restore(index, now),
                age,
            },
            Found::SetAside { error, moved_to } => Loaded::SetAside { error, moved_to },
        }
    }
}

/// Restores `<dir>/index.snapshot` into `index`, if there is one. A bad
/// snapshot is moved aside and reported, and `index` is left empty.
#[cfg(test)]
pub(crate) fn load(index: &Index, dir: &Path, now: u64) -> Loaded {
    find(dir, now).restore(index, now)
}

/// Logs what a start found and restored; returns whether snapshots may be
/// written (see [`Loaded::may_save`]).
pub(crate) fn report(loaded: Loaded, dir: &Path, started: Instant, metrics: &Metrics) -> bool {
    let may_save = loaded.may_save();
    match loaded {
        Loaded::Missing => tracing::info!(dir = %dir.display(), "no snapshot; starting empty"),
        Loaded::Restored { summary, age } => tracing::info!(
            pods = summary.pods,
            inserts = summary.inserts,
            expired = summary.expired,
            refused = summary.refused,
            age = ?age,
            took = ?started.elapsed(),
            "restored the snapshot"
        ),
        Loaded::SetAside { error, moved_to } => {
            metrics.snapshot_failures.inc();
            tracing::error!(
                %error,
                moved_to = %moved_to.as_deref().map_or_else(|| "(left in place)".into(), |p| p.display().to_string()),
                "the snapshot cannot be restored; starting empty"
            );
            if !may_save {
                tracing::error!(
                    "the unreadable snapshot could not be moved aside: no snapshot will be \
                     written over it until it is moved or removed and the server restarted"
                );
            }
        }
    }
    may_save
}

/// Writes one snapshot on the blocking pool and records it.
pub(crate) async fn save_and_report(index: Arc<Index>, dir: PathBuf, metrics: &Metrics) {
    let started = Instant::now();
    let saved = tokio::task::spawn_blocking(move || save(&index, &dir, now_ms())).await;
    match saved {
        Ok(Ok(summary)) => {
            metrics.snapshot(&summary, started.elapsed().as_secs_f64());
            tracing::debug!(?summary, took = ?started.elapsed(), "snapshot written");
        }
        Ok(Err(e)) => {
            metrics.snapshot_failures.inc();
            tracing::error!(error = %e, "cannot write the snapshot");
        }
        Err(e) => {
            metrics.snapshot_failures.inc();
            tracing::error!(error = %e, "the snapshot task failed");
        }
    }
}

/// Writes a snapshot every `interval` until `shutdown` (the final one, at
/// shutdown, is written by the server after the drain).
pub(crate) async fn run(
    index: Arc<Index>,
    replica: Arc<Replica>,
    dir: PathBuf,
    metrics: Arc<Metrics>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first tick fires at once; the index was just loaded.
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // A server filling itself from a peer has nothing worth keeping yet:
        // its own snapshot stays until the fill is done.
        if replica.is_filling() {
            continue;
        }
        save_and_report(index.clone(), dir.clone(), &metrics).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_index::IndexConfig;

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn saved_snapshots_load_and_bad_ones_are_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            load(&Index::new(IndexConfig::default()), dir.path(), NOW),
            Loaded::Missing
        ));
        let index = Index::new(IndexConfig::default());
        index.insert("m", &[1, 2, 3], "p", NOW).unwrap();
        let sum = save(&index, dir.path(), NOW).unwrap();
        assert_eq!((sum.pods, sum.entries), (1, 1));
        assert!(!dir.path().join(format!("{FILE}.tmp")).exists());

        let restored = Index::new(IndexConfig::default());
        let Loaded::Restored { summary, age } = load(&restored, dir.path(), NOW + 5) else {
            panic!("not restored");
        };
        assert_eq!((summary.inserts, age), (1, Duration::from_millis(5)));
        assert_eq!(
            restored.lookup("m", &[1, 2, 3], None, NOW + 5),
            vec![("p".into(), 3)]
        );

        // Cut the file short: refused, moved aside, index left empty.
        let path = dir.path().join(FILE);
        let len = fs::metadata(&path).unwrap().len();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let empty = Index::new(IndexConfig::default());
        let Loaded::SetAside { error, moved_to } = load(&empty, dir.path(), NOW + 9) else {
            panic!("a truncated snapshot was accepted");
        };
        assert!(error.to_string().contains("checksum"), "{error}");
        assert_eq!(
            moved_to,
            Some(dir.path().join(format!("{FILE}.bad-{}", NOW + 9)))
        );
        assert!(!path.exists());
        assert_eq!(empty.stats().entries, 0);
        // The next start finds no snapshot and starts empty, quietly.
        assert!(matches!(
            load(&empty, dir.path(), NOW + 10),
            Loaded::Missing
        ));
    }
}
