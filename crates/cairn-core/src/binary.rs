//! Binary values in stored JSON.
//!
//! Step outputs, params, event payloads and workflow outputs are stored as JSON, and serde
//! writes a `Vec<u8>` as an array of numbers: a 200 KB image became about 700 KB of JSON.
//! [`to_string`] and [`to_value`] write serde_json's JSON with one difference: a byte
//! sequence is one object, `{"$bytes":"<base64>"}`. A byte sequence is what serde calls
//! bytes (`serialize_bytes`: `bytes::Bytes`, `serde_bytes`) and a non-empty sequence whose
//! items are all `u8` (`Vec<u8>`, `&[u8]`, `VecDeque<u8>`). That is 1.33 bytes per byte,
//! and [`size`] counts the bytes themselves against the payload limit.
//!
//! [`from_str`] and [`from_value`] read such an object as bytes wherever the target asks for
//! a sequence or bytes (so `Vec<u8>`, `Bytes`, `ByteBuf` and `[u8; N]` decode straight from
//! the base64) and as the array of numbers serde_json would have written wherever it takes
//! anything (`serde_json::Value`, untagged enums). JSON written before binary values reads
//! as it did, but for such one-key maps.
//!
//! An object whose only key is `$bytes` and whose value is base64 therefore means bytes
//! wherever a sequence, bytes or anything is wanted, also in JSON from elsewhere (an HTTP
//! client's params); read as a map, it is a map. (Read as a `serde_json::Value`, a map of
//! your own with that single key and a base64 value comes back as numbers.)

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer, IntoDeserializer};
use serde::ser::{self, Serialize, SerializeMap as _, Serializer};
use serde_json::Value;

/// The key of the object that holds a byte sequence as base64.
pub const BYTES_KEY: &str = "$bytes";

/// The character that starts [`BYTES_KEY`]: a user's key (or field, or variant name) that
/// starts with it is stored with one more in front (`$bytes` as `$$bytes`, `$x` as `$$x`,
/// `$$y` as `$$$y`), so that no key of theirs reads as a byte sequence, and every one reads
/// back as it was written.
const ESCAPE: char = '$';

/// A stored key as its writer wrote it: one [`ESCAPE`] less in front of one that starts
/// with two. (A key with one in front is written by no one but [`to_string`] for bytes, or
/// was stored before keys were escaped: it reads as it is.)
fn unescape(key: &str) -> &str {
    if key.starts_with("$$") {
        &key[1..]
    } else {
        key
    }
}

/// How a byte sequence starts in compact JSON: `{"$bytes":"`.
const OPEN: &str = "{\"$bytes\":\"";
/// How it ends.
const CLOSE: &str = "\"}";

/// How deep a stored value may nest: arrays and objects inside one another, `[[1]]` being
/// two deep. serde_json reads no JSON nested 128 deep (its guard against a stack overflow),
/// and Cairn wraps a value in up to a few more levels of its own (a log record's
/// `{"result": …}`, a wait's `{"payload": …}`, a worker's frame): a value any deeper would be
/// stored, then fail to read back. So the writers refuse it, as an HTTP body is.
pub const MAX_DEPTH: usize = 100;

fn too_deep() -> serde_json::Error {
    ser::Error::custom(format!(
        "it nests deeper than {MAX_DEPTH} levels of arrays and objects, the most a stored value may"
    ))
}

/// How deep JSON text nests (its arrays and objects), counted up to one past `MAX_DEPTH`.
fn text_depth(json: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in json.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > MAX_DEPTH {
                    break;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// How deep a JSON value nests, counted up to one past `MAX_DEPTH` (without recursion).
fn value_depth(value: &Value) -> usize {
    if !(value.is_array() || value.is_object()) {
        return 0;
    }
    let mut deepest = 0;
    let mut open = vec![(value, 0usize)];
    while let Some((value, depth)) = open.pop() {
        let inner = depth + 1;
        match value {
            Value::Array(items) => open.extend(items.iter().map(|item| (item, inner))),
            Value::Object(fields) => open.extend(fields.values().map(|item| (item, inner))),
            _ => continue,
        }
        deepest = deepest.max(inner);
        if deepest > MAX_DEPTH {
            break;
        }
    }
    deepest
}

/// `value` as compact JSON text, with byte sequences as `{"$bytes":"<base64>"}`.
///
/// # Errors
/// As `serde_json::to_string`, and when it nests deeper than [`MAX_DEPTH`].
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, serde_json::Error> {
    let json = serde_json::to_string(&Compacted(value))?;
    // Nesting past the limit takes more brackets than that.
    if json.len() > 2 * MAX_DEPTH && text_depth(&json) > MAX_DEPTH {
        return Err(too_deep());
    }
    Ok(json)
}

/// `value` as a JSON value, with byte sequences as `{"$bytes": "<base64>"}`.
///
/// # Errors
/// As `serde_json::to_value`, and when it nests deeper than [`MAX_DEPTH`].
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Result<Value, serde_json::Error> {
    let value = serde_json::to_value(Compacted(value))?;
    if value_depth(&value) > MAX_DEPTH {
        return Err(too_deep());
    }
    Ok(value)
}

/// Decodes JSON text written by [`to_string`] (or by `serde_json`) as a `T`.
///
/// # Errors
/// Malformed JSON, or `T`'s own errors.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    if !text.contains("\"$") {
        // No key that starts with `$`: nothing to read as bytes or to unescape.
        return serde_json::from_str(text);
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = T::deserialize(Expanded(&mut de))?;
    de.end()?;
    Ok(value)
}

/// Decodes a JSON value written by [`to_value`] (or by `serde_json`) as a `T`.
///
/// # Errors
/// `T`'s own errors.
pub fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, serde_json::Error> {
    T::deserialize(Expanded(value))
}

/// The size `json` counts against a payload limit: its length, with the base64 of each
/// byte sequence counted as the bytes it holds (the object around it counts in full).
#[must_use]
pub fn size(json: &str) -> usize {
    let mut size = json.len();
    let mut rest = json;
    while let Some(at) = rest.find(OPEN) {
        // Inside a JSON string a quote is escaped, so `{"$bytes":"` opens an object; base64
        // holds no quote, so the next one ends the string, and `}` must close the object.
        let after = &rest[at + OPEN.len()..];
        let Some(len) = after.find('"') else { break };
        if after[len..].starts_with(CLOSE)
            && let Some(bytes) = base64_len(&after[..len])
        {
            size -= len - bytes;
        }
        rest = &after[len..];
    }
    size
}

/// The bytes of `json` when the whole value is one byte sequence.
#[must_use]
pub fn whole_bytes(json: &str) -> Option<Vec<u8>> {
    let base64 = json.strip_prefix(OPEN)?.strip_suffix(CLOSE)?;
    if base64.contains('"') {
        return None;
    }
    BASE64.decode(base64).ok()
}

/// Whether `json` may hold a byte sequence.
#[must_use]
pub fn has_bytes(json: &str) -> bool {
    json.contains(OPEN)
}

/// `json` as views and logs show it ([`summarise`]); `Null` when it is not JSON.
#[must_use]
pub fn view(json: &str) -> Value {
    let mut value = serde_json::from_str(json).unwrap_or(Value::Null);
    if shown_differently(json) {
        summarise(&mut value);
    }
    value
}

/// The most bytes of JSON a log record keeps of a value that is stored whole elsewhere
/// (an instance's params, in its row): a larger one is shown cut ([`log_view`]), so that
/// it is not stored twice.
pub const LOG_VALUE_LIMIT: usize = 4096;

/// The stored JSON `json` as a log record keeps it: as views show it ([`view`]), or, over
/// [`LOG_VALUE_LIMIT`] bytes, its first bytes and its size in a string.
#[must_use]
pub fn log_view(json: &str) -> Value {
    let shown = view(json);
    let text = if shown_differently(json) {
        std::borrow::Cow::Owned(shown.to_string())
    } else {
        std::borrow::Cow::Borrowed(json)
    };
    if text.len() <= LOG_VALUE_LIMIT {
        return shown;
    }
    let mut end = LOG_VALUE_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Value::from(format!(
        "{}… [truncated: {} bytes]",
        &text[..end],
        size(json)
    ))
}

/// Shows stored JSON as views and logs do: each byte sequence as `"[Bytes(<n> bytes)]"`,
/// every key as its writer wrote it.
pub fn summarise(value: &mut Value) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(summarise),
        Value::Object(map) => match bytes_len(map) {
            Some(n) => *value = Value::from(format!("[Bytes({n} bytes)]")),
            None => {
                unescape_keys(map);
                map.values_mut().for_each(summarise);
            }
        },
        _ => {}
    }
}

