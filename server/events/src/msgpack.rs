//! A msgpack cursor over one payload: it reads the few value kinds the event
//! formats use, borrows strings and bytes from the payload, and skips any
//! other value without recursion.
//!
//! Why not a generic decoder (rmp-serde, or a value tree): the engines mix
//! positional and named layouts, a hash is an int or bytes, and a tree
//! allocates for values the index throws away (`extra_keys`). Here each field
//! is read in place, and callers check a declared length against the bytes
//! left before they reserve anything. `rmp` supplies the marker table.

use rmp::Marker;

/// Why a read failed; the caller knows where, and says so in its error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// The payload ends inside the value (cut short, or a length field
    /// claims more than is left).
    Eof,
    /// The value has another type.
    Type {
        expected: &'static str,
        found: &'static str,
    },
    /// A string is not UTF-8.
    Utf8,
}

type Result<T> = std::result::Result<T, ReadError>;

/// An int or a byte string: the two forms of a block hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntOrBin<'a> {
    Int(i128),
    Bin(&'a [u8]),
}

/// A string, bytes or an int: the scalar forms of vLLM's extra keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scalar<'a> {
    /// A string's bytes, not checked to be UTF-8.
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Int(i128),
}

/// What a value is, as far as choosing a layout needs: the batch and the
/// events each come as an array (positional) or a map (named).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Array,
    Map,
    /// Anything else, named for an error message.
    Other(&'static str),
}

