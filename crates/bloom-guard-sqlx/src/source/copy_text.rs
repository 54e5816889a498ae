//! A decoder for the text format of Postgres `COPY ... TO STDOUT`.

use bloom_guard::keys::KeyBatch;

use crate::error::CopyTextError;

/// Decodes single-column `COPY` text output into keys, chunk by chunk.
///
/// Undoes the text format's escaping exactly: `\\`, `\b`, `\f`, `\n`, `\r`,
/// `\t`, `\v`, octal `\NNN`, hex `\xHH` and any other escaped character;
/// skips `NULL` (`\N`) rows. Rows may be split anywhere across chunks.
///
/// # Example
///
/// ```
/// use bloom_guard::keys::{Key, KeyBatch};
/// use bloom_guard_sqlx::CopyTextDecoder;
///
/// let mut decoder = CopyTextDecoder::default();
/// let mut keys = KeyBatch::default();
/// decoder.decode(b"plain\ntab\\there\nback\\\\sla", &mut keys)?;
/// decoder.decode(b"sh\n\\N\n", &mut keys)?;
/// decoder.finish()?;
/// let keys: Vec<Key<'_>> = keys.iter().collect();
/// assert_eq!(keys, [Key::from("plain"), Key::from("tab\there"), Key::from("back\\slash")]);
/// # Ok::<(), bloom_guard_sqlx::CopyTextError>(())
/// ```
#[derive(Debug, Default)]
pub struct CopyTextDecoder {
    /// The start of a row whose end has not arrived yet.
    partial: Vec<u8>,
}

impl CopyTextDecoder {
    /// Decodes the complete rows of `chunk` (and of what earlier chunks left
    /// unfinished) into `out`.
    ///
    /// # Errors
    ///
    /// [`CopyTextError`] if a row is malformed; `out` then holds the keys of
    /// the rows before it.
    pub fn decode(&mut self, chunk: &[u8], out: &mut KeyBatch) -> Result<(), CopyTextError> {
        let mut rest = chunk;
        if !self.partial.is_empty() {
            let Some(end) = memchr::memchr(b'\n', rest) else {
                self.partial.extend_from_slice(rest);
                return Ok(());
            };
            self.partial.extend_from_slice(&rest[..end]);
            rest = &rest[end + 1..];
            let row = std::mem::take(&mut self.partial);
            let decoded = decode_row(&row, out);
            self.partial = row;
            self.partial.clear();
            decoded?;
        }
        while let Some(end) = memchr::memchr(b'\n', rest) {
            decode_row(&rest[..end], out)?;
            rest = &rest[end + 1..];
        }
        self.partial.extend_from_slice(rest);
        Ok(())
    }

    /// Checks that the output ended at the end of a row.
    ///
    /// # Errors
    ///
    /// [`CopyTextError::Truncated`] if a row was left unfinished.
    pub fn finish(self) -> Result<(), CopyTextError> {
        if self.partial.is_empty() {
            Ok(())
        } else {
            Err(CopyTextError::Truncated)
        }
    }
}

/// Decodes one row (without its newline) into `out`.
fn decode_row(row: &[u8], out: &mut KeyBatch) -> Result<(), CopyTextError> {
    if row == b"\\N" {
        return Ok(());
    }
    if memchr::memchr(b'\t', row).is_some() {
        return Err(CopyTextError::SeveralColumns);
    }
    let mut rest = row;
    while let Some(at) = memchr::memchr(b'\\', rest) {
        out.extend_current(&rest[..at]);
        let escaped = &rest[at + 1..];
        let (byte, used) = match escaped.first() {
            None => {
                out.discard_current();
                return Err(CopyTextError::Truncated);
            }
            Some(b'b') => (0x08, 1),
            Some(b'f') => (0x0c, 1),
            Some(b'n') => (b'\n', 1),
            Some(b'r') => (b'\r', 1),
            Some(b't') => (b'\t', 1),
            Some(b'v') => (0x0b, 1),
            Some(b'0'..=b'7') => number(escaped, 8, 3),
            Some(b'x') if escaped.get(1).is_some_and(u8::is_ascii_hexdigit) => {
                let (byte, used) = number(&escaped[1..], 16, 2);
                (byte, used + 1)
            }
            Some(&other) => (other, 1),
        };
        out.extend_current(&[byte]);
        rest = &escaped[used..];
    }
    out.extend_current(rest);
    out.finish_text_key();
    Ok(())
}

