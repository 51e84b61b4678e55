//! The stored vocabulary: every state the store keeps as text (run status, stop reason,
//! trigger kind, occurrence status, approval kind and status) as an enum (`words!`), with its
//! SQL conversion written once, here.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

use crate::trace::{Status, StopReason};
use crate::words::words;

/// The SQL conversions of a stored word (a type with `as_str` and `parse`), for SQLite and
/// PostgreSQL: written as its text, read back checked.
macro_rules! sql_text {
    ($name:ident) => {
        impl ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }

        impl tokio_postgres::types::ToSql for $name {
            fn to_sql(
                &self,
                ty: &tokio_postgres::types::Type,
                out: &mut bytes::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
            {
                <&str as tokio_postgres::types::ToSql>::to_sql(&self.as_str(), ty, out)
            }
            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <&str as tokio_postgres::types::ToSql>::accepts(ty)
            }
            tokio_postgres::types::to_sql_checked!();
        }

        impl<'a> tokio_postgres::types::FromSql<'a> for $name {
            fn from_sql(
                ty: &tokio_postgres::types::Type,
                raw: &'a [u8],
            ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                let s = <&str as tokio_postgres::types::FromSql>::from_sql(ty, raw)?;
                $name::parse(s).ok_or_else(|| {
                    format!(
                        "`{s}` is not a {} this version of sup knows",
                        stringify!($name)
                    )
                    .into()
                })
            }
            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <&str as tokio_postgres::types::FromSql>::accepts(ty)
            }
        }

        impl FromSql for $name {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                let s = value.as_str()?;
                $name::parse(s).ok_or_else(|| {
                    FromSqlError::Other(
                        format!(
                            "`{s}` is not a {} this version of sup knows",
                            stringify!($name)
                        )
                        .into(),
                    )
                })
            }
        }
    };
}

words! {
    /// A run's status in the store: `running` until it ends, then its outcome's.
    pub enum RunStatus {
        Running = "running",
        Achieved = "achieved",
        Failed = "failed",
        Unfinished = "unfinished",
        Error = "error",
        Interrupted = "interrupted",
    }
}

impl From<Status> for RunStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Achieved => RunStatus::Achieved,
            Status::Failed => RunStatus::Failed,
            Status::Unfinished => RunStatus::Unfinished,
            Status::Error => RunStatus::Error,
            Status::Interrupted => RunStatus::Interrupted,
        }
    }
}

words! {
    /// What started a run.
    pub enum TriggerKind {
        /// `sup run`, `sup goal`.
        Cli = "cli",
        /// The daemon, at an occurrence.
        Schedule = "schedule",
        /// `sup trigger`.
        Manual = "manual",
        /// A fleet's retry of a run its dead daemon left (a trigger's kind; it runs as `manual`).
        Retry = "retry",
        /// A signed `POST /hooks/GOAL` on the console.
        Webhook = "webhook",
        /// The daemon, after a change to a file the goal's `watch` globs match.
        Watch = "watch",
    }
}

words! {
    /// What became of a claimed schedule occurrence.
    pub enum OccurrenceStatus {
        Claimed = "claimed",
        /// Passed while no daemon ran, outside the catch-up window.
        Missed = "missed",
        Paused = "paused",
        /// The last run was still going (overlap `skip`), or one already waited.
        Skipped = "skipped",
        /// Waits behind the running one (overlap `queue`).
        Queued = "queued",
        Running = "running",
        Done = "done",
    }
}

words! {
    /// What an approval request asks about.
    pub enum ApprovalKind {
        /// A call waiting for a yes.
        Tool = "tool",
        /// A person as a check.
        Check = "check",
    }
}

words! {
    /// Where an approval request stands.
    pub enum ApprovalStatus {
        Pending = "pending",
        Approved = "approved",
        Denied = "denied",
        TimedOut = "timed_out",
        Cancelled = "cancelled",
    }
}

sql_text!(RunStatus);
sql_text!(StopReason);
sql_text!(TriggerKind);
sql_text!(OccurrenceStatus);
sql_text!(ApprovalKind);
sql_text!(ApprovalStatus);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_reads_back_as_text_json_and_sql() {
        fn round<T>(all: &[T])
        where
            T: Copy + PartialEq + std::fmt::Debug + ToSql + FromSql + serde::Serialize,
            T: serde::de::DeserializeOwned + std::str::FromStr + std::fmt::Display,
        {
            let conn = rusqlite::Connection::open_in_memory().unwrap();
            for v in all {
                let text = v.to_string();
                assert_eq!(text.parse::<T>().ok(), Some(*v));
                let json = serde_json::to_string(v).unwrap();
                assert_eq!(json, format!("\"{text}\""));
                assert_eq!(serde_json::from_str::<T>(&json).unwrap(), *v);
                let back: T = conn.query_row("SELECT ?1", [v], |r| r.get(0)).unwrap();
                assert_eq!(back, *v);
                let raw: String = conn.query_row("SELECT ?1", [v], |r| r.get(0)).unwrap();
                assert_eq!(raw, text);
            }
        }
        round(RunStatus::ALL);
        round(TriggerKind::ALL);
        round(OccurrenceStatus::ALL);
        round(ApprovalKind::ALL);
        round(ApprovalStatus::ALL);
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for r in StopReason::ALL {
            let back: StopReason = conn.query_row("SELECT ?1", [r], |row| row.get(0)).unwrap();
            assert_eq!(back, *r);
            assert_eq!(serde_json::to_string(r).unwrap(), format!("\"{r}\""));
        }
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let e = conn
            .query_row("SELECT 'sleeping'", [], |r| r.get::<_, RunStatus>(0))
            .unwrap_err();
        assert!(e.to_string().contains("sleeping"), "{e}");
        assert!(
            "nope"
                .parse::<TriggerKind>()
                .unwrap_err()
                .contains("cli, schedule, manual, retry, webhook, watch")
        );
    }
}