/// A position in a payload. `Copy`, so a caller can keep one to come back
/// to a value later (a map's fields are found first and read afterwards).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not read yet. Every msgpack value takes at least one byte, so
    /// this bounds how many values can follow.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or(ReadError::Eof)?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    /// A big-endian unsigned int of `n` ≤ 8 bytes.
    fn be(&mut self, n: usize) -> Result<u64> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// A length field of `n` bytes (1, 2 or 4: at most `u32::MAX`).
    fn len(&mut self, n: usize) -> Result<usize> {
        // At most 4 bytes, so it fits in usize on the 32- and 64-bit targets
        // we build for; saturating keeps it safe anywhere else (the following
        // `take` then fails as Eof).
        Ok(usize::try_from(self.be(n)?).unwrap_or(usize::MAX))
    }

    pub(crate) fn peek(&self) -> Result<Marker> {
        self.buf
            .get(self.pos)
            .map(|&b| Marker::from_u8(b))
            .ok_or(ReadError::Eof)
    }

    fn marker(&mut self) -> Result<Marker> {
        let m = self.peek()?;
        self.pos += 1;
        Ok(m)
    }

    /// The shape of the next value, without consuming it.
    pub(crate) fn shape(&self) -> Result<Shape> {
        Ok(match self.peek()? {
            Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => Shape::Array,
            Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => Shape::Map,
            m => Shape::Other(kind(m)),
        })
    }

    /// Consumes a nil if one is next; says whether it did.
    pub(crate) fn eat_nil(&mut self) -> bool {
        if matches!(self.peek(), Ok(Marker::Null)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn mismatch<T>(expected: &'static str, m: Marker) -> Result<T> {
        Err(ReadError::Type {
            expected,
            found: kind(m),
        })
    }

    /// An array header: the declared element count, not yet checked against
    /// the bytes left.
    pub(crate) fn array_len(&mut self) -> Result<usize> {
        match self.marker()? {
            Marker::FixArray(n) => Ok(usize::from(n)),
            Marker::Array16 => self.len(2),
            Marker::Array32 => self.len(4),
            m => Self::mismatch("an array", m),
        }
    }

    /// A map header: the declared entry count (pairs).
    pub(crate) fn map_len(&mut self) -> Result<usize> {
        match self.marker()? {
            Marker::FixMap(n) => Ok(usize::from(n)),
            Marker::Map16 => self.len(2),
            Marker::Map32 => self.len(4),
            m => Self::mismatch("a map", m),
        }
    }

    /// A string, borrowed from the payload.
    pub(crate) fn str(&mut self) -> Result<&'a str> {
        utf8(self.str_bytes()?)
    }

    /// A string's bytes, not checked to be UTF-8: for comparing with known
    /// ASCII names (map keys, type tags), which match only UTF-8 bytes
    /// anyway, so only a string that matches none needs [`utf8`].
    pub(crate) fn str_bytes(&mut self) -> Result<&'a [u8]> {
        let n = match self.marker()? {
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 => self.len(1)?,
            Marker::Str16 => self.len(2)?,
            Marker::Str32 => self.len(4)?,
            m => return Self::mismatch("a string", m),
        };
        self.take(n)
    }

    /// Reads the int whose marker `m` was just consumed; `None` when `m`
    /// is not an int marker. i128 holds every msgpack int (u64 and i64), so
    /// callers range-check one value.
    fn int_after(&mut self, m: Marker) -> Option<Result<i128>> {
        // The `as` casts reinterpret the bytes read (1, 2, 4 or 8 of them)
        // as the signed type of that width.
        Some(match m {
            Marker::FixPos(n) => Ok(i128::from(n)),
            Marker::FixNeg(n) => Ok(i128::from(n)),
            Marker::U8 => self.be(1).map(i128::from),
            Marker::U16 => self.be(2).map(i128::from),
            Marker::U32 => self.be(4).map(i128::from),
            Marker::U64 => self.be(8).map(i128::from),
            Marker::I8 => self.be(1).map(|v| i128::from(v as u8 as i8)),
            Marker::I16 => self.be(2).map(|v| i128::from(v as u16 as i16)),
            Marker::I32 => self.be(4).map(|v| i128::from(v as u32 as i32)),
            Marker::I64 => self.be(8).map(|v| i128::from(v as i64)),
            _ => return None,
        })
    }

    /// The next value if it is an unsigned int of at most 32 bits (the
    /// widths token ids take), read with no error path; `None`, consuming
    /// nothing, for anything else.
    #[inline]
    pub(crate) fn small_uint(&mut self) -> Option<u32> {
        let rest = self.buf.get(self.pos..)?;
        let len = usize::from(SMALL_UINT_LEN[usize::from(*rest.first()?)]);
        let (&marker, value) = rest.get(..len)?.split_first()?;
        let value = match value {
            // A positive fixint is its own value.
            [] => u32::from(marker),
            // At most four bytes (the table's widest).
            bytes => bytes.iter().fold(0, |acc, &b| acc << 8 | u32::from(b)),
        };
        self.pos += len;
        Some(value)
    }

    /// Reads up to `n` values into `out` while each is an unsigned int of
    /// at most 32 bits, as [`Reader::small_uint`] does; stops before any
    /// other value and returns how many it read.
    ///
    /// Token ids are most of a `BlockStored`'s bytes, and their widths vary
    /// from one to the next (in Llama 3's vocabulary of 128,256 ids, half
    /// take three bytes and half five; ids below 256, one or two), so a
    /// branch on each one's width goes the wrong way about as often as not.
    /// This loop has no such branch: it loads eight bytes, looks the width
    /// up by the first, and shifts the value out (`value_in_word`). The
    /// last values, within eight bytes of the payload's end, go through
    /// `small_uint`.
    ///
    /// What bounds the loop is the chain from one value's width to the
    /// next one's. A value takes at most five of its word's eight bytes, so
    /// the next marker is in the word already: its width is looked up from
    /// there, while the word at the next position loads beside it, instead
    /// of after that load.
    pub(crate) fn small_uints(&mut self, n: usize, out: &mut Vec<u32>) -> usize {
        // Locals the loop keeps in registers: the position, the word there
        // and its value's width, and a chunk of values appended at once (a
        // push per value would store the vector's length, and the
        // position, at every step).
        let buf = self.buf;
        let mut pos = self.pos;
        let mut word = word_at(buf, pos).unwrap_or(0);
        let mut len = usize::from(SMALL_UINT_LEN[(word >> 56) as usize]);
        let mut chunk = [0u32; 16];
        let mut read = 0;
        while read < n {
            let want = (n - read).min(chunk.len());
            let mut got = 0;
            // `word` holds the eight bytes at `pos` while they are in `buf`.
            while got < want && len != 0 && pos + 8 <= buf.len() {
                chunk[got] = value_in_word(word, len);
                // The byte after the value: its width, read from this word.
                let next = SMALL_UINT_LEN[((word >> (56 - 8 * len)) & 0xff) as usize];
                pos += len;
                got += 1;
                word = word_at(buf, pos).unwrap_or(0);
                len = usize::from(next);
            }
            out.extend_from_slice(&chunk[..got]);
            read += got;
            if got < want {
                break;
            }
        }
        self.pos = pos;
        while read < n {
            let Some(value) = self.small_uint() else {
                break;
            };
            out.push(value);
            read += 1;
        }
        read
    }

    /// An int of any width and sign.
    pub(crate) fn int(&mut self) -> Result<i128> {
        let m = self.marker()?;
        self.int_after(m)
            .unwrap_or_else(|| Self::mismatch("an integer", m))
    }

    /// An int, or bytes (borrowed): the two forms of a block hash.
    pub(crate) fn int_or_bin(&mut self) -> Result<IntOrBin<'a>> {
        let m = self.marker()?;
        if let Some(int) = self.int_after(m) {
            return int.map(IntOrBin::Int);
        }
        let n = match m {
            Marker::Bin8 => self.len(1)?,
            Marker::Bin16 => self.len(2)?,
            Marker::Bin32 => self.len(4)?,
            m => return Self::mismatch("an integer or bytes", m),
        };
        Ok(IntOrBin::Bin(self.take(n)?))
    }

    /// The next value if it is a string, bytes or an int (then read);
    /// `None`, consuming nothing, for any other value.
    pub(crate) fn scalar(&mut self) -> Result<Option<Scalar<'a>>> {
        Ok(Some(match self.peek()? {
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                Scalar::Str(self.str_bytes()?)
            }
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => match self.int_or_bin()? {
                IntOrBin::Bin(b) => Scalar::Bin(b),
                IntOrBin::Int(i) => Scalar::Int(i),
            },
            _ => {
                let mut ahead = *self;
                let m = ahead.marker()?;
                match ahead.int_after(m) {
                    Some(int) => {
                        *self = ahead;
                        Scalar::Int(int?)
                    }
                    None => return Ok(None),
                }
            }
        }))
    }

    /// A float; an int is taken as its value too (msgspec's decoder does the
    /// same for a `float` field).
    pub(crate) fn float(&mut self) -> Result<f64> {
        let m = self.marker()?;
        match m {
            Marker::F64 => Ok(f64::from_bits(self.be(8)?)),
            // Four bytes read: the cast keeps every bit.
            Marker::F32 => Ok(f64::from(f32::from_bits(self.be(4)? as u32))),
            m => match self.int_after(m) {
                Some(int) => int.map(|i| i as f64),
                None => Self::mismatch("a float", m),
            },
        }
    }

    /// Skips one value of any type, containers included.
    ///
    /// Iterative: a count of values still to skip replaces the call stack,
    /// so a payload nested ten thousand levels deep costs no stack. Each
    /// value read consumes at least its marker byte, so the loop runs at most
    /// `remaining()` times whatever the length fields claim, and a container
    /// that claims more values than bytes are left fails at once.
    pub(crate) fn skip(&mut self) -> Result<()> {
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            let (bytes, values) = match self.marker()? {
                Marker::FixPos(_)
                | Marker::FixNeg(_)
                | Marker::Null
                | Marker::False
                | Marker::True => (0, 0),
                Marker::Reserved => return Self::mismatch("a msgpack value", Marker::Reserved),
                Marker::U8 | Marker::I8 => (1, 0),
                Marker::U16 | Marker::I16 => (2, 0),
                Marker::U32 | Marker::I32 | Marker::F32 => (4, 0),
                Marker::U64 | Marker::I64 | Marker::F64 => (8, 0),
                Marker::FixStr(n) => (usize::from(n), 0),
                Marker::Str8 | Marker::Bin8 => (self.len(1)?, 0),
                Marker::Str16 | Marker::Bin16 => (self.len(2)?, 0),
                Marker::Str32 | Marker::Bin32 => (self.len(4)?, 0),
                Marker::FixArray(n) => (0, u64::from(n)),
                Marker::Array16 => (0, self.be(2)?),
                Marker::Array32 => (0, self.be(4)?),
                Marker::FixMap(n) => (0, 2 * u64::from(n)),
                Marker::Map16 => (0, 2 * self.be(2)?),
                Marker::Map32 => (0, 2 * self.be(4)?),
                // Type byte, then data.
                Marker::FixExt1 => (2, 0),
                Marker::FixExt2 => (3, 0),
                Marker::FixExt4 => (5, 0),
                Marker::FixExt8 => (9, 0),
                Marker::FixExt16 => (17, 0),
                Marker::Ext8 => (self.len(1)?.saturating_add(1), 0),
                Marker::Ext16 => (self.len(2)?.saturating_add(1), 0),
                Marker::Ext32 => (self.len(4)?.saturating_add(1), 0),
            };
            self.take(bytes)?;
            pending += values;
            if pending > self.remaining() as u64 {
                return Err(ReadError::Eof);
            }
        }
        Ok(())
    }
}

