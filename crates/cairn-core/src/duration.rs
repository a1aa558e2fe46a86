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

/// The longest duration a string can say: `u64::MAX` milliseconds (584 million years).
/// [`format_duration`] saturates here, so whatever it prints parses back.
pub const MAX_DURATION: Duration = Duration::from_millis(u64::MAX);

const MS_PER_DAY: u64 = 86_400_000;

/// Milliseconds per unit. Every unit is a whole number of milliseconds (a year is
/// 365.25 days = 31,557,600,000 ms), so whole numbers of units convert exactly.
///
/// The units are listed in full, singular and plural, rather than derived by stripping an
/// `s`: stripping turned `"ms"` into `"m"` and so made a bare `"m"` mean milliseconds.
fn unit_ms(unit: &str) -> Option<u64> {
    Some(match unit {
        "ms" | "millisecond" | "milliseconds" => 1,
        "second" | "seconds" => 1_000,
        "minute" | "minutes" => 60_000,
        "hour" | "hours" => 3_600_000,
        "day" | "days" => MS_PER_DAY,
        "week" | "weeks" => 7 * MS_PER_DAY,
        "month" | "months" => 30 * MS_PER_DAY,
        "year" | "years" => 365 * MS_PER_DAY + MS_PER_DAY / 4,
        _ => return None,
    })
}

/// A plain decimal number: digits with at most one dot; no sign, exponent, `inf` or `NaN`.
fn is_plain_number(s: &str) -> bool {
    let digits = s.chars().filter(char::is_ascii_digit).count();
    let dots = s.chars().filter(|&c| c == '.').count();
    digits > 0 && dots <= 1 && digits + dots == s.len()
}

/// `number × unit` in milliseconds, or `None` beyond [`MAX_DURATION`]. Whole numbers are
/// multiplied exactly; fractions go through `f64` and round to the nearest millisecond.
fn to_ms(number: &str, unit: u64) -> Option<u64> {
    if !is_plain_number(number) {
        return None;
    }
    if !number.contains('.') {
        // Leading zeros are fine; more digits than u128 holds is too large either way.
        let n: u128 = number.parse().ok()?;
        return u64::try_from(n.checked_mul(u128::from(unit))?).ok();
    }
    let ms = number.parse::<f64>().ok()? * unit as f64;
    // `u64::MAX as f64` is 2^64, one past the largest u64: `<` keeps the cast exact.
    (ms.is_finite() && ms.round() < u64::MAX as f64).then(|| ms.round() as u64)
}

/// Parses a duration string such as `"10 seconds"`, `"1.5 hours"` or `"250"` (milliseconds).
///
/// Fractions of a millisecond are rounded to the nearest millisecond. Negative values are
/// rejected: no Cairn duration can be negative.
///
/// # Errors
/// [`DurationError`] quoting `input` when it does not follow the grammar or is longer than
/// [`MAX_DURATION`].
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        input: input.to_owned(),
    };
    let trimmed = input.trim();
    let ms = if is_plain_number(trimmed) {
        to_ms(trimmed, 1)
    } else {
        let (number, unit) = trimmed.split_once(' ').ok_or_else(err)?;
        let unit = unit.trim_start_matches(' ');
        to_ms(number, unit_ms(unit).ok_or_else(err)?)
    };
    ms.map(Duration::from_millis).ok_or_else(err)
}

