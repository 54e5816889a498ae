//! The weights of a MySQL or MariaDB collation, read from the server with
//! `WEIGHT_STRING`: what a guard's [`KeyType::Collated`] looks request keys
//! up by.

use bloom_guard::{Collation, KeyType};
use sqlx::{AssertSqlSafe, MySqlPool};
use unicode_normalization::char::is_combining_mark;

use crate::FeedError;

/// The case- and accent-insensitive collations whose weights the guard
/// reproduces: the root collations of each family, PAD SPACE and NO PAD,
/// whose weights are one level (primary) and need no language's rules.
const SUPPORTED: &[&str] = &[
    "general_ci",
    "general_nopad_ci",
    "unicode_ci",
    "unicode_nopad_ci",
    "unicode_520_ci",
    "unicode_520_nopad_ci",
    "uca1400_ai_ci",
    "uca1400_nopad_ai_ci",
    "0900_ai_ci",
];

/// The character sets a supported collation may belong to.
const CHARSETS: &[&str] = &["utf8mb4", "utf8mb3", "utf8"];

/// Whether the guard reproduces `collation` (`utf8mb4_general_ci`) by its
/// weights.
pub(super) fn is_supported(collation: &str) -> bool {
    let collation = collation.to_ascii_lowercase();
    CHARSETS.iter().any(|charset| {
        collation
            .strip_prefix(charset)
            .and_then(|rest| rest.strip_prefix('_'))
            .is_some_and(|family| SUPPORTED.contains(&family))
    })
}

/// The supported collations, for an error message.
pub(super) fn supported_list() -> String {
    SUPPORTED
        .iter()
        .map(|family| format!("utf8mb4_{family}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The character set of a supported `collation`.
fn charset(collation: &str) -> &'static str {
    let collation = collation.to_ascii_lowercase();
    CHARSETS
        .iter()
        .find(|charset| collation.starts_with(&format!("{charset}_")))
        .copied()
        .unwrap_or("utf8mb4")
}

/// `expression` (binary UTF-8) weighed under `collation` by the server, as
/// a stored key a guard takes ([`Collation::weighed`]): the exact form of
/// any key, whatever characters it holds.
pub(super) fn weighed(expression: &str, collation: &str) -> String {
    format!(
        "concat(x'ff', weight_string(convert({expression} using {}) collate {collation}))",
        charset(collation)
    )
}

/// The key type of a guard over a column under `collation`: its weights,
/// read from the server once per process.
pub(super) async fn key_type(pool: &MySqlPool, collation: &str) -> Result<KeyType, FeedError> {
    if !is_supported(collation)
        || !collation
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(FeedError::Uncomparable(format!(
            "collation {collation} is not one whose weights the guard reproduces ({})",
            supported_list()
        )));
    }
    let collation = collation.to_ascii_lowercase();
    let server: String = sqlx::query_scalar("select cast(version() as char)")
        .fetch_one(pool)
        .await?;
    if let Some(known) = Collation::find(&format!("{collation} on {server}")) {
        return Ok(KeyType::Collated(known));
    }
    let weigh = |text: &str| {
        format!(
            "weight_string(convert({text} using {}) collate {collation})",
            charset(&collation)
        )
    };
    // Every code point of the Basic Multilingual Plane with its weights
    // (NULL for a surrogate), in one statement.
    let digits = "(select 0 d union all select 1 union all select 2 union all select 3 union all select 4 union all select 5 union all select 6 union all select 7 union all select 8 union all select 9 union all select 10 union all select 11 union all select 12 union all select 13 union all select 14 union all select 15)";
    let rows: Vec<(i64, Option<Vec<u8>>)> = sqlx::query_as(AssertSqlSafe(format!(
        "select n, {} from (select a.d * 4096 + b.d * 256 + c.d * 16 + e.d as n
            from {digits} a, {digits} b, {digits} c, {digits} e) as points",
        weigh("char(n using utf32)")
    )))
    .fetch_all(pool)
    .await?;
    let one_level = |text: &str| {
        format!(
            "{} = concat({}, {})",
            weigh(&format!("_utf8mb4'{text}'")),
            weigh(&format!("_utf8mb4'{}'", &text[..1])),
            weigh(&format!("_utf8mb4'{}'", &text[1..]))
        )
    };
    let set = charset(&collation);
    let (pads, one_level, supplementary): (i64, i64, Option<Vec<u8>>) =
        sqlx::query_as(AssertSqlSafe(format!(
            "select cast(convert(_utf8mb4'a' using {set}) collate {collation} = _utf8mb4'a ' as signed),
                    cast(({}) and ({}) as signed),
                    case when {} = {} and {} = {} then {} end",
            one_level("ab"),
            one_level("Ab"),
            weigh("_utf8mb4 x'f0908080'"),
            weigh("_utf8mb4 x'f09f9880'"),
            weigh("_utf8mb4 x'f0a08080'"),
            weigh("_utf8mb4 x'f48fbfbd'"),
            weigh("_utf8mb4 x'f0908080'"),
        )))
        .fetch_one(pool)
        .await?;
    if one_level != 1 {
        return Err(FeedError::Uncomparable(format!(
            "collation {collation} weighs a key in several levels, which the guard does not reproduce ({})",
            supported_list()
        )));
    }
    let general = collation.contains("general");
    let mut builder = Collation::builder(collation.clone(), server).pad_space(pads == 1);
    for (point, weights) in rows {
        let (Some(c), Some(weights)) =
            (u32::try_from(point).ok().and_then(char::from_u32), weights)
        else {
            continue;
        };
        if let Some(units) = units(&weights) {
            if general || !may_contract(c) {
                builder = builder.weigh(c, &units);
            }
        }
    }
    // MariaDB's `utf8mb4_general_ci` weighs every character outside the
    // BMP as U+FFFD (four of them agreeing above); the UCA families weigh
    // each its own, which the table leaves out.
    let utf8mb4 = charset(&collation) == "utf8mb4";
    if let Some(units) = supplementary
        .as_deref()
        .and_then(units)
        .filter(|_| general && utf8mb4)
    {
        builder = builder.supplementary(&units);
    }
    let built = builder
        .build()
        .map_err(|error| FeedError::Uncomparable(error.to_string()))?;
    Ok(KeyType::Collated(built))
}