/// Stored JSON as the HTTP API answers it: every key as its writer wrote it, byte
/// sequences as stored (`{"$bytes": "<base64>"}`, never a million numbers).
pub fn external(value: &mut Value) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(external),
        Value::Object(map) if bytes_len(map).is_none() => {
            unescape_keys(map);
            map.values_mut().for_each(external);
        }
        _ => {}
    }
}

/// Whether views show `json` otherwise than it is stored: it may hold a byte sequence or a
/// key stored escaped.
#[must_use]
pub fn shown_differently(json: &str) -> bool {
    json.contains("\"$")
}

/// The stored JSON text `json` as a value in [`external`] form.
///
/// # Errors
/// When `json` is not JSON.
pub fn external_value(json: &str) -> Result<Value, serde_json::Error> {
    let mut value = serde_json::from_str(json)?;
    if json.contains("\"$$") {
        external(&mut value);
    }
    Ok(value)
}

/// [`external`] of the stored JSON text `json`, as text (itself when nothing changes).
#[must_use]
pub fn external_text(json: &str) -> std::borrow::Cow<'_, str> {
    if !json.contains("\"$$") {
        return std::borrow::Cow::Borrowed(json);
    }
    match serde_json::from_str::<Value>(json) {
        Ok(mut value) => {
            external(&mut value);
            std::borrow::Cow::Owned(value.to_string())
        }
        Err(_) => std::borrow::Cow::Borrowed(json),
    }
}

/// The keys of `map` as their writer wrote them ([`unescape`]), in their order.
fn unescape_keys(map: &mut serde_json::Map<String, Value>) {
    if !map.keys().any(|k| k.starts_with("$$")) {
        return;
    }
    *map = std::mem::take(map)
        .into_iter()
        .map(|(mut key, value)| {
            unescape_owned(&mut key);
            (key, value)
        })
        .collect();
}

/// The number of bytes `map` holds when it is a byte sequence.
fn bytes_len(map: &serde_json::Map<String, Value>) -> Option<usize> {
    if map.len() != 1 {
        return None;
    }
    base64_len(map.get(BYTES_KEY)?.as_str()?)
}

/// How many bytes `text` decodes to, if it is canonical padded base64 (what [`to_string`]
/// writes); checked without decoding.
fn base64_len(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let padding = bytes.iter().rev().take_while(|&&b| b == b'=').count();
    if padding > 2 {
        return None;
    }
    let body = &bytes[..bytes.len() - padding];
    if !body
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
    {
        return None;
    }
    // With padding, the last character's unused low bits must be zero (the decoder refuses
    // anything else, and size and views must agree with it).
    let unused = match padding {
        1 => 0b11,
        2 => 0b1111,
        _ => 0,
    };
    if let Some(&last) = body.last()
        && sextet(last) & unused != 0
    {
        return None;
    }
    Some(bytes.len() / 4 * 3 - padding)
}

fn sextet(c: u8) -> u8 {
    match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    }
}

fn base64_text(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

// ---------------------------------------------------------------------------------------
// Writing: a serializer that wraps another (serde_json's) and changes byte sequences only.
// ---------------------------------------------------------------------------------------

/// `T` serialised through [`Compact`].
struct Compacted<'a, T: ?Sized>(&'a T);

impl<T: Serialize + ?Sized> Serialize for Compacted<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(Compact(serializer))
    }
}

/// Passes everything to `S`, except byte sequences, which it writes as `{"$bytes": …}`.
struct Compact<S>(S);

fn write_bytes<S: Serializer>(serializer: S, bytes: &[u8]) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(1))?;
    map.serialize_entry(BYTES_KEY, &base64_text(bytes))?;
    map.end()
}