/// Bytes an unsigned int of at most 32 bits takes, marker included, by its
/// marker byte; 0 for any other marker. [`Reader::small_uint`] and
/// [`Reader::small_uints`] read by it.
const SMALL_UINT_LEN: [u8; 256] = {
    let mut len = [0; 256];
    let mut b = 0;
    while b < 0x80 {
        len[b] = 1;
        b += 1;
    }
    len[0xcc] = 2;
    len[0xcd] = 3;
    len[0xce] = 5;
    len
};

/// The eight bytes at `pos`, big-endian; `None` when fewer are left.
#[inline(always)]
fn word_at(buf: &[u8], pos: usize) -> Option<u64> {
    Some(u64::from_be_bytes(*buf.get(pos..)?.first_chunk::<8>()?))
}

/// The unsigned int that `word` starts with, `len` bytes long with its
/// marker (a width [`SMALL_UINT_LEN`] gives, not 0): the bytes that end
/// `len` bytes into the word, under the mask of its width (a positive
/// fixint is its marker byte).
#[inline(always)]
fn value_in_word(word: u64, len: usize) -> u32 {
    // At most 32 bits: the table lists no wider value.
    (word >> (64 - 8 * len)) as u32 & SMALL_UINT_MASK[len]
}

/// The bits of an unsigned int's value, by the bytes it takes with its
/// marker ([`SMALL_UINT_LEN`]).
const SMALL_UINT_MASK: [u32; 8] = [0, 0xff, 0xff, 0xffff, 0, 0xffff_ffff, 0, 0];

