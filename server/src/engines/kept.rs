//! Subscriptions made at run time, kept in `<data-dir>/subscriptions.json`
//! so that a restarted server follows what it followed before it stopped.
//!
//! The file holds the net effect of the `subscribe` and `unsubscribe` ops
//! on top of the configuration: every pod subscribed at run time (its
//! whole subscription), and every configured pod unsubscribed at run time.
//! At start the configured subscriptions go first, then this file, so the
//! last word is the run-time one, as it was before the restart. A pod that
//! is not configured leaves no trace once unsubscribed, so the file stays
//! within `max-engines` subscriptions and the configured pods' names.
//!
//! It is written whole after each op (once for all the `subscribe` ops,
//! or all the `unsubscribe` ops, in a row of one batch), to a temporary
//! file renamed over the old one, so a crash leaves the old file or the
//! new one, never a torn one.
//! A file that cannot be read is never written over: it is moved aside to
//! `subscriptions.json.bad-<unix ms>` (for an operator to look at) and the
//! run-time subscriptions start from nothing; if it cannot be moved either,
//! nothing is kept until a restart finds it readable.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::Subscription;

/// The file's name in the data directory.
pub const FILE: &str = "subscriptions.json";

/// The run-time subscriptions' net effect and the file that keeps it, read
/// when first needed.
#[derive(Debug)]
pub(super) struct Keeper {
    /// The file; none when subscriptions are not kept (snapshots off).
    path: Option<PathBuf>,
    /// The pods the configuration subscribes.
    configured: BTreeSet<String>,
    /// What it holds, once read.
    kept: Option<Kept>,
    /// Whether the file may be written: not when it could neither be read
    /// nor moved aside.
    writable: bool,
}

impl Keeper {
    /// Subscriptions kept in the file at `path`, if any, on top of a
    /// configuration that subscribes the pods `configured`.
    pub(super) fn new(path: Option<PathBuf>, configured: BTreeSet<String>) -> Keeper {
        Keeper {
            path,
            configured,
            kept: None,
            writable: true,
        }
    }

    /// The net effect kept, read from the file the first time (at `now`,
    /// in unix ms). Unsubscriptions of pods the configuration no longer
    /// names are left out: they have nothing left to undo.
    pub(super) fn kept(&mut self, now: u64) -> &mut Kept {
        let (path, configured, writable) = (&self.path, &self.configured, &mut self.writable);
        self.kept.get_or_insert_with(|| {
            let Some(path) = path else {
                return Kept::default();
            };
            match Kept::load(path) {
                Ok(mut kept) => {
                    kept.unsubscribed.retain(|pod| configured.contains(pod));
                    kept
                }
                Err(e) => {
                    match crate::files::set_aside(path, now) {
                        Some(aside) => tracing::error!(
                            "engine subscriptions made at run time are not restored: {e}; the file is moved to {}",
                            aside.display()
                        ),
                        None => {
                            *writable = false;
                            tracing::error!(
                                "engine subscriptions made at run time are not restored: {e}; the file cannot be moved aside either, so run-time subscriptions are not kept until a restart finds it readable"
                            );
                        }
                    }
                    Kept::default()
                }
            }
        })
    }

    /// `subs` were subscribed at run time (at `now`, in unix ms), by one
    /// request: the file is written once for all of them.
    pub(super) fn subscribed<'a>(
        &mut self,
        now: u64,
        subs: impl IntoIterator<Item = &'a Subscription>,
    ) {
        self.change(now, |k| subs.into_iter().for_each(|sub| k.subscribed(sub)));
    }

    /// `pods` were unsubscribed at run time (at `now`, in unix ms), by one
    /// request: the file is written once for all of them.
    pub(super) fn unsubscribed<'a>(&mut self, now: u64, pods: impl IntoIterator<Item = &'a str>) {
        let configured = &self.configured;
        let pods: Vec<_> = pods
            .into_iter()
            .map(|pod| (pod, configured.contains(pod)))
            .collect();
        self.change(now, |k| {
            pods.into_iter()
                .for_each(|(pod, configured)| k.unsubscribed(pod, configured))
        });
    }

    /// Applies a run-time change and writes the file. A file that cannot
    /// be written is logged: the change holds until a restart.
    fn change(&mut self, now: u64, change: impl FnOnce(&mut Kept)) {
        change(self.kept(now));
        let (Some(path), true, Some(kept)) = (&self.path, self.writable, &self.kept) else {
            return;
        };
        if let Err(e) = kept.save(path) {
            tracing::error!(path = %path.display(), "engine subscriptions not kept for a restart: {e}");
        }
    }
}

/// The run-time subscriptions' net effect.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Kept {
    /// Pods subscribed at run time, by pod name.
    #[serde(default)]
    pub(super) subscribed: BTreeMap<String, Subscription>,
    /// Configured pods unsubscribed at run time.
    #[serde(default)]
    pub(super) unsubscribed: BTreeSet<String>,
}

