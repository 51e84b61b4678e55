//! The built-in tools, all confined to the workspace: `read_file`, `write_file`, `edit_file`,
//! `list_files`, `search_files` and `run_command`. Files are opened beneath the workspace
//! (no symlink, however it flips, leads out); writes under `.git/` and to files with other
//! hard links are refused unless a rule allows them; listing and search skip what a rule
//! denies to read.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::paths::{in_git, real_path, relative, resolve};
use super::process::{self, Ending, read_capped};
use super::{About, Registry, RegistryError, Risk, Tool, ToolContext, ToolError};
use crate::model::ToolSpec;

/// Lines `read_file` returns in one page unless asked for fewer.
const PAGE_LINES: usize = 2000;
/// Entries `list_files` and matches `search_files` return at most.
const MAX_LISTED: usize = 2000;
const MAX_MATCHES: usize = 500;

/// Every built-in tool, ready to register.
pub fn register_all(registry: &mut Registry) -> Result<(), RegistryError> {
    for tool in [
        read_file_tool(),
        write_file_tool(),
        edit_file_tool(),
        list_files_tool(),
        search_files_tool(),
        run_command_tool(),
    ] {
        registry.add(Arc::new(tool))?;
    }
    Ok(())
}

/// Which built-in tool a `Builtin` is.
#[derive(Clone, Copy)]
enum Kind {
    ReadFile,
    WriteFile,
    EditFile,
    ListFiles,
    SearchFiles,
    RunCommand,
}

/// A built-in tool: which one, and what it is to the model and the gate.
struct Builtin {
    kind: Kind,
    about: About,
}

impl Builtin {
    /// A tool whose input is an object of `properties`, those `required`, and no others.
    fn new(
        kind: Kind,
        risk: Risk,
        name: &str,
        description: String,
        properties: Value,
        required: &[&str],
    ) -> Self {
        let mut input_schema = json!({"type": "object", "properties": properties});
        if !required.is_empty() {
            input_schema["required"] = json!(required);
        }
        input_schema["additionalProperties"] = json!(false);
        let spec = ToolSpec {
            name: name.into(),
            description,
            input_schema,
        };
        Builtin {
            kind,
            about: About { spec, risk },
        }
    }
}

#[async_trait]
impl Tool for Builtin {
    fn about(&self) -> &About {
        &self.about
    }
    fn approval_subject(&self, input: &Value, workspace: &Path) -> String {
        match self.kind {
            Kind::RunCommand => input
                .get("command")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            _ => super::path_subject(input, workspace),
        }
    }
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        match self.kind {
            Kind::ReadFile => read_file(parse(input)?, ctx).await,
            Kind::WriteFile => write_file(parse(input)?, ctx),
            Kind::EditFile => edit_file(parse(input)?, ctx),
            Kind::ListFiles => list_files(parse(input)?, ctx).await,
            Kind::SearchFiles => search_files(parse(input)?, ctx).await,
            Kind::RunCommand => run_command(parse(input)?, ctx).await,
        }
    }
}

fn parse<T: for<'de> Deserialize<'de>>(input: &Value) -> Result<T, ToolError> {
    serde_json::from_value(input.clone()).map_err(|e| ToolError::Invalid(e.to_string()))
}

fn io_error(what: &str, path: &str, e: std::io::Error) -> ToolError {
    if e.kind() == std::io::ErrorKind::NotFound {
        ToolError::Failed(format!("{path} does not exist"))
    } else {
        ToolError::Failed(format!("cannot {what} {path}: {e}"))
    }
}

fn refuse_protected(ctx: &ToolContext, path: &Path, rel: &str) -> Result<(), ToolError> {
    let real = relative(&ctx.workspace, path);
    if ctx.guarded.glob_matches(&real, path.is_dir()) {
        return Err(ToolError::Invalid(format!(
            "{rel} is protected (protect = [{}]): the goal's checks read it, so you may not \
             create, change or delete it; change the work so that the checks pass",
            ctx.guarded.patterns.join(", ")
        )));
    }
    // A `.git` that does not exist yet would point git at a repository of the agent's.
    if let Some(git) = ctx.guarded.git_of(&real)
        && std::fs::symlink_metadata(ctx.workspace.join(&git)).is_err()
    {
        return Err(ToolError::Invalid(format!(
            "{rel} would create {git}: no .git can be created in the workspace (it would point \
             git at another repository); a goal's `writable` can name one on purpose"
        )));
    }
    if ctx.protected.iter().any(|p| path.starts_with(p)) {
        return Err(ToolError::Invalid(format!(
            "{rel} is read-only to you: an acceptance check, goal file or configuration of sup \
             (or in the daemon's goals folder); change the work so that the check passes, not \
             the check"
        )));
    }
    Ok(())
}

