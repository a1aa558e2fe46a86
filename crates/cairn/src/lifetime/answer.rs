//! A commit's answer awaited by more than one future: the op that made the commit, and the
//! later commits of its lifetime that must know it landed first (its carrier's waiters).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use cairn_core::InstanceStatus;

/// The store's answer to a commit.
pub(super) type Outcome = Result<InstanceStatus, cairn_store::Error>;

/// A commit on its way, boxed.
pub(super) type Answer = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// A commit's answer shared by whoever waits for it: each waiter drives it when polled, so
/// no waiter depends on another being polled (workflow code may keep the op that made it
/// unpolled), and all of them learn the outcome.
///
/// Unlike `futures::future::Shared`, the waiter whose poll sees the commit complete is not
/// woken for it: it has the outcome already. (`Shared` wakes every waiter then, that one
/// too, which cost every step of a workflow a second poll of its whole lifetime.)
pub(super) struct SharedAnswer {
    state: Mutex<State>,
    /// The waiters to wake when the commit's future makes progress.
    waiters: Arc<Waiters>,
}

enum State {
    Running(Answer),
    Done(Outcome),
}

impl SharedAnswer {
    pub(super) fn new(commit: Answer) -> Self {
        SharedAnswer {
            state: Mutex::new(State::Running(commit)),
            waiters: Arc::default(),
        }
    }

    /// Polls the commit for the waiter of `cx`, driving it if it is still on its way.
    pub(super) fn poll(&self, cx: &mut Context<'_>) -> Poll<Outcome> {
        // A panic of the commit's future (a store's bug) poisons the lock: the panicking
        // waiter unwinds with it, and the others learn that the commit is not known to
        // have landed.
        let Ok(mut state) = self.state.lock() else {
            return Poll::Ready(Err(cairn_store::Error::Unavailable(
                "a commit panicked in the store".into(),
            )));
        };
        let commit = match &mut *state {
            State::Done(outcome) => return Poll::Ready(outcome.clone()),
            State::Running(commit) => commit,
        };
        // Registered before the poll: a completion on another thread right after it
        // wakes this waiter.
        self.waiters.register(cx.waker());
        let waker = Waker::from(Arc::clone(&self.waiters));
        let Poll::Ready(outcome) = commit.as_mut().poll(&mut Context::from_waker(&waker)) else {
            return Poll::Pending;
        };
        *state = State::Done(outcome.clone());
        drop(state);
        self.waiters.wake_all_but(Some(cx.waker()));
        Poll::Ready(outcome)
    }
}

/// The wakers of the futures waiting for a commit; the waker the commit's future is polled
/// with wakes them all. Mostly one (the op that made the commit), kept without allocating.
#[derive(Default)]
struct Waiters(Mutex<Wakers>);

#[derive(Default)]
struct Wakers {
    first: Option<Waker>,
    more: Vec<Waker>,
}

impl Wakers {
    fn iter(&self) -> impl Iterator<Item = &Waker> {
        self.first.iter().chain(&self.more)
    }
}

impl Waiters {
    fn register(&self, waker: &Waker) {
        let mut wakers = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if wakers.iter().any(|w| w.will_wake(waker)) {
            return;
        }
        match &wakers.first {
            None => wakers.first = Some(waker.clone()),
            Some(_) => wakers.more.push(waker.clone()),
        }
    }

    /// Wakes every waiter but `current` (`None`: every one). Taken out first: a waiter
    /// woken registers again when it polls again.
    fn wake_all_but(&self, current: Option<&Waker>) {
        let wakers = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        let Wakers { first, more } = wakers;
        for waker in first.into_iter().chain(more) {
            if !current.is_some_and(|current| waker.will_wake(current)) {
                waker.wake();
            }
        }
    }
}

impl Wake for Waiters {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_all_but(None);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counted() -> (Arc<Counted>, Waker) {
        let counted = Arc::new(Counted::default());
        (Arc::clone(&counted), Waker::from(counted))
    }

