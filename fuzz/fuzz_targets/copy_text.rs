//! The COPY text decoder on arbitrary bytes split at an arbitrary point:
//! never a panic, and the same keys whatever the split.
#![no_main]

use bloom_guard::keys::KeyBatch;
use bloom_guard_sqlx::CopyTextDecoder;
use libfuzzer_sys::fuzz_target;

fn decode(chunks: &[&[u8]]) -> (Vec<Vec<u8>>, bool) {
    let mut decoder = CopyTextDecoder::default();
    let mut batch = KeyBatch::default();
    let mut ok = true;
    for chunk in chunks {
        if decoder.decode(chunk, &mut batch).is_err() {
            ok = false;
            break;
        }
    }
    ok = ok && decoder.finish().is_ok();
    (batch.iter().map(|k| k.as_bytes().to_vec()).collect(), ok)
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, bytes)) = data.split_first() else {
        return;
    };
    let at = usize::from(split) % (bytes.len() + 1);
    let whole = decode(&[bytes]);
    let split = decode(&[&bytes[..at], &bytes[at..]]);
    assert_eq!(whole, split, "a chunk boundary changed the result");
});