/// The real target of a typed path and its workspace-relative spelling, which rules judge.
fn target(ctx: &ToolContext, typed: &str) -> Result<(PathBuf, String), ToolError> {
    let path = resolve(&ctx.workspace, typed)?;
    let rel = relative(&ctx.workspace, &path);
    Ok((path, rel))
}

/// Check where an opened file really is: inside the workspace, whatever raced.
fn opened_inside(
    ctx: &ToolContext,
    file: &std::fs::File,
    typed: &str,
) -> Result<PathBuf, ToolError> {
    match real_path(file) {
        Some(real) if real.starts_with(&ctx.workspace) => Ok(real),
        _ => Err(ToolError::Invalid(format!(
            "{typed} leads outside the workspace; nothing outside it can be read or written"
        ))),
    }
}

/// Open `rel` beneath `dir` without blocking, and only when it is a regular file: a FIFO or
/// a device the agent put in the workspace (even in place of a file, meanwhile) would
/// otherwise hang the tool, and the run with it, for good.
fn open_regular(
    dir: &cap_std::fs::Dir,
    rel: &str,
    options: &mut cap_std::fs::OpenOptions,
) -> std::io::Result<std::fs::File> {
    use cap_std::fs::OpenOptionsExt;
    let file = dir
        .open_with(rel, options.custom_flags(libc::O_NONBLOCK))?
        .into_std();
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(
            "not a regular file (a folder, FIFO, socket or device); the file tools read and \
             write regular files only",
        ));
    }
    Ok(file)
}

/// Open a file beneath the workspace for `tool`: no symlink leads out, even one that flips
/// meanwhile, and a deny rule on where it really is holds.
fn open_beneath(ctx: &ToolContext, tool: &str, typed: &str) -> Result<std::fs::File, ToolError> {
    let (_, rel) = target(ctx, typed)?;
    let file = open_regular(
        ctx.root.dir()?,
        if rel.is_empty() { "." } else { rel.as_str() },
        cap_std::fs::OpenOptions::new().read(true),
    )
    .map_err(|e| io_error("read", typed, e))?;
    let real = opened_inside(ctx, &file, typed)?;
    denied_at_open(ctx, tool, &relative(&ctx.workspace, &real), typed)?;
    Ok(file)
}

/// Read a whole file beneath the workspace for `tool` (see `open_beneath`).
fn read_beneath(ctx: &ToolContext, tool: &str, typed: &str) -> Result<Vec<u8>, ToolError> {
    use std::io::Read;
    let mut file = open_beneath(ctx, tool, typed)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| io_error("read", typed, e))?;
    Ok(bytes)
}

/// Why a write to this real path needs a rule: inside `.git`, or a file with other hard
/// links (writing it would change a file elsewhere).
fn special_write(
    ctx: &ToolContext,
    tool: &str,
    rel: &str,
    typed: &str,
    links: u64,
) -> Result<(), ToolError> {
    if in_git(rel) && !ctx.rules.allows(tool, rel) {
        return Err(ToolError::Invalid(format!(
            "{typed} is inside a .git folder, which file tools do not write (git does); an approval \
             rule `{tool}({rel})` would allow it"
        )));
    }
    if links > 1 && !ctx.rules.allows(tool, rel) {
        return Err(ToolError::Invalid(format!(
            "{typed} has {links} hard links: writing it would change the same file elsewhere, \
             so it is refused; an approval rule `{tool}({rel})` would allow it"
        )));
    }
    Ok(())
}

