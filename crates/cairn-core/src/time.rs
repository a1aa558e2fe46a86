//! Wall-clock timestamps as milliseconds since the Unix epoch: how every time is stored.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A point in wall-clock time, in milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// Wraps milliseconds since the epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// Converts from a `SystemTime`, saturating outside the representable range.
    pub fn from_system_time(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Err(e) => Timestamp(-i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX)),
        }
    }

    /// Converts to a `SystemTime`.
    pub fn to_system_time(self) -> SystemTime {
        if self.0 >= 0 {
            UNIX_EPOCH + Duration::from_millis(self.0.unsigned_abs())
        } else {
            UNIX_EPOCH - Duration::from_millis(self.0.unsigned_abs())
        }
    }

    /// This time plus `d`, saturating.
    pub fn saturating_add(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }

    /// This time minus `d`, saturating.
    pub fn saturating_sub(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_sub(ms))
    }

    /// The time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// RFC 3339 in UTC with milliseconds, e.g. `2026-11-30T04:28:19.123Z`.
    pub fn to_rfc3339(self) -> String {
        humantime::format_rfc3339_millis(self.to_system_time()).to_string()
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// Serde for timestamps in the API's views: RFC 3339, UTC, milliseconds
/// (`2024-10-24T13:00:00.123Z`), as Cloudflare's API writes them. Reading accepts that or
/// milliseconds since the epoch. Storage does not go through serde.
pub mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Timestamp;

    /// Writes `t` as RFC 3339.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<S: Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.to_rfc3339())
    }

    /// Reads RFC 3339 or epoch milliseconds.
    ///
    /// # Errors
    /// When the value is neither.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Millis(i64),
            Text(String),
        }
        match Either::deserialize(d)? {
            Either::Millis(ms) => Ok(Timestamp::from_millis(ms)),
            Either::Text(text) => humantime::parse_rfc3339_weak(&text)
                .map(Timestamp::from_system_time)
                .map_err(serde::de::Error::custom),
        }
    }

    /// The same for an optional timestamp.
    pub mod option {
        use serde::{Deserialize, Deserializer, Serializer};

        use super::Timestamp;

        /// Writes `t` as RFC 3339, or `null`.
        ///
        /// # Errors
        /// The serializer's.
        pub fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => s.serialize_str(&t.to_rfc3339()),
                None => s.serialize_none(),
            }
        }

        /// Reads RFC 3339, epoch milliseconds, or `null`.
        ///
        /// # Errors
        /// When the value is none of them.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
            #[derive(Deserialize)]
            struct Wrap(#[serde(with = "super")] Timestamp);
            Ok(Option::<Wrap>::deserialize(d)?.map(|Wrap(t)| t))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_timestamps_are_rfc3339_and_read_back_either_way() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct T {
            #[serde(with = "rfc3339")]
            at: Timestamp,
            #[serde(with = "rfc3339::option")]
            end: Option<Timestamp>,
        }
        let t = T {
            at: Timestamp::from_millis(1_729_774_800_123),
            end: None,
        };
        let text = serde_json::to_string(&t).unwrap_or_default();
        assert_eq!(text, r#"{"at":"2024-10-24T13:00:00.123Z","end":null}"#);
        assert_eq!(serde_json::from_str::<T>(&text).ok(), Some(T { ..t }));
        let old: Option<T> = serde_json::from_str(r#"{"at":1729774800123,"end":5}"#).ok();
        assert_eq!(
            old.map(|o| (o.at, o.end)),
            Some((
                Timestamp::from_millis(1_729_774_800_123),
                Some(Timestamp::from_millis(5))
            ))
        );
    }

    #[test]
    fn formats_rfc3339() {
        assert_eq!(
            Timestamp::from_millis(0).to_rfc3339(),
            "1970-01-01T00:00:00.000Z"
        );
        assert_eq!(
            Timestamp::from_millis(1_729_774_800_123).to_rfc3339(),
            "2024-10-24T13:00:00.123Z"
        );
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_millis(1_000);
        assert_eq!(t.saturating_add(Duration::from_secs(1)).as_millis(), 2_000);
        assert_eq!(
            Timestamp::from_millis(i64::MAX)
                .saturating_add(Duration::MAX)
                .as_millis(),
            i64::MAX
        );
        assert_eq!(t.since(Timestamp::from_millis(5_000)), Duration::ZERO);
        let st = SystemTime::now();
        let ts = Timestamp::from_system_time(st);
        assert!(ts.to_system_time() <= st);
    }
}
