//! Cloudflare's duration strings, parsed strictly (SPEC Part A.10, §1.5).
//!
//! Grammar: `<number> <unit>` where unit is `millisecond|second|minute|hour|day|week|month|year`,
//! optionally plural (also `ms`); one or more spaces between; month = 30 days and
//! year = 365.25 days; a bare number means milliseconds. Anything else is an error
//! that quotes the input.

use std::time::Duration;

/// A duration string that does not follow the grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: expected \"<number> <unit>\" with unit millisecond, second, minute, hour, day, week, month or year (optionally plural), or a number of milliseconds"
)]
pub struct DurationError {
    /// The rejected input, quoted in the message.
    pub input: String,
}

const MS_PER_DAY: f64 = 86_400_000.0;

fn unit_ms(unit: &str) -> Option<f64> {
    let singular = unit.strip_suffix('s').unwrap_or(unit);
    Some(match singular {
        "m" | "millisecond" => 1.0, // "ms" with its trailing s stripped
        "second" => 1_000.0,
        "minute" => 60_000.0,
        "hour" => 3_600_000.0,
        "day" => MS_PER_DAY,
        "week" => 7.0 * MS_PER_DAY,
        "month" => 30.0 * MS_PER_DAY,
        "year" => 365.25 * MS_PER_DAY,
        _ => return None,
    })
}

/// A plain decimal number: digits with at most one dot; no sign, exponent, `inf` or `NaN`.
fn parse_number(s: &str) -> Option<f64> {
    let digits = s.chars().filter(char::is_ascii_digit).count();
    let dots = s.chars().filter(|&c| c == '.').count();
    if digits == 0 || dots > 1 || digits + dots != s.len() {
        return None;
    }
    s.parse().ok()
}

/// Parses a duration string such as `"10 seconds"`, `"1.5 hours"` or `"250"` (milliseconds).
///
/// Fractions of a millisecond are rounded to the nearest millisecond. Negative values are
/// rejected: no Cairn duration can be negative.
///
/// # Errors
/// [`DurationError`] quoting `input` when it does not follow the grammar or is too large.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        input: input.to_owned(),
    };
    let trimmed = input.trim();
    let ms = if let Some(n) = parse_number(trimmed) {
        n
    } else {
        let (number, unit) = trimmed.split_once(' ').ok_or_else(err)?;
        let value = parse_number(number).ok_or_else(err)?;
        let unit = unit.trim_start_matches(' ');
        value * unit_ms(unit).ok_or_else(err)?
    };
    // u64 milliseconds cover 584 million years; anything beyond is a typo, not a wish.
    if !ms.is_finite() || ms >= u64::MAX as f64 {
        return Err(err());
    }
    Ok(Duration::from_millis(ms.round() as u64))
}

/// Formats a duration the way Cloudflare shows one: `"10 minutes"`, `"1 second"`, `"1500 milliseconds"`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    let units: [(u128, &str); 5] = [
        (86_400_000, "day"),
        (3_600_000, "hour"),
        (60_000, "minute"),
        (1_000, "second"),
        (1, "millisecond"),
    ];
    for (size, name) in units {
        if ms >= size && ms.is_multiple_of(size) {
            let n = ms / size;
            return format!("{n} {name}{}", if n == 1 { "" } else { "s" });
        }
    }
    "0 milliseconds".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_the_documented_grammar() {
        let cases: &[(&str, u64)] = &[
            ("100", 100),
            ("0", 0),
            ("1 second", 1_000),
            ("10 seconds", 10_000),
            ("30.5 seconds", 30_500),
            ("1 minute", 60_000),
            ("26 hours", 93_600_000),
            ("2  days", 172_800_000),
            ("1 week", 604_800_000),
            ("1 month", 2_592_000_000),
            ("1 year", 31_557_600_000),
            ("250 ms", 250),
            ("5 milliseconds", 5),
            (" 3 hours ", 10_800_000),
        ];
        for (input, ms) in cases {
            assert_eq!(
                parse_duration(input),
                Ok(Duration::from_millis(*ms)),
                "{input:?}"
            );
        }
    }

    #[test]
    fn rejects_everything_else_quoting_the_input() {
        for input in [
            "",
            "1hour",
            "1 Hour",
            "1 fortnight",
            "-1 second",
            "one second",
            "1e3",
            "NaN",
            "inf",
            "1 second later",
            "1.2.3 seconds",
            "seconds",
            "1 s",
            "1 sec",
        ] {
            let err = parse_duration(input).expect_err(input);
            assert!(err.to_string().contains(&format!("{input:?}")), "{err}");
        }
    }

    #[test]
    fn formats_like_cloudflare() {
        assert_eq!(format_duration(Duration::from_secs(600)), "10 minutes");
        assert_eq!(format_duration(Duration::from_secs(1)), "1 second");
        assert_eq!(
            format_duration(Duration::from_millis(1500)),
            "1500 milliseconds"
        );
        assert_eq!(format_duration(Duration::ZERO), "0 milliseconds");
    }

    proptest! {
        #[test]
        fn formatted_durations_parse_back(ms in 0u64..10_000_000_000_000) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }

        #[test]
        fn never_panics(s in ".{0,40}") {
            let _ = parse_duration(&s);
        }
    }
}
