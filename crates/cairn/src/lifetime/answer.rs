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
/// too, which cost every step of a workflow a second poll of its whole lifetime.) Other
/// waiters are, even those of the same task: each waiter has a slot of its own.
pub(super) struct SharedAnswer {
    state: Mutex<State>,
    /// The waiters to wake when the commit's future makes progress.
    waiters: Arc<Waiters>,
}

enum State {
    Running(Answer),
    Done(Outcome),
}

/// A waiter's slot among a [`SharedAnswer`]'s: `None` until it first waits.
pub(super) type Slot = Option<u64>;

impl SharedAnswer {
    pub(super) fn new(commit: Answer) -> Self {
        SharedAnswer {
            state: Mutex::new(State::Running(commit)),
            waiters: Arc::default(),
        }
    }

    /// Polls the commit for the waiter in `slot`, driving it if it is still on its way.
    pub(super) fn poll(&self, slot: &mut Slot, cx: &mut Context<'_>) -> Poll<Outcome> {
        // A panic of the commit's future (a store's bug) poisons the lock: the panicking
        // waiter unwinds with it, waking the others, which learn that the commit is not
        // known to have landed.
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
        let key = self.waiters.register(slot, cx.waker());
        let waker = Waker::from(Arc::clone(&self.waiters));
        let unwinding = WakeOnUnwind(&self.waiters);
        let polled = commit.as_mut().poll(&mut Context::from_waker(&waker));
        std::mem::forget(unwinding);
        let Poll::Ready(outcome) = polled else {
            return Poll::Pending;
        };
        *state = State::Done(outcome.clone());
        drop(state);
        self.waiters.wake_all_but(Some(key));
        Poll::Ready(outcome)
    }
}

/// Wakes every waiter if the commit's future panics while polled.
struct WakeOnUnwind<'a>(&'a Waiters);

impl Drop for WakeOnUnwind<'_> {
    fn drop(&mut self) {
        self.0.wake_all_but(None);
    }
}

/// The wakers of the futures waiting for a commit, each in its slot; the waker the
/// commit's future is polled with wakes them all. Mostly one (the op that made the
/// commit), kept without allocating.
#[derive(Default)]
struct Waiters(Mutex<Wakers>);

#[derive(Default)]
struct Wakers {
    first: Option<(u64, Waker)>,
    more: Vec<(u64, Waker)>,
    /// The slot the next new waiter gets.
    next: u64,
}

impl Waiters {
    /// Keeps `waker` in the waiter's slot (a new one if it has none, or if its slot was
    /// emptied by a wake-up since), and returns the slot.
    fn register(&self, slot: &mut Slot, waker: &Waker) -> u64 {
        let mut wakers = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Wakers { first, more, next } = &mut *wakers;
        if let Some(key) = *slot
            && let Some((_, kept)) = first
                .iter_mut()
                .chain(more.iter_mut())
                .find(|(k, _)| *k == key)
        {
            if !kept.will_wake(waker) {
                kept.clone_from(waker);
            }
            return key;
        }
        let key = *next;
        *next += 1;
        *slot = Some(key);
        match first {
            None => *first = Some((key, waker.clone())),
            Some(_) => more.push((key, waker.clone())),
        }
        key
    }

