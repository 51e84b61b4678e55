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
use super::{Registry, RegistryError, Risk, Tool, ToolContext, ToolError};
use crate::model::ToolSpec;

/// Lines `read_file` returns in one page unless asked for fewer.
const PAGE_LINES: usize = 2000;
/// Entries `list_files` and matches `search_files` return at most.
const MAX_LISTED: usize = 2000;
const MAX_MATCHES: usize = 500;

/// Every built-in tool, ready to register.
pub fn register_all(registry: &mut Registry) -> Result<(), RegistryError> {
    registry.add(Arc::new(ReadFile::new()))?;
    registry.add(Arc::new(WriteFile::new()))?;
    registry.add(Arc::new(EditFile::new()))?;
    registry.add(Arc::new(ListFiles::new()))?;
    registry.add(Arc::new(SearchFiles::new()))?;
    registry.add(Arc::new(RunCommand::new()))?;
    Ok(())
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

pub(crate) struct ReadFile(ToolSpec);

impl ReadFile {
    fn new() -> Self {
        ReadFile(ToolSpec {
            name: "read_file".into(),
            description: format!(
                "Read a text file of the workspace. Long files come in pages of {PAGE_LINES} \
                 lines: pass `offset` (first line, from 1) and `limit` to read on."
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to the workspace"},
                    "offset": {"type": "integer", "minimum": 1},
                    "limit": {"type": "integer", "minimum": 1}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        })
    }
}

#[derive(Deserialize)]
struct ReadInput {
    path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[async_trait]
impl Tool for ReadFile {
    fn approval_subject(&self, input: &Value, workspace: &Path) -> String {
        super::path_subject(input, workspace)
    }
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn risk(&self) -> Risk {
        Risk::Read
    }
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let input: ReadInput = parse(input)?;
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
}

pub(crate) struct WriteFile(ToolSpec);

impl WriteFile {
    fn new() -> Self {
        WriteFile(ToolSpec {
            name: "write_file".into(),
            description: "Create or overwrite a file of the workspace with the given content; \
                          missing parent folders are created."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path relative to the workspace"},
                    "content": {"type": "string"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        })
    }
}

#[derive(Deserialize)]
struct WriteInput {
    path: String,
    content: String,
}

#[async_trait]
impl Tool for WriteFile {
    fn approval_subject(&self, input: &Value, workspace: &Path) -> String {
        super::path_subject(input, workspace)
    }
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn risk(&self) -> Risk {
        Risk::Write
    }
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let input: WriteInput = parse(input)?;
        let (existed, rel) =
            write_beneath(ctx, "write_file", &input.path, input.content.as_bytes())?;
        Ok(format!(
            "{} {rel} ({} bytes)",
            if existed { "overwrote" } else { "created" },
            input.content.len()
        ))
    }
}

pub(crate) struct EditFile(ToolSpec);

impl EditFile {
    fn new() -> Self {
        EditFile(ToolSpec {
            name: "edit_file".into(),
            description: "Replace one exact occurrence of `old_string` in a file with \
                          `new_string`. `old_string` must occur exactly once: include enough \
                          surrounding text to make it unique."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old_string": {"type": "string", "minLength": 1},
                    "new_string": {"type": "string"}
                },
                "required": ["path", "old_string", "new_string"],
                "additionalProperties": false
            }),
        })
    }
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

#[async_trait]
impl Tool for EditFile {
    fn approval_subject(&self, input: &Value, workspace: &Path) -> String {
        super::path_subject(input, workspace)
    }
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn risk(&self) -> Risk {
        Risk::Write
    }
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let input: EditInput = parse(input)?;
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
}

/// The workspace's files under `root`, skipping `.git` and what `.gitignore` and `.ignore`
/// files under `root` ignore (an `.ignore` wins over a `.gitignore` beside it), and what
/// git's global excludes and the repository's `info/exclude` do. The ignore files are read
/// as the walk meets them; the rules from outside were read once, with the workspace
/// (`Root`): nothing above `root` is looked at.
fn walk(ctx: &ToolContext, root: &Path) -> impl Iterator<Item = PathBuf> + use<> {
    let ws = ctx.workspace.clone();
    let rules = ctx.root.clone();
    let at_top = root == ws;
    ignore::WalkBuilder::new(root)
        .standard_filters(false)
        .add_custom_ignore_filename(".gitignore")
        .add_custom_ignore_filename(".ignore")
        .filter_entry(move |e| {
            e.file_name() != ".git"
                && !rules.ignored(e.path(), e.file_type().is_some_and(|t| t.is_dir()), at_top)
        })
        .sort_by_file_name(|a, b| a.cmp(b))
        .build()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
        .map(|e| e.into_path())
        .filter(move |p| p.starts_with(&ws))
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

pub(crate) struct ListFiles(ToolSpec);

impl ListFiles {
    fn new() -> Self {
        ListFiles(ToolSpec {
            name: "list_files".into(),
            description: "List the workspace's files (paths relative to the workspace), \
                          optionally under `path` and matching a glob `pattern` such as \
                          `**/*.rs`. What .gitignore ignores is skipped."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "path": {"type": "string"}
                },
                "additionalProperties": false
            }),
        })
    }
}