/// Write a whole file beneath the workspace, after the checks a write needs; says whether
/// it existed, and where it is. What changed goes to `ctx.diff` when old and new are text.
fn write_beneath(
    ctx: &ToolContext,
    tool: &str,
    typed: &str,
    content: &[u8],
) -> Result<(bool, String), ToolError> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;
    let (path, rel) = target(ctx, typed)?;
    refuse_protected(ctx, &path, typed)?;
    if rel.is_empty() || path.is_dir() {
        return Err(ToolError::Invalid(format!("{typed} is a folder")));
    }
    special_write(ctx, tool, &rel, typed, 1)?;
    let dir = ctx.root.dir()?;
    if let Some(parent) = Path::new(&rel)
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
    {
        dir.create_dir_all(parent)
            .map_err(|e| io_error("create the folders of", typed, e))?;
    }
    let existed = dir.exists(&rel);
    let open = |read| {
        open_regular(
            dir,
            &rel,
            cap_std::fs::OpenOptions::new()
                .read(read)
                .write(true)
                .create(true),
        )
    };
    // Read as well, for the diff; a file the agent may write but not read is written unseen.
    let (file, readable) = match open(true) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => (open(false), false),
        opened => (opened, true),
    };
    let mut file = file.map_err(|e| io_error("write", typed, e))?;
    let real = opened_inside(ctx, &file, typed)?;
    let meta = file.metadata().map_err(|e| io_error("write", typed, e))?;
    let real_rel = relative(&ctx.workspace, &real);
    let checked = refuse_protected(ctx, &real, typed)
        .and_then(|()| denied_at_open(ctx, tool, &real_rel, typed))
        .and_then(|()| special_write(ctx, tool, &real_rel, typed, meta.nlink()));
    if let Err(e) = checked {
        if !existed {
            let _ = dir.remove_file(&rel);
        }
        return Err(e);
    }
    let old = if readable && meta.len() <= DIFF_SOURCE_CAP {
        let mut old = Vec::new();
        file.read_to_end(&mut old).ok().map(|_| old)
    } else {
        None
    };
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(content))
        .map_err(|e| io_error("write", typed, e))?;
    if let Some(old) = old
        && old != content
        && let (Ok(old), Ok(new)) = (std::str::from_utf8(&old), std::str::from_utf8(content))
    {
        let _ = ctx.diff.set(super::traced_diff(&real_rel, old, new));
    }
    Ok((existed, real_rel))
}

/// The largest file whose change a write traces as a diff (a diff of larger ones is cut
/// anyway, and reading them costs).
const DIFF_SOURCE_CAP: u64 = 1024 * 1024;

/// A deny rule on where an opened file really is: the path may have changed since the gate
/// judged it (a symlink flipped inside the workspace).
fn denied_at_open(
    ctx: &ToolContext,
    tool: &str,
    real_rel: &str,
    typed: &str,
) -> Result<(), ToolError> {
    use crate::rules::Verdict;
    match ctx.rules.judge(tool, real_rel) {
        Some((Verdict::Deny, rule)) => Err(ToolError::Invalid(format!(
            "{typed} leads to {real_rel}, which the approval rule deny `{}` matches; refused",
            rule.text
        ))),
        _ => Ok(()),
    }
}

/// Whether a rule denies reading this workspace-relative path (by `read_file` or the tool
/// that lists it): listing and search skip it.
fn read_denied(ctx: &ToolContext, tool: &str, rel: &str) -> bool {
    use crate::rules::Verdict;
    [tool, "read_file"]
        .iter()
        .any(|t| matches!(ctx.rules.judge(t, rel), Some((Verdict::Deny, _))))
}

fn is_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(8192)].contains(&0)
}

fn read_file_tool() -> Builtin {
    Builtin::new(
        Kind::ReadFile,
        Risk::Read,
        "read_file",
        format!(
            "Read a text file of the workspace. Long files come in pages of {PAGE_LINES} \
             lines: pass `offset` (first line, from 1) and `limit` to read on."
        ),
        json!({
            "path": {"type": "string", "description": "Path relative to the workspace"},
            "offset": {"type": "integer", "minimum": 1},
            "limit": {"type": "integer", "minimum": 1}
        }),
        &["path"],
    )
}

