//! Panics in user code are failures, never crashes: every call into user code (a step body,
//! a delay function, a rollback handler, `Workflow::run`) goes through [`guarded`], which
//! catches a panic both while the future is *built* and while it is polled.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::Either;

/// A caught panic's payload.
pub(crate) type Panic = Box<dyn Any + Send>;

/// Calls `make` and runs the future it returns, turning a panic in either into `Err`.
pub(crate) fn guarded<F: Future>(
    make: impl FnOnce() -> F,
) -> impl Future<Output = Result<F::Output, Panic>> {
    match std::panic::catch_unwind(AssertUnwindSafe(make)) {
        Ok(future) => Either::Left(AssertUnwindSafe(future).catch_unwind()),
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
