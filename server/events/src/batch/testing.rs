//! Test helpers: a small msgpack writer for hand-built events.

use rmp::encode as enc;

/// `[1.0, events, 0]` around already-encoded events.
pub(super) fn batch_of(events: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    enc::write_array_len(&mut out, 3).unwrap();
    enc::write_f64(&mut out, 1.0).unwrap();
    enc::write_array_len(&mut out, events.len() as u32).unwrap();
    for e in events {
        out.extend_from_slice(e);
    }
    enc::write_uint(&mut out, 0).unwrap();
    out
}

/// A tiny msgpack writer for test events.
#[derive(Default)]
pub(super) struct W(Vec<u8>);

impl W {
    pub(super) fn arr(mut self, n: u32) -> Self {
        enc::write_array_len(&mut self.0, n).unwrap();
        self
    }
    pub(super) fn map(mut self, n: u32) -> Self {
        enc::write_map_len(&mut self.0, n).unwrap();
        self
    }
    pub(super) fn s(mut self, s: &str) -> Self {
        enc::write_str(&mut self.0, s).unwrap();
        self
    }
    pub(super) fn u(mut self, v: u64) -> Self {
        enc::write_uint(&mut self.0, v).unwrap();
        self
    }
    pub(super) fn i(mut self, v: i64) -> Self {
        enc::write_sint(&mut self.0, v).unwrap();
        self
    }
    pub(super) fn bin(mut self, b: &[u8]) -> Self {
        enc::write_bin(&mut self.0, b).unwrap();
        self
    }
    pub(super) fn nil(mut self) -> Self {
        enc::write_nil(&mut self.0).unwrap();
        self
    }
    pub(super) fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    pub(super) fn done(self) -> Vec<u8> {
        self.0
    }
}