#[derive(Deserialize)]
struct ReadInput {
    path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

async fn read_file(input: ReadInput, ctx: &ToolContext) -> Result<String, ToolError> {
    let file = open_beneath(ctx, "read_file", &input.path)?;
    let first = input.offset.unwrap_or(1);
    let limit = input.limit.unwrap_or(PAGE_LINES);
    // Only the page is held, whatever the file's size.
    let page = tokio::task::spawn_blocking(move || super::page::read_page(file, first, limit))
        .await
        .map_err(|e| ToolError::Failed(format!("reading {} failed: {e}", input.path)))?
        .map_err(|e| io_error("read", &input.path, e))?;
    if page.binary {
        return Err(ToolError::Failed(format!(
            "{} is a binary file ({} bytes); read_file reads text",
            input.path, page.size
        )));
    }
    let lines = page.total;
    if first > lines.max(1) {
        return Err(ToolError::Invalid(format!(
            "{} has {lines} lines; offset {first} is past its end",
            input.path
        )));
    }
    let last = first.saturating_sub(1).saturating_add(limit).min(lines);
    let mut out = page.text;
    if first > 1 || last < lines || page.cut {
        if !out.ends_with('\n') {
            out.push('\n');
        }
        if page.cut {
            out.push_str(&format!(
                "[the page was cut at {} KB; read fewer lines with `limit`]\n",
                super::page::MAX_PAGE_BYTES / 1024
            ));
        }
        out.push_str(&format!("[lines {first}-{last} of {lines}"));
        if last < lines {
            out.push_str(&format!("; read on with offset={}", last + 1));
        }
        out.push(']');
    }
    Ok(out)
}

fn write_file_tool() -> Builtin {
    Builtin::new(
        Kind::WriteFile,
        Risk::Write,
        "write_file",
        "Create or overwrite a file of the workspace with the given content; missing parent \
         folders are created."
            .into(),
        json!({
            "path": {"type": "string", "description": "Path relative to the workspace"},
            "content": {"type": "string"}
        }),
        &["path", "content"],
    )
}

#[derive(Deserialize)]
struct WriteInput {
    path: String,
    content: String,
}

fn write_file(input: WriteInput, ctx: &ToolContext) -> Result<String, ToolError> {
    let (existed, rel) = write_beneath(ctx, "write_file", &input.path, input.content.as_bytes())?;
    Ok(format!(
        "{} {rel} ({} bytes)",
        if existed { "overwrote" } else { "created" },
        input.content.len()
    ))
}

fn edit_file_tool() -> Builtin {
    Builtin::new(
        Kind::EditFile,
        Risk::Write,
        "edit_file",
        "Replace one exact occurrence of `old_string` in a file with `new_string`. \
         `old_string` must occur exactly once: include enough surrounding text to make it \
         unique."
            .into(),
        json!({
            "path": {"type": "string"},
            "old_string": {"type": "string", "minLength": 1},
            "new_string": {"type": "string"}
        }),
        &["path", "old_string", "new_string"],
    )
}

#[derive(Deserialize)]
struct EditInput {
    path: String,
    old_string: String,
    new_string: String,
}

fn line_of(text: &str, byte: usize) -> usize {
    text[..byte].matches('\n').count() + 1
}

fn edit_file(input: EditInput, ctx: &ToolContext) -> Result<String, ToolError> {
    let (path, _) = target(ctx, &input.path)?;
    refuse_protected(ctx, &path, &input.path)?;
    let bytes = read_beneath(ctx, "edit_file", &input.path)?;
    let text = String::from_utf8(bytes).map_err(|_| {
        ToolError::Failed(format!(
            "{} is not UTF-8 text; edit_file edits text",
            input.path
        ))
    })?;
    let at: Vec<usize> = text
        .match_indices(&input.old_string)
        .map(|(i, _)| i)
        .collect();
    match at.as_slice() {
        [] => Err(ToolError::Failed(format!(
            "old_string was not found in {}; read the file and copy the text exactly, \
             whitespace included",
            input.path
        ))),
        [one] => {
            let edited = format!(
                "{}{}{}",
                &text[..*one],
                input.new_string,
                &text[one + input.old_string.len()..]
            );
            write_beneath(ctx, "edit_file", &input.path, edited.as_bytes())?;
            Ok(format!(
                "edited {} at line {}",
                input.path,
                line_of(&text, *one)
            ))
        }
        many => {
            let lines: Vec<String> = many
                .iter()
                .map(|i| line_of(&text, *i).to_string())
                .collect();
            Err(ToolError::Failed(format!(
                "old_string occurs {} times in {} (lines {}); include more surrounding text \
                 so that it matches exactly once",
                many.len(),
                input.path,
                lines.join(", ")
            )))
        }
    }
}

fn glob_matcher(pattern: Option<&str>) -> Result<Option<globset::GlobMatcher>, ToolError> {
    pattern
        .map(|p| {
            globset::GlobBuilder::new(p)
                .literal_separator(false)
                .build()
                .map(|g| g.compile_matcher())
                .map_err(|e| ToolError::Invalid(format!("bad glob `{p}`: {e}")))
        })
        .transpose()
}

/// Lines up to a cap, and how many more there were.
#[derive(Default)]
struct Capped {
    lines: Vec<String>,
    more: usize,
}

impl Capped {
    fn push(&mut self, cap: usize, line: impl FnOnce() -> String) {
        if self.lines.len() < cap {
            self.lines.push(line());
        } else {
            self.more += 1;
        }
    }

