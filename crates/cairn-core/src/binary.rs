//! Binary values in stored JSON.
//!
//! Step outputs, params, event payloads and workflow outputs are stored as JSON, and serde
//! writes a `Vec<u8>` as an array of numbers: a 200 KB image became about 700 KB of JSON.
//! [`to_value`] and [`to_string`] write every byte sequence instead as one object,
//! `{"$bytes":"<base64>"}`: a sequence whose items are all `u8` (`Vec<u8>`, `[u8; 32]`,
//! `VecDeque<u8>`) and every `serialize_bytes` (`bytes::Bytes`, `serde_bytes`). That is
//! 1.33 bytes per byte, and [`size`] counts the bytes themselves against the payload limit.
//!
//! [`from_str`] and [`from_value`] turn each such object back into the array of numbers
//! serde's own types read, so every target type decodes as it did before: `Vec<u8>`,
//! `Bytes`, `ByteBuf`, `[u8; N]`, even `Vec<u16>`, and a `serde_json::Value` sees the array
//! it would have seen. Values stored before this format decode unchanged.
//!
//! An object key spelled `$bytes` (or `$$bytes`, …) in user data is stored with one more `$`
//! and read back without it, so no user map is ever taken for bytes. (JSON written
//! elsewhere — an HTTP client's params — is read the same way: a key `$$bytes` in it
//! arrives as `$bytes`, and an object that is only `{"$bytes": "<base64>"}` is bytes.)

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::de::DeserializeOwned;
use serde::ser::{self, Serialize};
use serde_json::{Map, Value};

/// The key of the object that holds a byte sequence as base64.
pub const BYTES_KEY: &str = "$bytes";

/// How a byte sequence starts in compact JSON: `{"$bytes":"`.
const OPEN: &str = "{\"$bytes\":\"";

/// `value` as a JSON value, with byte sequences as `{"$bytes": base64}`.
///
/// # Errors
/// As `serde_json::to_value`: a map key that is not a string, a failing `Serialize`.
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Result<Value, serde_json::Error> {
    value.serialize(Compact).map(Node::into_value)
}

/// `value` as compact JSON text, with byte sequences as `{"$bytes":"<base64>"}`.
///
/// # Errors
/// As [`to_value`].
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, serde_json::Error> {
    serde_json::to_string(&to_value(value)?)
}

/// Decodes JSON text written by [`to_string`] (or by `serde_json`) as a `T`.
///
/// # Errors
/// Malformed JSON, or `T`'s own errors.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    if !text.contains(BYTES_KEY) {
        // Nothing to expand: decode straight from the text, as before binary values.
        return serde_json::from_str(text);
    }
    from_value(serde_json::from_str(text)?)
}

/// Decodes a JSON value written by [`to_value`] (or by `serde_json`) as a `T`.
///
/// # Errors
/// `T`'s own errors.
pub fn from_value<T: DeserializeOwned>(mut value: Value) -> Result<T, serde_json::Error> {
    expand(&mut value);
    serde_json::from_value(value)
}

/// The size `json` counts against a payload limit: its length, with each byte sequence
/// counted as its bytes rather than its base64.
#[must_use]
pub fn size(json: &str) -> usize {
    let mut size = json.len();
    let mut rest = json;
    while let Some(at) = rest.find(OPEN) {
        // Inside a JSON string a quote is escaped, so `{"$bytes":"` only ever opens a
        // byte sequence; base64 holds no quote, so the next one closes it.
        let after = &rest[at + OPEN.len()..];
        let Some(len) = after.find('"') else { break };
        let decoded = decoded_len(&after[..len]);
        // `{"$bytes":"` + base64 + `"}` stands for `decoded` bytes.
        size = size.saturating_sub(OPEN.len() + len + 2 - decoded);
        rest = &after[len..];
    }
    size
}

/// The bytes of `json` when the whole value is one byte sequence.
#[must_use]
pub fn whole_bytes(json: &str) -> Option<Vec<u8>> {
    let base64 = json.strip_prefix(OPEN)?.strip_suffix("\"}")?;
    if base64.contains('"') {
        return None;
    }
    BASE64.decode(base64).ok()
}