/// `bytes` as a string, if they are UTF-8.
pub(crate) fn utf8(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).map_err(|_| ReadError::Utf8)
}

/// How an error names a value's type ("expected an array, found a string").
pub(crate) fn kind(m: Marker) -> &'static str {
    match m {
        Marker::FixPos(_)
        | Marker::FixNeg(_)
        | Marker::U8
        | Marker::U16
        | Marker::U32
        | Marker::U64
        | Marker::I8
        | Marker::I16
        | Marker::I32
        | Marker::I64 => "an integer",
        Marker::Null => "nil",
        Marker::True | Marker::False => "a boolean",
        Marker::F32 | Marker::F64 => "a float",
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => "a string",
        Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => "bytes",
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => "an array",
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => "a map",
        Marker::FixExt1
        | Marker::FixExt2
        | Marker::FixExt4
        | Marker::FixExt8
        | Marker::FixExt16
        | Marker::Ext8
        | Marker::Ext16
        | Marker::Ext32 => "an extension value",
        Marker::Reserved => "the reserved byte 0xc1",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one<'a, T>(bytes: &'a [u8], f: impl FnOnce(&mut Reader<'a>) -> Result<T>) -> Result<T> {
        let mut r = Reader::new(bytes);
        let v = f(&mut r)?;
        assert_eq!(r.remaining(), 0, "{bytes:02x?} not consumed whole");
        Ok(v)
    }

    #[test]
    fn ints_of_every_width_and_sign() {
        let cases: &[(&[u8], i128)] = &[
            (&[0x05], 5),
            (&[0x7f], 127),
            (&[0xff], -1),
            (&[0xe0], -32),
            (&[0xcc, 0xff], 255),
            (&[0xcd, 0x11, 0x33], 4403),
            (&[0xce, 0, 1, 0, 0], 65536),
            (
                &[0xcf, 0x84, 0xb8, 0x2a, 0x06, 0x6b, 0x92, 0x79, 0xf6],
                9_563_440_015_784_180_214,
            ),
            (&[0xd0, 0x80], -128),
            (&[0xd1, 0xff, 0x7f], -129),
            (&[0xd2, 0x80, 0, 0, 0], i128::from(i32::MIN)),
            (&[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], i128::from(i64::MIN)),
            // Non-canonical: a small value in a wide form.
            (&[0xcf, 0, 0, 0, 0, 0, 0, 0, 7], 7),
            (&[0xd3, 0, 0, 0, 0, 0, 0, 0, 7], 7),
        ];
        for (bytes, want) in cases {
            assert_eq!(one(bytes, |r| r.int()), Ok(*want), "{bytes:02x?}");
        }
    }

    #[test]
    fn headers_need_not_be_minimal() {
        // map16 with 2 entries, array32 with 1 element, str8 of 1 byte.
        let mut r = Reader::new(&[0xde, 0, 2]);
        assert_eq!(r.map_len(), Ok(2));
        let mut r = Reader::new(&[0xdd, 0, 0, 0, 1]);
        assert_eq!(r.array_len(), Ok(1));
        assert_eq!(one(&[0xd9, 1, b'x'], |r| r.str()), Ok("x"));
    }

    #[test]
    fn wrong_types_and_short_input_are_typed() {
        assert_eq!(
            Reader::new(&[0xa1, b'x']).array_len(),
            Err(ReadError::Type {
                expected: "an array",
                found: "a string"
            })
        );
        assert_eq!(Reader::new(&[]).int(), Err(ReadError::Eof));
        assert_eq!(Reader::new(&[0xcd, 0x11]).int(), Err(ReadError::Eof));
        assert_eq!(
            Reader::new(&[0xdb, 0xff, 0xff, 0xff, 0xff]).str(),
            Err(ReadError::Eof)
        );
        assert_eq!(Reader::new(&[0xa2, 0xff, 0xfe]).str(), Err(ReadError::Utf8));
        assert_eq!(
            Reader::new(&[0xc4, 1, 0]).int(),
            Err(ReadError::Type {
                expected: "an integer",
                found: "bytes"
            })
        );
    }

    #[test]
    fn floats_and_ints_read_as_floats() {
        let ts = [0xcb, 0x41, 0xda, 0xc3, 0x63, 0x13, 0x63, 0x77, 0x45];
        assert_eq!(
            one(&ts, |r| r.float()).map(f64::to_bits),
            Ok(0x41da_c363_1363_7745)
        );
        assert_eq!(one(&[0xca, 0x3f, 0xc0, 0, 0], |r| r.float()), Ok(1.5));
        assert_eq!(one(&[0x07], |r| r.float()), Ok(7.0));
    }

    /// Unsigned ints of every width the token readers take, at each edge.
    const SMALL_UINTS: [u64; 10] = [
        0,
        1,
        127,
        128,
        255,
        256,
        65_535,
        65_536,
        150_000,
        u32::MAX as u64,
    ];

    /// Values the token readers leave for the general path: wider, signed,
    /// nil, an array (an EAGLE pair), cut short, or nothing.
    const NOT_SMALL_UINTS: [&[u8]; 8] = [
        &[0xcf, 0, 0, 0, 1, 0, 0, 0, 0],
        &[0xd0, 0x85],
        &[0xff],
        &[0xc0],
        &[0x92, 1, 2],
        &[0xcd, 1],
        &[0xce, 0, 0, 1],
        &[],
    ];

    #[test]
    fn small_uints_read_as_ints_do_and_nothing_else_is_taken() {
        for v in SMALL_UINTS {
            let mut buf = Vec::new();
            rmp::encode::write_uint(&mut buf, v).unwrap();
            let mut r = Reader::new(&buf);
            assert_eq!(r.small_uint().map(u64::from), Some(v));
            assert_eq!(r.remaining(), 0);
        }
        for buf in NOT_SMALL_UINTS {
            let mut r = Reader::new(buf);
            assert_eq!(r.small_uint(), None);
            assert_eq!(r.remaining(), buf.len());
        }
    }

    /// Every width, each value at every distance from the payload's end
    /// (the eight-byte loads and the careful tail), and every kind of value
    /// that stops the run.
    #[test]
    fn small_uints_read_runs_as_small_uint_does_and_stop_before_anything_else() {
        let values = SMALL_UINTS;
        for len in 0..=values.len() * 2 {
            // A run of `len` values cycling through the widths, from each
            // starting width.
            for start in 0..values.len() {
                let run: Vec<u64> = (0..len)
                    .map(|i| values[(start + i) % values.len()])
                    .collect();
                for stop in NOT_SMALL_UINTS {
                    let mut buf = Vec::new();
                    for &v in &run {
                        rmp::encode::write_uint(&mut buf, v).unwrap();
                    }
                    let end_of_run = buf.len();
                    buf.extend_from_slice(stop);
                    // Asked for all of them, for fewer, and for more.
                    for n in [len, len / 2, len + 3] {
                        let mut r = Reader::new(&buf);
                        let mut out = Vec::new();
                        let read = r.small_uints(n, &mut out);
                        let want = n.min(len);
                        assert_eq!(read, want, "run {run:?}, stop {stop:?}, n {n}");
                        let got: Vec<u64> = out.iter().map(|&v| u64::from(v)).collect();
                        assert_eq!(got, run[..want]);
                        let mut expect = Reader::new(&buf);
                        for _ in 0..want {
                            expect.small_uint().unwrap();
                        }
                        assert_eq!(r.remaining(), expect.remaining());
                        if want == len {
                            assert_eq!(r.remaining(), buf.len() - end_of_run);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn skip_passes_over_any_value() {
        let nested: &[u8] = &[
            0x92, // [
            0x81, 0xa1, b'k', 0x93, 0xc0, 0xc3, 0xc2, // {"k": [nil, true, false]},
            0xd7, 0x01, 1, 2, 3, 4, 5, 6, 7, 8,    // fixext8
            0x2a, // trailing value, not skipped
        ];
        let mut r = Reader::new(nested);
        assert_eq!(r.skip(), Ok(()));
        assert_eq!(r.remaining(), 1);
    }

    #[test]
    fn skip_refuses_claims_beyond_the_payload_at_once() {
        // An array32 claiming 2^32 - 1 elements, then one byte.
        let mut r = Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0]);
        assert_eq!(r.skip(), Err(ReadError::Eof));
        assert_eq!(
            Reader::new(&[0xc1]).skip(),
            Err(ReadError::Type {
                expected: "a msgpack value",
                found: "the reserved byte 0xc1"
            })
        );
    }

    #[test]
    fn skip_has_no_depth_limit_and_no_recursion() {
        // 100,000 nested one-element arrays around a nil.
        let mut deep = vec![0x91u8; 100_000];
        deep.push(0xc0);
        let mut r = Reader::new(&deep);
        assert_eq!(r.skip(), Ok(()));
        assert_eq!(r.remaining(), 0);
    }
}