impl<S: Serializer> Serializer for Compact<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Seq<S>;
    type SerializeTuple = Compound<S::SerializeTuple>;
    type SerializeTupleStruct = Compound<S::SerializeTupleStruct>;
    type SerializeTupleVariant = Compound<S::SerializeTupleVariant>;
    type SerializeMap = Compound<S::SerializeMap>;
    type SerializeStruct = Compound<S::SerializeStruct>;
    type SerializeStructVariant = Compound<S::SerializeStructVariant>;

    fn serialize_bool(self, v: bool) -> Result<S::Ok, S::Error> {
        self.0.serialize_bool(v)
    }
    fn serialize_i8(self, v: i8) -> Result<S::Ok, S::Error> {
        self.0.serialize_i8(v)
    }
    fn serialize_i16(self, v: i16) -> Result<S::Ok, S::Error> {
        self.0.serialize_i16(v)
    }
    fn serialize_i32(self, v: i32) -> Result<S::Ok, S::Error> {
        self.0.serialize_i32(v)
    }
    fn serialize_i64(self, v: i64) -> Result<S::Ok, S::Error> {
        self.0.serialize_i64(v)
    }
    fn serialize_i128(self, v: i128) -> Result<S::Ok, S::Error> {
        self.0.serialize_i128(v)
    }
    fn serialize_u8(self, v: u8) -> Result<S::Ok, S::Error> {
        self.0.serialize_u8(v)
    }
    fn serialize_u16(self, v: u16) -> Result<S::Ok, S::Error> {
        self.0.serialize_u16(v)
    }
    fn serialize_u32(self, v: u32) -> Result<S::Ok, S::Error> {
        self.0.serialize_u32(v)
    }
    fn serialize_u64(self, v: u64) -> Result<S::Ok, S::Error> {
        self.0.serialize_u64(v)
    }
    fn serialize_u128(self, v: u128) -> Result<S::Ok, S::Error> {
        self.0.serialize_u128(v)
    }
    fn serialize_f32(self, v: f32) -> Result<S::Ok, S::Error> {
        self.0.serialize_f32(v)
    }
    fn serialize_f64(self, v: f64) -> Result<S::Ok, S::Error> {
        self.0.serialize_f64(v)
    }
    fn serialize_char(self, v: char) -> Result<S::Ok, S::Error> {
        self.0.serialize_char(v)
    }
    fn serialize_str(self, v: &str) -> Result<S::Ok, S::Error> {
        self.0.serialize_str(v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<S::Ok, S::Error> {
        write_bytes(self.0, v)
    }
    fn serialize_none(self) -> Result<S::Ok, S::Error> {
        self.0.serialize_none()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        self.0.serialize_some(&Compacted(value))
    }
    fn serialize_unit(self) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit()
    }
    fn serialize_unit_struct(self, name: &'static str) -> Result<S::Ok, S::Error> {
        self.0.serialize_unit_struct(name)
    }
    fn serialize_unit_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
    ) -> Result<S::Ok, S::Error> {
        self.0
            .serialize_unit_variant(name, index, escape_static(variant))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0.serialize_newtype_struct(name, &Compacted(value))
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0
            .serialize_newtype_variant(name, index, escape_static(variant), &Compacted(value))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Seq<S>, S::Error> {
        Ok(Seq::Undecided {
            serializer: self.0,
            len,
            bytes: Vec::new(),
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        self.0.serialize_tuple(len).map(Compound)
    }
    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        self.0.serialize_tuple_struct(name, len).map(Compound)
    }
    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        self.0
            .serialize_tuple_variant(name, index, escape_static(variant), len)
            .map(Compound)
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        self.0.serialize_map(len).map(Compound)
    }
    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        self.0.serialize_struct(name, len).map(Compound)
    }
    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        self.0
            .serialize_struct_variant(name, index, escape_static(variant), len)
            .map(Compound)
    }
    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// A sequence being written: its items are held back while every one is a `u8`; the first
/// that is not starts the sequence as serde_json writes it.
enum Seq<S: Serializer> {
    Undecided {
        serializer: S,
        len: Option<usize>,
        bytes: Vec<u8>,
    },
    Items(S::SerializeSeq),
    /// Only while switching from one to the other.
    Moving,
}

impl<S: Serializer> ser::SerializeSeq for Seq<S> {
    type Ok = S::Ok;
    type Error = S::Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), S::Error> {
        if let Seq::Undecided { bytes, .. } = self
            && let Ok(byte) = value.serialize(ByteProbe)
        {
            bytes.push(byte);
            return Ok(());
        }
        if matches!(self, Seq::Undecided { .. })
            && let Seq::Undecided {
                serializer,
                len,
                bytes,
            } = std::mem::replace(self, Seq::Moving)
        {
            let mut items = serializer.serialize_seq(len)?;
            for b in bytes {
                items.serialize_element(&b)?;
            }
            *self = Seq::Items(items);
        }
        match self {
            Seq::Items(items) => items.serialize_element(&Compacted(value)),
            _ => Err(ser::Error::custom("a sequence failed half-way")),
        }
    }

    fn end(self) -> Result<S::Ok, S::Error> {
        match self {
            // An empty sequence may be of anything: it stays `[]`.
            Seq::Undecided {
                serializer,
                len,
                bytes,
            } if bytes.is_empty() => serializer.serialize_seq(len)?.end(),
            Seq::Undecided {
                serializer, bytes, ..
            } => write_bytes(serializer, &bytes),
            Seq::Items(items) => items.end(),
            Seq::Moving => Err(ser::Error::custom("a sequence failed half-way")),
        }
    }
}

/// A tuple, map, struct or variant of `S`, whose fields are written through [`Compact`].
struct Compound<C>(C);

/// A compound whose items go through one method taking the value.
macro_rules! items {
    ($($trait:ident::$method:ident),*) => {$(
        impl<C: ser::$trait> ser::$trait for Compound<C> {
            type Ok = C::Ok;
            type Error = C::Error;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
                self.0.$method(&Compacted(value))
            }
            fn end(self) -> Result<C::Ok, C::Error> {
                self.0.end()
            }
        }
    )*};
}

