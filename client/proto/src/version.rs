//! What names the protocol on the wire: its QUIC ALPN and the frame
//! format's version.

/// The QUIC ALPN of this protocol version.
pub const ALPN: &[u8] = b"prefix-index/1";
/// The frame format version this crate speaks.
pub const VERSION: u8 = 1;
