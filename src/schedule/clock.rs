//! Where the daemons get the time: the system clock, or a clock that moves only when a test
//! tells it to, so tests move time instead of sleeping.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

/// Where a daemon gets the time.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
    fn sleep_until(&self, t: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// Sleep until `t` on `clock`, or forever when there is no `t` (nothing is scheduled).
pub(crate) async fn sleep_until_or_never(clock: &dyn Clock, t: Option<DateTime<Utc>>) {
    match t {
        Some(t) => clock.sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The real clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
    fn sleep_until(&self, t: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let wait = (t - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        Box::pin(tokio::time::sleep(wait))
    }
}

/// A clock that moves only when told: for tests.
pub struct ManualClock {
    now: watch::Sender<DateTime<Utc>>,
    /// What each sleeper waits for, by a number of its own.
    sleepers: Arc<Mutex<BTreeMap<u64, DateTime<Utc>>>>,
    numbers: AtomicU64,
}

/// A sleeper's entry in `ManualClock::sleepers`, taken out when the sleep ends or is dropped.
struct Sleeper {
    number: u64,
    sleepers: Arc<Mutex<BTreeMap<u64, DateTime<Utc>>>>,
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        if let Ok(mut s) = self.sleepers.lock() {
            s.remove(&self.number);
        }
    }
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        ManualClock {
            now: watch::Sender::new(start),
            sleepers: Arc::default(),
            numbers: AtomicU64::new(0),
        }
    }
    pub fn set(&self, t: DateTime<Utc>) {
        self.now.send_replace(t);
    }
    /// How many sleepers wait on this clock: a test knows the daemon is idle when it is > 0.
    pub fn waiting(&self) -> usize {
        self.now.receiver_count()
    }
    /// The times the sleepers on this clock wait for, earliest first: a test sees when a
    /// daemon means to wake (its next occurrence, a run's jitter) without moving time.
    pub fn deadlines(&self) -> Vec<DateTime<Utc>> {
        let mut d: Vec<DateTime<Utc>> = self
            .sleepers
            .lock()
            .map(|s| s.values().copied().collect())
            .unwrap_or_default();
        d.sort();
        d
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.borrow()
    }
    fn sleep_until(&self, t: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let mut rx = self.now.subscribe();
        let number = self.numbers.fetch_add(1, Ordering::Relaxed);
        let sleeper = Sleeper {
            number,
            sleepers: self.sleepers.clone(),
        };
        if let Ok(mut s) = self.sleepers.lock() {
            s.insert(number, t);
        }
        Box::pin(async move {
            let _sleeper = sleeper;
            while *rx.borrow_and_update() < t {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_lists_what_its_sleepers_wait_for_until_they_wake() {
        let t = |s: i64| DateTime::from_timestamp(s, 0).unwrap();
        let clock = ManualClock::new(t(0));
        let soon = clock.sleep_until(t(10));
        let later = clock.sleep_until(t(20));
        assert_eq!(clock.deadlines(), [t(10), t(20)]);
        clock.set(t(10));
        soon.await;
        assert_eq!(clock.deadlines(), [t(20)]);
        drop(later);
        assert!(clock.deadlines().is_empty());
    }
}
