//! The weights of a MySQL or MariaDB collation, read from the server with
//! `WEIGHT_STRING`: what a guard's [`KeyType::Collated`] looks request keys
//! up by.

use bloom_guard::{keys::Collation, KeyType};
use sqlx::{AssertSqlSafe, MySqlPool, Row};
use unicode_normalization::char::is_combining_mark;

use crate::error::FeedError;

/// The case- or accent-insensitive collations whose weights the guard
/// reproduces: the root collations of each family, PAD SPACE and NO PAD,
/// which need no language's rules; MariaDB's `uca1400` ones at every
/// strength (its `WEIGHT_STRING` gives each level apart, MySQL 8's does
/// not).
const SUPPORTED: &[&str] = &[
    "general_ci",
    "general_nopad_ci",
    "unicode_ci",
    "unicode_nopad_ci",
    "unicode_520_ci",
    "unicode_520_nopad_ci",
    "uca1400_ai_ci",
    "uca1400_nopad_ai_ci",
    "uca1400_as_ci",
    "uca1400_nopad_as_ci",
    "uca1400_ai_cs",
    "uca1400_nopad_ai_cs",
    "uca1400_as_cs",
    "uca1400_nopad_as_cs",
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

/// The levels a supported `collation` compares: letters (1), accents (2),
/// case (3), from its name (`_as_ci`: 1 and 2; `_ai_cs`: 1 and 3).
fn levels(collation: &str) -> &'static [u8] {
    let collation = collation.to_ascii_lowercase();
    if collation.ends_with("_as_cs") {
        &[1, 2, 3]
    } else if collation.ends_with("_as_ci") {
        &[1, 2]
    } else if collation.ends_with("_ai_cs") {
        &[1, 3]
    } else {
        &[1]
    }
}

/// `text` weighed under `collation` at `level` (no `LEVEL` clause for a
/// collation of one level: MySQL 8 has none).
fn weigh(text: &str, collation: &str, level: u8) -> String {
    let charset = charset(collation);
    let at = if levels(collation).len() > 1 {
        format!(" level {level}")
    } else {
        String::new()
    };
    format!("weight_string(convert({text} using {charset}) collate {collation}{at})")
}

