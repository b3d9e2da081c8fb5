//! The tests' stand-in for the gateways' hash rule: any fixed function of
//! a block's tokens and its identity seed (FNV-1a, the seed mixed in
//! after). The integration tests reach it through `common`; the unit tests
//! of `precise` include this file by its path.

/// [`seeded`] under seed 0.
pub fn hash(tokens: &[u32]) -> u64 {
    seeded(tokens, 0)
}

/// The hash of `tokens` under an identity seed (seed 0: [`hash`]).
pub fn seeded(tokens: &[u32], seed: u64) -> u64 {
    let h = tokens.iter().fold(0xcbf2_9ce4_8422_2325, |h, &t| {
        (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3)
    });
    h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(31)
}
