//! Tests of `pgoutput.rs`.

use super::*;

/// Bytes as Postgres writes them, built field by field.
#[derive(Default)]
struct Bytes(Vec<u8>);

impl Bytes {
    fn u8(mut self, value: u8) -> Self {
        self.0.push(value);
        self
    }
    fn u16(mut self, value: u16) -> Self {
        self.0.extend(value.to_be_bytes());
        self
    }
    fn u32(mut self, value: u32) -> Self {
        self.0.extend(value.to_be_bytes());
        self
    }
    fn string(mut self, value: &str) -> Self {
        self.0.extend(value.as_bytes());
        self.0.push(0);
        self
    }
    fn text(self, value: &str) -> Self {
        let mut this = self.u8(b't').u32(value.len() as u32);
        this.0.extend(value.as_bytes());
        this
    }
}

fn items_relation() -> Vec<u8> {
    Bytes::default()
        .u8(b'R')
        .u32(16_384)
        .string("public")
        .string("items")
        .u8(b'i')
        .u16(2)
        .u8(0)
        .string("id")
        .u32(20)
        .u32(u32::MAX)
        .u8(1)
        .string("key")
        .u32(25)
        .u32(u32::MAX)
        .0
}

#[test]
fn a_relation_names_its_columns_and_its_identity() {
    let bytes = items_relation();
    let Message::Relation(relation) = decode(&bytes).unwrap() else {
        panic!("not a relation");
    };
    assert_eq!(relation.id, 16_384);
    assert_eq!((&*relation.namespace, &*relation.name), ("public", "items"));
    assert_eq!(relation.identity, b'i');
    let names: Vec<_> = relation
        .columns
        .iter()
        .map(|c| (&*c.name, c.in_identity))
        .collect();
    assert_eq!(names, [("id", false), ("key", true)]);
}

#[test]
fn rows_carry_their_values_null_unchanged_and_text() {
    let insert = Bytes::default()
        .u8(b'I')
        .u32(7)
        .u8(b'N')
        .u16(3)
        .text("42")
        .u8(b'n')
        .u8(b'u')
        .0;
    assert_eq!(
        decode(&insert).unwrap(),
        Message::Insert {
            relation: 7,
            new: Tuple(vec![Value::Text(b"42"), Value::Null, Value::Unchanged]),
        }
    );
    let update = Bytes::default()
        .u8(b'U')
        .u32(7)
        .u8(b'K')
        .u16(1)
        .text("old")
        .u8(b'N')
        .u16(1)
        .text("new")
        .0;
    assert_eq!(
        decode(&update).unwrap(),
        Message::Update {
            relation: 7,
            old: Some(Old::Key(Tuple(vec![Value::Text(b"old")]))),
            new: Tuple(vec![Value::Text(b"new")]),
        }
    );
    let same_key = Bytes::default().u8(b'U').u32(7).u8(b'N').u16(1).text("k").0;
    assert!(matches!(
        decode(&same_key).unwrap(),
        Message::Update { old: None, .. }
    ));
    let delete = Bytes::default()
        .u8(b'D')
        .u32(7)
        .u8(b'O')
        .u16(1)
        .text("gone")
        .0;
    assert_eq!(
        decode(&delete).unwrap(),
        Message::Delete {
            relation: 7,
            old: Old::Row(Tuple(vec![Value::Text(b"gone")])),
        }
    );
    let truncate = Bytes::default().u8(b'T').u32(2).u8(0).u32(7).u32(8).0;
    assert_eq!(
        decode(&truncate).unwrap(),
        Message::Truncate {
            relations: vec![7, 8]
        }
    );
}

#[test]
fn bytes_that_end_early_or_carry_an_unknown_tag_are_errors() {
    let bytes = items_relation();
    for len in 0..bytes.len() {
        assert!(decode(&bytes[..len]).is_err(), "{len} bytes decoded");
    }
    assert_eq!(decode(b"Z"), Err(DecodeError::Tag('Z')));
    let bad_value = Bytes::default().u8(b'I').u32(7).u8(b'N').u16(1).u8(b'x').0;
    assert_eq!(decode(&bad_value), Err(DecodeError::Tag('x')));
    let huge = Bytes::default()
        .u8(b'I')
        .u32(7)
        .u8(b'N')
        .u16(1)
        .u8(b't')
        .u32(u32::MAX)
        .0;
    assert_eq!(decode(&huge), Err(DecodeError::Truncated));
}

proptest::proptest! {
    #[test]
    fn any_bytes_decode_or_fail_without_a_panic(bytes: Vec<u8>) {
        let _ = decode(&bytes);
    }
}