    /// The lines, or `none` when there are none; past the cap, how many `more` there were.
    fn text(self, none: &str, more: &str) -> String {
        if self.lines.is_empty() {
            return none.into();
        }
        let mut text = self.lines.join("\n");
        if self.more > 0 {
            text.push_str(&format!("\n[… {} more {more}]", self.more));
        }
        text
    }
}

/// Give `each` every file under `path` (default: the workspace) that the glob `pattern`
/// matches and no rule denies `tool` to read, by its workspace-relative path, off the async
/// threads; what it keeps, capped.
async fn each_file(
    ctx: &ToolContext,
    tool: &'static str,
    (path, pattern): (Option<&str>, Option<&str>),
    mut each: impl FnMut(&ToolContext, &str, &mut Capped) + Send + 'static,
) -> Result<Capped, ToolError> {
    let root = resolve(&ctx.workspace, path.unwrap_or("."))?;
    let matcher = glob_matcher(pattern)?;
    let ctx = ctx.clone();
    tokio::task::spawn_blocking(move || {
        let mut kept = Capped::default();
        for p in ctx.root.files(&ctx.workspace, &root)? {
            let rel = relative(&ctx.workspace, &p);
            if matcher.as_ref().is_some_and(|m| !m.is_match(&rel)) || read_denied(&ctx, tool, &rel)
            {
                continue;
            }
            each(&ctx, &rel, &mut kept);
        }
        Ok(kept)
    })
    .await
    .map_err(|e| ToolError::Failed(format!("{tool} failed: {e}")))?
}

fn list_files_tool() -> Builtin {
    Builtin::new(
        Kind::ListFiles,
        Risk::Read,
        "list_files",
        "List the workspace's files (paths relative to the workspace), optionally under \
         `path` and matching a glob `pattern` such as `**/*.rs`. What .gitignore ignores is \
         skipped."
            .into(),
        json!({
            "pattern": {"type": "string"},
            "path": {"type": "string"}
        }),
        &[],
    )
}

#[derive(Deserialize)]
struct ListInput {
    pattern: Option<String>,
    path: Option<String>,
}

async fn list_files(input: ListInput, ctx: &ToolContext) -> Result<String, ToolError> {
    let files = each_file(
        ctx,
        "list_files",
        (input.path.as_deref(), input.pattern.as_deref()),
        |_, rel, files| files.push(MAX_LISTED, || rel.to_string()),
    )
    .await?;
    Ok(files.text("no files match", "files; narrow the pattern or path"))
}

fn search_files_tool() -> Builtin {
    Builtin::new(
        Kind::SearchFiles,
        Risk::Read,
        "search_files",
        "Search the workspace's text files for a regular expression; answers `path:line: \
         text` for each matching line. Optional `path` (a folder or file) and `glob` narrow \
         the search."
            .into(),
        json!({
            "pattern": {"type": "string", "minLength": 1},
            "path": {"type": "string"},
            "glob": {"type": "string"}
        }),
        &["pattern"],
    )
}

#[derive(Deserialize)]
struct SearchInput {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
}

async fn search_files(input: SearchInput, ctx: &ToolContext) -> Result<String, ToolError> {
    let re = regex::Regex::new(&input.pattern)
        .map_err(|e| ToolError::Invalid(format!("bad regular expression: {e}")))?;
    ctx.root.dir()?;
    let lines = each_file(
        ctx,
        "search_files",
        (input.path.as_deref(), input.glob.as_deref()),
        move |ctx, rel, lines| {
            let Ok(dir) = ctx.root.dir() else {
                return;
            };
            let mut bytes = Vec::new();
            let read = open_regular(dir, rel, cap_std::fs::OpenOptions::new().read(true))
                .and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut bytes));
            if read.is_err() || is_binary(&bytes) {
                return;
            }
            for (n, line) in String::from_utf8_lossy(&bytes).lines().enumerate() {
                if re.is_match(line) {
                    lines.push(MAX_MATCHES, || {
                        let shown: String = line.chars().take(300).collect();
                        format!("{rel}:{}: {shown}", n + 1)
                    });
                }
            }
        },
    )
    .await?;
    Ok(lines.text("no matches", "matches; narrow the pattern, path or glob"))
}