items!(
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// A compound whose fields are named.
macro_rules! fields {
    ($($trait:ident),*) => {$(
        impl<C: ser::$trait> ser::$trait for Compound<C> {
            type Ok = C::Ok;
            type Error = C::Error;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), C::Error> {
                self.0.serialize_field(escape_static(key), &Compacted(value))
            }
            fn skip_field(&mut self, key: &'static str) -> Result<(), C::Error> {
                self.0.skip_field(escape_static(key))
            }
            fn end(self) -> Result<C::Ok, C::Error> {
                self.0.end()
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

impl<C: ser::SerializeMap> ser::SerializeMap for Compound<C> {
    type Ok = C::Ok;
    type Error = C::Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), C::Error> {
        self.0.serialize_key(&EscapedKey(key))
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        self.0.serialize_value(&Compacted(value))
    }
    fn end(self) -> Result<C::Ok, C::Error> {
        self.0.end()
    }
}

/// A serializer that looks at a value before any of it is written: it answers for the one
/// kind of value it looks for, and refuses every other (no side effect either way).
#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not what the probe looks for")
    }
}

impl std::error::Error for Refused {}

impl ser::Error for Refused {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Refused
    }
}

/// A probe's `Serializer` impl: `$accept` are the methods it answers, every other refuses.
macro_rules! probe {
    ($probe:ty, $ok:ty, { $($accept:tt)* }, [$($refused:ident: $ty:ty)*]) => {
        impl Serializer for $probe {
            type Ok = $ok;
            type Error = Refused;
            type SerializeSeq = ser::Impossible<$ok, Refused>;
            type SerializeTuple = ser::Impossible<$ok, Refused>;
            type SerializeTupleStruct = ser::Impossible<$ok, Refused>;
            type SerializeTupleVariant = ser::Impossible<$ok, Refused>;
            type SerializeMap = ser::Impossible<$ok, Refused>;
            type SerializeStruct = ser::Impossible<$ok, Refused>;
            type SerializeStructVariant = ser::Impossible<$ok, Refused>;

            $($accept)*

            $(
                fn $refused(self, _: $ty) -> Result<$ok, Refused> {
                    Err(Refused)
                }
            )*
            fn serialize_none(self) -> Result<$ok, Refused> {
                Err(Refused)
            }
            fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<$ok, Refused> {
                Err(Refused)
            }
            fn serialize_unit(self) -> Result<$ok, Refused> {
                Err(Refused)
            }
            fn serialize_unit_struct(self, _: &'static str) -> Result<$ok, Refused> {
                Err(Refused)
            }
            fn serialize_unit_variant(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
            ) -> Result<$ok, Refused> {
                Err(Refused)
            }
            fn serialize_newtype_struct<T: Serialize + ?Sized>(
                self,
                _: &'static str,
                _: &T,
            ) -> Result<$ok, Refused> {
                Err(Refused)
            }
            fn serialize_newtype_variant<T: Serialize + ?Sized>(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: &T,
            ) -> Result<$ok, Refused> {
                Err(Refused)
            }
            fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Refused> {
                Err(Refused)
            }
            fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Refused> {
                Err(Refused)
            }
            fn serialize_tuple_struct(
                self,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeTupleStruct, Refused> {
                Err(Refused)
            }
            fn serialize_tuple_variant(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeTupleVariant, Refused> {
                Err(Refused)
            }
            fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Refused> {
                Err(Refused)
            }
            fn serialize_struct(
                self,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeStruct, Refused> {
                Err(Refused)
            }
            fn serialize_struct_variant(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeStructVariant, Refused> {
                Err(Refused)
            }
        }
    };
}

/// Whether a sequence's item is a `u8`: `Ok(byte)` for `serialize_u8`, refused for anything
/// else, before any of it is written.
struct ByteProbe;

probe!(ByteProbe, u8, {
    fn serialize_u8(self, v: u8) -> Result<u8, Refused> {
        Ok(v)
    }
}, [
    serialize_bool: bool serialize_i8: i8 serialize_i16: i16 serialize_i32: i32
    serialize_i64: i64 serialize_u16: u16 serialize_u32: u32 serialize_u64: u64
    serialize_f32: f32 serialize_f64: f64 serialize_char: char serialize_str: &str
    serialize_bytes: &[u8]
]);

/// A map key as text, when it is text that must be escaped ([`escape`]): `Ok(Some(key))`;
/// `Ok(None)` for text that needs nothing; refused for a key that is not text (a number).
struct KeyProbe;

probe!(KeyProbe, Option<String>, {
    fn serialize_str(self, v: &str) -> Result<Option<String>, Refused> {
        Ok(v.starts_with(ESCAPE).then(|| format!("{ESCAPE}{v}")))
    }
    fn serialize_char(self, v: char) -> Result<Option<String>, Refused> {
        Ok((v == ESCAPE).then(|| format!("{ESCAPE}{v}")))
    }
}, [
    serialize_bool: bool serialize_i8: i8 serialize_i16: i16 serialize_i32: i32
    serialize_i64: i64 serialize_u8: u8 serialize_u16: u16 serialize_u32: u32
    serialize_u64: u64 serialize_f32: f32 serialize_f64: f64 serialize_bytes: &[u8]
]);

/// A user's map key, written escaped (see [`escape`]).
struct EscapedKey<'a, T: ?Sized>(&'a T);

impl<T: Serialize + ?Sized> Serialize for EscapedKey<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.serialize(KeyProbe) {
            Ok(Some(escaped)) => serializer.serialize_str(&escaped),
            _ => self.0.serialize(serializer),
        }
    }
}

/// A field or variant name, escaped (see [`escape`]): names are few and fixed in the code,
/// so each escaped one is made once and kept.
fn escape_static(name: &'static str) -> &'static str {
    if !name.starts_with(ESCAPE) {
        return name;
    }
    static ESCAPED: std::sync::Mutex<Vec<(&str, &str)>> = std::sync::Mutex::new(Vec::new());
    let mut escaped = ESCAPED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, e)) = escaped.iter().find(|(n, _)| *n == name) {
        return e;
    }
    let e: &'static str = Box::leak(format!("{ESCAPE}{name}").into_boxed_str());
    escaped.push((name, e));
    e
}

// ---------------------------------------------------------------------------------------
// Reading: a deserializer that wraps another (serde_json's) and reads byte sequences.
// ---------------------------------------------------------------------------------------

/// What the target asked for, which decides what a byte sequence is read as.
#[derive(Clone, Copy, PartialEq)]
enum Want {
    /// A sequence: the bytes, one `u8` at a time.
    Seq,
    /// Bytes: the bytes at once.
    Bytes,
    /// Anything: the array of numbers serde_json would have written.
    Any,
    /// Something else: a byte sequence is the object it is written as.
    Other,
}

/// Passes everything to `D`, reading `{"$bytes": …}` as bytes where a sequence or bytes are
/// wanted.
struct Expanded<D>(D);

impl<'de, D: Deserializer<'de>> Expanded<D> {
    fn any<V: de::Visitor<'de>>(self, visitor: V, want: Want) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(Reader { visitor, want })
    }
}

macro_rules! other {
    ($($method:ident)*) => {$(
        fn $method<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.$method(Reader { visitor, want: Want::Other })
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Expanded<D> {
    type Error = D::Error;

    other! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_option deserialize_unit deserialize_map
        deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_any<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.any(visitor, Want::Any)
    }
    fn deserialize_seq<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.any(visitor, Want::Seq)
    }
    fn deserialize_tuple<V: de::Visitor<'de>>(
        self,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.any(visitor, Want::Seq)
    }
    fn deserialize_tuple_struct<V: de::Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.any(visitor, Want::Seq)
    }
    fn deserialize_bytes<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.any(visitor, Want::Bytes)
    }
    fn deserialize_byte_buf<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.any(visitor, Want::Bytes)
    }
    fn deserialize_unit_struct<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_unit_struct(
            name,
            Reader {
                visitor,
                want: Want::Other,
            },
        )
    }
    fn deserialize_newtype_struct<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_newtype_struct(
            name,
            Reader {
                visitor,
                want: Want::Other,
            },
        )
    }
    fn deserialize_struct<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_struct(
            name,
            fields,
            Reader {
                visitor,
                want: Want::Other,
            },
        )
    }
    fn deserialize_enum<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_enum(
            name,
            variants,
            Reader {
                visitor,
                want: Want::Other,
            },
        )
    }
    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// A seed that deserializes through [`Expanded`].
struct Seed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Expanded(deserializer))
    }
}

/// The target's visitor, seeing what `D` found through [`Expanded`].
struct Reader<V> {
    visitor: V,
    want: Want,
}

macro_rules! forward {
    ($($method:ident: $ty:ty)*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.visitor.$method(v)
        }
    )*};
}

