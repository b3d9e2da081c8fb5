//! The atomics every lock-free building block uses, in one place.
//!
//! Under `--cfg loom` they are loom's model-checked atomics, so the node-level
//! protocols in `slots` and `children` can be explored by
//! `tests/loom.rs` exactly as they are compiled for production (the same
//! arrangement as crossbeam-epoch's `primitive` module).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize};

pub(crate) use std::sync::atomic::Ordering;