    /// A commit answered by a oneshot channel, as the stores answer.
    fn commit() -> (tokio::sync::oneshot::Sender<Outcome>, SharedAnswer) {
        let (tx, rx) = tokio::sync::oneshot::channel::<Outcome>();
        let answer = SharedAnswer::new(Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(cairn_store::Error::Unavailable("dropped".into())))
        }));
        (tx, answer)
    }

    /// A commit that completes when its gate opens, waking nobody itself.
    fn gated() -> (Arc<std::sync::atomic::AtomicBool>, SharedAnswer) {
        let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gate = Arc::clone(&open);
        let answer = SharedAnswer::new(Box::pin(std::future::poll_fn(move |_| {
            if gate.load(Ordering::SeqCst) {
                Poll::Ready(Ok(InstanceStatus::Complete))
            } else {
                Poll::Pending
            }
        })));
        (open, answer)
    }

    /// The waiter whose poll sees the commit complete is not woken for it (it has the
    /// outcome); the others are, and learn the same outcome, as does a later poll.
    #[test]
    fn the_waiter_that_sees_the_commit_complete_is_not_woken_and_the_others_are() {
        let (open, answer) = gated();
        let (a_count, a) = counted();
        let (b_count, b) = counted();
        assert!(answer.poll(&mut Context::from_waker(&a)).is_pending());
        assert!(answer.poll(&mut Context::from_waker(&b)).is_pending());
        open.store(true, Ordering::SeqCst);
        let done = Poll::Ready(Ok(InstanceStatus::Complete));
        assert_eq!(answer.poll(&mut Context::from_waker(&b)), done);
        assert_eq!(
            b_count.0.load(Ordering::SeqCst),
            0,
            "the waiter that saw it"
        );
        assert_eq!(a_count.0.load(Ordering::SeqCst), 1, "the other waiter");
        assert_eq!(answer.poll(&mut Context::from_waker(&a)), done);
        let (c_count, c) = counted();
        assert_eq!(answer.poll(&mut Context::from_waker(&c)), done);
        assert_eq!(
            c_count.0.load(Ordering::SeqCst),
            0,
            "an answer known wakes nobody"
        );
        assert_eq!(a_count.0.load(Ordering::SeqCst), 1);
    }

    /// The store's answer wakes every waiter, each once however often it polled.
    #[test]
    fn the_stores_answer_wakes_every_waiter_once() {
        let (tx, answer) = commit();
        let (a_count, a) = counted();
        let (b_count, b) = counted();
        assert!(answer.poll(&mut Context::from_waker(&a)).is_pending());
        assert!(answer.poll(&mut Context::from_waker(&b)).is_pending());
        assert!(answer.poll(&mut Context::from_waker(&a)).is_pending());
        tx.send(Ok(InstanceStatus::Running)).unwrap();
        assert_eq!(a_count.0.load(Ordering::SeqCst), 1);
        assert_eq!(b_count.0.load(Ordering::SeqCst), 1);
        let done = Poll::Ready(Ok(InstanceStatus::Running));
        assert_eq!(answer.poll(&mut Context::from_waker(&a)), done);
        assert_eq!(answer.poll(&mut Context::from_waker(&b)), done);
    }

    /// A commit's future that panics: the waiter polling it unwinds, and the others learn
    /// that it is not known to have landed.
    #[test]
    fn a_panicking_commit_fails_the_other_waiters() {
        let answer = SharedAnswer::new(Box::pin(async { panic!("a store's bug") }));
        let (_, a) = counted();
        let (_, b) = counted();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = answer.poll(&mut Context::from_waker(&a));
        }));
        assert!(unwound.is_err());
        assert!(matches!(
            answer.poll(&mut Context::from_waker(&b)),
            Poll::Ready(Err(cairn_store::Error::Unavailable(_)))
        ));
    }
}
