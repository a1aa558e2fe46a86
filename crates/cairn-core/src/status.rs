//! Instance statuses and the transitions between them (SPEC §2.3, Appendix A, Part A.2).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The status of an instance, with Cloudflare's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InstanceStatus {
    /// Created or woken, waiting for a concurrency slot.
    Queued,
    /// Executing.
    Running,
    /// Paused by a user.
    Paused,
    /// Ended with an uncaught error (terminal).
    Errored,
    /// Ended by a user's terminate (terminal).
    Terminated,
    /// `run` returned (terminal).
    Complete,
    /// Pause requested; in-flight attempts are finishing.
    WaitingForPause,
    /// Hibernating: sleeping, in a retry back-off or waiting for an event.
    Waiting,
}

impl InstanceStatus {
    /// Every status, in Cloudflare's numeric order.
    pub const ALL: [InstanceStatus; 8] = [
        InstanceStatus::Queued,
        InstanceStatus::Running,
        InstanceStatus::Paused,
        InstanceStatus::Errored,
        InstanceStatus::Terminated,
        InstanceStatus::Complete,
        InstanceStatus::WaitingForPause,
        InstanceStatus::Waiting,
    ];

    /// Whether the instance has finished for good (errored, terminated, complete).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            InstanceStatus::Errored | InstanceStatus::Terminated | InstanceStatus::Complete
        )
    }

    /// Cloudflare's numeric code, which is also how the status is stored.
    pub fn code(self) -> i64 {
        match self {
            InstanceStatus::Queued => 0,
            InstanceStatus::Running => 1,
            InstanceStatus::Paused => 2,
            InstanceStatus::Errored => 3,
            InstanceStatus::Terminated => 4,
            InstanceStatus::Complete => 5,
            InstanceStatus::WaitingForPause => 6,
            InstanceStatus::Waiting => 7,
        }
    }

    /// The status with numeric code `code`, if any.
    pub fn from_code(code: i64) -> Option<Self> {
        InstanceStatus::ALL.into_iter().find(|s| s.code() == code)
    }

    /// The name used in JSON and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceStatus::Queued => "queued",
            InstanceStatus::Running => "running",
            InstanceStatus::Paused => "paused",
            InstanceStatus::Errored => "errored",
            InstanceStatus::Terminated => "terminated",
            InstanceStatus::Complete => "complete",
            InstanceStatus::WaitingForPause => "waitingForPause",
            InstanceStatus::Waiting => "waiting",
        }
    }

    /// Whether an engine should (re)start executing an instance found in this status.
    /// Appendix A: queued, running and waiting instances are replayed; paused and terminal ones are not.
    pub fn is_runnable(self) -> bool {
        matches!(
            self,
            InstanceStatus::Queued | InstanceStatus::Running | InstanceStatus::Waiting
        )
    }
}

impl fmt::Display for InstanceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for InstanceStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        InstanceStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown status {s:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_match_cloudflare() {
        for s in InstanceStatus::ALL {
            assert_eq!(InstanceStatus::from_code(s.code()), Some(s));
            assert_eq!(s.as_str().parse::<InstanceStatus>(), Ok(s));
            assert_eq!(serde_json::to_value(s).expect("serialize"), s.as_str());
        }
        assert_eq!(InstanceStatus::from_code(99), None);
        assert_eq!(InstanceStatus::WaitingForPause.code(), 6);
    }

    #[test]
    fn terminal_set() {
        let terminal: Vec<_> = InstanceStatus::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [
                InstanceStatus::Errored,
                InstanceStatus::Terminated,
                InstanceStatus::Complete
            ]
        );
    }
}
