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
//! It is written whole after each op, to a temporary file renamed over the
//! old one, so a crash leaves the old file or the new one, never a torn one.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::Subscription;

/// The file's name in the data directory.
pub const FILE: &str = "subscriptions.json";

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
}
