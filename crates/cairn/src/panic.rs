//! Panics in user code are failures, never crashes: every call into user code (a step body,
//! a delay function, a rollback handler, `Workflow::run`) goes through [`guarded`], which
//! catches a panic both while the future is *built* and while it is polled.
//!
//! The ops' own code (the attempt loop, commits, waits) runs inside the workflow's future,
//! so a panic there unwinds to the same catch as a panic in `Workflow::run`. [`EngineCode`]
//! marks it: a panic that unwinds through engine code sets a flag that
//! [`take_engine_panic`] reads, and the driver then releases the instance instead of
//! failing it for a bug that is not the user's.

use std::any::Any;
use std::cell::Cell;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt;
use futures::future::Either;

thread_local! {
    /// How deep the current thread is in engine code (0 in user code).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// A panic unwound through engine code on this thread since the last look.
    static ENGINE_PANICKED: Cell<bool> = const { Cell::new(false) };
}

/// Held while engine code runs inside the workflow's future (an op's poll).
pub(crate) struct EngineCode(());

impl EngineCode {
    pub(crate) fn enter() -> Self {
        DEPTH.with(|d| d.set(d.get() + 1));
        EngineCode(())
    }
}

impl Drop for EngineCode {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        if std::thread::panicking() {
            ENGINE_PANICKED.with(|p| p.set(true));
        }
    }
}

/// Whether the panic just caught unwound through engine code; resets the flag.
pub(crate) fn take_engine_panic() -> bool {
    ENGINE_PANICKED.with(|p| p.replace(false))
}

/// Runs `f` as user code: engine-code depth 0, so a panic in it is never taken for the
/// engine's (and is caught by the caller).
fn as_user<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(DEPTH.with(|d| d.replace(0)));
    f()
}

/// Calls user code that returns a value (a `Serialize` or `Deserialize` impl), turning a
/// panic into `Err`.
pub(crate) fn catch_user<R>(f: impl FnOnce() -> R) -> Result<R, Panic> {
    as_user(|| std::panic::catch_unwind(AssertUnwindSafe(f)))
}

/// `serde_json::to_string` of a value whose `Serialize` impl is user code: a panic in it
/// is a serialisation error.
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> serde_json::Result<String> {
    catch_user(|| cairn_core::binary::to_string(value)).unwrap_or_else(|panic| {
        Err(serde::ser::Error::custom(format!(
            "its Serialize impl panicked: {}",
            message(&*panic)
        )))
    })
}

/// `serde_json::from_str` into a type whose `Deserialize` impl is user code: a panic in it
/// is a decoding error.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> serde_json::Result<T> {
    catch_user(|| cairn_core::binary::from_str(text)).unwrap_or_else(|panic| {
        Err(serde::de::Error::custom(format!(
            "its Deserialize impl panicked: {}",
            message(&*panic)
        )))
    })
}

/// [`cairn_core::binary::from_value`] into a type whose `Deserialize` impl is user code: a
/// panic in it is a decoding error.
pub(crate) fn from_value<T: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
) -> serde_json::Result<T> {
    catch_user(|| cairn_core::binary::from_value(value)).unwrap_or_else(|panic| {
        Err(serde::de::Error::custom(format!(
            "its Deserialize impl panicked: {}",
            message(&*panic)
        )))
    })
}

/// A future polled as user code.
struct UserFuture<F>(F);

impl<F: Future + Unpin> Future for UserFuture<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        as_user(|| Pin::new(&mut self.0).poll(cx))
    }
}

/// A caught panic's payload.
pub(crate) type Panic = Box<dyn Any + Send>;

/// Calls `make` and runs the future it returns, turning a panic in either into `Err`.
pub(crate) fn guarded<F: Future>(
    make: impl FnOnce() -> F,
) -> impl Future<Output = Result<F::Output, Panic>> {
    match catch_user(make) {
        Ok(future) => Either::Left(UserFuture(
            AssertUnwindSafe(Box::pin(future)).catch_unwind(),
        )),
        Err(panic) => Either::Right(std::future::ready(Err(panic))),
    }
}

/// The panic's message, if it carried one.
pub(crate) fn message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}
