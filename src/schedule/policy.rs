//! The scheduling decisions, taken alike by the local daemon, the fleet daemon and the
//! fleet's claims in PostgreSQL: which occurrences came due, which of them run and which are
//! missed (catch-up), what an occurrence does while the goal's last run still goes (overlap),
//! and how long a run waits before it starts (jitter). Pure functions of times and states;
//! their tests are beside them.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::cron::Schedule;
use crate::config::Overlap;

/// How late an occurrence may be noticed and still count as on time.
pub(crate) const ON_TIME: Duration = Duration::from_secs(2);
/// Missed occurrences recorded one by one at most, per catch-up.
pub(crate) const MISSED_CAP: usize = 1000;

/// How late an occurrence of a goal with `catch_up` may run.
pub(crate) fn window(catch_up: Duration) -> Duration {
    catch_up.max(ON_TIME)
}

/// The goals whose next occurrence (`next`) came due by `now`, by name.
pub(crate) fn due_goals<G>(
    goals: &BTreeMap<String, G>,
    next: impl Fn(&G) -> Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Vec<String> {
    goals
        .iter()
        .filter(|(_, g)| next(g).is_some_and(|n| n <= now))
        .map(|(name, _)| name.clone())
        .collect()
}

/// What became of the occurrences that came due.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Settled {
    /// Recorded as missed, oldest first.
    pub missed: Vec<DateTime<Utc>>,
    /// Missed too, but too many to list one by one.
    pub uncounted: usize,
    /// The one that runs: the latest, when it is on time.
    pub fire: Option<DateTime<Utc>>,
}

/// Of `due` (oldest first, `total` in all): the latest runs when it is within `window` of
/// `now`; the others are missed.
pub(crate) fn settle(
    mut due: Vec<DateTime<Utc>>,
    total: usize,
    now: DateTime<Utc>,
    window: Duration,
) -> Settled {
    let Some(latest) = due.pop() else {
        return Settled {
            missed: Vec::new(),
            uncounted: 0,
            fire: None,
        };
    };
    let on_time = (now - latest).to_std().unwrap_or(Duration::ZERO) <= window;
    if !on_time {
        due.push(latest);
    }
    Settled {
        uncounted: total.saturating_sub(due.len() + usize::from(on_time)),
        missed: due,
        fire: on_time.then_some(latest),
    }
}

/// The occurrences of `schedule` due by `now`, the first being `first` (the goal's next, due
/// already, followed by `after_first`); with how many there are in all and the next after
/// `now`. (Goals share schedules: the caller may have `after_first` worked out already.)
pub(crate) fn due(
    schedule: &Schedule,
    first: DateTime<Utc>,
    after_first: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> (Vec<DateTime<Utc>>, usize, Option<DateTime<Utc>>) {
    // Only when more than one came due is the whole list worked out.
    if after_first.is_none_or(|t| t > now) {
        return (vec![first], 1, after_first);
    }
    let (mut later, total) = schedule.between(first, now, MISSED_CAP);
    let mut list = vec![first];
    list.append(&mut later);
    (list, total + 1, schedule.next_after(now))
}

/// At start: of the occurrences since `last` (the latest claimed), missed while no daemon
/// ran, the latest within the goal's `catch_up` runs and the others are missed.
pub(crate) fn catch_up(
    schedule: &Schedule,
    last: DateTime<Utc>,
    now: DateTime<Utc>,
    catch_up: Duration,
) -> Settled {
    let (list, total) = schedule.between(last, now, MISSED_CAP);
    settle(list, total, now, window(catch_up))
}

/// What an occurrence does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// It runs.
    Start,
    /// It is recorded as skipped.
    Skip,
    /// It waits behind the running one.
    Queue,
    /// The running ones are cancelled, and it runs.
    Replace,
}