impl<'de, V: de::Visitor<'de>> de::Visitor<'de> for Reader<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.visitor.expecting(f)
    }

    forward! {
        visit_bool: bool visit_i8: i8 visit_i16: i16 visit_i32: i32 visit_i64: i64
        visit_i128: i128 visit_u8: u8 visit_u16: u16 visit_u32: u32 visit_u64: u64
        visit_u128: u128 visit_f32: f32 visit_f64: f64 visit_char: char visit_str: &str
        visit_borrowed_str: &'de str visit_string: String visit_bytes: &[u8]
        visit_borrowed_bytes: &'de [u8] visit_byte_buf: Vec<u8>
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(Expanded(d))
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_newtype_struct(Expanded(d))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_seq(Items(seq))
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_enum(Variant(data))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<V::Value, A::Error> {
        if self.want == Want::Other {
            return self.visitor.visit_map(Entries::new(map, None));
        }
        // Where a sequence or anything will do, an object may be a byte sequence: look at
        // its first key and, if it is `$bytes`, at its value and whether it is the only one.
        let Some(mut first) = map.next_key::<String>()? else {
            return self.visitor.visit_map(Entries::new(map, None));
        };
        if first != BYTES_KEY {
            unescape_owned(&mut first);
            return self
                .visitor
                .visit_map(Entries::new(map, Some((first, None))));
        }
        // Read in one pass, byte sequences in it read as anything reads them, and handed
        // over as read when it is not bytes (so a chain of `$bytes` keys is not read again
        // at every level).
        let value = map.next_value_seed(Build)?;
        let second = map.next_key::<String>()?;
        let bytes = match (&value, &second) {
            (Value::String(text), None) => BASE64.decode(text).ok(),
            _ => None,
        };
        let Some(bytes) = bytes else {
            let mut entries = Entries::new(map, Some((first, Some(value))));
            entries.next = second.map(|mut key| {
                unescape_owned(&mut key);
                key
            });
            return self.visitor.visit_map(entries);
        };
        let total = bytes.len();
        match self.want {
            Want::Bytes => self.visitor.visit_byte_buf(bytes),
            _ => {
                let mut items = ByteItems(bytes.into_iter(), std::marker::PhantomData);
                let value = self.visitor.visit_seq(&mut items)?;
                // A fixed-size target reads only what it needs: the rest is an error, as
                // serde_json's own "trailing elements" is.
                if items.0.len() > 0 {
                    return Err(de::Error::invalid_length(
                        total,
                        &"fewer elements in the byte sequence",
                    ));
                }
                Ok(value)
            }
        }
    }
}

/// Reads any value as a `serde_json::Value`, as [`Expanded`] reads one for a target that
/// takes anything (byte sequences as arrays of numbers), in one pass however it nests.
struct Build;

impl<'de> DeserializeSeed<'de> for Build {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(Build)
    }
}

impl<'de> de::Visitor<'de> for Build {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        serde_json::to_value(v).map_err(E::custom)
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        serde_json::to_value(v).map_err(E::custom)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Build.deserialize(d)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element_seed(Build)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        let mut escaped = false;
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(Build)?;
            escaped |= key.starts_with("$$");
            object.insert(key, value);
        }
        if escaped {
            // A user's keys, as they wrote them (never a byte sequence then).
            return Ok(Value::Object(
                object
                    .into_iter()
                    .map(|(mut key, value)| {
                        unescape_owned(&mut key);
                        (key, value)
                    })
                    .collect(),
            ));
        }
        Ok(match bytes_of(&object) {
            Some(bytes) => Value::Array(bytes.into_iter().map(Value::from).collect()),
            None => Value::Object(object),
        })
    }
}

/// The bytes `map` holds when it is a byte sequence.
fn bytes_of(map: &serde_json::Map<String, Value>) -> Option<Vec<u8>> {
    if map.len() != 1 {
        return None;
    }
    BASE64.decode(map.get(BYTES_KEY)?.as_str()?).ok()
}

/// A byte sequence's bytes as the items of a sequence: numbers, as serde_json reads them.
struct ByteItems<E>(std::vec::IntoIter<u8>, std::marker::PhantomData<E>);

impl<'de, E: de::Error> de::SeqAccess<'de> for ByteItems<E> {
    type Error = E;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, E> {
        self.0
            .next()
            .map(|b| seed.deserialize(Value::from(b)).map_err(E::custom))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// A sequence's items, each read through [`Expanded`].
struct Items<A>(A);

impl<'de, A: de::SeqAccess<'de>> de::SeqAccess<'de> for Items<A> {
    type Error = A::Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(Seed(seed))
    }
    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

/// A map's entries, values read through [`Expanded`], after the ones already looked at: a
/// first key (with its value, when it was read), then a next key.
struct Entries<A> {
    map: A,
    first: Option<(String, Option<Value>)>,
    /// The value of the key just handed out, when it was read ahead.
    value: Option<Value>,
    next: Option<String>,
}

impl<A> Entries<A> {
    fn new(map: A, first: Option<(String, Option<Value>)>) -> Self {
        Entries {
            map,
            first,
            value: None,
            next: None,
        }
    }
}

impl<'de, A: de::MapAccess<'de>> de::MapAccess<'de> for Entries<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        if let Some((key, value)) = self.first.take() {
            self.value = value;
            return seed.deserialize(key.into_deserializer()).map(Some);
        }
        if let Some(key) = self.next.take() {
            return seed.deserialize(key.into_deserializer()).map(Some);
        }
        self.map.next_key_seed(KeySeed(seed))
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        match self.value.take() {
            // The value of a `$bytes` key that is not bytes: user data, handed over as it
            // was read.
            Some(value) => seed.deserialize(value).map_err(de::Error::custom),
            None => self.map.next_value_seed(Seed(seed)),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        let pending = usize::from(self.first.is_some()) + usize::from(self.next.is_some());
        self.map.size_hint().map(|n| n + pending)
    }
}

/// [`unescape`] in place.
fn unescape_owned(key: &mut String) {
    if key.starts_with("$$") {
        key.remove(0);
    }
}

/// A seed for a map key or a variant name, read through [`KeyDe`].
struct KeySeed<K>(K);

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<K> {
    type Value = K::Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<K::Value, D::Error> {
        self.0.deserialize(KeyDe(deserializer))
    }
}

/// A key's deserializer: `D`'s, with the key's text unescaped ([`unescape`]). Keys that are
/// read as numbers (`HashMap<u32, _>`) go through `D` as they did.
struct KeyDe<D>(D);

macro_rules! key_forward {
    ($($method:ident)*) => {$(
        fn $method<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.$method(KeyReader(visitor))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for KeyDe<D> {
    type Error = D::Error;

    key_forward! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
        deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
        deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
        deserialize_option deserialize_unit deserialize_seq deserialize_map
        deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_unit_struct<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_unit_struct(name, KeyReader(visitor))
    }
    fn deserialize_newtype_struct<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_newtype_struct(name, KeyReader(visitor))
    }
    fn deserialize_tuple<V: de::Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_tuple(len, KeyReader(visitor))
    }
    fn deserialize_tuple_struct<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0
            .deserialize_tuple_struct(name, len, KeyReader(visitor))
    }
    fn deserialize_struct<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_struct(name, fields, KeyReader(visitor))
    }
    fn deserialize_enum<V: de::Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.0.deserialize_enum(name, variants, KeyReader(visitor))
    }
    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// A key's visitor: text is handed on unescaped, everything else as it is.
