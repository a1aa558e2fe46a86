//! JSON objects that must be objects.
//!
//! Serde's derived `Deserialize` for a struct also accepts a JSON *array*, read
//! positionally, which bypasses field names and `deny_unknown_fields`:
//! `[[3, "5 seconds"], "1 minute"]` would be a full step config. Every object Cairn reads
//! from users (step configs, HTTP bodies) goes through [`Object`] or [`object`], which
//! refuse anything but a JSON object with serde's usual "invalid type" error.

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// A `T` that was written as a JSON object, never as an array.
#[derive(Debug, Clone, PartialEq)]
pub struct Object<T>(pub T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        object(deserializer).map(Object)
    }
}

/// For `#[serde(deserialize_with = "…")]`: reads `T` only from a JSON object.
///
/// # Errors
/// `invalid type: …, expected a map` for anything but an object, then `T`'s own errors.
pub fn object<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    deserializer: D,
) -> Result<T, D::Error> {
    // `Map` deserializes through `deserialize_map`, which takes objects only.
    let map = Map::<String, Value>::deserialize(deserializer)?;
    T::deserialize(Value::Object(map)).map_err(D::Error::custom)
}

/// [`object`] for an optional field: `null` or absent is `None`.
///
/// # Errors
/// As [`object`].
pub fn optional_object<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    Option::<Object<T>>::deserialize(deserializer).map(|o| o.map(|Object(t)| t))
}

/// Parses `text` as a `T` written as a JSON object.
///
/// # Errors
/// Malformed JSON, anything but an object, or `T`'s own errors.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    serde_json::from_str::<Object<T>>(text).map(|Object(t)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: u32,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[serde(default, deserialize_with = "optional_object")]
        inner: Option<Inner>,
    }

    #[test]
    fn arrays_are_refused_at_every_level() {
        assert!(
            serde_json::from_str::<Inner>("[1]").is_ok(),
            "serde's default"
        );
        let err = from_str::<Inner>("[1]").expect_err("array");
        assert!(err.to_string().contains("invalid type: sequence"), "{err}");
        assert!(from_str::<Outer>(r#"{"inner": [1]}"#).is_err());
        assert!(from_str::<Outer>("[[1]]").is_err());
        assert_eq!(
            from_str::<Outer>(r#"{"inner": {"a": 1}}"#).expect("object"),
            Outer {
                inner: Some(Inner { a: 1 })
            }
        );
        assert_eq!(
            from_str::<Outer>(r#"{"inner": null}"#).expect("null"),
            Outer { inner: None }
        );
        assert_eq!(
            from_str::<Outer>("{}").expect("absent"),
            Outer { inner: None }
        );
        assert!(from_str::<Outer>(r#"{"inner": {"a": 1, "b": 2}}"#).is_err());
    }
}
