//! A single-value channel that wakes its waiters in a fixed order: what
//! `tokio::sync::watch` does, minus its one source of chance.
//!
//! `tokio::sync::watch` spreads its waiters over eight `Notify`s and picks one per wait
//! from tokio's thread-local RNG, which tokio seeds from a process-wide counter. A send
//! wakes the eight in index order, so the order in which two tasks waiting on one channel
//! wake depends on how many threads touched tokio before. On a real runtime nothing
//! depends on that order; under the simulator (madsim runs the ready tasks in an order
//! drawn from the seed, given the order they were woken in) it made one seed and plan
//! schedule differently from run to run. This channel keeps one `Notify`: its waiters wake
//! in the order they started waiting, on every thread.
//!
//! Only what the connection and the simulated processes use: [`channel`], a [`Sender`]
//! that replaces or modifies the value (and closes the channel when dropped), and a
//! [`Receiver`] that borrows it, waits for a change, or waits until it satisfies a
//! predicate. Semantics follow `tokio::sync::watch`.

use std::ops::Deref;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

/// The sender is gone and the receiver has seen its last value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the watch channel's sender is gone")
    }
}

impl std::error::Error for Closed {}

#[derive(Debug)]
struct State<T> {
    value: T,
    /// Bumped by every send.
    version: u64,
    /// The sender was dropped.
    closed: bool,
}

#[derive(Debug)]
struct Shared<T> {
    state: Mutex<State<T>>,
    /// Woken at every send and when the sender goes; waiters wake in the order they
    /// registered.
    changed: Notify,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Creates a channel holding `init`.
pub fn channel<T>(init: T) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            value: init,
            version: 0,
            closed: false,
        }),
        changed: Notify::new(),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared, seen: 0 },
    )
}

/// The sending half; dropping it closes the channel.
#[derive(Debug)]
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Replaces the value, wakes every waiter, and returns the old value.
    pub fn send_replace(&self, value: T) -> T {
        let old = {
            let mut state = self.shared.lock();
            state.version += 1;
            std::mem::replace(&mut state.value, value)
        };
        self.shared.changed.notify_waiters();
        old
    }

    /// Lets `modify` change the value in place; if it says it did (returns true), the
    /// receivers see a new value and every waiter wakes. Returns what `modify` returned.
    pub fn send_if_modified(&self, modify: impl FnOnce(&mut T) -> bool) -> bool {
        let modified = {
            let mut state = self.shared.lock();
            let modified = modify(&mut state.value);
            if modified {
                state.version += 1;
            }
            modified
        };
        if modified {
            self.shared.changed.notify_waiters();
        }
        modified
    }

    /// The current value.
    pub fn borrow(&self) -> Ref<'_, T> {
        Ref(self.shared.lock())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_waiters();
    }
}

/// The receiving half; a clone has seen what the original has seen.
#[derive(Debug)]
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    /// The version this receiver saw last.
    seen: u64,
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Receiver {
            shared: self.shared.clone(),
            seen: self.seen,
        }
    }
}

/// A borrowed value (the channel is locked while it lives: do not hold it across an
/// `.await`).
#[derive(Debug)]
pub struct Ref<'a, T>(MutexGuard<'a, State<T>>);

impl<T> Deref for Ref<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0.value
    }
}

