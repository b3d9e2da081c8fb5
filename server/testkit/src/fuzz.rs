//! Mutations of valid inputs for the decoders' fuzzers (proptest, on
//! stable): flip bits, cut the tail, splice in a run of bytes.
//!
//! A fuzzer encodes a valid frame or payload, applies a few [`Mutation`]s
//! drawn from [`mutation`] with [`mutate`], and checks that the decoder
//! fails typed and cheaply. The spliced runs favour the format's own
//! length markers, the way to claim a huge container in a few bytes.

use proptest::prelude::*;
use proptest::strategy::Union;

/// Cases to run: `FUZZ_CASES` if set, else `default` (a few thousand in
/// `cargo test`; the long runs set it).
pub fn cases(default: u32) -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One change to a valid input. Positions are taken modulo the input's
/// length when applied, so any `usize` is a valid one.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// XOR the byte at this position with this (nonzero) mask.
    Flip(usize, u8),
    /// Keep only the bytes before this position.
    Cut(usize),
    /// Insert this run before this position.
    Splice(usize, Vec<u8>),
}

/// Flips, cuts and splices, one in three each. A spliced run is 1 to 9
/// bytes, each one of `markers` or any byte, every choice equally likely
/// (a marker byte per choice, any byte as one more).
pub fn mutation(markers: &[u8]) -> impl Strategy<Value = Mutation> {
    let byte = Union::new(
        markers
            .iter()
            .map(|&b| Just(b).boxed())
            .chain([any::<u8>().boxed()]),
    );
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
        any::<usize>().prop_map(Mutation::Cut),
        (any::<usize>(), prop::collection::vec(byte, 1..10))
            .prop_map(|(i, b)| Mutation::Splice(i, b)),
    ]
}

/// `bytes` with `muts` applied in order; an input cut to nothing stays
/// empty.
pub fn mutate(mut bytes: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        if bytes.is_empty() {
            break;
        }
        match m {
            Mutation::Flip(i, x) => {
                let i = i % bytes.len();
                bytes[i] ^= x;
            }
            Mutation::Cut(i) => bytes.truncate(i % bytes.len()),
            Mutation::Splice(i, run) => {
                let i = i % bytes.len();
                bytes.splice(i..i, run.iter().copied());
            }
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_apply_in_order_and_wrap_their_positions() {
        let m = [
            Mutation::Splice(5, vec![9, 9]),
            Mutation::Flip(1, 0x0f),
            Mutation::Cut(7),
        ];
        // Splice at 5 % 4 = 1, flip the first 9, cut at 7 % 6 = 1.
        assert_eq!(mutate(vec![1, 2, 3, 4], &m[..1]), [1, 9, 9, 2, 3, 4]);
        assert_eq!(mutate(vec![1, 2, 3, 4], &m[..2]), [1, 6, 9, 2, 3, 4]);
        assert_eq!(mutate(vec![1, 2, 3, 4], &m), [1]);
        assert!(mutate(Vec::new(), &m).is_empty());
    }
}
