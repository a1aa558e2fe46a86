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

    /// RFC 3339 in UTC with milliseconds, e.g. `2026-11-30T04:28:19.123Z`. A year outside
    /// 0000–9999 is written as JavaScript's `toISOString` writes it, with six digits and a
    /// sign (`+010000-01-01T00:00:00.000Z`): every timestamp formats (humantime's
    /// formatter fails past 9999 and panics before 1970).
    pub fn to_rfc3339(self) -> String {
        let (secs, millis) = (self.0.div_euclid(1000), self.0.rem_euclid(1000));
        let (days, second) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let (year, month, day) = civil_from_days(days);
        let (h, m, s) = (second / 3600, second % 3600 / 60, second % 60);
        let year = match year {
            0..=9999 => format!("{year:04}"),
            ..0 => format!("-{:06}", year.unsigned_abs()),
            _ => format!("+{year:06}"),
        };
        format!("{year}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
    }
}

/// The proleptic Gregorian `(year, month, day)` of a day counted from 1970-01-01 (Howard
/// Hinnant's `civil_from_days`): whole 400-year eras, then the day within its era, in
/// years that start on 1 March so that the leap day comes last.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
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

    /// Every timestamp formats, as JavaScript's `toISOString` writes years outside
    /// 0000–9999 (six digits and a sign); none panics.
    #[test]
    fn any_timestamp_formats_and_years_outside_four_digits_carry_a_sign() {
        let cases = [
            (-1, "1969-12-31T23:59:59.999Z"),
            (-62_167_219_200_000, "0000-01-01T00:00:00.000Z"),
            (-62_167_219_200_001, "-000001-12-31T23:59:59.999Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
            (253_402_300_800_000, "+010000-01-01T00:00:00.000Z"),
            (8_640_000_000_000_000, "+275760-09-13T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
        ];
        for (ms, text) in cases {
            assert_eq!(Timestamp::from_millis(ms).to_rfc3339(), text, "{ms}");
        }
        for ms in [i64::MIN, i64::MAX, i64::MIN + 1, i64::MAX - 1] {
            assert!(Timestamp::from_millis(ms).to_string().ends_with('Z'));
        }
        // Within four-digit years, what humantime writes (a seeded sweep).
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ms = (x % 253_402_300_800_000) as i64;
            let t = Timestamp::from_millis(ms);
            assert_eq!(
                t.to_rfc3339(),
                humantime::format_rfc3339_millis(t.to_system_time()).to_string()
            );
        }
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