/// `json` as views show it: each byte sequence as `"[Bytes(<n> bytes)]"` and user keys as
/// written; `Null` when it is not JSON.
#[must_use]
pub fn view(json: &str) -> Value {
    let mut value = serde_json::from_str(json).unwrap_or(Value::Null);
    if json.contains(BYTES_KEY) {
        rewrite(&mut value, &|bytes| {
            Value::from(format!("[Bytes({} bytes)]", bytes.len()))
        });
    }
    value
}

/// Whether `json` holds a byte sequence.
#[must_use]
pub fn has_bytes(json: &str) -> bool {
    json.contains(OPEN)
}

fn decoded_len(base64: &str) -> usize {
    let padding = base64.bytes().rev().take_while(|&b| b == b'=').count();
    (base64.len() / 4 * 3).saturating_sub(padding)
}

/// Replaces each byte sequence by the array of numbers serde reads, and unescapes keys.
fn expand(value: &mut Value) {
    rewrite(value, &|bytes| {
        Value::Array(bytes.into_iter().map(Value::from).collect())
    });
}

/// Replaces each `{"$bytes": base64}` in `value` by `with(bytes)`, and restores escaped keys.
fn rewrite(value: &mut Value, with: &dyn Fn(Vec<u8>) -> Value) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite(v, with)),
        Value::Object(map) => {
            if let Some(bytes) = bytes_of(map) {
                *value = with(bytes);
                return;
            }
            if map.keys().any(|k| is_escaped(k)) {
                let old = std::mem::take(map);
                for (key, v) in old {
                    let key = if is_escaped(&key) {
                        key[1..].to_owned()
                    } else {
                        key
                    };
                    map.insert(key, v);
                }
            }
            map.values_mut().for_each(|v| rewrite(v, with));
        }
        _ => {}
    }
}

fn bytes_of(map: &Map<String, Value>) -> Option<Vec<u8>> {
    if map.len() != 1 {
        return None;
    }
    BASE64.decode(map.get(BYTES_KEY)?.as_str()?).ok()
}

/// `$bytes`, `$$bytes`, …: a user key that [`escape`] gives one more `$`.
fn is_key_like(key: &str) -> bool {
    key.trim_start_matches('$') == "bytes" && key.starts_with('$')
}

/// A stored key that was escaped: `$$bytes`, `$$$bytes`, ….
fn is_escaped(key: &str) -> bool {
    is_key_like(key) && key.starts_with("$$")
}

fn escape(key: String) -> String {
    if is_key_like(&key) {
        format!("${key}")
    } else {
        key
    }
}

fn bytes_value(bytes: &[u8]) -> Value {
    let mut map = Map::new();
    map.insert(BYTES_KEY.to_owned(), Value::String(BASE64.encode(bytes)));
    Value::Object(map)
}

/// What [`Compact`] made of a value: a `u8` stays apart so a sequence can tell it holds bytes.
enum Node {
    Byte(u8),
    Value(Value),
}

impl Node {
    fn into_value(self) -> Value {
        match self {
            Node::Byte(b) => Value::from(b),
            Node::Value(v) => v,
        }
    }
}

/// `serde_json`'s value serializer, but byte sequences become `{"$bytes": base64}`.
struct Compact;

type Error = serde_json::Error;

fn json<T: Serialize + ?Sized>(value: &T) -> Result<Node, Error> {
    serde_json::to_value(value).map(Node::Value)
}

impl ser::Serializer for Compact {
    type Ok = Node;
    type Error = Error;
    type SerializeSeq = Seq;
    type SerializeTuple = Seq;
    type SerializeTupleStruct = Seq;
    type SerializeTupleVariant = Variant<Seq>;
    type SerializeMap = Object;
    type SerializeStruct = Object;
    type SerializeStructVariant = Variant<Object>;

