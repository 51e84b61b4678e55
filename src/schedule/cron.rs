//! Cron schedules in a time zone: standard 5-field expressions with an optional leading
//! seconds field, `L`, `W`, `#`, names, and day-of-month OR day-of-week as classic cron,
//! parsed by `croner` and evaluated in an IANA zone from `chrono-tz`. Across DST a time in the
//! spring-forward gap runs right after the gap, and a time in the fall-back overlap once.
//! Schedules are shared: every goal with the same expression and zone holds one `Schedule`,
//! checked once (it must fire within five years), and every zone of an expression one parse
//! (croner keeps a table of every year in each, about 10 KB): ten thousand goals at
//! `0 9 * * *` hold one.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

/// A checked cron expression in a zone; cheap to clone, shared by every goal that has it.
#[derive(Clone, Debug)]
pub(crate) struct Schedule(Arc<Parsed>);

#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) expr: String,
    pub(crate) tz: Tz,
    cron: Arc<Cron>,
}

impl Deref for Schedule {
    type Target = Parsed;
    fn deref(&self) -> &Parsed {
        &self.0
    }
}

/// What is parsed, while anything holds it: expressions, and schedules by expression and zone.
#[derive(Default)]
struct Shared {
    crons: HashMap<String, Weak<Cron>>,
    schedules: HashMap<(String, Tz), Weak<Parsed>>,
}

fn shared() -> std::sync::MutexGuard<'static, Shared> {
    static SHARED: OnceLock<Mutex<Shared>> = OnceLock::new();
    SHARED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Forget what nothing holds any more, now and then (when the map has doubled).
fn forget<K, V>(map: &mut HashMap<K, Weak<V>>) {
    if map.len() >= 64 && map.len().is_power_of_two() {
        map.retain(|_, v| v.strong_count() > 0);
    }
}

/// The parsed form of `expr`, shared with every other schedule of the same text.
fn cron_of(shared: &mut Shared, expr: &str) -> Result<Arc<Cron>, String> {
    if let Some(cron) = shared.crons.get(expr).and_then(Weak::upgrade) {
        return Ok(cron);
    }
    let cron = Arc::new(
        CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expr)
            .map_err(|e| format!("`{expr}` is not a valid cron expression: {e}"))?,
    );
    forget(&mut shared.crons);
    shared.crons.insert(expr.to_string(), Arc::downgrade(&cron));
    Ok(cron)
}

impl Schedule {
    /// Parse `expr` (5 or 6 fields) for zone `tz`, or share the schedule parsed before.
    pub(crate) fn parse(expr: &str, tz: Tz) -> Result<Schedule, String> {
        let mut shared = shared();
        let key = (expr.to_string(), tz);
        if let Some(parsed) = shared.schedules.get(&key).and_then(Weak::upgrade) {
            return Ok(Schedule(parsed));
        }
        let fields = expr.split_whitespace().count();
        if !expr.trim_start().starts_with('@') && !(5..=6).contains(&fields) {
            return Err(format!(
                "`{expr}` has {fields} fields; a schedule has 5 (minute hour day month weekday) \
                 or 6 (seconds first)"
            ));
        }
        let cron = cron_of(&mut shared, expr)?;
        let schedule = Schedule(Arc::new(Parsed {
            expr: expr.to_string(),
            tz,
            cron,
        }));
        // A schedule that never fires is a mistake (`0 0 31 2 *`: February has no 31st).
        let now = Utc::now();
        let horizon = now + chrono::Duration::days(5 * 366);
        match schedule.next_after(now) {
            Some(next) if next <= horizon => {}
            _ => {
                return Err(format!(
                    "`{expr}` has no occurrence in the next five years; check its day, month \
                     and weekday fields"
                ));
            }
        }
        forget(&mut shared.schedules);
        shared.schedules.insert(key, Arc::downgrade(&schedule.0));
        Ok(schedule)
    }

