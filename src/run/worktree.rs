//! A run isolated in a git worktree (`isolation = "worktree"`, implied by `parallel`): the
//! repository holding the workspace is found (it must have a commit), a fresh worktree is made
//! under `SUP_HOME/worktrees/RUN_ID` on a new branch `sup/GOAL/RUN_ID` from the current HEAD,
//! and the run's agent and checks work there. At the end the agent's work becomes one commit
//! on that branch (its message naming the goal, the outcome and the run id), `keep` decides
//! whether the branch stays, and the worktree folder is removed. The person's working tree,
//! index and branches are never touched: only `git worktree` and the new branch are.
//! A run's folder is locked (`flock`) while a run works in it; a folder left by a run that
//! was killed is swept at the next start: its work committed on its branch, the folder removed.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::fcntl::{Flock, FlockArg};

use crate::config::{Isolation, Keep, Settings};
use crate::trace::Status;

#[derive(Debug, thiserror::Error)]
pub(crate) enum WorktreeError {
    #[error(
        "isolation = \"worktree\": the workspace {0} is not inside a git repository; make it \
         one (`git init`, then a first commit) or run without isolation"
    )]
    NotARepo(String),
    #[error(
        "isolation = \"worktree\": the repository {0} has no commit yet; a worktree is made \
         from HEAD, so a first commit is needed (e.g. `git commit --allow-empty -m init`)"
    )]
    NoCommit(String),
    #[error("isolation = \"worktree\": `git {args}` failed: {message}")]
    Git { args: String, message: String },
    #[error("isolation = \"worktree\": {0}")]
    Protect(String),
}

impl WorktreeError {
    /// Whether the user's setup is wrong (exit 2), rather than git failing on the machine.
    pub(crate) fn is_usage(&self) -> bool {
        !matches!(self, WorktreeError::Git { .. })
    }
}

/// The git repository holding a workspace.
#[derive(Clone, Debug)]
pub(crate) struct Repo {
    /// Its top folder, canonical.
    pub(crate) top: PathBuf,
    /// The workspace's path inside it (empty at the top).
    sub: PathBuf,
}

/// How a run is isolated, resolved from its settings.
#[derive(Clone, Debug, Default)]
pub(crate) struct Isolate {
    /// The repository, when the run works in a worktree.
    pub(crate) repo: Option<Repo>,
    pub(crate) keep: Keep,
    /// Attempts at once (1: a single run).
    pub(crate) parallel: u32,
    /// The branch a continued run goes on with.
    pub(crate) resume: Option<Resume>,
}

/// Where a continued run picks its worktree up: the folder the interrupted run left (its
/// uncommitted work in it), else its branch made again at its last commit.
#[derive(Clone, Debug)]
pub(crate) struct Resume {
    pub(crate) branch: String,
    pub(crate) base: String,
    pub(crate) commit: Option<String>,
    pub(crate) path: PathBuf,
}

impl Isolate {
    /// `isolation`, `keep` and `parallel` of `s`, with the repository of `workspace` found.
    pub(crate) fn resolve(s: &Settings, workspace: &Path) -> Result<Isolate, WorktreeError> {
        let parallel = s.parallel.unwrap_or(1).max(1);
        let isolated = s.isolation == Some(Isolation::Worktree) || parallel > 1;
        Ok(Isolate {
            repo: if isolated {
                Some(Repo::of(workspace)?)
            } else {
                None
            },
            keep: s.keep.unwrap_or_default(),
            parallel,
            resume: None,
        })
    }
}