/// Reads up to `max_digits` digits of `radix` from the start of `digits`,
/// as Postgres does (the value wraps to a byte).
fn number(digits: &[u8], radix: u32, max_digits: usize) -> (u8, usize) {
    let mut value: u32 = 0;
    let mut used = 0;
    for &d in digits.iter().take(max_digits) {
        let Some(digit) = char::from(d).to_digit(radix) else {
            break;
        };
        value = value * radix + digit;
        used += 1;
    }
    (value as u8, used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Escapes `key` as Postgres's `COPY TO` text format does.
    fn escape(key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(key.len());
        for &b in key {
            match b {
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                0x08 => out.extend_from_slice(b"\\b"),
                0x0c => out.extend_from_slice(b"\\f"),
                0x0b => out.extend_from_slice(b"\\v"),
                other => out.push(other),
            }
        }
        out
    }

    fn decode_all(chunks: &[&[u8]]) -> Result<Vec<Vec<u8>>, CopyTextError> {
        let mut decoder = CopyTextDecoder::default();
        let mut batch = KeyBatch::default();
        for chunk in chunks {
            decoder.decode(chunk, &mut batch)?;
        }
        decoder.finish()?;
        Ok(batch.iter().map(|k| k.as_bytes().to_vec()).collect())
    }

    #[test]
    fn undoes_every_escape() {
        let decoded = decode_all(&[b"a\\\\b\\nc\\rd\\te\\bf\\fg\\vh\\101\\x42\\x4\\q\\7z\n"]);
        assert_eq!(
            decoded,
            Ok(vec![b"a\\b\nc\rd\te\x08f\x0cg\x0bhAB\x04q\x07z".to_vec()])
        );
    }

    #[test]
    fn counts_keys_that_are_not_utf8_as_skipped() {
        let mut decoder = CopyTextDecoder::default();
        let mut batch = KeyBatch::default();
        decoder
            .decode(b"ok\nbad\\377\nfine\n", &mut batch)
            .expect("decode");
        let keys: Vec<_> = batch.iter().map(|k| k.as_bytes().to_vec()).collect();
        assert_eq!(keys, [b"ok".to_vec(), b"fine".to_vec()]);
        assert_eq!(batch.skipped(), 1);
    }

    #[test]
    fn skips_nulls_and_keeps_empty_keys() {
        assert_eq!(
            decode_all(&[b"\\N\n\na\n"]),
            Ok(vec![b"".to_vec(), b"a".to_vec()])
        );
    }

    #[test]
    fn refuses_several_columns_and_cut_rows() {
        assert_eq!(decode_all(&[b"a\tb\n"]), Err(CopyTextError::SeveralColumns));
        assert_eq!(decode_all(&[b"a\n", b"b"]), Err(CopyTextError::Truncated));
        assert_eq!(decode_all(&[b"a\\\n"]), Err(CopyTextError::Truncated));
    }

    proptest! {
        #[test]
        fn round_trips_any_keys_split_anywhere(
            keys in proptest::collection::vec(
                prop_oneof![
                    proptest::collection::vec(any::<u8>(), 0..40),
                    "\\PC{0,20}".prop_map(String::into_bytes),
                ],
                0..40,
            ),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let mut encoded = Vec::new();
            for key in &keys {
                encoded.extend(escape(key));
                encoded.push(b'\n');
            }
            let mut positions: Vec<usize> = cuts.iter().map(|i| i.index(encoded.len() + 1)).collect();
            positions.sort_unstable();
            let mut chunks = Vec::new();
            let mut start = 0;
            for p in positions {
                chunks.push(&encoded[start..p]);
                start = p;
            }
            chunks.push(&encoded[start..]);
            // Text keys: the ones that are not UTF-8 are skipped.
            let text: Vec<Vec<u8>> = keys.into_iter().filter(|k| std::str::from_utf8(k).is_ok()).collect();
            prop_assert_eq!(decode_all(&chunks), Ok(text));
        }
    }
}
