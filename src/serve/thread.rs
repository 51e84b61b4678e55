//! The part of a run's page that says how it ties to others and what it left in git: the run
//! it continued (or that continued it), a parallel run's attempts, a worktree run's branch,
//! commit, diff summary and the diff itself (read from the repository, escaped like
//! everything else that came from a run).

use maud::{Markup, html};

use crate::store::db::{Db, RunRow};
use crate::store::lineage::Lineage;

/// What the page shows; empty for a run of a fleet's store.
#[derive(Default)]
pub(crate) struct Shown {
    lineage: Lineage,
    continued_by: Option<String>,
    attempts: Vec<(u32, RunRow)>,
    diff: Option<String>,
}

/// The most of a diff the page shows.
const MAX_DIFF: usize = 256 * 1024;

/// Read what run `id`'s page shows of its lineage and worktree.
pub(crate) fn load(db: &Db, id: &str) -> Shown {
    let lineage = db.lineage(id).unwrap_or_default();
    let diff = match (&lineage.repo, &lineage.base, &lineage.commit) {
        (Some(repo), Some(base), Some(commit)) => {
            crate::run::worktree::diff(std::path::Path::new(repo), base, commit)
                .ok()
                .map(|mut d| {
                    if d.len() > MAX_DIFF {
                        let mut cut = MAX_DIFF;
                        while !d.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        d.truncate(cut);
                        d.push_str("\n[… the rest is cut; `sup show RUN_ID --diff` prints it all]");
                    }
                    d
                })
        }
        _ => None,
    };
    Shown {
        continued_by: db.continued_by(id).ok().flatten(),
        attempts: db.attempts(id).unwrap_or_default(),
        lineage,
        diff,
    }
}

/// The section, or nothing when the run is on its own and not isolated.
pub(crate) fn section(s: &Shown) -> Markup {
    let l = &s.lineage;
    html! {
        @if l.continued_from.is_some() || s.continued_by.is_some() || l.parent.is_some() {
            dl.summary.thread {
                @if let Some(from) = &l.continued_from {
                    dt { "Continued from" } dd { a href={ "/runs/" (from) } { (from) } }
                }
                @if let Some(by) = &s.continued_by {
                    dt { "Continued by" } dd { a href={ "/runs/" (by) } { (by) } }
                }
                @if let (Some(p), Some(n)) = (&l.parent, l.attempt) {
                    dt { "Attempt" } dd { (n) " of " a href={ "/runs/" (p) } { (p) } }
                }
            }
        }
        @if !s.attempts.is_empty() {
            h2 { "Attempts" }
            table.attempts {
                thead { tr { th { "Attempt" } th { "Run" } th { "Outcome" } } }
                tbody {
                    @for (n, r) in &s.attempts {
                        tr class=(if r.status == crate::store::RunStatus::Achieved { "ok" } else { "err" }) {
                            td { (n) @if l.attempt == Some(*n) { " · wins" } }
                            td { a href={ "/runs/" (r.id) } { (r.id) } }
                            td { (r.status) @if let Some(e) = &r.error { " · " (crate::serve::render::clean(e)) } }
                        }
                    }
                }
            }
        }
        @if let Some(branch) = &l.branch {
            h2 { "Worktree" }
            p { "Branch " code { (branch) }
                @if let Some(c) = &l.commit { " · commit " code { (c) } } }
            @if let Some(stat) = &l.diff_stat { pre.diffstat { (crate::serve::render::clean(stat)) } }
            @if let Some(d) = &s.diff { pre.diff { (crate::serve::render::clean(d)) } }
        }
    }
}