struct KeyReader<V>(V);

macro_rules! key_visit {
    ($($method:ident: $ty:ty)*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.0.$method(v)
        }
    )*};
}

impl<'de, V: de::Visitor<'de>> de::Visitor<'de> for KeyReader<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.expecting(f)
    }

    key_visit! {
        visit_bool: bool visit_i8: i8 visit_i16: i16 visit_i32: i32 visit_i64: i64
        visit_i128: i128 visit_u8: u8 visit_u16: u16 visit_u32: u32 visit_u64: u64
        visit_u128: u128 visit_f32: f32 visit_f64: f64 visit_char: char
        visit_bytes: &[u8] visit_borrowed_bytes: &'de [u8] visit_byte_buf: Vec<u8>
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.0.visit_str(unescape(v))
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.0.visit_borrowed_str(unescape(v))
    }
    fn visit_string<E: de::Error>(self, mut v: String) -> Result<V::Value, E> {
        unescape_owned(&mut v);
        self.0.visit_string(v)
    }
    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        self.0.visit_newtype_struct(d)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(seq)
    }
    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(map)
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.0.visit_enum(data)
    }
}

/// An enum's variant, its content read through [`Expanded`].
struct Variant<A>(A);

impl<'de, A: de::EnumAccess<'de>> de::EnumAccess<'de> for Variant<A> {
    type Error = A::Error;
    type Variant = Variant<A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), A::Error> {
        self.0
            .variant_seed(KeySeed(seed))
            .map(|(v, rest)| (v, Variant(rest)))
    }
}