/// `expression` (binary UTF-8) weighed under `collation` by the server, as
/// a stored key a guard takes ([`Collation::weighed`]): the exact form of
/// any key, whatever characters it holds, level after level.
pub(super) fn weighed(expression: &str, collation: &str) -> String {
    let levels: Vec<String> = levels(collation)
        .iter()
        .map(|level| weigh(expression, collation, *level))
        .collect();
    format!("concat(x'ff', {})", levels.join(", x'0000', "))
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
    let levels = levels(&collation);
    // Every code point of the Basic Multilingual Plane with its weights at
    // each level (NULL for a surrogate), in one statement.
    let digits = "(select 0 d union all select 1 union all select 2 union all select 3 union all select 4 union all select 5 union all select 6 union all select 7 union all select 8 union all select 9 union all select 10 union all select 11 union all select 12 union all select 13 union all select 14 union all select 15)";
    let columns: Vec<String> = levels
        .iter()
        .map(|level| weigh("char(n using utf32)", &collation, *level))
        .collect();
    let rows = sqlx::query(AssertSqlSafe(format!(
        "select n, {} from (select a.d * 4096 + b.d * 256 + c.d * 16 + e.d as n
            from {digits} a, {digits} b, {digits} c, {digits} e) as points",
        columns.join(", ")
    )))
    .fetch_all(pool)
    .await?;
    // Each level weighs a pair of characters as the two alone, one after
    // the other; a padded collation equates `a` and `a `.
    let separate: Vec<String> = levels
        .iter()
        .flat_map(|level| {
            ["ab", "Ab"].map(|pair| {
                let at = |text: &str| weigh(&format!("_utf8mb4'{text}'"), &collation, *level);
                format!(
                    "{} = concat({}, {})",
                    at(pair),
                    at(&pair[..1]),
                    at(&pair[1..])
                )
            })
        })
        .collect();
    let plane = |bytes: &str| weigh(&format!("_utf8mb4 x'{bytes}'"), &collation, 1);
    let set = charset(&collation);
    let (pads, separate, supplementary): (i64, i64, Option<Vec<u8>>) =
        sqlx::query_as(AssertSqlSafe(format!(
            "select cast(convert(_utf8mb4'a' using {set}) collate {collation} = _utf8mb4'a ' as signed),
                    cast({} as signed),
                    case when {} = {} and {} = {} then {} end",
            separate.join(" and "),
            plane("f0908080"),
            plane("f09f9880"),
            plane("f0a08080"),
            plane("f48fbfbd"),
            plane("f0908080"),
        )))
        .fetch_one(pool)
        .await?;
    if separate != 1 {
        return Err(FeedError::Uncomparable(format!(
            "collation {collation} weighs characters otherwise beside others, which the guard does not reproduce ({})",
            supported_list()
        )));
    }
    let general = collation.contains("general");
    let mut builder = Collation::builder(collation.clone(), server).pad_space(pads == 1);
    for row in rows {
        let point: i64 = row.try_get(0)?;
        let Some(c) = u32::try_from(point).ok().and_then(char::from_u32) else {
            continue;
        };
        if !general && may_contract(c) {
            continue;
        }
        for at in 1..=levels.len() {
            let weights: Option<Vec<u8>> = row.try_get(at)?;
            if let Some(units) = weights.as_deref().and_then(units) {
                builder = builder.weigh_at(at, c, &units);
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
/// collation: a combining mark (`И` and a breve weigh as `Й`), a middle
/// dot (`l·` weighs as `l` under `uca1400`: Catalan's `l·l`), a conjoining
/// Hangul jamo, or a character of a script whose Unicode collation rules
/// contract sequences of letters (Thai and Lao vowels, Tibetan, Myanmar,
/// Khmer and their neighbours). A request key holding one passes to the
/// handler unchecked. (Searched on MariaDB 10.11's `uca1400_ai_ci`, every
/// BMP character after every character of U+0020-U+1FFF, U+2000-U+303F,
/// the kana, U+A000-U+A9FF and U+FB00-U+FFFF outside the ranges below, and
/// samples of CJK and Hangul syllables: the only characters that weigh
/// otherwise after another are combining marks and the two middle dots.)
fn may_contract(c: char) -> bool {
    is_combining_mark(c)
        || matches!(
            c,
            '\u{00b7}' | '\u{0387}' // middle dots
                | '\u{0e00}'..='\u{0fff}'   // Thai, Lao, Tibetan
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
            "utf8mb4_uca1400_german2_ai_ci",
            "utf8mb4_0900_as_ci",
            "latin1_swedish_ci",
            "utf8mb4_bin",
        ] {
            assert!(!is_supported(collation), "{collation}");
        }
        assert!(is_supported("utf8mb4_uca1400_as_ci"));
        assert_eq!(levels("utf8mb4_uca1400_as_ci"), [1, 2]);
        assert_eq!(levels("utf8mb4_uca1400_nopad_ai_cs"), [1, 3]);
        assert_eq!(levels("utf8mb4_general_ci"), [1]);
        assert_eq!(
            weighed("c.k", "utf8mb4_uca1400_as_ci"),
            "concat(x'ff', weight_string(convert(c.k using utf8mb4) collate utf8mb4_uca1400_as_ci level 1), x'0000', weight_string(convert(c.k using utf8mb4) collate utf8mb4_uca1400_as_ci level 2))"
        );
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
        assert!(may_contract('·'));
        assert!(!may_contract('И'));
        assert!(!may_contract('ß'));
        assert_eq!(units(&[0x0e, 0x33, 0, 1]), Some(vec![0x0e33, 1]));
        assert_eq!(units(&[1]), None);
    }
}