/// Formats a duration the way Cloudflare shows one: `"10 minutes"`, `"1 second"`, `"1500 milliseconds"`.
///
/// Exact for every whole number of milliseconds up to [`MAX_DURATION`], so the result
/// parses back to the same value; sub-millisecond parts are dropped and longer durations
/// saturate at [`MAX_DURATION`].
pub fn format_duration(d: Duration) -> String {
    let ms = d.min(MAX_DURATION).as_millis();
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
    fn a_bare_m_is_not_a_unit() {
        for input in ["5 m", "1.5 m", "1 m", "5 mss", "5 s", "5 msec"] {
            let err = parse_duration(input).expect_err(input);
            assert!(err.to_string().contains(&format!("{input:?}")), "{err}");
        }
        assert_eq!(parse_duration("5 ms"), Ok(Duration::from_millis(5)));
    }

    #[test]
    fn durations_beyond_2_pow_53_ms_format_exactly() {
        for ms in [
            (1u64 << 53) + 1,
            (1 << 60) + 7,
            u64::MAX - 1,
            u64::MAX,
            86_400_000 * ((1 << 35) + 3),
        ] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{ms}");
        }
        // Beyond the largest duration a string can say, formatting saturates at it.
        assert_eq!(
            format_duration(Duration::MAX),
            format_duration(MAX_DURATION)
        );
        assert_eq!(
            parse_duration(&format_duration(Duration::MAX)),
            Ok(MAX_DURATION)
        );
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

        /// Strings from the grammar's own alphabet (digits, dots, spaces, the letters of the
        /// unit words, and near misses such as `m`, `s`, `Minute`) against the model.
        #[test]
        fn grammar_matches_the_documented_contract(input in grammar_like()) {
            prop_assert_eq!(
                parse_duration(&input).ok().map(|d| d.as_millis()),
                model::parse(&input),
                "input {:?}", input
            );
        }
    }

    /// SPEC Part A.10 written down independently of the parser: a table of every accepted
    /// unit spelling, and numbers checked character by character.
    mod model {
        const UNITS: &[(&str, u128)] = &[
            ("ms", 1),
            ("millisecond", 1),
            ("milliseconds", 1),
            ("second", 1_000),
            ("seconds", 1_000),
            ("minute", 60_000),
            ("minutes", 60_000),
            ("hour", 3_600_000),
            ("hours", 3_600_000),
            ("day", 86_400_000),
            ("days", 86_400_000),
            ("week", 604_800_000),
            ("weeks", 604_800_000),
            ("month", 2_592_000_000),
            ("months", 2_592_000_000),
            ("year", 31_557_600_000),
            ("years", 31_557_600_000),
        ];

        fn number(s: &str, unit: u128) -> Option<u128> {
            let (whole, fraction) = s.split_once('.').unwrap_or((s, ""));
            let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
            if !digits(whole) || !digits(fraction) || whole.len() + fraction.len() == 0 {
                return None;
            }
            let ms = if s.contains('.') {
                let v = s.parse::<f64>().ok()? * unit as f64;
                if v.round() >= 18_446_744_073_709_551_616.0 {
                    return None;
                }
                v.round() as u128
            } else {
                whole.parse::<u128>().ok()?.checked_mul(unit)?
            };
            (ms <= u128::from(u64::MAX)).then_some(ms)
        }

        pub(super) fn parse(input: &str) -> Option<u128> {
            let s = input.trim();
            if let Some(ms) = number(s, 1) {
                return Some(ms);
            }
            let space = s.find(' ')?;
            let unit = s[space..].trim_start_matches(' ');
            let (_, per) = UNITS.iter().find(|(name, _)| *name == unit)?;
            number(&s[..space], *per)
        }
    }

    fn grammar_like() -> impl Strategy<Value = String> {
        let number = prop_oneof![
            "[0-9]{1,6}",
            "[0-9]{0,3}\\.[0-9]{0,3}",
            "[0-9]{15,22}",
            "[0-9.\\-+e]{0,5}",
        ];
        let unit = prop_oneof![
            prop::sample::select(vec![
                "ms",
                "m",
                "s",
                "mss",
                "msec",
                "millisecond",
                "milliseconds",
                "second",
                "seconds",
                "secondss",
                "sec",
                "minute",
                "minutes",
                "Minute",
                "min",
                "hour",
                "hours",
                "h",
                "day",
                "days",
                "week",
                "weeks",
                "month",
                "months",
                "year",
                "years",
                "y",
                "",
            ])
            .prop_map(str::to_owned),
            "[msecondiuthrkywal]{0,12}",
        ];
        let spaces = prop_oneof![Just(""), Just(" "), Just("  "), Just("\t")];
        (spaces.clone(), number, spaces.clone(), unit, spaces)
            .prop_map(|(a, n, b, u, c)| format!("{a}{n}{b}{u}{c}"))
    }
}