    /// The same for every goal that shares this schedule (while any holds it).
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// Whether two schedules are the same expression in the same zone.
    pub(crate) fn same(&self, other: &Schedule) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || (self.expr == other.expr && self.tz == other.tz)
    }

    /// The first occurrence strictly after `t`.
    pub(crate) fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// The next `n` occurrences after `t`.
    pub(crate) fn upcoming(&self, t: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n);
        let mut at = t;
        while out.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    out.push(next);
                    at = next;
                }
                None => break,
            }
        }
        out
    }

    /// Occurrences in `(from, to]`, at most `cap` of them (the latest ones), and how many
    /// there were in all.
    pub(crate) fn between(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        cap: usize,
    ) -> (Vec<DateTime<Utc>>, usize) {
        let mut all = std::collections::VecDeque::new();
        let mut total = 0;
        let mut at = from;
        while let Some(next) = self.next_after(at) {
            if next > to {
                break;
            }
            total += 1;
            all.push_back(next);
            if all.len() > cap {
                all.pop_front();
            }
            at = next;
        }
        (all.into(), total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    /// The occurrences of `expr` in zone `tz` after `after` are `want`, in that zone.
    fn upcoming(expr: &str, tz: &str, after: &str, want: &[&str]) {
        let zone = crate::config::parse_zone(tz).unwrap();
        let got: Vec<String> = Schedule::parse(expr, zone)
            .unwrap()
            .upcoming(utc(after), want.len())
            .into_iter()
            .map(|t| t.with_timezone(&zone).to_rfc3339())
            .collect();
        assert_eq!(got, want, "{expr} in {tz} after {after}");
    }

    #[test]
    fn five_and_six_fields() {
        upcoming(
            "0 9 * * MON-FRI",
            "UTC",
            "2026-11-27T10:00:00Z",
            &["2026-11-30T09:00:00+00:00", "2026-12-01T09:00:00+00:00"],
        );
        upcoming(
            "*/20 * * * * *",
            "UTC",
            "2026-11-27T10:00:00Z",
            &[
                "2026-11-27T10:00:20+00:00",
                "2026-11-27T10:00:40+00:00",
                "2026-11-27T10:01:00+00:00",
            ],
        );
    }

    #[test]
    fn last_weekday_and_nth() {
        // L: the last day of the month.
        upcoming(
            "0 0 L * *",
            "UTC",
            "2026-02-01T00:00:00Z",
            &["2026-02-28T00:00:00+00:00"],
        );
        // W: the weekday closest to the 15th (2026-11-15 is a Sunday → Monday the 16th).
        upcoming(
            "0 0 15W * *",
            "UTC",
            "2026-11-01T00:00:00Z",
            &["2026-11-16T00:00:00+00:00"],
        );
        // #: the second Tuesday.
        upcoming(
            "0 0 * * TUE#2",
            "UTC",
            "2026-11-01T00:00:00Z",
            &["2026-11-10T00:00:00+00:00"],
        );
    }

    #[test]
    fn day_of_month_or_day_of_week() {
        // The 1st of the month OR any Monday, as classic cron.
        upcoming(
            "0 0 1 * MON",
            "UTC",
            "2026-11-25T00:00:00Z",
            &[
                "2026-11-30T00:00:00+00:00",
                "2026-12-01T00:00:00+00:00",
                "2026-12-07T00:00:00+00:00",
            ],
        );
    }

    #[test]
    fn spring_forward_gap_runs_right_after_the_gap() {
        // 2026-03-08 02:30 does not exist in New York; the run comes at 03:00 EDT.
        upcoming(
            "30 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            &["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"],
        );
        upcoming(
            "30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00:00Z",
            &["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
        );
    }

    #[test]
    fn fall_back_overlap_runs_once() {
        // 01:30 happens twice in New York on 2026-11-01; the job runs once.
        upcoming(
            "30 1 * * *",
            "America/New_York",
            "2026-10-31T12:00:00Z",
            &["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"],
        );
        upcoming(
            "30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            &["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
        );
    }

    #[test]
    fn schedules_of_one_expression_share_its_parse() {
        let a = Schedule::parse("0 9 * * MON-FRI", Tz::UTC).unwrap();
        let b = Schedule::parse(
            "0 9 * * MON-FRI",
            crate::config::parse_zone("Asia/Shanghai").unwrap(),
        )
        .unwrap();
        let c = Schedule::parse("0 10 * * MON-FRI", Tz::UTC).unwrap();
        assert!(Arc::ptr_eq(&a.cron, &b.cron));
        assert!(!Arc::ptr_eq(&a.cron, &c.cron));
        // One expression in one zone is one schedule, checked once.
        let a2 = Schedule::parse("0 9 * * MON-FRI", Tz::UTC).unwrap();
        assert!(Arc::ptr_eq(&a.0, &a2.0));
        assert!(!Arc::ptr_eq(&a.0, &b.0));
        // Each still counts in its own zone.
        let t = utc("2026-11-27T00:00:00Z");
        assert_eq!(a.next_after(t).unwrap(), utc("2026-11-27T09:00:00Z"));
        assert_eq!(b.next_after(t).unwrap(), utc("2026-11-27T01:00:00Z"));
        // Once no schedule holds it, it is parsed anew.
        let weak = Arc::downgrade(&c.cron);
        drop(c);
        assert!(weak.upgrade().is_none());
        let c = Schedule::parse("0 10 * * MON-FRI", Tz::UTC).unwrap();
        assert_eq!(c.next_after(t).unwrap(), utc("2026-11-27T10:00:00Z"));
    }

    #[test]
    fn bad_expressions_say_why() {
        let e = Schedule::parse("0 9 * *", Tz::UTC).unwrap_err();
        assert!(e.contains("4 fields"), "{e}");
        let e = Schedule::parse("0 25 * * *", Tz::UTC).unwrap_err();
        assert!(e.contains("not a valid cron"), "{e}");
        assert!(
            crate::config::parse_zone("Mars/Olympus")
                .unwrap_err()
                .contains("IANA")
        );
    }
}