impl<'de, A: de::VariantAccess<'de>> de::VariantAccess<'de> for Variant<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(Seed(seed))
    }
    fn tuple_variant<V: de::Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(
            len,
            Reader {
                visitor,
                want: Want::Other,
            },
        )
    }
    fn struct_variant<V: de::Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.0.struct_variant(
            fields,
            Reader {
                visitor,
                want: Want::Other,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    /// Arrays and objects `depth` deep, with a string of brackets (which count for nothing)
    /// at the bottom.
    fn nested(depth: usize) -> Value {
        let mut value = serde_json::json!(["[[{{\\\"", 1]);
        for level in 1..depth {
            value = if level % 2 == 0 {
                serde_json::json!([value])
            } else {
                serde_json::json!({ "k": value })
            };
        }
        value
    }

    #[test]
    fn a_value_nested_past_the_limit_is_refused_and_one_at_it_reads_back() {
        for (depth, ok) in [(MAX_DEPTH, true), (MAX_DEPTH + 1, false)] {
            let value = nested(depth);
            assert_eq!(value_depth(&value), depth);
            let text = to_string(&value);
            assert_eq!(text.is_ok(), ok, "{depth}: {text:?}");
            assert_eq!(to_value(&value).is_ok(), ok, "{depth}");
            let text = serde_json::to_string(&value).unwrap();
            assert_eq!(text_depth(&text), depth);
            if ok {
                let back: Value = from_str(&to_string(&value).unwrap()).unwrap();
                assert_eq!(back, value);
                // Wrapped in the few levels Cairn adds, it still reads.
                let wrapped = serde_json::json!({ "a": { "b": { "c": value } } }).to_string();
                assert!(serde_json::from_str::<Value>(&wrapped).is_ok());
            } else {
                let error = to_string(&value).unwrap_err().to_string();
                assert!(error.contains("deeper than 100 levels"), "{error}");
            }
        }
    }

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
            json.len() < 270_000,
            "200,000 bytes take {} bytes",
            json.len()
        );
        let plain = serde_json::to_string(&image).expect("encodes");
        assert!(plain.len() > 700_000, "serde_json: {}", plain.len());
        assert_eq!(from_str::<Image>(&json).expect("decodes"), image);
        assert_eq!(
            from_value::<Image>(&to_value(&image).expect("value")).expect("decodes"),
            image
        );
        // JSON written before binary values still reads.
        assert_eq!(from_str::<Image>(&plain).expect("decodes"), image);
        // An untyped reader sees what serde_json would have written.
        let untyped: Value = from_str(&json).expect("decodes");
        assert_eq!(untyped, serde_json::to_value(&image).expect("value"));
    }

    #[test]
    fn only_sequences_of_u8_and_serde_bytes_are_compacted() {
        #[derive(Serialize)]
        struct Fields<'a> {
            #[serde(serialize_with = "as_bytes")]
            raw: &'a [u8],
            deque: VecDeque<u8>,
            array: [u8; 3],
            tuple: (u8, u8),
            wide: Vec<u16>,
            options: Vec<Option<u8>>,
            empty: Vec<u8>,
            mixed: (u8, &'a str),
        }
        fn as_bytes<S: serde::Serializer>(v: &&[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
        let json = to_string(&Fields {
            raw: b"hi",
            deque: VecDeque::from(vec![1, 2]),
            array: [1, 2, 3],
            tuple: (5, 6),
            wide: vec![1, 2],
            options: vec![Some(1)],
            empty: vec![],
            mixed: (1, "a"),
        })
        .expect("encodes");
        assert_eq!(
            json,
            r#"{"raw":{"$bytes":"aGk="},"deque":{"$bytes":"AQI="},"array":[1,2,3],"tuple":[5,6],"wide":[1,2],"options":[1],"empty":[],"mixed":[1,"a"]}"#
        );
        assert_eq!(
            whole_bytes(&to_string(&vec![104u8, 105]).expect("encodes")),
            Some(b"hi".to_vec())
        );
        assert_eq!(whole_bytes("[1,2]"), None);
        let nested: Vec<Vec<u8>> = vec![vec![1], vec![]];
        let json = to_string(&nested).expect("encodes");
        assert_eq!(json, r#"[{"$bytes":"AQ=="},[]]"#);
        assert_eq!(from_str::<Vec<Vec<u8>>>(&json).expect("decodes"), nested);
    }

    #[test]
    fn everything_else_is_written_exactly_as_serde_json_writes_it() {
        #[derive(Serialize)]
        struct Odd {
            z_first: u8,
            a_second: f32,
            big: u128,
            small: i128,
            order: Vec<(String, u32)>,
            unit: (),
            nan: f64,
        }
        let odd = Odd {
            z_first: 7,
            a_second: 1.1,
            big: u128::MAX,
            small: i128::MIN,
            order: vec![("b".into(), 1), ("a".into(), 2)],
            unit: (),
            nan: f64::NAN,
        };
        assert_eq!(
            to_string(&odd).expect("encodes"),
            serde_json::to_string(&odd).expect("encodes")
        );
    }

    #[test]
    fn size_counts_the_bytes_not_their_base64() {
        let image = image();
        let json = to_string(&image).expect("encodes");
        let size = size(&json);
        // 201,000 bytes, 2 × 13 for the objects around them, and the rest of the JSON.
        assert!((201_026..201_200).contains(&size), "{size}");
        for n in 0..7 {
            let json = to_string(&vec![7u8; n]).expect("encodes");
            let expected = if n == 0 { 2 } else { n + 13 };
            assert_eq!(super::size(&json), expected, "{json}");
        }
    }

    #[test]
    fn size_counts_in_full_what_is_not_canonical_base64() {
        for json in [
            r#"{"$bytes":"===="}"#,
            r#"{"$bytes":"========================="}"#,
            r#"{"$bytes":"AQI"}"#,
            r#"{"$bytes":"AQ=I"}"#,
            r#"{"$bytes":"A Q="}"#,
            r#"{"$bytes":"AQID","a":1}"#,
            r#"{"$bytes":""#,
        ] {
            assert_eq!(size(json), json.len(), "{json}");
        }
        assert_eq!(size(r#"{"$bytes":""}"#), 13);
        // 37 characters, of which "AQID" stands for 3 bytes.
        assert_eq!(size(r#"[{"$bytes":"AQID"},{"$bytes":"===="}]"#), 36);
    }

    #[test]
    fn an_object_that_is_only_bytes_is_bytes_where_a_sequence_or_anything_is_wanted() {
        let json = r#"{"$bytes":"AQID"}"#;
        assert_eq!(from_str::<Vec<u8>>(json).expect("decodes"), vec![1, 2, 3]);
        assert_eq!(from_str::<[u8; 3]>(json).expect("decodes"), [1, 2, 3]);
        assert_eq!(from_str::<Vec<u16>>(json).expect("decodes"), vec![1, 2, 3]);
        assert_eq!(
            from_str::<Value>(json).expect("decodes"),
            serde_json::json!([1, 2, 3])
        );
        // A map wanted is a map.
        let map: BTreeMap<String, String> = from_str(json).expect("decodes");
        assert_eq!(map["$bytes"], "AQID");
        // Not bytes: invalid base64, another key, not a string.
        for json in [
            r#"{"$bytes":"A"}"#,
            r#"{"$bytes":"AQID","b":1}"#,
            r#"{"a":1,"$bytes":"AQID"}"#,
            r#"{"$bytes":[1]}"#,
        ] {
            let plain: Value = serde_json::from_str(json).expect("json");
            assert_eq!(from_str::<Value>(json).expect("decodes"), plain, "{json}");
            assert!(from_str::<Vec<u8>>(json).is_err(), "{json}");
        }
    }

    #[test]
    fn a_fixed_size_target_takes_exactly_its_bytes() {
        assert_eq!(
            from_str::<[u8; 3]>(r#"{"$bytes":"AQID"}"#).expect("decodes"),
            [1, 2, 3]
        );
        assert!(from_str::<[u8; 3]>(r#"{"$bytes":"AQIDBA=="}"#).is_err());
        assert!(from_str::<(u8, u8)>(r#"{"$bytes":"AQID"}"#).is_err());
        assert!(from_str::<[u8; 4]>(r#"{"$bytes":"AQID"}"#).is_err());
        assert!(from_value::<[u8; 2]>(&serde_json::json!({"$bytes": "AQID"})).is_err());
    }

    #[test]
    fn size_views_and_decoding_agree_on_what_is_base64() {
        // "AB==" has bits set past its one byte: not canonical, so not bytes anywhere.
        for (text, bytes) in [
            ("AB==", None),
            ("AA==", Some(1)),
            ("AAE=", Some(2)),
            ("AAF=", None),
        ] {
            let json = format!(r#"{{"$bytes":"{text}"}}"#);
            assert_eq!(base64_len(text), bytes, "{text}");
            assert_eq!(whole_bytes(&json).map(|b| b.len()), bytes, "{text}");
            assert_eq!(
                from_str::<Vec<u8>>(&json).ok().map(|b| b.len()),
                bytes,
                "{text}"
            );
            assert_eq!(view(&json).is_string(), bytes.is_some(), "{text}");
            let counted = match bytes {
                Some(n) => json.len() - 4 + n,
                None => json.len(),
            };
            assert_eq!(size(&json), counted, "{text}");
        }
    }

    #[test]
    fn a_chain_of_bytes_keys_is_read_in_one_pass() {
        // `{"$bytes":{"$bytes":…[0, 0, …]…}}`, 100 deep around 200,000 numbers: each level
        // is user data, read once; quadratic work would take minutes.
        let depth = 100;
        let json = format!(
            "{}[{}0]{}",
            r#"{"$bytes":"#.repeat(depth),
            "0,".repeat(200_000),
            "}".repeat(depth)
        );
        let started = std::time::Instant::now();
        let value: Value = from_str(&json).expect("decodes");
        let plain: Value = serde_json::from_str(&json).expect("json");
        assert_eq!(value, plain);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn u128_and_raw_values_round_trip() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Big {
            id: u128,
            data: Vec<u8>,
        }
        let big = Big {
            id: u128::MAX - 1,
            data: vec![1, 2],
        };
        assert_eq!(
            from_str::<Big>(&to_string(&big).expect("encodes")).expect("decodes"),
            big
        );
    }

    #[test]
    fn enums_options_flatten_and_untagged_read_bytes() {
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
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        #[serde(untagged)]
        enum Untagged {
            Bytes { data: Vec<u8> },
        }
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Inner {
            data: Vec<u8>,
        }
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Flat {
            #[serde(flatten)]
            inner: Inner,
            maybe: Option<Vec<u8>>,
            keyed: BTreeMap<u32, Vec<u8>>,
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
        assert!(json.contains(r#"{"New":{"$bytes":"AQI="}}"#), "{json}");
        assert_eq!(from_str::<Vec<E>>(&json).expect("decodes"), values);
        let tagged = Tagged::A {
            data: vec![1, 2, 3],
        };
        let json = to_string(&tagged).expect("encodes");
        assert_eq!(from_str::<Tagged>(&json).expect("decodes"), tagged);
        let untagged = Untagged::Bytes { data: vec![9; 10] };
        let json = to_string(&untagged).expect("encodes");
        assert_eq!(from_str::<Untagged>(&json).expect("decodes"), untagged);
        let flat = Flat {
            inner: Inner { data: vec![7; 5] },
            maybe: Some(vec![1]),
            keyed: [(7, vec![1])].into(),
        };
        let json = to_string(&flat).expect("encodes");
        assert_eq!(from_str::<Flat>(&json).expect("decodes"), flat);
    }

    /// Issue 30 §3: a user's JSON with a `$bytes` key (or any key starting with `$`) is
    /// theirs: it comes back exactly as it went in, typed or untyped, never as bytes.
    #[test]
    fn a_users_value_with_a_dollar_bytes_key_comes_back_exactly_as_it_went_in() {
        let value = serde_json::json!({"$bytes": "aGk="});
        let json = to_string(&value).expect("encodes");
        assert_eq!(json, r#"{"$$bytes":"aGk="}"#, "stored with one more $");
        assert_eq!(from_str::<Value>(&json).expect("decodes"), value);
        assert_eq!(
            from_value::<Value>(&to_value(&value).expect("value")).expect("decodes"),
            value
        );
        assert_eq!(size(&json), json.len(), "no bytes to discount");
        let nested = serde_json::json!({
            "$x": 1, "$$y": [{"$bytes": "AQID", "k": 2}], "$": {"$bytes": "AQID"},
            "plain": {"$bytes": [1, 2]}, "s": "$bytes"
        });
        let json = to_string(&nested).expect("encodes");
        assert_eq!(from_str::<Value>(&json).expect("decodes"), nested);
        assert_eq!(view(&json), nested, "views show the keys as written");
        let mut answered: Value = serde_json::from_str(&json).expect("json");
        external(&mut answered);
        assert_eq!(answered, nested, "the HTTP form");
        assert_eq!(external_text(&json), nested.to_string());
        // Typed: a map, a struct whose field is named `$bytes`, an enum variant.
        let map: BTreeMap<String, String> = from_str(&to_string(&value).expect("e")).expect("d");
        assert_eq!(map["$bytes"], "aGk=");
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Odd {
            #[serde(rename = "$bytes")]
            bytes: String,
        }
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        enum Tagged {
            #[serde(rename = "$v")]
            V(u8),
            #[serde(rename = "$u")]
            U,
        }
        let odd = Odd {
            bytes: "aGk=".into(),
        };
        let json = to_string(&odd).expect("encodes");
        assert_eq!(from_str::<Odd>(&json).expect("decodes"), odd);
        assert_eq!(
            from_str::<Value>(&json).expect("decodes"),
            serde_json::json!({"$bytes": "aGk="})
        );
        for tagged in [Tagged::V(7), Tagged::U] {
            let json = to_string(&tagged).expect("encodes");
            assert_eq!(
                from_str::<Tagged>(&json).expect("decodes"),
                tagged,
                "{json}"
            );
        }
        // Keys read as numbers still are.
        let numbered: BTreeMap<u32, u8> = [(1, 2), (3, 4)].into();
        let json = to_string(&numbered).expect("encodes");
        assert_eq!(from_str::<BTreeMap<u32, u8>>(&json).expect("d"), numbered);
    }

    /// Byte sequences stay bytes next to such keys, and old rows (keys stored before they
    /// were escaped) read as they did.
    #[test]
    fn bytes_beside_escaped_keys_and_old_rows() {
        let mixed: BTreeMap<String, Vec<u8>> = [
            ("$bytes".to_owned(), vec![1, 2, 3]),
            ("$x".to_owned(), vec![4]),
        ]
        .into();
        let json = to_string(&mixed).expect("encodes");
        assert_eq!(
            json,
            r#"{"$$bytes":{"$bytes":"AQID"},"$$x":{"$bytes":"BA=="}}"#
        );
        assert_eq!(
            from_str::<BTreeMap<String, Vec<u8>>>(&json).expect("d"),
            mixed
        );
        assert_eq!(
            view(&json),
            serde_json::json!({"$bytes": "[Bytes(3 bytes)]", "$x": "[Bytes(1 bytes)]"})
        );
        let mut external_form: Value = serde_json::from_str(&json).expect("json");
        external(&mut external_form);
        assert_eq!(
            external_form,
            serde_json::json!({"$bytes": {"$bytes": "AQID"}, "$x": {"$bytes": "BA=="}})
        );
        // Written before escaping: `$x` was stored as `$x`.
        let old = r#"{"$x":1,"$bytes":"AQID"}"#;
        assert_eq!(
            from_str::<Value>(old).expect("d"),
            serde_json::json!({"$x": 1, "$bytes": "AQID"})
        );
        assert_eq!(
            from_value::<Vec<u8>>(&serde_json::json!({"$bytes": "AQID"})).expect("d"),
            vec![1, 2, 3],
            "a stored byte sequence held in a Value still reads as bytes"
        );
    }

    #[test]
    fn views_summarise_bytes() {
        let json = to_string(&image()).expect("encodes");
        let shown = view(&json);
        assert_eq!(shown["pixels"], "[Bytes(200000 bytes)]");
        assert_eq!(shown["thumbs"][0]["data"], "[Bytes(1000 bytes)]");
        assert_eq!(shown["thumbs"][1]["data"], serde_json::json!([]));
        assert_eq!(shown["digest"], serde_json::json!([1, 2, 3, 4]));
        assert_eq!(
            view(r#"{"$bytes":"no!"}"#),
            serde_json::json!({"$bytes": "no!"})
        );
        assert_eq!(view("not json"), Value::Null);
    }

    type Mixed = Vec<(
        String,
        Vec<u8>,
        Vec<u16>,
        Option<Vec<u8>>,
        BTreeMap<String, Vec<u8>>,
        Vec<Option<u8>>,
    )>;

    fn mixed() -> impl proptest::strategy::Strategy<Value = Mixed> {
        use proptest::prelude::*;
        proptest::collection::vec(
            (
                any::<String>(),
                any::<Vec<u8>>(),
                any::<Vec<u16>>(),
                any::<Option<Vec<u8>>>(),
                proptest::collection::btree_map("\\$?(bytes|x)", any::<Vec<u8>>(), 0..4),
                any::<Vec<Option<u8>>>(),
            ),
            0..4,
        )
    }

    /// Any JSON value, with keys that start with any number of `$`.
    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-zA-Z0-9+/=$]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::btree_map("\\$*(bytes|x|)", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// Issue 30 §3: every JSON value a user stores comes back exactly as it went in.
        #[test]
        fn every_json_value_comes_back_exactly(v in json_value()) {
            let json = to_string(&v).expect("encodes");
            proptest::prop_assert_eq!(&from_str::<Value>(&json).expect("decodes"), &v);
            let value = to_value(&v).expect("value");
            proptest::prop_assert_eq!(&from_value::<Value>(&value).expect("decodes"), &v);
            let mut shown = serde_json::from_str::<Value>(&json).expect("json");
            external(&mut shown);
            proptest::prop_assert_eq!(&shown, &v, "the HTTP form");
            proptest::prop_assert_eq!(&view(&json), &v, "the views");
        }

        #[test]
        fn anything_round_trips_and_reads_untyped_as_serde_json_wrote_it(v in mixed()) {
            let json = to_string(&v).expect("encodes");
            proptest::prop_assert_eq!(&from_str::<Mixed>(&json).expect("decodes"), &v);
            let value = to_value(&v).expect("value");
            proptest::prop_assert_eq!(&from_value::<Mixed>(&value).expect("decodes"), &v);
            proptest::prop_assert_eq!(
                from_str::<Value>(&json).expect("decodes"),
                serde_json::to_value(&v).expect("value")
            );
            let plain = serde_json::to_string(&v).expect("encodes");
            proptest::prop_assert_eq!(&from_str::<Mixed>(&plain).expect("decodes"), &v);
            proptest::prop_assert!(size(&json) <= json.len());
        }
    }
}
