//! The injected source of time. Every timer the engine sets is an absolute wall-clock time,
//! so it means the same thing after a restart.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cairn_core::Timestamp;
use futures::future::BoxFuture;

/// Where the engine gets the time from: the system clock, or a virtual clock for tests.
///
/// The virtual clock follows tokio's clock, so under `#[tokio::test(start_paused = true)]`
/// time stands still while anything runs and jumps straight to the next timer when
/// everything waits: a 10-second back-off or a 3-hour sleep costs no wall time. The engine
/// keeps store calls from letting time jump (see `Engine::builder().clock(..)`).
#[derive(Clone)]
pub struct Clock(Arc<dyn ClockSource>);

trait ClockSource: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
    fn sleep_until(&self, at: Timestamp) -> BoxFuture<'static, ()>;
    fn is_virtual(&self) -> bool;
}

struct SystemSource;

impl ClockSource for SystemSource {
    fn now(&self) -> Timestamp {
        Timestamp::from_system_time(SystemTime::now())
    }

    fn sleep_until(&self, at: Timestamp) -> BoxFuture<'static, ()> {
        let wait = at.since(self.now());
        Box::pin(tokio::time::sleep(wait))
    }

    fn is_virtual(&self) -> bool {
        false
    }
}

struct VirtualSource {
    start: Timestamp,
    base: tokio::time::Instant,
}

impl ClockSource for VirtualSource {
    fn now(&self) -> Timestamp {
        self.start.saturating_add(self.base.elapsed())
    }

    fn sleep_until(&self, at: Timestamp) -> BoxFuture<'static, ()> {
        let offset = at.since(self.start);
        let deadline = self
            .base
            .checked_add(offset)
            .unwrap_or_else(|| self.base + Duration::from_secs(100 * 365 * 86_400));
        Box::pin(tokio::time::sleep_until(deadline))
    }

    fn is_virtual(&self) -> bool {
        true
    }
}

impl Clock {
    /// The system's wall clock.
    pub fn system() -> Self {
        Clock(Arc::new(SystemSource))
    }

    /// A virtual clock that reads `start` now and then advances with tokio's clock.
    /// Create it inside the runtime that will run the engine.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn virtual_at(start: Timestamp) -> Self {
        Clock(Arc::new(VirtualSource {
            start,
            base: tokio::time::Instant::now(),
        }))
    }

    /// A virtual clock starting at the current system time.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn virtual_now() -> Self {
        Self::virtual_at(Timestamp::from_system_time(SystemTime::now()))
    }

    /// The current time.
    pub fn now(&self) -> Timestamp {
        self.0.now()
    }

    /// Resolves at `at` (at once if it has passed).
    ///
    /// # Cancel safety
    /// Dropping the future cancels the timer; nothing else happens.
    pub fn sleep_until(&self, at: Timestamp) -> BoxFuture<'static, ()> {
        self.0.sleep_until(at)
    }

    /// Resolves after `d`.
    pub fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        self.sleep_until(self.now().saturating_add(d))
    }

    /// Whether this clock is virtual.
    pub fn is_virtual(&self) -> bool {
        self.0.is_virtual()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_virtual() {
            "Clock::virtual"
        } else {
            "Clock::system"
        })
    }
}