    fn serialize_bool(self, v: bool) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_i8(self, v: i8) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_i16(self, v: i16) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_i32(self, v: i32) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_i64(self, v: i64) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_i128(self, v: i128) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_u8(self, v: u8) -> Result<Node, Error> {
        Ok(Node::Byte(v))
    }
    fn serialize_u16(self, v: u16) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_u32(self, v: u32) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_u64(self, v: u64) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_u128(self, v: u128) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_f32(self, v: f32) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_f64(self, v: f64) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_char(self, v: char) -> Result<Node, Error> {
        json(&v)
    }
    fn serialize_str(self, v: &str) -> Result<Node, Error> {
        json(v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Node, Error> {
        Ok(Node::Value(bytes_value(v)))
    }
    fn serialize_none(self) -> Result<Node, Error> {
        Ok(Node::Value(Value::Null))
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Node, Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Node, Error> {
        Ok(Node::Value(Value::Null))
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Node, Error> {
        Ok(Node::Value(Value::Null))
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<Node, Error> {
        json(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Node, Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        name: &'static str,
        value: &T,
    ) -> Result<Node, Error> {
        Ok(variant(name, to_value(value)?))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Seq, Error> {
        Ok(Seq::new(len.unwrap_or(0)))
    }
    fn serialize_tuple(self, len: usize) -> Result<Seq, Error> {
        Ok(Seq::new(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Seq, Error> {
        Ok(Seq::new(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Variant<Seq>, Error> {
        Ok(Variant {
            name: variant,
            inner: Seq::new(len),
        })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Object, Error> {
        Ok(Object::default())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Object, Error> {
        Ok(Object::default())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Variant<Object>, Error> {
        Ok(Variant {
            name: variant,
            inner: Object::default(),
        })
    }
}

/// A sequence being written: bytes while every item is a `u8`, values once one is not.
enum Seq {
    Bytes(Vec<u8>),
    Values(Vec<Value>),
}

impl Seq {
    fn new(len: usize) -> Seq {
        // Capacity for bytes: most long sequences of `u8` are binary data.
        Seq::Bytes(Vec::with_capacity(len.min(1 << 20)))
    }

    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        match (value.serialize(Compact)?, &mut *self) {
            (Node::Byte(b), Seq::Bytes(bytes)) => bytes.push(b),
            (node, Seq::Values(values)) => values.push(node.into_value()),
            (node, Seq::Bytes(bytes)) => {
                let mut values: Vec<Value> = bytes.drain(..).map(Value::from).collect();
                values.push(node.into_value());
                *self = Seq::Values(values);
            }
        }
        Ok(())
    }

    fn finish(self) -> Value {
        match self {
            // An empty sequence may be of anything: it stays `[]`.
            Seq::Bytes(bytes) if bytes.is_empty() => Value::Array(Vec::new()),
            Seq::Bytes(bytes) => bytes_value(&bytes),
            Seq::Values(values) => Value::Array(values),
        }
    }
}

impl ser::SerializeSeq for Seq {
    type Ok = Node;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.push(value)
    }
    fn end(self) -> Result<Node, Error> {
        Ok(Node::Value(self.finish()))
    }
}

impl ser::SerializeTuple for Seq {
    type Ok = Node;
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.push(value)
    }
    fn end(self) -> Result<Node, Error> {
        Ok(Node::Value(self.finish()))
    }
}

impl ser::SerializeTupleStruct for Seq {
    type Ok = Node;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.push(value)
    }
    fn end(self) -> Result<Node, Error> {
        Ok(Node::Value(self.finish()))
    }
}

/// A map or struct being written.
#[derive(Default)]
struct Object {
    map: Map<String, Value>,
    key: Option<String>,
}

impl Object {
    fn field<T: Serialize + ?Sized>(&mut self, key: String, value: &T) -> Result<(), Error> {
        self.map.insert(escape(key), to_value(value)?);
        Ok(())
    }
}

impl ser::SerializeMap for Object {
    type Ok = Node;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        // serde_json's rules for keys: strings, and numbers, booleans and chars as text.
        self.key = Some(match serde_json::to_value(key)? {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => return Err(ser::Error::custom("key must be a string")),
        });
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| <Error as ser::Error>::custom("a map value came before its key"))?;
        self.field(key, value)
    }
    fn end(self) -> Result<Node, Error> {
        Ok(Node::Value(Value::Object(self.map)))
    }
}

impl ser::SerializeStruct for Object {
    type Ok = Node;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.field(key.to_owned(), value)
    }
    fn end(self) -> Result<Node, Error> {
        Ok(Node::Value(Value::Object(self.map)))
    }
}

/// An enum variant with fields: `{"<variant>": <fields>}`.
struct Variant<T> {
    name: &'static str,
    inner: T,
}

/// `{"<variant>": inner}`.
fn variant(name: &'static str, inner: Value) -> Node {
    let mut map = Map::new();
    map.insert(escape(name.to_owned()), inner);
    Node::Value(Value::Object(map))
}

impl ser::SerializeTupleVariant for Variant<Seq> {
    type Ok = Node;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.inner.push(value)
    }
    fn end(self) -> Result<Node, Error> {
        Ok(variant(self.name, self.inner.finish()))
    }
}

impl ser::SerializeStructVariant for Variant<Object> {
    type Ok = Node;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.inner.field(key.to_owned(), value)
    }
    fn end(self) -> Result<Node, Error> {
        Ok(variant(self.name, Value::Object(self.inner.map)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};
    use std::collections::{BTreeMap, VecDeque};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Image {
        name: String,
        pixels: Vec<u8>,
        digest: [u8; 4],
        thumbs: Vec<Thumb>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Thumb {
        size: u16,
        data: Vec<u8>,
    }

    fn image() -> Image {
        Image {
            name: "cat".into(),
            pixels: (0..=255).cycle().take(200_000).collect(),
            digest: [1, 2, 3, 4],
            thumbs: vec![
                Thumb {
                    size: 300,
                    data: vec![9; 1000],
                },
                Thumb {
                    size: 0,
                    data: vec![],
                },
            ],
        }
    }

    #[test]
    fn byte_sequences_are_stored_as_base64_and_read_back_exactly() {
        let image = image();
        let json = to_string(&image).expect("encodes");
        assert!(
            json.len() < 280_000,
            "200,000 bytes take {} bytes of JSON",
            json.len()
        );
        let plain = serde_json::to_string(&image).expect("encodes");
        assert!(plain.len() > 700_000, "serde_json: {}", plain.len());
        assert_eq!(from_str::<Image>(&json).expect("decodes"), image);
        // And the old form still reads.
        assert_eq!(from_str::<Image>(&plain).expect("decodes"), image);
        // An untyped reader sees what serde_json would have written.
        let untyped: Value = from_str(&json).expect("decodes");
        assert_eq!(untyped, serde_json::to_value(&image).expect("value"));
    }

    #[test]
    fn size_counts_the_bytes_not_their_base64() {
        let image = image();
        let json = to_string(&image).expect("encodes");
        let bytes = 200_000 + 4 + 1000;
        let rest = json.len() - size(&json);
        assert!(rest > bytes / 4, "{rest}");
        assert!(
            size(&json) > bytes && size(&json) < bytes + 200,
            "{}",
            size(&json)
        );
        for n in 0..7 {
            let json = to_string(&vec![7u8; n]).expect("encodes");
            let overhead = if n == 0 { 2 } else { 0 };
            assert_eq!(size(&json), n + overhead, "{json}");
        }
    }

    #[test]
    fn bytes_types_and_byte_arrays_are_compact() {
        #[derive(Serialize)]
        struct Fields<'a> {
            #[serde(with = "serde_bytes_like")]
            raw: &'a [u8],
            deque: VecDeque<u8>,
            array: [u8; 3],
            tuple: (u8, u8),
        }
        mod serde_bytes_like {
            pub(super) fn serialize<S: serde::Serializer>(
                v: &[u8],
                s: S,
            ) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(v)
            }
        }
        let value = to_value(&Fields {
            raw: b"hi",
            deque: VecDeque::from(vec![1, 2]),
            array: [1, 2, 3],
            tuple: (5, 6),
        })
        .expect("encodes");
        assert_eq!(
            value,
            serde_json::json!({
                "raw": {"$bytes": "aGk="},
                "deque": {"$bytes": "AQI="},
                "array": {"$bytes": "AQID"},
                "tuple": {"$bytes": "BQY="},
            })
        );
        assert_eq!(
            whole_bytes(&to_string(&vec![104u8, 105]).expect("encodes")),
            Some(b"hi".to_vec())
        );
        assert_eq!(whole_bytes("[1,2]"), None);
    }

    #[test]
    fn other_numbers_and_mixed_sequences_stay_arrays() {
        assert_eq!(to_string(&vec![1u16, 2]).expect("encodes"), "[1,2]");
        assert_eq!(to_string(&Vec::<u8>::new()).expect("encodes"), "[]");
        assert_eq!(to_string(&(1u8, "a")).expect("encodes"), "[1,\"a\"]");
        let nested: Vec<Vec<u8>> = vec![vec![1], vec![]];
        let json = to_string(&nested).expect("encodes");
        assert_eq!(json, r#"[{"$bytes":"AQ=="},[]]"#);
        assert_eq!(from_str::<Vec<Vec<u8>>>(&json).expect("decodes"), nested);
    }

    #[test]
    fn user_keys_spelled_like_the_marker_round_trip() {
        let mut map = BTreeMap::new();
        map.insert("$bytes".to_owned(), "AQID".to_owned());
        map.insert("$$bytes".to_owned(), "x".to_owned());
        map.insert("bytes".to_owned(), "y".to_owned());
        let json = to_string(&map).expect("encodes");
        assert!(json.contains("$$$bytes"), "{json}");
        assert_eq!(
            from_str::<BTreeMap<String, String>>(&json).expect("decodes"),
            map
        );
        let alone: BTreeMap<String, String> = [("$bytes".to_owned(), "AQID".to_owned())].into();
        let json = to_string(&alone).expect("encodes");
        assert_eq!(
            from_str::<Value>(&json).expect("decodes"),
            serde_json::json!({"$bytes": "AQID"})
        );
        assert_eq!(view(&json), serde_json::json!({"$bytes": "AQID"}));
    }

    #[test]
    fn enums_options_and_maps_with_number_keys_match_serde_json() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        enum E {
            Unit,
            New(Vec<u8>),
            Tuple(u8, Vec<u8>),
            Struct { data: Vec<u8>, n: Option<u32> },
        }
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "type")]
        enum Tagged {
            A { data: Vec<u8> },
        }
        let values = vec![
            E::Unit,
            E::New(vec![1, 2]),
            E::Tuple(3, vec![4]),
            E::Struct {
                data: vec![5],
                n: None,
            },
        ];
        let json = to_string(&values).expect("encodes");
        assert_eq!(from_str::<Vec<E>>(&json).expect("decodes"), values);
        let tagged = Tagged::A {
            data: vec![1, 2, 3],
        };
        let json = to_string(&tagged).expect("encodes");
        assert_eq!(from_str::<Tagged>(&json).expect("decodes"), tagged);
        let keys: BTreeMap<u32, Vec<u8>> = [(7, vec![1])].into();
        let json = to_string(&keys).expect("encodes");
        assert_eq!(json, r#"{"7":{"$bytes":"AQ=="}}"#);
        assert_eq!(
            from_str::<BTreeMap<u32, Vec<u8>>>(&json).expect("decodes"),
            keys
        );
        assert_eq!(to_string(&f64::NAN).expect("encodes"), "null");
    }

    #[test]
    fn views_summarise_bytes() {
        let json = to_string(&image()).expect("encodes");
        let shown = view(&json);
        assert_eq!(shown["pixels"], "[Bytes(200000 bytes)]");
        assert_eq!(shown["thumbs"][0]["data"], "[Bytes(1000 bytes)]");
        assert_eq!(shown["thumbs"][1]["data"], serde_json::json!([]));
        assert_eq!(view("not json"), Value::Null);
    }

    type Mixed = Vec<(
        String,
        Vec<u8>,
        Vec<u16>,
        Option<Vec<u8>>,
        BTreeMap<String, Vec<u8>>,
    )>;

    fn mixed() -> impl proptest::strategy::Strategy<Value = Mixed> {
        use proptest::prelude::*;
        let key = "\\$*(bytes|x)";
        proptest::collection::vec(
            (
                any::<String>(),
                any::<Vec<u8>>(),
                any::<Vec<u16>>(),
                any::<Option<Vec<u8>>>(),
                proptest::collection::btree_map(key, any::<Vec<u8>>(), 0..4),
            ),
            0..4,
        )
    }

    proptest::proptest! {
        #[test]
        fn anything_round_trips_and_is_never_larger_than_its_bytes_suggest(v in mixed()) {
            let json = to_string(&v).expect("encodes");
            proptest::prop_assert_eq!(&from_str::<Mixed>(&json).expect("decodes"), &v);
            // As `serde_json` wrote it, the same value reads the same, unless it has a key
            // that reads as escaped (`$$bytes`): that one loses a `$`.
            let plain = serde_json::to_string(&v).expect("encodes");
            if !plain.contains("\"$$") {
                proptest::prop_assert_eq!(&from_str::<Mixed>(&plain).expect("decodes"), &v);
            }
            proptest::prop_assert!(size(&json) <= plain.len());
        }
    }
}