/// Run git in `dir` with the environment's git variables left out (they would point it
/// elsewhere), and no hooks or automatic maintenance (the repository's `post-checkout` or a
/// background `gc` are not sup's to run); its output, trimmed, or what it said on failure.
fn git(dir: &Path, args: &[&str]) -> Result<String, WorktreeError> {
    let mut cmd = Command::new("git");
    cmd.arg("-C").arg(dir).args([
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "maintenance.auto=false",
        "-c",
        "gc.auto=0",
    ]);
    cmd.args(args);
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_COMMON_DIR",
        "GIT_CEILING_DIRECTORIES",
    ] {
        cmd.env_remove(var);
    }
    // The commit is sup's, for the agent: no identity of the person is needed or used.
    cmd.env("GIT_AUTHOR_NAME", "sup")
        .env("GIT_AUTHOR_EMAIL", "sup@localhost")
        .env("GIT_COMMITTER_NAME", "sup")
        .env("GIT_COMMITTER_EMAIL", "sup@localhost")
        .stdin(std::process::Stdio::null());
    let shown = || args.join(" ");
    let out = cmd.output().map_err(|e| WorktreeError::Git {
        args: shown(),
        message: format!("cannot run git: {e}"),
    })?;
    if !out.status.success() {
        return Err(WorktreeError::Git {
            args: shown(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

impl Repo {
    /// The repository holding `workspace`, which must have a commit.
    pub(crate) fn of(workspace: &Path) -> Result<Repo, WorktreeError> {
        let shown = workspace.display().to_string();
        let top = git(workspace, &["rev-parse", "--show-toplevel"])
            .map_err(|_| WorktreeError::NotARepo(shown.clone()))?;
        let top = std::fs::canonicalize(&top).map_err(|_| WorktreeError::NotARepo(shown))?;
        if git(&top, &["rev-parse", "--verify", "-q", "HEAD^{commit}"]).is_err() {
            return Err(WorktreeError::NoCommit(top.display().to_string()));
        }
        let sub = workspace
            .strip_prefix(&top)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Ok(Repo { top, sub })
    }
}

/// `sup/GOAL/RUN_ID`, the goal's name made a valid ref component.
pub(crate) fn branch_name(goal: &str, run_id: &str) -> String {
    let mut name: String = goal
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    name = name.trim_matches('-').to_string();
    if name.is_empty() {
        name = "goal".into();
    }
    format!("sup/{name}/{run_id}")
}

/// A run's worktree while it works. Dropped unfinished (the run could not start), it is
/// removed with its branch.
pub(crate) struct Worktree {
    top: PathBuf,
    path: PathBuf,
    pub(crate) branch: String,
    /// The commit the branch started from.
    pub(crate) base: String,
    /// Where the agent works: the workspace's place inside the worktree.
    workspace: PathBuf,
    /// Whether the branch was made for this run (and so goes with it when it cannot start).
    made_branch: bool,
    done: bool,
    /// The folder's lock, held while the run works there: no sweep removes it meanwhile.
    _lock: Option<Flock<File>>,
}

/// What a finished worktree left.
#[derive(Clone, Debug, Default)]
pub(crate) struct Finished {
    /// The branch, when it stays.
    pub(crate) branch: Option<String>,
    pub(crate) commit: Option<String>,
    pub(crate) diff_stat: String,
}

impl Worktree {
    /// A fresh worktree for run `run_id` of `goal`, from HEAD, or a continued run's.
    pub(crate) fn add(
        iso: &Isolate,
        repo: &Repo,
        home: &Path,
        goal: &str,
        run_id: &str,
    ) -> Result<Worktree, WorktreeError> {
        let root = home.join("worktrees");
        std::fs::create_dir_all(&root).map_err(|e| WorktreeError::Git {
            args: "worktree add".into(),
            message: format!("cannot create {}: {e}", root.display()),
        })?;
        let root = std::fs::canonicalize(&root).unwrap_or(root);
        // The interrupted run's folder is locked before it is looked at: a sweep that holds
        // it now removes it, and then it is made again below.
        let held = iso
            .resume
            .as_ref()
            .and_then(|r| lock(&r.path, FlockArg::LockExclusive));
        let (path, branch, base, made_branch, lock_) = match &iso.resume {
            // The interrupted run's folder, with what it left uncommitted.
            Some(r) if held.is_some() && r.path.join(".git").exists() => (
                r.path.clone(),
                r.branch.clone(),
                r.base.clone(),
                false,
                held,
            ),
            Some(r) => {
                // Where the interrupted run worked: the worktree's `.git` names the folder,
                // and the exam compares it with what the first run started from.
                let path = r
                    .path
                    .file_name()
                    .map_or_else(|| r.path.clone(), |n| root.join(n));
                // The branch as a sweep left it (the killed run's work committed on it),
                // else the run's last commit.
                let tip = format!("refs/heads/{}", r.branch);
                let at = git(&repo.top, &["rev-parse", "--verify", "-q", &tip])
                    .ok()
                    .or_else(|| r.commit.clone())
                    .unwrap_or_else(|| r.base.clone());
                git(
                    &repo.top,
                    &["worktree", "add", "-q", "-B", &r.branch, &s(&path), &at],
                )?;
                let l = lock(&path, FlockArg::LockExclusive);
                (path, r.branch.clone(), r.base.clone(), false, l)
            }
            None => {
                let path = root.join(run_id);
                let branch = branch_name(goal, run_id);
                let base = git(&repo.top, &["rev-parse", "HEAD^{commit}"])?;
                git(
                    &repo.top,
                    &["worktree", "add", "-q", "-b", &branch, &s(&path), &base],
                )?;
                let l = lock(&path, FlockArg::LockExclusive);
                (path, branch, base, true, l)
            }
        };
        // What `keep` is, for a sweep after this run is killed.
        let kept = serde_json::to_string(&iso.keep).unwrap_or_default();
        let _ = std::fs::write(home.join("runs").join(run_id).join(KEEP_FILE), kept);
        let mut tree = Worktree {
            top: repo.top.clone(),
            workspace: path.join(&repo.sub),
            path,
            branch,
            base,
            made_branch,
            done: false,
            _lock: lock_,
        };
        // A workspace folder that HEAD does not hold (untracked) is made empty.
        if let Err(e) = std::fs::create_dir_all(&tree.workspace) {
            tree.remove();
            return Err(WorktreeError::Git {
                args: "worktree add".into(),
                message: format!("cannot create {}: {e}", tree.workspace.display()),
            });
        }
        if let Ok(w) = std::fs::canonicalize(&tree.workspace) {
            tree.workspace = w;
        }
        Ok(tree)
    }

    /// Commit the agent's work as one commit on the branch, keep the branch or not, remove
    /// the folder.
    pub(crate) fn finish(
        mut self,
        goal: &str,
        status: Status,
        run_id: &str,
        keep: Keep,
    ) -> Finished {
        self.done = true;
        let mut out = Finished::default();
        let message = format!("sup {goal}: {} · run {run_id}", status.as_str());
        let kept = match keep {
            Keep::Always => true,
            Keep::Never => false,
            Keep::Achieved => status == Status::Achieved,
        };
        let committed = commit_work(&self.path, &message, &self.base).and_then(|sha| {
            if kept {
                let tip = format!("refs/heads/{}", self.branch);
                git(&self.path, &["update-ref", &tip, &sha])?;
            }
            Ok(sha)
        });
        // The folder goes first: its files are removed while the rest is told.
        self.remove_folder();
        match committed {
            Ok(sha) => {
                out.diff_stat =
                    git(&self.top, &["diff", "--stat", &self.base, &sha]).unwrap_or_default();
                out.commit = Some(sha);
            }
            Err(e) => tracing::error!("run {run_id}: the agent's work was not committed: {e}"),
        }
        if kept && out.commit.is_some() {
            out.branch = Some(self.branch.clone());
        } else if let Err(e) = git(&self.top, &["branch", "-q", "-D", &self.branch]) {
            tracing::warn!(
                "run {run_id}: cannot delete the branch {}: {e}",
                self.branch
            );
        }
        out
    }

    fn remove_folder(&self) {
        remove_worktree(&self.top, &self.path);
    }

    fn remove(&mut self) {
        self.done = true;
        self.remove_folder();
        if self.made_branch {
            let _ = git(&self.top, &["branch", "-q", "-D", &self.branch]);
        }
    }
}

impl Drop for Worktree {
    fn drop(&mut self) {
        if !self.done {
            self.remove();
        }
    }
}

/// The spec and goal of run `run_id` moved into a fresh worktree, with the worktree; `None`
/// for a run that is not isolated.
pub(crate) fn isolate(
    spec: &super::RunSpec,
    goal: &crate::verify::Goal,
    home: &Path,
    run_id: &str,
) -> Result<Option<(super::RunSpec, crate::verify::Goal, Worktree)>, WorktreeError> {
    let Some(repo) = &spec.isolate.repo else {
        return Ok(None);
    };
    let tree = Worktree::add(&spec.isolate, repo, home, &spec.goal.name, run_id)?;
    let old = crate::verify::default_system(&spec.goal.workspace);
    let new = crate::verify::default_system(&tree.workspace);
    let mut spec = spec.clone();
    let mut goal = goal.clone();
    spec.goal.workspace = tree.workspace.clone();
    goal.workspace = tree.workspace.clone();
    // What the goal protects, it protects in the worktree.
    let protect = std::sync::Arc::new(
        crate::tools::Protected::new(
            &tree.workspace,
            &spec.goal.protect.patterns,
            &spec.sandbox.writable,
        )
        .map_err(WorktreeError::Protect)?,
    );
    spec.goal.protect = protect.clone();
    goal.protect = protect;
    // The default system prompt names the workspace: the worktree's now.
    if spec.system_src.text == old {
        spec.system_src.text = new.clone();
        spec.goal.system = new.clone();
    }
    if goal.system == old {
        goal.system = new;
    }
    Ok(Some((spec, goal, tree)))
}

/// The file of a run's folder that says what its `keep` is.
const KEEP_FILE: &str = "worktree-keep";

/// The lock of a worktree folder (`flock` on the folder itself); `None` when it is held
/// elsewhere (with `LockExclusiveNonblock`) or the folder is gone.
fn lock(path: &Path, how: FlockArg) -> Option<Flock<File>> {
    let dir = File::open(path).ok()?;
    Flock::lock(dir, how).ok()
}

/// At start-up: the worktree folders of runs that are over (killed with `kill -9`, crashed,
/// and so never finished) are removed. A folder's run is over when no run holds its lock and
/// the store has the run not running. What the run left uncommitted is committed on its
/// branch first (`sup continue` goes on from it), and the branch stays unless the run's
/// `keep` is `"never"`: a killed run may still be continued, and `keep` decides at its end.
/// Returns how many folders were removed.
pub(crate) fn sweep_dead(home: &Path, db: &crate::store::db::Db) -> usize {
    let Ok(entries) = std::fs::read_dir(home.join("worktrees")) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let id = entry.file_name().to_string_lossy().into_owned();
        if id == REMOVED {
            // Folders whose removal was cut short (the process that removed them was killed).
            for gone in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                remove_later(&gone.path());
            }
            continue;
        }
        // Held: a run works there. Not held but no row yet: a run is just starting.
        let Some(held) = lock(&path, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        let Ok(row) = db.run(&id) else {
            continue;
        };
        if row.status == crate::store::RunStatus::Running {
            continue;
        }
        let Ok(lineage) = db.lineage(&id) else {
            continue;
        };
        let Some(top) = lineage.repo.as_deref().map(PathBuf::from) else {
            continue;
        };
        if let (Some(branch), Some(base)) = (&lineage.branch, &lineage.base)
            && path.join(".git").exists()
        {
            let message = format!("sup {}: {} · run {id}", row.goal, row.status.as_str());
            let tip = format!("refs/heads/{branch}");
            let committed = commit_work(&path, &message, base)
                .and_then(|sha| git(&path, &["update-ref", &tip, &sha]).map(|_| sha));
            match committed {
                Ok(sha) => {
                    let l = crate::store::lineage::Lineage {
                        commit: Some(sha),
                        ..Default::default()
                    };
                    if let Err(e) = db.set_lineage(&id, &l) {
                        tracing::warn!("run {id}: cannot record its worktree's commit: {e}");
                    }
                }
                Err(e) => tracing::warn!("run {id}: its worktree's work was not committed: {e}"),
            }
            let keep = std::fs::read_to_string(home.join("runs").join(&id).join(KEEP_FILE))
                .ok()
                .and_then(|k| serde_json::from_str::<Keep>(&k).ok())
                .unwrap_or_default();
            remove_worktree(&top, &path);
            if keep == Keep::Never {
                let _ = git(&top, &["branch", "-q", "-D", branch]);
            }
        } else {
            remove_worktree(&top, &path);
        }
        drop(held);
        if !path.exists() {
            removed += 1;
            tracing::info!("run {id}: its worktree {} was removed", path.display());
        }
    }
    removed
}

/// What is in worktree `path` now (tracked or not, but not ignored), as one commit on
/// `base`, whatever the agent committed meanwhile; its id. The branch is not moved: the
/// caller says whether it stays.
fn commit_work(path: &Path, message: &str, base: &str) -> Result<String, WorktreeError> {
    git(path, &["add", "-A"])?;
    let tree = git(path, &["write-tree"])?;
    git(path, &["commit-tree", &tree, "-p", base, "-m", message])
}

/// Where removed worktree folders wait for their files to go (`SUP_HOME/worktrees/.removed`).
const REMOVED: &str = ".removed";

/// Remove the worktree folder `path` of the repository `top`, and git's record of it: the
/// folder is moved aside at once and git's record of it removed, then its files go in a
/// process of their own (thousands of files take a while; nothing waits for them). Where
/// that cannot be done, `git worktree remove` does it all.
fn remove_worktree(top: &Path, path: &Path) {
    let aside = path
        .parent()
        .zip(path.file_name())
        .map(|(root, name)| root.join(REMOVED).join(name));
    let record = record_of(path);
    let moved = match (&aside, &record) {
        (Some(aside), Some(_)) => {
            aside
                .parent()
                .is_some_and(|d| std::fs::create_dir_all(d).is_ok())
                && std::fs::rename(path, aside).is_ok()
        }
        _ => false,
    };
    if let (true, Some(aside), Some(record)) = (moved, aside, record) {
        if let Err(e) = std::fs::remove_dir_all(&record) {
            tracing::warn!("cannot remove git's record {}: {e}", record.display());
        }
        remove_later(&aside);
    } else if git(top, &["worktree", "remove", "--force", &s(path)]).is_err() {
        let _ = std::fs::remove_dir_all(path);
        let _ = git(top, &["worktree", "prune"]);
    }
}

/// Git's record of worktree `path` (`.git/worktrees/NAME`), when it names `path` back.
fn record_of(path: &Path) -> Option<PathBuf> {
    let dot_git = std::fs::read_to_string(path.join(".git")).ok()?;
    let record = PathBuf::from(dot_git.strip_prefix("gitdir:")?.trim());
    let named = std::fs::read_to_string(record.join("gitdir")).ok()?;
    let real = std::fs::canonicalize(path).ok()?;
    (Path::new(named.trim()) == real.join(".git")).then_some(record)
}

/// Remove `dir` in an `rm -rf` of its own, in a process group of its own, not waited for
/// (a thread reaps it in a process that lives on, as the daemon). A removal cut short
/// is finished by the next start's sweep.
fn remove_later(dir: &Path) {
    use std::os::unix::process::CommandExt;
    let child = Command::new("rm")
        .arg("-rf")
        .arg("--")
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    match child {
        Ok(mut c) => {
            std::thread::spawn(move || c.wait());
        }
        Err(e) => {
            tracing::warn!("cannot run rm: {e}; removing {} here", dir.display());
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The diff a run's commit holds, from its base, as `git diff` prints it.
pub(crate) fn diff(repo: &Path, base: &str, commit: &str) -> Result<String, WorktreeError> {
    git(repo, &["diff", "--no-color", base, commit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_are_valid_refs() {
        assert_eq!(branch_name("haiku", "r1"), "sup/haiku/r1");
        assert_eq!(branch_name("a b..c/d", "r1"), "sup/a-b--c-d/r1");
        assert_eq!(branch_name("..", "r1"), "sup/goal/r1");
    }
}