fn run_command_tool() -> Builtin {
    Builtin::new(
        Kind::RunCommand,
        Risk::Exec,
        "run_command",
        "Run a bash command line in the workspace and get its exit code, stdout and stderr. \
         Long outputs are cut in the middle. Optional `timeout_secs` (at most the tool \
         timeout)."
            .into(),
        json!({
            "command": {"type": "string", "minLength": 1},
            "timeout_secs": {"type": "integer", "minimum": 1}
        }),
        &["command"],
    )
}

#[derive(Deserialize)]
struct CommandInput {
    command: String,
    timeout_secs: Option<u64>,
}

/// Run a process for a tool and render what it did; shared by `run_command` and command
/// tools. The result text starts with the exit status; each stream is capped at half the
/// result cap, and a cut stream's file is kept.
pub(crate) async fn run_for_tool(
    mut spec: process::Spec,
    ctx: &ToolContext,
) -> Result<(Ending, String, String), ToolError> {
    let base = &ctx.output_name;
    spec.stdout = ctx.output_dir.join(format!("{base}.stdout"));
    spec.stderr = ctx.output_dir.join(format!("{base}.stderr"));
    let finished = process::run(&spec, &ctx.cancel)
        .await
        .map_err(|e| ToolError::Failed(e.to_string()))?;
    let read = |path: &Path| -> String {
        match read_capped(path, ctx.output_cap / 2) {
            Ok(c) => {
                if !c.cut {
                    let _ = std::fs::remove_file(path);
                }
                c.text
            }
            Err(e) => format!("[output unreadable: {e}]"),
        }
    };
    let stdout = read(&spec.stdout);
    let mut stderr = read(&spec.stderr);
    if !finished.ending.success()
        && let Some(note) = ctx.jail.explain(
            &stderr,
            matches!(
                finished.ending,
                Ending::Signaled(libc::SIGKILL) | Ending::Exited(137)
            ),
        )
    {
        stderr.push_str(&format!("\n{note}\n"));
    }
    Ok((finished.ending, stdout, stderr))
}

async fn run_command(input: CommandInput, ctx: &ToolContext) -> Result<String, ToolError> {
    let timeout = input
        .timeout_secs
        .map(std::time::Duration::from_secs)
        .map_or(ctx.timeout, |t| t.min(ctx.timeout));
    let spec = process::Spec {
        program: "bash".into(),
        args: vec!["-c".into(), input.command.clone()],
        cwd: ctx.workspace.clone(),
        env: ctx.env.as_ref().clone(),
        stdin: None,
        timeout,
        stdout: PathBuf::new(),
        stderr: PathBuf::new(),
        jail: ctx.jail.clone(),
    };
    let (ending, stdout, stderr) = run_for_tool(spec, ctx).await?;
    let mut text = ending.describe(timeout);
    if ending == Ending::TimedOut {
        text.push_str("; the process group was killed");
    }
    if !stdout.is_empty() {
        text.push_str("\n--- stdout ---\n");
        text.push_str(&stdout);
    }
    if !stderr.is_empty() {
        text.push_str("\n--- stderr ---\n");
        text.push_str(&stderr);
    }
    match ending {
        Ending::Exited(0) => Ok(text),
        Ending::Cancelled => Err(ToolError::Cancelled),
        _ => Err(ToolError::Failed(text)),
    }
}
