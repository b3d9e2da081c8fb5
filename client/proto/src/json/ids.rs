//! A JSON object's array of token ids, read by a loop of its own.
//!
//! A lookup's body is mostly its prompt's token ids. serde_json reads an
//! array of integers one element at a time through serde's visitor, and
//! that is most of the server's time on an HTTP lookup (docs/benchmarks.md,
//! "Where a lookup's time goes over HTTP"). [`from_slice`] finds the ids'
//! field among the object's top-level keys, reads its array with a loop
//! that knows only digits, commas and whitespace, and hands serde_json the
//! rest of the object with `[]` in the array's place.
//!
//! Whatever that loop does not know makes it step aside, and serde_json
//! reads the whole body as it would without it: a body that is not an
//! object, a key with an escape, the field given twice or as anything but
//! an array, a number with a sign, fraction, exponent or leading zero, or
//! one past `u32`. An error is always serde_json's own, on the body as
//! sent. So the answer, and any error's text, is the same either way.
//!
//! Replacing the array cannot change how the rest reads: the array and its
//! replacement are both bracketed and hold no quote, so every other byte
//! lies in the same string, or outside any, in both bodies. And the array
//! replaced is the one serde_json reads as the field: on a well-formed body
//! the scan of the top-level keys is exact, and a body it misreads is not
//! well formed, so serde_json refuses its rest too and reads it whole.

use serde::de::DeserializeOwned;

/// `body` as `T`, its top-level array `field` of token ids read apart and
/// given to `T` by `put` (which receives what serde_json read for the
/// field from `[]` and the ids read).
///
/// `T` must read `field` as a plain `Vec<u32>` (or `Option` of one), and
/// `put` set it to the ids as they are: then the result is serde_json's
/// own for the body.
pub fn from_slice<T: DeserializeOwned>(
    body: &[u8],
    field: &str,
    put: impl FnOnce(&mut T, Vec<u32>),
) -> serde_json::Result<T> {
    let Some(lifted) = lift(body, field) else {
        return serde_json::from_slice(body);
    };
    match serde_json::from_slice::<T>(&lifted.rest) {
        Ok(mut value) => {
            put(&mut value, lifted.ids);
            Ok(value)
        }
        // The error with the body's own positions.
        Err(_) => serde_json::from_slice(body),
    }
}

/// An object's ids field, read, and the object without them.
struct Lifted {
    ids: Vec<u32>,
    /// The object with `[]` for the field's array.
    rest: Vec<u8>,
}

/// `body`'s top-level field `field`, if the body is an object in which it
/// appears once, as an array of plain integers that fit `u32`.
fn lift(body: &[u8], field: &str) -> Option<Lifted> {
    let mut c = Cursor { body, at: 0 };
    c.ws();
    c.eat(b'{')?;
    c.ws();
    if c.peek()? == b'}' {
        return None;
    }
    let mut found = None;
    loop {
        c.ws();
        let key = c.key()?;
        c.ws();
        c.eat(b':')?;
        c.ws();
        if key == field.as_bytes() {
            if found.is_some() {
                return None;
            }
            let start = c.at;
            let ids = c.ids()?;
            found = Some((start, c.at, ids));
        } else {
            c.skip_value()?;
        }
        c.ws();
        match c.next()? {
            b',' => {}
            b'}' => break,
            _ => return None,
        }
    }
    c.ws();
    if c.at != body.len() {
        return None;
    }
    let (start, end, ids) = found?;
    let mut rest = Vec::with_capacity(body.len() - (end - start) + 2);
    rest.extend_from_slice(&body[..start]);
    rest.extend_from_slice(b"[]");
    rest.extend_from_slice(&body[end..]);
    Some(Lifted { ids, rest })
}