    /// Wakes the waiter of every slot but `current`'s (`None`: every one), and empties
    /// them: a waiter woken registers again when it polls again.
    fn wake_all_but(&self, current: Option<u64>) {
        let mut wakers = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let first = wakers.first.take();
        let more = std::mem::take(&mut wakers.more);
        drop(wakers);
        for (key, waker) in first.into_iter().chain(more) {
            if Some(key) != current {
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
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A waiter: its waker, how often that was woken, and its slot.
    struct Waiter {
        woken: Arc<Counted>,
        waker: Waker,
        slot: Slot,
    }

    impl Waiter {
        fn new() -> Self {
            let woken = Arc::new(Counted::default());
            let waker = Waker::from(Arc::clone(&woken));
            Waiter {
                woken,
                waker,
                slot: None,
            }
        }

        /// Another waiter of the same task: the same waker, a slot of its own.
        fn beside(&self) -> Self {
            Waiter {
                woken: Arc::clone(&self.woken),
                waker: self.waker.clone(),
                slot: None,
            }
        }

        fn poll(&mut self, answer: &SharedAnswer) -> Poll<Outcome> {
            answer.poll(&mut self.slot, &mut Context::from_waker(&self.waker))
        }

        fn woken(&self) -> usize {
            self.woken.0.load(Ordering::SeqCst)
        }
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

    /// A commit that completes when its gate opens, waking nobody itself (as a channel
    /// answered, whose wake-up has not come yet).
    fn gated() -> (Arc<AtomicBool>, SharedAnswer) {
        let open = Arc::new(AtomicBool::new(false));
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

    const DONE: Poll<Outcome> = Poll::Ready(Ok(InstanceStatus::Complete));

    /// The waiter whose poll sees the commit complete is not woken for it (it has the
    /// outcome); the others are, and learn the same outcome, as does a later poll.
    #[test]
    fn the_waiter_that_sees_the_commit_complete_is_not_woken_and_the_others_are() {
        let (open, answer) = gated();
        let (mut a, mut b) = (Waiter::new(), Waiter::new());
        assert!(a.poll(&answer).is_pending());
        assert!(b.poll(&answer).is_pending());
        open.store(true, Ordering::SeqCst);
        assert_eq!(b.poll(&answer), DONE);
        assert_eq!(b.woken(), 0, "the waiter that saw it");
        assert_eq!(a.woken(), 1, "the other waiter");
        assert_eq!(a.poll(&answer), DONE);
        let mut c = Waiter::new();
        assert_eq!(c.poll(&answer), DONE);
        assert_eq!(c.woken(), 0, "an answer known wakes nobody");
        assert_eq!(a.woken(), 1);
    }

    /// Two waiters of one task (an op, and a later op's wait for it): the one that sees
    /// the commit complete wakes the task for the other, which would otherwise wait for a
    /// wake-up already spent.
    #[test]
    fn a_waiter_of_the_same_task_is_woken_by_the_one_that_saw_the_commit_complete() {
        let (open, answer) = gated();
        let mut op = Waiter::new();
        let mut later = op.beside();
        assert!(op.poll(&answer).is_pending());
        open.store(true, Ordering::SeqCst);
        assert_eq!(later.poll(&answer), DONE);
        assert_eq!(op.woken(), 1, "the task is polled again, for the op");
        assert_eq!(op.poll(&answer), DONE);
    }

    /// The store's answer wakes every waiter, each once however often it polled.
    #[test]
    fn the_stores_answer_wakes_every_waiter_once() {
        let (tx, answer) = commit();
        let (mut a, mut b) = (Waiter::new(), Waiter::new());
        assert!(a.poll(&answer).is_pending());
        assert!(b.poll(&answer).is_pending());
        assert!(a.poll(&answer).is_pending());
        tx.send(Ok(InstanceStatus::Running)).unwrap();
        assert_eq!((a.woken(), b.woken()), (1, 1));
        let done = Poll::Ready(Ok(InstanceStatus::Running));
        assert_eq!(a.poll(&answer), done);
        assert_eq!(b.poll(&answer), done);
    }

    /// A commit's future that panics: the waiter polling it unwinds and wakes the others,
    /// which learn that it is not known to have landed.
    #[test]
    fn a_panicking_commit_wakes_and_fails_the_other_waiters() {
        let answer = SharedAnswer::new(Box::pin(async { panic!("a store's bug") }));
        let (mut a, mut b) = (Waiter::new(), Waiter::new());
        // `b` registered first, by a poll that found the commit on its way: a future that
        // panics at once cannot give it one, so its slot is taken by hand.
        answer.waiters.register(&mut b.slot, &b.waker.clone());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = a.poll(&answer);
        }));
        assert!(unwound.is_err());
        assert_eq!(b.woken(), 1, "woken by the unwinding waiter");
        assert!(matches!(
            b.poll(&answer),
            Poll::Ready(Err(cairn_store::Error::Unavailable(_)))
        ));
    }
}