/// Big-endian 16-bit weights, or `None` for an odd number of bytes.
fn units(bytes: &[u8]) -> Option<Vec<u16>> {
    bytes.len().is_multiple_of(2).then(|| {
        bytes
            .chunks_exact(2)
            .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
            .collect()
    })
}

/// Whether `c` may weigh otherwise beside its neighbours under a UCA
/// collation: a combining mark (`И` and a breve weigh as `Й`), a conjoining
/// Hangul jamo, or a character of a script whose Unicode collation rules
/// contract sequences of letters (Thai and Lao vowels, Tibetan, Myanmar,
/// Khmer and their neighbours). A request key holding one passes to the
/// handler unchecked.
fn may_contract(c: char) -> bool {
    is_combining_mark(c)
        || matches!(
            c,
            '\u{0e00}'..='\u{0fff}'   // Thai, Lao, Tibetan
                | '\u{1000}'..='\u{109f}' // Myanmar
                | '\u{1100}'..='\u{11ff}' // Hangul jamo
                | '\u{1780}'..='\u{17ff}' // Khmer
                | '\u{1950}'..='\u{1aaf}' // Tai Le, New Tai Lue, Khmer symbols, Buginese, Tai Tham
                | '\u{1b00}'..='\u{1b7f}' // Balinese
                | '\u{3130}'..='\u{318f}' // Hangul compatibility jamo
                | '\u{a960}'..='\u{a97f}' // Hangul jamo extended-A
                | '\u{aa60}'..='\u{aadf}' // Myanmar extended-A, Tai Viet
                | '\u{d7b0}'..='\u{d7ff}' // Hangul jamo extended-B
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_collations_are_supported() {
        for collation in [
            "utf8mb4_general_ci",
            "UTF8MB4_UNICODE_CI",
            "utf8mb4_unicode_520_nopad_ci",
            "utf8mb4_uca1400_ai_ci",
            "utf8mb3_general_ci",
            "utf8mb4_0900_ai_ci",
        ] {
            assert!(is_supported(collation), "{collation}");
        }
        for collation in [
            "utf8mb4_german2_ci",
            "utf8mb4_uca1400_as_ci",
            "utf8mb4_0900_as_ci",
            "latin1_swedish_ci",
            "utf8mb4_bin",
        ] {
            assert!(!is_supported(collation), "{collation}");
        }
        assert_eq!(charset("utf8mb3_general_ci"), "utf8mb3");
        assert_eq!(
            weighed("c.k", "utf8mb4_general_ci"),
            "concat(x'ff', weight_string(convert(c.k using utf8mb4) collate utf8mb4_general_ci))"
        );
    }

    #[test]
    fn marks_and_contracting_scripts_are_left_out() {
        assert!(may_contract('\u{0306}'));
        assert!(may_contract('เ'));
        assert!(!may_contract('И'));
        assert!(!may_contract('ß'));
        assert_eq!(units(&[0x0e, 0x33, 0, 1]), Some(vec![0x0e33, 1]));
        assert_eq!(units(&[1]), None);
    }
}