#[derive(Deserialize)]
struct ListInput {
    pattern: Option<String>,
    path: Option<String>,
}

#[async_trait]
impl Tool for ListFiles {
    fn approval_subject(&self, input: &Value, workspace: &Path) -> String {
        super::path_subject(input, workspace)
    }
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn risk(&self) -> Risk {
        Risk::Read
    }
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let input: ListInput = parse(input)?;
        let root = resolve(&ctx.workspace, input.path.as_deref().unwrap_or("."))?;
        let matcher = glob_matcher(input.pattern.as_deref())?;
        let ws = ctx.workspace.clone();
        let ctx = ctx.clone();
        let listed = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let mut more = 0usize;
            for p in walk(&ctx, &root) {
                let rel = relative(&ws, &p);
                if matcher.as_ref().is_some_and(|m| !m.is_match(&rel))
                    || read_denied(&ctx, "list_files", &rel)
                {
                    continue;
                }
                if out.len() < MAX_LISTED {
                    out.push(rel);
                } else {
                    more += 1;
                }
            }
            (out, more)
        })
        .await
        .map_err(|e| ToolError::Failed(format!("listing failed: {e}")))?;
        let (files, more) = listed;
        if files.is_empty() {
            return Ok("no files match".into());
        }
        let mut text = files.join("\n");
        if more > 0 {
            text.push_str(&format!(
                "\n[… {more} more files; narrow the pattern or path]"
            ));
        }
        Ok(text)
    }
}

pub(crate) struct SearchFiles(ToolSpec);

impl SearchFiles {
    fn new() -> Self {
        SearchFiles(ToolSpec {
            name: "search_files".into(),
            description: "Search the workspace's text files for a regular expression; \
                          answers `path:line: text` for each matching line. Optional `path` \
                          (a folder or file) and `glob` narrow the search."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "minLength": 1},
                    "path": {"type": "string"},
                    "glob": {"type": "string"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        })
    }
}

#[derive(Deserialize)]
struct SearchInput {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
}

#[async_trait]
impl Tool for SearchFiles {
    fn approval_subject(&self, input: &Value, workspace: &Path) -> String {
        super::path_subject(input, workspace)
    }
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn risk(&self) -> Risk {
        Risk::Read
    }
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let input: SearchInput = parse(input)?;
        let re = regex::Regex::new(&input.pattern)
            .map_err(|e| ToolError::Invalid(format!("bad regular expression: {e}")))?;
        let root = resolve(&ctx.workspace, input.path.as_deref().unwrap_or("."))?;
        let matcher = glob_matcher(input.glob.as_deref())?;
        let ws = ctx.workspace.clone();
        ctx.root.dir()?;
        let ctx = ctx.clone();
        let found = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let mut more = 0usize;
            let Ok(dir) = ctx.root.dir() else {
                return (out, more);
            };
            for p in walk(&ctx, &root) {
                let rel = relative(&ws, &p);
                if matcher.as_ref().is_some_and(|m| !m.is_match(&rel))
                    || read_denied(&ctx, "search_files", &rel)
                {
                    continue;
                }
                let mut bytes = Vec::new();
                let read = open_regular(dir, &rel, cap_std::fs::OpenOptions::new().read(true))
                    .and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut bytes));
                if read.is_err() {
                    continue;
                }
                if is_binary(&bytes) {
                    continue;
                }
                let text = String::from_utf8_lossy(&bytes);
                for (n, line) in text.lines().enumerate() {
                    if re.is_match(line) {
                        if out.len() < MAX_MATCHES {
                            let shown: String = line.chars().take(300).collect();
                            out.push(format!("{rel}:{}: {shown}", n + 1));
                        } else {
                            more += 1;
                        }
                    }
                }
            }
            (out, more)
        })
        .await
        .map_err(|e| ToolError::Failed(format!("search failed: {e}")))?;
        let (lines, more) = found;
        if lines.is_empty() {
            return Ok("no matches".into());
        }
        let mut text = lines.join("\n");
        if more > 0 {
            text.push_str(&format!(
                "\n[… {more} more matches; narrow the pattern, path or glob]"
            ));
        }
        Ok(text)
    }
}

pub(crate) struct RunCommand(ToolSpec);

impl RunCommand {
    fn new() -> Self {
        RunCommand(ToolSpec {
            name: "run_command".into(),
            description: "Run a bash command line in the workspace and get its exit code, \
                          stdout and stderr. Long outputs are cut in the middle. Optional \
                          `timeout_secs` (at most the tool timeout)."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "minLength": 1},
                    "timeout_secs": {"type": "integer", "minimum": 1}
                },
                "required": ["command"],
                "additionalProperties": false
            }),
        })
    }
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

#[async_trait]
impl Tool for RunCommand {
    fn approval_subject(&self, input: &Value, _workspace: &Path) -> String {
        input
            .get("command")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    }
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn risk(&self) -> Risk {
        Risk::Exec
    }
    async fn call(&self, input: &Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let input: CommandInput = parse(input)?;
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
}