/// Why the file could not be read.
#[derive(Debug, Error)]
pub enum KeptError {
    /// It exists but could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// It is not the JSON this module writes.
    #[error("{path} is not a subscriptions file: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: serde_json::Error,
    },
    /// It names a pod under a key that is not the pod's own.
    #[error("{path}: the subscription kept under {key:?} is for pod {pod:?}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The subscription's pod.
        pod: String,
    },
}

impl Kept {
    /// The file at `path`; empty when there is none.
    pub(super) fn load(path: &Path) -> Result<Kept, KeptError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Kept::default()),
            Err(source) => {
                return Err(KeptError::Read {
                    path: path.into(),
                    source,
                })
            }
        };
        let kept: Kept = serde_json::from_slice(&bytes).map_err(|source| KeptError::Parse {
            path: path.into(),
            source,
        })?;
        if let Some((key, sub)) = kept.subscribed.iter().find(|(k, s)| **k != s.pod) {
            return Err(KeptError::Mismatch {
                path: path.into(),
                key: key.clone(),
                pod: sub.pod.clone(),
            });
        }
        Ok(kept)
    }

    /// Writes the file at `path`: a temporary file beside it, synced, then
    /// renamed over it.
    pub(super) fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        serde_json::to_writer_pretty(&mut f, self)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    }

    /// `sub` was subscribed at run time.
    pub(super) fn subscribed(&mut self, sub: &Subscription) {
        self.unsubscribed.remove(&sub.pod);
        self.subscribed.insert(sub.pod.clone(), sub.clone());
    }

    /// `pod` was unsubscribed at run time; `configured` says whether the
    /// configuration subscribes it (which a restart must then not undo).
    pub(super) fn unsubscribed(&mut self, pod: &str, configured: bool) {
        self.subscribed.remove(pod);
        if configured {
            self.unsubscribed.insert(pod.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(pod: &str) -> Subscription {
        format!("pod={pod},model=m,endpoint=tcp://h:1,replay=tcp://h:2,topic=kv,media=GPU+CPU")
            .parse()
            .unwrap()
    }

    #[test]
    fn the_file_round_trips_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        assert_eq!(Kept::load(&path).unwrap(), Kept::default());
        let mut kept = Kept::default();
        kept.subscribed(&sub("a"));
        kept.subscribed(&sub("b"));
        kept.unsubscribed("b", false);
        kept.unsubscribed("c", true);
        kept.save(&path).unwrap();
        let back = Kept::load(&path).unwrap();
        assert_eq!(back, kept);
        assert_eq!(back.subscribed.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(back.unsubscribed.iter().collect::<Vec<_>>(), ["c"]);
        assert!(!path.with_extension("json.tmp").exists());
        // Subscribing a configured pod again takes back its unsubscription.
        kept.subscribed(&sub("c"));
        assert!(kept.unsubscribed.is_empty());
    }

    #[test]
    fn a_damaged_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        for (text, why) in [
            ("{\"subscribed\": {\"a\": 1}}", "not a subscriptions file"),
            ("not json", "not a subscriptions file"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = Kept::load(&path).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains(FILE), "{text}: {err}");
        }
        let mut kept = Kept::default();
        kept.subscribed.insert("x".into(), sub("a"));
        kept.save(&path).unwrap();
        let err = Kept::load(&path).unwrap_err().to_string();
        assert!(err.contains("for pod \"a\""), "{err}");
    }

    #[test]
    fn a_file_that_cannot_be_read_is_moved_aside_not_written_over() {
        const NOW: u64 = 1_700_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        std::fs::write(&path, "not json").unwrap();
        let mut keeper = Keeper::new(Some(path.clone()), BTreeSet::new());
        assert_eq!(*keeper.kept(NOW), Kept::default());
        let aside = dir.path().join(format!("{FILE}.bad-{NOW}"));
        assert_eq!(std::fs::read_to_string(&aside).unwrap(), "not json");
        keeper.subscribed(NOW + 1, [&sub("a")]);
        let back = Kept::load(&path).unwrap();
        assert_eq!(back.subscribed.keys().collect::<Vec<_>>(), ["a"]);

        // When it cannot be moved aside either (a directory is in the way),
        // nothing is written until a restart finds it readable.
        std::fs::write(&path, "not json").unwrap();
        std::fs::remove_file(&aside).unwrap();
        std::fs::create_dir(&aside).unwrap();
        std::fs::write(aside.join("x"), "").unwrap();
        let mut keeper = Keeper::new(Some(path.clone()), BTreeSet::new());
        keeper.subscribed(NOW, [&sub("b")]);
        assert_eq!(keeper.kept(NOW).subscribed.len(), 1);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not json");
    }

    #[test]
    fn unsubscriptions_of_pods_no_longer_configured_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let mut kept = Kept::default();
        kept.unsubscribed("a", true);
        kept.unsubscribed("b", true);
        kept.save(&path).unwrap();
        let mut keeper = Keeper::new(Some(path), BTreeSet::from(["b".to_string()]));
        let back = keeper.kept(0);
        assert_eq!(back.unsubscribed.iter().collect::<Vec<_>>(), ["b"]);
    }
}