/// A position in a body; each step returns `None` where the body is not
/// what the fast reading takes.
struct Cursor<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.body.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn eat(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    /// Skips JSON's whitespace.
    fn ws(&mut self) {
        while self.peek().is_some_and(is_ws) {
            self.at += 1;
        }
    }

    /// A key without escapes, its bytes.
    fn key(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.at;
        let len = self.body[start..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\')?;
        self.at = start + len;
        self.eat(b'"')?;
        Some(&self.body[start..start + len])
    }

    /// Past a string's closing quote, from inside it.
    fn skip_string(&mut self) -> Option<()> {
        loop {
            match self.next()? {
                b'"' => return Some(()),
                b'\\' => {
                    self.next()?;
                }
                _ => {}
            }
        }
    }

    /// Past one value of a well-formed body (a body it misreads is not
    /// well formed: serde_json refuses its rest, and reads it whole).
    fn skip_value(&mut self) -> Option<()> {
        match self.next()? {
            b'"' => self.skip_string(),
            b'{' | b'[' => {
                let mut depth = 1usize;
                while depth > 0 {
                    match self.next()? {
                        b'"' => self.skip_string()?,
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => depth -= 1,
                        _ => {}
                    }
                }
                Some(())
            }
            // A number, `true`, `false` or `null`: up to what ends it.
            _ => {
                while self
                    .peek()
                    .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !is_ws(b))
                {
                    self.at += 1;
                }
                Some(())
            }
        }
    }

    /// An array of plain integers that fit `u32`.
    fn ids(&mut self) -> Option<Vec<u32>> {
        self.eat(b'[')?;
        // Room up front for ids of three digits with their commas, within
        // the array's extent (its first `]`): a tokenizer's ids are mostly
        // longer, and memory stays within the body's size.
        let extent = memchr::memchr(b']', &self.body[self.at..])?;
        let mut ids = Vec::with_capacity(extent / 4 + 1);
        self.ws();
        if self.peek()? == b']' {
            self.at += 1;
            return Some(ids);
        }
        loop {
            self.ws();
            ids.push(self.id()?);
            // A compact array's comma comes right after its id.
            let mut after = self.next()?;
            if is_ws(after) {
                self.ws();
                after = self.next()?;
            }
            match after {
                b',' => {}
                b']' => return Some(ids),
                _ => return None,
            }
        }
    }

    /// One plain integer that fits `u32`: digits, no leading zero.
    #[inline]
    fn id(&mut self) -> Option<u32> {
        let start = self.at;
        // Up to seven digits at once, from the eight bytes at `start`.
        if let Some(word) = self.body.get(start..start + 8) {
            let word = u64::from_le_bytes(word.try_into().ok()?);
            let digits = leading_digits(word);
            if (1..8).contains(&digits) {
                if digits > 1 && word as u8 == b'0' {
                    return None;
                }
                self.at += digits;
                return Some(digits_value(word, digits));
            }
        }
        let mut value: u64 = 0;
        while let Some(digit) = self
            .peek()
            .map(|b| b.wrapping_sub(b'0'))
            .filter(|&d| d < 10)
        {
            value = value * 10 + u64::from(digit);
            if value > u64::from(u32::MAX) {
                return None;
            }
            self.at += 1;
        }
        let digits = self.at - start;
        if digits == 0 || (digits > 1 && self.body[start] == b'0') {
            return None;
        }
        Some(value as u32)
    }
}

/// Whether `b` is JSON's whitespace.
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Every byte of a word's lanes.
const LANES: u64 = 0x0101_0101_0101_0101;

/// How many of `word`'s bytes, first (lowest) first, are ASCII digits
/// before the first that is not (8: all of them).
#[inline]
fn leading_digits(word: u64) -> usize {
    // A digit is 0x30..=0x39: its high nibble is 3, before and after
    // adding 6. A byte's `+ 6` may carry into the next (and on), but only
    // from a byte of 0xFA or more, itself no digit: the lanes before the
    // first non-digit get no carry, and it is found right all the same.
    let high = word & (0xF0 * LANES);
    let plus_six = word.wrapping_add(6 * LANES) & (0xF0 * LANES);
    let off = (high ^ (0x30 * LANES)) | (plus_six ^ (0x30 * LANES));
    // The top bit of each byte of `off` that is not zero (no carry between
    // lanes: each sum is at most 0xFE).
    let nonzero = (((off & (0x7F * LANES)) + 0x7F * LANES) | off) & (0x80 * LANES);
    (nonzero.trailing_zeros() / 8) as usize
}