impl<T> Receiver<T> {
    /// The current value, without marking it seen.
    pub fn borrow(&self) -> Ref<'_, T> {
        Ref(self.shared.lock())
    }

    /// The current value, marked seen.
    pub fn borrow_and_update(&mut self) -> Ref<'_, T> {
        let state = self.shared.lock();
        self.seen = state.version;
        Ref(state)
    }

    /// Resolves once there is a value this receiver has not seen (and marks it seen);
    /// [`Closed`] once the sender is gone and nothing unseen is left.
    pub async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            // Registered before the state is looked at, so no send in between is missed.
            let mut notified = pin!(self.shared.changed.notified());
            notified.as_mut().enable();
            {
                let state = self.shared.lock();
                if state.version != self.seen {
                    self.seen = state.version;
                    return Ok(());
                }
                if state.closed {
                    return Err(Closed);
                }
            }
            notified.await;
        }
    }

    /// Resolves with the value once `holds` holds for it (the current value counts; it is
    /// marked seen); [`Closed`] if the sender goes before it does.
    pub async fn wait_for(
        &mut self,
        mut holds: impl FnMut(&T) -> bool,
    ) -> Result<Ref<'_, T>, Closed> {
        let shared = &*self.shared;
        loop {
            let mut notified = pin!(shared.changed.notified());
            notified.as_mut().enable();
            {
                let state = shared.lock();
                self.seen = state.version;
                if holds(&state.value) {
                    return Ok(Ref(state));
                }
                if state.closed {
                    return Err(Closed);
                }
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Wake, Waker};

    use super::*;

    /// A waker that appends its name to a shared list when woken.
    struct Named(&'static str, Arc<Mutex<Vec<&'static str>>>);

    impl Wake for Named {
        fn wake(self: Arc<Self>) {
            self.1.lock().expect("not poisoned").push(self.0);
        }
    }

    /// The order in which two tasks waiting on one channel (the first registered first)
    /// are woken by a send.
    fn wake_order() -> Vec<&'static str> {
        let woken = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = channel(false);
        let mut first = rx.clone();
        let mut second = rx;
        let mut a = Box::pin(first.wait_for(|v| *v));
        let mut b = Box::pin(second.wait_for(|v| *v));
        let wa = Waker::from(Arc::new(Named("first", woken.clone())));
        let wb = Waker::from(Arc::new(Named("second", woken.clone())));
        assert!(a.as_mut().poll(&mut Context::from_waker(&wa)).is_pending());
        assert!(b.as_mut().poll(&mut Context::from_waker(&wb)).is_pending());
        tx.send_replace(true);
        let order = woken.lock().expect("not poisoned").clone();
        assert!(matches!(
            a.as_mut().poll(&mut Context::from_waker(&wa)),
            Poll::Ready(Ok(_))
        ));
        drop(a);
        assert!(matches!(
            b.as_mut().poll(&mut Context::from_waker(&wb)),
            Poll::Ready(Ok(_))
        ));
        order
    }

    /// Waiters wake in the same order on every thread (`tokio::sync::watch` draws it from
    /// a thread-local RNG seeded per thread: on fresh threads the order changes).
    #[test]
    fn waiters_wake_in_the_same_order_on_every_thread() {
        let orders: Vec<Vec<&str>> = (0..32)
            .map(|_| std::thread::spawn(wake_order).join().expect("no panic"))
            .collect();
        assert!(
            orders.windows(2).all(|w| w[0] == w[1]),
            "wake orders differ across threads: {orders:?}"
        );
        assert_eq!(
            orders[0].len(),
            2,
            "both waiters were woken: {:?}",
            orders[0]
        );
    }

    #[test]
    fn changed_sees_each_send_and_ends_when_the_sender_goes() {
        let (tx, mut rx) = channel(0);
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        {
            let mut changed = Box::pin(rx.changed());
            assert!(changed.as_mut().poll(&mut cx).is_pending());
            tx.send_replace(1);
            assert_eq!(changed.as_mut().poll(&mut cx), Poll::Ready(Ok(())));
        }
        assert_eq!(*rx.borrow_and_update(), 1);
        assert!(!tx.send_if_modified(|_| false));
        {
            let mut changed = Box::pin(rx.changed());
            assert!(changed.as_mut().poll(&mut cx).is_pending());
            assert!(tx.send_if_modified(|v| {
                *v = 2;
                true
            }));
            assert_eq!(changed.as_mut().poll(&mut cx), Poll::Ready(Ok(())));
        }
        drop(tx);
        let mut changed = Box::pin(rx.changed());
        assert_eq!(changed.as_mut().poll(&mut cx), Poll::Ready(Err(Closed)));
        drop(changed);
        let mut waiting = Box::pin(rx.wait_for(|v| *v == 3));
        assert!(matches!(
            waiting.as_mut().poll(&mut cx),
            Poll::Ready(Err(Closed))
        ));
    }
}
