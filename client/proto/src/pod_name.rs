//! Pod names in decoded answers, kept inline when short.
//!
//! A lookup answer names every pod that holds a prefix of the key, so a
//! gateway decodes millions of pod names a second under load, and a `String`
//! per name costs an allocation, a copy and a free per pod per answer. A
//! [`PodName`] keeps names of up to 24 bytes inline (StatefulSet pods such as
//! `vllm-3`, `ip:port` endpoints), so decoding one is a copy and a UTF-8
//! check; longer ones (a Deployment's pods are named
//! `<deployment>-<hash>-<suffix>`, often past 24 bytes) go to the heap, still
//! without the zeroed copy `String` decoding makes. (A shared `Arc<str>` per
//! name would move its reference count's cache line between the decoding core
//! and the consuming one at every clone and drop.) `docs/benchmarks.md`,
//! "Pod names decoded without allocating", has the figures. The bytes on the
//! wire are a string's, unchanged; this and `codec.rs` (with the messages'
//! derives) are the only places that touch bincode.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use bincode::de::read::Reader;
use bincode::de::{BorrowDecoder, Decoder};
use bincode::enc::Encoder;
use bincode::error::{DecodeError, EncodeError};
use bincode::{BorrowDecode, Decode, Encode};
use compact_str::CompactString;

/// A pod's name, as answers carry it. Derefs to `str` and compares with
/// strings.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodName(CompactString);

impl PodName {
    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for PodName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for PodName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for PodName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for PodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for PodName {
    fn from(s: &str) -> Self {
        PodName(s.into())
    }
}

impl From<String> for PodName {
    fn from(s: String) -> Self {
        PodName(s.into())
    }
}

impl From<PodName> for String {
    fn from(p: PodName) -> Self {
        p.0.into_string()
    }
}

impl PartialEq<str> for PodName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for PodName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for PodName {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<PodName> for str {
    fn eq(&self, other: &PodName) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<PodName> for &str {
    fn eq(&self, other: &PodName) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<PodName> for String {
    fn eq(&self, other: &PodName) -> bool {
        self == other.as_str()
    }
}

impl serde::Serialize for PodName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Encoded exactly as a `String`: a varint length, then the UTF-8 bytes.
impl Encode for PodName {
    fn encode<E: Encoder>(&self, encoder: &mut E) -> Result<(), EncodeError> {
        self.0.as_bytes().encode(encoder)
    }
}

/// Decoded as a `String` is: a `u64` length that must fit a `usize`, charged
/// against the decode budget before anything is read or allocated.
impl<Context> Decode<Context> for PodName {
    fn decode<D: Decoder<Context = Context>>(decoder: &mut D) -> Result<Self, DecodeError> {
        let len = u64::decode(decoder)?;
        let len = usize::try_from(len).map_err(|_| DecodeError::OutsideUsizeRange(len))?;
        decoder.claim_container_read::<u8>(len)?;
        let utf8 = |bytes: &[u8]| {
            std::str::from_utf8(bytes)
                .map(CompactString::from)
                .map_err(|inner| DecodeError::Utf8 { inner })
        };
        let name = match decoder.reader().peek_read(len) {
            // All of the name is in the reader's buffer: copy it once.
            Some(bytes) => utf8(bytes)?,
            // A reader that cannot lend its bytes, or fewer than `len` left
            // (a cut frame, which then fails with `UnexpectedEnd`): read
            // through a buffer, as `String` decoding does. The budget claimed
            // above bounds it.
            None => {
                let mut bytes = vec![0u8; len];
                decoder.reader().read(&mut bytes)?;
                return utf8(&bytes).map(PodName);
            }
        };
        decoder.reader().consume(len);
        Ok(PodName(name))
    }
}

impl<'de, Context> BorrowDecode<'de, Context> for PodName {
    fn borrow_decode<D: BorrowDecoder<'de, Context = Context>>(
        decoder: &mut D,
    ) -> Result<Self, DecodeError> {
        Self::decode(decoder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> Result<PodName, DecodeError> {
        let cfg = bincode::config::standard().with_limit::<{ 1 << 20 }>();
        bincode::decode_from_slice(bytes, cfg).map(|(n, _)| n)
    }

    #[test]
    fn encodes_as_a_string_and_decodes_back() {
        let cfg = bincode::config::standard();
        for name in ["pod-a", "a-pod-name-longer-than-24-bytes-kept-on-the-heap"] {
            let as_string = bincode::encode_to_vec(name.to_string(), cfg).unwrap();
            let as_name = bincode::encode_to_vec(PodName::from(name), cfg).unwrap();
            assert_eq!(as_name, as_string);
            assert_eq!(decode(&as_name).unwrap(), name);
        }
    }

    #[test]
    fn a_reader_without_a_buffer_decodes_the_same() {
        let cfg = bincode::config::standard().with_limit::<{ 1 << 20 }>();
        let bytes = bincode::encode_to_vec("pod-a", cfg).unwrap();
        let name: PodName = bincode::decode_from_std_read(&mut &bytes[..], cfg).unwrap();
        assert_eq!(name, "pod-a");
        let cut = bincode::decode_from_std_read::<PodName, _, _>(&mut &bytes[..3], cfg);
        assert!(cut.is_err());
    }

    #[test]
    fn bad_names_fail_typed() {
        assert!(matches!(
            decode(&[2, 0xff, 0xfe]),
            Err(DecodeError::Utf8 { .. })
        ));
        assert!(matches!(
            decode(&[9, b'a']),
            Err(DecodeError::UnexpectedEnd { .. })
        ));
        // A length past the budget is refused before anything is reserved.
        assert!(matches!(
            decode(&[0xfc, 0, 0, 0, 0x40]),
            Err(DecodeError::LimitExceeded)
        ));
    }
}
