//! The application's hand on a running live session ([`LiveHandle`]): closures run on the
//! client while the session waits (between rounds or for a request), a round asked for, a
//! stop; and the small single-threaded future plumbing the session waits with (no async
//! runtime: natively tokio drives it, in the browser the JavaScript event loop).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::engine::Client;
use crate::transport::Transport;

/// [`LiveHandle::with_client`] was called on a session that has ended (the closure did not
/// run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the live session is not running")]
pub struct NotRunning;

pub(super) type Job<T> = Box<dyn FnOnce(&mut Client<T>)>;

struct Shared<T: Transport> {
    stop: bool,
    sync_now: bool,
    ended: bool,
    jobs: VecDeque<Job<T>>,
    waker: Option<Waker>,
}

/// The application's hand on a running session: run closures on the client while it
/// waits, ask for a round, stop. Cheap to clone; single-threaded (like the client).
pub struct LiveHandle<T: Transport> {
    shared: Rc<RefCell<Shared<T>>>,
}

impl<T: Transport> Clone for LiveHandle<T> {
    fn clone(&self) -> Self {
        LiveHandle {
            shared: self.shared.clone(),
        }
    }
}

impl<T: Transport> Default for LiveHandle<T> {
    fn default() -> Self {
        LiveHandle::new()
    }
}

impl<T: Transport> LiveHandle<T> {
    /// A handle for one session (pass it to [`Client::run_live`]).
    pub fn new() -> LiveHandle<T> {
        LiveHandle {
            shared: Rc::new(RefCell::new(Shared {
                stop: false,
                sync_now: false,
                ended: false,
                jobs: VecDeque::new(),
                waker: None,
            })),
        }
    }

    fn wake(&self) {
        if let Some(w) = self.shared.borrow_mut().waker.take() {
            w.wake();
        }
    }

    /// Ends the session at its next step; [`Client::run_live`] then returns
    /// [`LiveEnd::Stopped`]. Closures already queued still run.
    pub fn stop(&self) {
        self.shared.borrow_mut().stop = true;
        self.wake();
    }

    /// Asks for a round now (a pull without waiting for a notification).
    pub fn sync_now(&self) {
        self.shared.borrow_mut().sync_now = true;
        self.wake();
    }

    /// Whether the session has ended.
    pub fn ended(&self) -> bool {
        self.shared.borrow().ended
    }

    /// Runs `f` on the client as soon as the session is waiting: between rounds, or while a
    /// request of a round is in flight (a write or query waits for no round to finish), and
    /// resolves to its result. A query mid-round sees the round as far as it went: the
    /// pages applied so far (each page is applied whole, with its verified rows), and
    /// rows with queued intent at their local value. When `f` leaves queued intent (a local write), a round
    /// follows at once and pushes it; a read costs no request.
    /// A write is durable when this resolves. [`NotRunning`] after the session ended.
    pub fn with_client<R: 'static>(
        &self,
        f: impl FnOnce(&mut Client<T>) -> R + 'static,
    ) -> impl Future<Output = Result<R, NotRunning>> {
        let slot = Rc::new(RefCell::new(Slot::<R> {
            value: None,
            closed: false,
            waker: None,
        }));
        let sender = Sender(slot.clone());
        {
            let mut shared = self.shared.borrow_mut();
            if !shared.ended {
                shared.jobs.push_back(Box::new(move |c: &mut Client<T>| {
                    let r = f(c);
                    sender.0.borrow_mut().value = Some(r);
                }));
            }
            // When ended, `sender` is dropped here and the future resolves to NotRunning.
        }
        self.wake();
        poll_fn(move |cx| {
            let mut s = slot.borrow_mut();
            if let Some(v) = s.value.take() {
                return Poll::Ready(Ok(v));
            }
            if s.closed {
                return Poll::Ready(Err(NotRunning));
            }
            s.waker = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    /// Resolves when there is something for the session to do.
    pub(super) fn woken(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| {
            let mut s = self.shared.borrow_mut();
            if s.stop || s.sync_now || !s.jobs.is_empty() {
                return Poll::Ready(());
            }
            s.waker = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    /// Resolves when a closure is queued.
    pub(super) fn job_queued(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| {
            let mut s = self.shared.borrow_mut();
            if !s.jobs.is_empty() {
                return Poll::Ready(());
            }
            s.waker = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    /// Marks the session ended and drops what is still queued (those futures resolve to
    /// [`NotRunning`]).
    pub(super) fn end(&self) {
        let jobs = {
            let mut s = self.shared.borrow_mut();
            s.ended = true;
            std::mem::take(&mut s.jobs)
        };
        drop(jobs);
    }

    pub(super) fn next_job(&self) -> Option<Job<T>> {
        self.shared.borrow_mut().jobs.pop_front()
    }

    pub(super) fn stopping(&self) -> bool {
        self.shared.borrow().stop
    }

    pub(super) fn take_sync_now(&self) -> bool {
        std::mem::take(&mut self.shared.borrow_mut().sync_now)
    }
}

/// One closure's result.
struct Slot<R> {
    value: Option<R>,
    closed: bool,
    waker: Option<Waker>,
}

/// Closes its slot when the job ran or was dropped, waking the waiting future.
struct Sender<R>(Rc<RefCell<Slot<R>>>);

impl<R> Drop for Sender<R> {
    fn drop(&mut self) {
        let mut s = self.0.borrow_mut();
        s.closed = true;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }
}

/// Which of three futures finished first.
pub(super) enum First<A, B> {
    A(A),
    B(B),
    Woken,
}

/// Polls `woken` first (so a stop is prompt), then `a`, then `b`.
pub(super) async fn first<A: Future, B: Future>(
    a: A,
    b: B,
    woken: impl Future<Output = ()>,
) -> First<A::Output, B::Output> {
    let (mut a, mut b, mut woken) = (pin!(a), pin!(b), pin!(woken));
    poll_fn(|cx| {
        if woken.as_mut().poll(cx).is_ready() {
            return Poll::Ready(First::Woken);
        }
        if let Poll::Ready(v) = a.as_mut().poll(cx) {
            return Poll::Ready(First::A(v));
        }
        if let Poll::Ready(v) = b.as_mut().poll(cx) {
            return Poll::Ready(First::B(v));
        }
        Poll::Pending
    })
    .await
}
