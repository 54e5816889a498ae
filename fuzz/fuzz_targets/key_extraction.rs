//! Key extraction and canonicalisation on arbitrary request targets and
//! headers: never a panic; a decoded path key always re-encodes to itself.
#![no_main]

use bloom_guard::{extract::{Header, KeyExtractor, PathSegment, QueryParam}, keys::Key, KeyType};
use libfuzzer_sys::fuzz_target;
use percent_encoding::{utf8_percent_encode, percent_encode, NON_ALPHANUMERIC};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Decoding one path segment: a decoded key re-encodes to itself.
    let key = Key::from_percent_encoded(text);
    let again = percent_encode(key.as_bytes(), NON_ALPHANUMERIC).to_string();
    assert_eq!(Key::from_percent_encoded(&again), key, "re-encoding changed {text:?}");
    // Every key type's canonical form is a fixed point.
    for key_type in [KeyType::Text, KeyType::CaseInsensitiveText, KeyType::Integer, KeyType::Uuid] {
        if let Some(canonical) = key_type.canonical(Key::from(text)) {
            assert_eq!(key_type.canonical(canonical.clone()), Some(canonical));
        }
    }
    let stored = utf8_percent_encode(text, NON_ALPHANUMERIC).to_string();
    assert_eq!(Key::from_percent_encoded(&stored), Key::from(text));

    // Whole requests, through every extractor.
    let Ok(request) = http::Request::builder()
        .uri(format!("/items/{text}"))
        .header("x-key", text)
        .body(())
    else {
        return;
    };
    let _ = PathSegment(1).extract(&request);
    let _ = QueryParam("id").extract(&request);
    let _ = Header(http::HeaderName::from_static("x-key")).extract(&request);
    if let Ok(query) = http::Request::builder().uri(format!("/lookup?{text}")).body(()) {
        let _ = QueryParam("id").extract(&query);
    }
});
