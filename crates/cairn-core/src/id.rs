//! Validated domain ids: instance ids, workflow names, step names and event types.
//!
//! Each is a newtype that can only be built through validation, so a value of the type is
//! always valid (SPEC Part A.13, §2.4).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest instance id a user may supply.
pub const MAX_INSTANCE_ID_LEN: usize = 100;
/// Longest workflow name.
pub const MAX_WORKFLOW_NAME_LEN: usize = 64;
/// Longest step name, in characters.
pub const MAX_STEP_NAME_LEN: usize = 256;
/// Longest event type.
pub const MAX_EVENT_TYPE_LEN: usize = 100;

/// Why an id or name was rejected. The message quotes the input and the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// An instance id that is empty, too long or has characters outside `[a-zA-Z0-9_-]`.
    #[error(
        "Workflow instance has invalid id: {0:?} (1-100 characters of a-z, A-Z, 0-9, '_' and '-', not starting with '-')"
    )]
    InstanceId(String),
    /// An instance id that a route or the CLI reads as a word of its own (`latest`).
    #[error(
        "Workflow instance id {0:?} is reserved: `latest` names the newest instance in the CLIs (`cairn` and wrangler); choose another id"
    )]
    ReservedInstanceId(String),
    /// A workflow name that breaks the same pattern or is longer than 64 characters.
    #[error(
        "invalid workflow name {0:?} (1-64 characters of a-z, A-Z, 0-9, '_' and '-', not starting with '-')"
    )]
    WorkflowName(String),
    /// A step name longer than 256 characters or with a control character.
    #[error("Step name {0:?} exceeds max length (256 chars) or invalid characters found")]
    StepName(String),
    /// An event type that is empty, too long or has characters outside the pattern.
    #[error(
        "invalid event type {0:?} (1-100 characters of a-z, A-Z, 0-9, '_' and '-', not starting with '-')"
    )]
    EventType(String),
}

impl IdError {
    /// The stable error code for this kind of rejection, as used over HTTP.
    pub fn code(&self) -> &'static str {
        match self {
            IdError::InstanceId(_) | IdError::ReservedInstanceId(_) => "instance.invalid_id",
            IdError::WorkflowName(_) => "workflow.invalid_name",
            IdError::StepName(_) => "step.invalid_name",
            IdError::EventType(_) => "event.invalid_type",
        }
    }
}

/// Ids a create refuses: words the CLI and the routes read as something else.
pub const RESERVED_INSTANCE_IDS: &[&str] = &["latest"];

/// The longest id that lookups accept: cron-generated ids (`<cron>-<ms>`) are longer than
/// user ids.
pub const MAX_ADDRESSABLE_ID_LEN: usize = 271;

/// Whether `s` can name an instance in a lookup (get, delete): a user id, or a cron-style
/// id such as `*/30 * * * *-1786001400000` (`^[a-zA-Z0-9, */#_-]+$`, 1–271 characters).
/// Such an id is "not found" rather than "invalid" when no instance has it.
pub fn is_addressable_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ADDRESSABLE_ID_LEN
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || ", */#_-".contains(c))
}

/// `^[a-zA-Z0-9_][a-zA-Z0-9-_]*$` with a length bound.
fn is_plain_id(s: &str, max: usize) -> bool {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    s.len() <= max
        && (first.is_ascii_alphanumeric() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $check:expr, $err:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Validates `value` and wraps it.
            ///
            /// # Errors
            /// When `value` breaks the rule described on the type.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                let check: fn(&str) -> bool = $check;
                if check(&value) { Ok(Self(value)) } else { Err($err(value)) }
            }

            /// The validated string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = IdError;
            fn try_from(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// An instance id: 1–100 characters matching `^[a-zA-Z0-9_][a-zA-Z0-9-_]*$`, unique per workflow.
    InstanceId,
    |s| is_plain_id(s, MAX_INSTANCE_ID_LEN),
    IdError::InstanceId
);
string_id!(
    /// A workflow name: 1–64 characters matching `^[a-zA-Z0-9_][a-zA-Z0-9-_]*$`.
    WorkflowName,
    |s| is_plain_id(s, MAX_WORKFLOW_NAME_LEN),
    IdError::WorkflowName
);
string_id!(
    /// A step name: at most 256 characters, none of them a control character (U+0000–U+001F).
    StepName,
    |s| s.chars().count() <= MAX_STEP_NAME_LEN && !s.chars().any(|c| (c as u32) < 0x20),
    IdError::StepName
);
string_id!(
    /// An event type: 1–100 characters matching `^[a-zA-Z0-9_][a-zA-Z0-9-_]*$`.
    EventType,
    |s| is_plain_id(s, MAX_EVENT_TYPE_LEN),
    IdError::EventType
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_names() {
        for ok in ["abc", "NAME_123-hello", &"a".repeat(64), "_x"] {
            assert!(WorkflowName::new(ok).is_ok(), "{ok:?} should be accepted");
        }
        for bad in [
            "",
            " ",
            "a b",
            "\nabc",
            &"a".repeat(65),
            "a.b",
            "-abc",
            "ab!",
            "é",
        ] {
            let err = WorkflowName::new(bad).expect_err(bad);
            assert_eq!(err.code(), "workflow.invalid_name");
        }
    }

    #[test]
    fn instance_ids() {
        for ok in ["a", "0", "user-1_x", &"x".repeat(100)] {
            assert!(InstanceId::new(ok).is_ok(), "{ok:?} should be accepted");
        }
        for bad in ["", " ", "a\n", &"x".repeat(101), "a/b", "-a", "a.b"] {
            let err = InstanceId::new(bad).expect_err(bad);
            assert!(err.to_string().contains("Workflow instance has invalid id"));
        }
    }

    #[test]
    fn addressable_ids() {
        for ok in [
            "*/30 * * * *-1786001400000",
            "0 0 * * MON#2-1786001400000",
            "0 0 1,15 * *-1",
            "NAME_123-/cron",
            &"1".repeat(271),
        ] {
            assert!(is_addressable_id(ok), "{ok:?}");
        }
        for bad in ["", "invalid!", "a?b", &"1".repeat(272)] {
            assert!(!is_addressable_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn step_names() {
        assert!(StepName::new("charge customer 123 for the month").is_ok());
        assert!(StepName::new("💤💤💤").is_ok());
        assert!(
            StepName::new("é".repeat(256)).is_ok(),
            "limit counts characters"
        );
        assert!(StepName::new("").is_ok());
        let err = StepName::new("a".repeat(257)).expect_err("too long");
        assert!(err.to_string().contains("exceeds max length (256 chars)"));
        assert!(StepName::new("tab\there").is_err());
        assert!(StepName::new("nul\0").is_err());
    }

    #[test]
    fn event_types() {
        assert!(EventType::new("approved").is_ok());
        assert!(EventType::new("order-paid_2").is_ok());
        for bad in ["", "a.b", &"e".repeat(101), "with space"] {
            assert_eq!(
                EventType::new(bad).expect_err(bad).code(),
                "event.invalid_type"
            );
        }
    }

    #[test]
    fn ids_deserialize_with_validation() {
        let ok: InstanceId = serde_json::from_str("\"abc\"").expect("valid");
        assert_eq!(ok.as_str(), "abc");
        assert!(serde_json::from_str::<InstanceId>("\"a b\"").is_err());
    }
}