/// What an occurrence does under `overlap`, when the goal has runs going (`busy`) and
/// perhaps one occurrence waiting already (`queued`).
pub(crate) fn overlap(overlap: Overlap, busy: bool, queued: bool) -> Decision {
    match (busy, overlap) {
        (false, _) | (true, Overlap::Allow) => Decision::Start,
        (true, Overlap::Replace) => Decision::Replace,
        (true, Overlap::Queue) if !queued => Decision::Queue,
        (true, Overlap::Queue | Overlap::Skip) => Decision::Skip,
    }
}

/// How long a run waits before it starts: a share `r` (in 0..1) of the goal's `jitter`.
pub(crate) fn jitter(jitter: Duration, r: f64) -> Duration {
    jitter.mul_f64(r.clamp(0.0, 1.0))
}

/// A stable hash of some strings that every daemon computes alike (FNV-1a, each string
/// ended by a byte no UTF-8 text holds).
pub(crate) fn stable_hash(parts: &[&str]) -> u64 {
    parts
        .iter()
        .flat_map(|p| p.bytes().chain([0xff]))
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// How long the run of `goal`'s occurrence `at` waits within the goal's `jitter` (none when
/// it has none). A share drawn from the goal and the occurrence, not from chance: the goals
/// of one schedule spread out, each occurrence of a goal waits its own time, and every
/// daemon (and a test on a manual clock) knows that time alike.
pub(crate) fn jitter_wait(goal: &str, at: DateTime<Utc>, max: Duration) -> Duration {
    if max.is_zero() {
        return Duration::ZERO;
    }
    let h = stable_hash(&[goal, &at.timestamp_micros().to_string()]);
    // The hash's bits mixed (splitmix64's finish), so that near times differ far.
    let h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let h = h ^ (h >> 31);
    jitter(max, (h >> 11) as f64 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::clock::{Clock, ManualClock};

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn every_minute() -> Schedule {
        Schedule::parse("* * * * *", chrono_tz::UTC).unwrap()
    }

    #[test]
    fn settle_runs_the_latest_on_time_and_misses_the_rest() {
        let clock = ManualClock::new(t("2026-01-01T10:00:00Z"));
        let (a, b, c) = (
            t("2026-01-01T09:58:00Z"),
            t("2026-01-01T09:59:00Z"),
            t("2026-01-01T10:00:00Z"),
        );
        type Times = Vec<DateTime<Utc>>;
        type Want = (Times, usize, Option<DateTime<Utc>>);
        // (due, total, seconds after 10:00, window) → (missed, uncounted, fire)
        let table: &[(Times, usize, i64, u64, Want)] = &[
            (vec![], 0, 0, 2, (vec![], 0, None)),
            (vec![c], 1, 0, 2, (vec![], 0, Some(c))),
            (vec![c], 1, 2, 2, (vec![], 0, Some(c))),
            (vec![c], 1, 3, 2, (vec![c], 0, None)),
            (vec![a, b, c], 3, 1, 2, (vec![a, b], 0, Some(c))),
            (vec![a, b, c], 3, 90, 2, (vec![a, b, c], 0, None)),
            (vec![a, b, c], 3, 90, 120, (vec![a, b], 0, Some(c))),
            (vec![a, b, c], 10, 1, 2, (vec![a, b], 7, Some(c))),
        ];
        for (due, total, after, window, (missed, uncounted, fire)) in table {
            clock.set(c + chrono::Duration::seconds(*after));
            let got = settle(
                due.clone(),
                *total,
                clock.now(),
                Duration::from_secs(*window),
            );
            let want = Settled {
                missed: missed.clone(),
                uncounted: *uncounted,
                fire: *fire,
            };
            assert_eq!(got, want, "due {due:?}, {after}s late, window {window}s");
        }
    }

    #[test]
    fn due_lists_every_occurrence_that_came_due_and_the_next() {
        let s = every_minute();
        let clock = ManualClock::new(t("2026-01-01T10:00:00.500Z"));
        let first = t("2026-01-01T10:00:00Z");
        let (list, total, next) = due(&s, first, s.next_after(first), clock.now());
        assert_eq!(
            (list, total, next),
            (vec![first], 1, Some(t("2026-01-01T10:01:00Z")))
        );
        clock.set(t("2026-01-01T10:02:30Z"));
        let (list, total, next) = due(&s, first, s.next_after(first), clock.now());
        assert_eq!(
            list,
            vec![first, t("2026-01-01T10:01:00Z"), t("2026-01-01T10:02:00Z")]
        );
        assert_eq!(total, 3);
        assert_eq!(next, Some(t("2026-01-01T10:03:00Z")));
    }

    #[test]
    fn catch_up_runs_the_latest_within_the_window_only() {
        let s = every_minute();
        let last = t("2026-01-01T09:00:00Z");
        let clock = ManualClock::new(t("2026-01-01T09:03:30Z"));
        let none = catch_up(&s, last, clock.now(), Duration::ZERO);
        assert_eq!(none.fire, None);
        assert_eq!(none.missed.len(), 3);
        let hour = catch_up(&s, last, clock.now(), Duration::from_secs(3600));
        assert_eq!(hour.fire, Some(t("2026-01-01T09:03:00Z")));
        assert_eq!(hour.missed.len(), 2);
        // Within ON_TIME of the latest: it runs even with no catch-up.
        clock.set(t("2026-01-01T09:03:01Z"));
        let just = catch_up(&s, last, clock.now(), Duration::ZERO);
        assert_eq!(just.fire, Some(t("2026-01-01T09:03:00Z")));
    }

    #[test]
    fn overlap_decides_from_the_policy_and_the_goal_state() {
        use Decision as D;
        use Overlap as O;
        // (overlap, busy, queued) → decision
        let table = [
            (O::Skip, false, false, D::Start),
            (O::Queue, false, true, D::Start),
            (O::Replace, false, false, D::Start),
            (O::Allow, true, true, D::Start),
            (O::Skip, true, false, D::Skip),
            (O::Queue, true, false, D::Queue),
            (O::Queue, true, true, D::Skip),
            (O::Replace, true, false, D::Replace),
            (O::Replace, true, true, D::Replace),
        ];
        for (o, busy, queued, want) in table {
            assert_eq!(
                overlap(o, busy, queued),
                want,
                "{o:?} busy {busy} queued {queued}"
            );
        }
    }

    #[test]
    fn jitter_is_a_share_of_the_goal_s_jitter() {
        let j = Duration::from_secs(10);
        assert_eq!(jitter(j, 0.0), Duration::ZERO);
        assert_eq!(jitter(j, 0.5), Duration::from_secs(5));
        assert_eq!(jitter(j, 7.0), j);
        let at = t("2026-01-01T10:00:00Z");
        assert_eq!(jitter_wait("g", at, Duration::ZERO), Duration::ZERO);
        let minute = chrono::Duration::minutes(1);
        let waits: Vec<Duration> = (0..100)
            .map(|i| jitter_wait("g", at + minute * i, j))
            .collect();
        assert!(waits.iter().all(|w| *w <= j), "{waits:?}");
        // The same for the same goal and occurrence, wherever it is worked out.
        assert_eq!(jitter_wait("g", at, j), waits[0]);
        // Spread over the bound: occurrences and goals each wait their own time.
        let mut distinct = waits.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 90, "{waits:?}");
        assert!(waits.iter().any(|w| *w < j / 4), "{waits:?}");
        assert!(waits.iter().any(|w| *w > j * 3 / 4), "{waits:?}");
        assert_ne!(jitter_wait("g", at, j), jitter_wait("h", at, j));
    }

    #[test]
    fn stable_hash_separates_its_parts() {
        assert_ne!(stable_hash(&["ab", "c"]), stable_hash(&["a", "bc"]));
        assert_eq!(stable_hash(&["a", "b"]), stable_hash(&["a", "b"]));
    }
}