/// The value of `word`'s first `digits` bytes (1 to 8), all ASCII digits,
/// the first the most significant.
#[inline]
fn digits_value(word: u64, digits: usize) -> u32 {
    // The digits to the word's top, zeros (leading, so worth nothing)
    // below them; then pairs, fours and the eight combined in three
    // multiplications.
    let v = (word & (0x0F * LANES)) << (8 * (8 - digits));
    let v = (v.wrapping_mul(10 * 256 + 1) >> 8) & 0x00FF_00FF_00FF_00FF;
    let v = (v.wrapping_mul(100 * 65_536 + 1) >> 16) & 0x0000_FFFF_0000_FFFF;
    (v.wrapping_mul(10_000 * (1 << 32) + 1) >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Body {
        token_ids: Vec<u32>,
        model: String,
        #[serde(default)]
        extra: Option<serde_json::Value>,
    }

    fn read(body: &str) -> serde_json::Result<Body> {
        from_slice(body.as_bytes(), "token_ids", |b: &mut Body, ids| {
            b.token_ids = ids
        })
    }

    /// The body as serde_json alone reads it, or its error's text.
    fn plain(body: &str) -> Result<Body, String> {
        serde_json::from_str(body).map_err(|e| e.to_string())
    }

    #[test]
    fn ids_are_read_apart_and_the_rest_by_serde_json() {
        let body = r#" { "model" : "m", "extra": {"a": ["]", "\"token_ids\"", [1, {}]]},
            "token_ids" : [ 0, 1 ,4294967295,20	]
        } "#;
        let lifted = lift(body.as_bytes(), "token_ids").expect("a body the loop reads");
        assert_eq!(lifted.ids, vec![0, 1, u32::MAX, 20]);
        assert!(std::str::from_utf8(&lifted.rest)
            .unwrap()
            .contains(r#""token_ids" : []"#));
        assert_eq!(read(body).unwrap(), plain(body).unwrap());
    }

    #[test]
    fn what_the_loop_does_not_read_reads_as_serde_json_alone_reads_it() {
        for body in [
            r#"{"token_ids":[1,-2],"model":"m"}"#,
            r#"{"token_ids":[1,2.0],"model":"m"}"#,
            r#"{"token_ids":[1,2e1],"model":"m"}"#,
            r#"{"token_ids":[01],"model":"m"}"#,
            // The same, read byte by byte (near the end; and past 7 digits).
            r#"{"model":"m","token_ids":[01]}"#,
            r#"{"token_ids":[012345678],"model":"m"}"#,
            r#"{"token_ids":[123456789, 4294967295],"model":"m"}"#,
            r#"{"token_ids":[4294967296],"model":"m"}"#,
            r#"{"token_ids":[1,],"model":"m"}"#,
            r#"{"token_ids":[1 2],"model":"m"}"#,
            r#"{"token_ids":null,"model":"m"}"#,
            r#"{"token_ids":"1,2","model":"m"}"#,
            r#"{"token_ids":[1],"token_ids":[2],"model":"m"}"#,
            r#"{"token\u005fids":[1],"model":"m"}"#,
            r#"{"token_ids":[1],"model":"m"} x"#,
            r#"{"token_ids":[1],"model":"m""#,
            r#"{"token_ids":[1],"model":5}"#,
            r#"{"token_ids":[1],"model":"m","other":1}"#,
            r#"{"token_ids":[1],"model":"m","extra":[}"#,
            r#"[[1],"m"]"#,
            r#"{}"#,
            "",
        ] {
            assert_eq!(read(body).map_err(|e| e.to_string()), plain(body), "{body}");
        }
        // Those the loop reads itself, and those it leaves whole.
        assert!(lift(br#"{"token_ids":[1],"model":5}"#, "token_ids").is_some());
        assert!(lift(br#"{"token_ids":[1,-2],"model":"m"}"#, "token_ids").is_none());
        assert!(lift(br#"{"token_ids":[1],"token_ids":[2]}"#, "token_ids").is_none());
        assert!(lift(br#"{"model":"m","token_ids":[01]}"#, "token_ids").is_none());
        assert!(lift(br#"{"token_ids":[012345678]}"#, "token_ids").is_none());
    }

    proptest! {
        /// Any body of ids, in any layout and key order, reads as
        /// serde_json alone reads it.
        #[test]
        fn bodies_read_as_serde_json_alone_reads_them(
            ids in proptest::collection::vec(
                prop_oneof![0..10u32, 0..1_000u32, 0..10_000_000u32, any::<u32>()],
                0..64,
            ),
            model in "[a-z\"\\\\\\[\\]{}:, ]{0,8}",
            ids_first in any::<bool>(),
            pretty in any::<bool>(),
        ) {
            let (a, b) = (("token_ids", json!(ids)), ("model", json!(model)));
            let fields = if ids_first { [a, b] } else { [b, a] };
            let object: serde_json::Map<String, serde_json::Value> =
                fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            let body = if pretty {
                serde_json::to_string_pretty(&object)
            } else {
                serde_json::to_string(&object)
            }
            .unwrap();
            prop_assert!(lift(body.as_bytes(), "token_ids").is_some());
            prop_assert_eq!(read(&body).unwrap(), plain(&body).unwrap());
        }

        /// Any text made of JSON's punctuation, digits and the field's
        /// name, well formed or not, reads (or fails) as serde_json alone
        /// reads it.
        #[test]
        fn any_text_reads_as_serde_json_alone_reads_it(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("{"), Just("}"), Just("["), Just("]"), Just(","), Just(":"),
                    Just("\""), Just("\\"), Just(" "), Just("0"), Just("7"), Just("42"),
                    Just("-"), Just("."), Just("e"), Just("\"token_ids\""),
                    Just("\"model\""), Just("\"m\""), Just("null"),
                    Just("{\"token_ids\":["), Just("],\"model\":\"m\"}"),
                ],
                0..24,
            ),
        ) {
            let body = parts.concat();
            prop_assert_eq!(read(&body).map_err(|e| e.to_string()), plain(&body));
        }
    }

    #[test]
    fn words_of_digits_read_as_their_numbers() {
        for text in [
            "0", "7", "42", "1234567", "99999999", "12345678", "305x", "9 ", "1,2",
        ] {
            let mut word = [b'!'; 8];
            word[..text.len()].copy_from_slice(text.as_bytes());
            let word = u64::from_le_bytes(word);
            let digits = text.bytes().take_while(u8::is_ascii_digit).count();
            assert_eq!(leading_digits(word), digits, "{text}");
            assert_eq!(
                digits_value(word, digits).to_string(),
                text[..digits],
                "{text}"
            );
        }
        // No digit; and a byte whose `+ 6` carries, then a digit.
        assert_eq!(leading_digits(u64::from_le_bytes(*b",1234567")), 0);
        assert_eq!(
            leading_digits(u64::from_le_bytes([0xFF, b'3', 0, 0, 0, 0, 0, 0])),
            0
        );
        assert_eq!(
            leading_digits(u64::from_le_bytes([b'3', 0xFA, b'3', 0, 0, 0, 0, 0])),
            1
        );
    }

    #[test]
    fn an_error_names_the_place_in_the_body_as_sent() {
        let body = r#"{"token_ids":[1,2,3,4,5,6,7,8,9],"model":5}"#;
        let err = read(body).unwrap_err().to_string();
        assert_eq!(err, plain(body).unwrap_err());
        assert!(err.ends_with("column 42"), "{err}");
    }
}
