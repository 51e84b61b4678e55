//! Prompt templates (minijinja): a prompt or system prompt with `{{ … }}` is rendered at
//! the start of each run with the date, the trigger, the goal's previous run and the
//! `[params]`; one without `{{` is used exactly as written. Unknown variables
//! and syntax errors are found when the goal is loaded, and name the file and line.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub(crate) struct TemplateError {
    pub(crate) file: String,
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// A template and where it was written: `line` is the file line of the template's first.
#[derive(Clone, Debug)]
pub struct Source {
    pub(crate) text: String,
    pub(crate) file: String,
    pub(crate) line: usize,
}

const VARIABLES: &str = "date, time, now, goal, trigger, scheduled_for, previous.status, \
                         previous.answer, previous.failed_checks, params.NAME";

const PREVIOUS: &[&str] = &["status", "answer", "failed_checks"];

/// Whether `text` is a template: it has `{{`. Anything else is used exactly as written.
pub(crate) fn is_template(text: &str) -> bool {
    text.contains("{{")
}

/// The goal's run before this one, as templates see it (empty strings when there was none).
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Previous {
    /// `achieved`, `failed`, `unfinished`, `error`, `interrupted`, or empty.
    pub(crate) status: String,
    pub(crate) answer: String,
    /// Each failing check of its last try: `NAME (OUTCOME)` and its output tail.
    pub(crate) failed_checks: String,
}

/// Everything a template may use.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Context {
    /// `YYYY-MM-DD` in the goal's time zone.
    pub(crate) date: String,
    /// `HH:MM` in the goal's time zone.
    pub(crate) time: String,
    /// RFC 3339 in the goal's time zone.
    pub(crate) now: String,
    pub(crate) goal: String,
    /// `cli`, `schedule` or `manual`.
    pub(crate) trigger: String,
    /// RFC 3339 in the goal's time zone; empty unless scheduled.
    pub(crate) scheduled_for: String,
    pub(crate) previous: Previous,
    pub(crate) params: BTreeMap<String, String>,
}

impl Context {
    pub(crate) fn new(
        tz: Tz,
        now: DateTime<Utc>,
        goal: &str,
        trigger: &str,
        scheduled_for: Option<DateTime<Utc>>,
        previous: Previous,
        params: BTreeMap<String, String>,
    ) -> Context {
        let local = now.with_timezone(&tz);
        Context {
            date: local.format("%Y-%m-%d").to_string(),
            time: local.format("%H:%M").to_string(),
            now: local.to_rfc3339(),
            goal: goal.to_string(),
            trigger: trigger.to_string(),
            scheduled_for: scheduled_for
                .map(|t| t.with_timezone(&tz).to_rfc3339())
                .unwrap_or_default(),
            previous,
            params,
        }
    }
}

fn env() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env
}

impl Source {
    fn error(&self, line: Option<usize>, message: String) -> TemplateError {
        TemplateError {
            file: self.file.clone(),
            line: self.line + line.unwrap_or(1).saturating_sub(1),
            message,
        }
    }

    fn minijinja(&self, e: &minijinja::Error) -> TemplateError {
        let message = match e.detail() {
            Some(d) => format!("template: {}: {d}", e.kind()),
            None => format!("template: {}", e.kind()),
        };
        self.error(e.line(), message)
    }

    /// The template line where `name` first appears.
    fn line_of(&self, name: &str) -> Option<usize> {
        let last = name.rsplit('.').next().unwrap_or(name);
        self.text
            .lines()
            .position(|l| l.contains(last))
            .map(|i| i + 1)
    }

    /// Find syntax errors and unknown variables, with `params` as the known parameters.
    pub(crate) fn check(&self, params: &BTreeMap<String, String>) -> Result<(), TemplateError> {
        if !is_template(&self.text) {
            return Ok(());
        }
        let env = env();
        let tmpl = env
            .template_from_str(&self.text)
            .map_err(|e| self.minijinja(&e))?;
        let top = [
            "date",
            "time",
            "now",
            "goal",
            "trigger",
            "scheduled_for",
            "previous",
            "params",
        ];
        let used: BTreeSet<String> = tmpl.undeclared_variables(true).into_iter().collect();
        for name in &used {
            let (head, rest) = name.split_once('.').unwrap_or((name, ""));
            let known = match head {
                "previous" => rest.is_empty() || PREVIOUS.contains(&rest),
                "params" => rest.is_empty() || params.contains_key(rest),
                _ => top.contains(&head),
            };
            if !known {
                let hint = if head == "params" {
                    format!("; set it under [params] in the goal file or with --param {rest}=VALUE")
                } else {
                    format!("; the variables are {VARIABLES}")
                };
                return Err(self.error(
                    self.line_of(name),
                    format!("template: unknown variable `{name}`{hint}"),
                ));
            }
        }
        // What a name alone cannot tell (`params[x]`, filters): a trial render.
        let sample = Context::new(
            Tz::UTC,
            Utc::now(),
            "goal",
            "cli",
            None,
            Previous::default(),
            params.clone(),
        );
        tmpl.render(minijinja::value::Serde(&sample))
            .map_err(|e| self.minijinja(&e))?;
        Ok(())
    }

    /// The text for this run: rendered when it uses template syntax, else as written.
    pub(crate) fn render(&self, ctx: &Context) -> Result<String, TemplateError> {
        if !is_template(&self.text) {
            return Ok(self.text.clone());
        }
        env()
            .render_str(&self.text, minijinja::value::Serde(ctx))
            .map_err(|e| self.minijinja(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(text: &str) -> Source {
        Source {
            text: text.into(),
            file: "goals/g.toml".into(),
            line: 3,
        }
    }

    fn ctx() -> Context {
        let now = DateTime::parse_from_rfc3339("2026-03-01T23:30:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let mut params = BTreeMap::new();
        params.insert("city".to_string(), "Paris".to_string());
        Context::new(
            "Asia/Shanghai".parse().unwrap(),
            now,
            "g",
            "schedule",
            Some(now),
            Previous {
                status: "failed".into(),
                answer: "42".into(),
                failed_checks: String::new(),
            },
            params,
        )
    }

    #[test]
    fn renders_in_the_goals_time_zone() {
        let out = src("{{ date }} {{ time }} {{ params.city }} {{ previous.answer }}\n")
            .render(&ctx())
            .unwrap();
        assert_eq!(out, "2026-03-02 07:30 Paris 42\n");
    }

    #[test]
    fn without_template_syntax_the_text_is_kept() {
        let text = "use } and { freely, and {x}";
        assert_eq!(src(text).render(&ctx()).unwrap(), text);
    }

    #[test]
    fn unknown_variables_and_syntax_errors_name_the_line() {
        let params = BTreeMap::new();
        let e = src("line one\n{{ previous.anwser }}")
            .check(&params)
            .unwrap_err();
        assert_eq!(e.line, 4, "{e}");
        assert!(e.to_string().contains("previous.anwser"), "{e}");
        let e = src("a\nb\n{{ params.city }}").check(&params).unwrap_err();
        assert_eq!(e.line, 5, "{e}");
        let e = src("{{ date ").check(&params).unwrap_err();
        assert!(e.to_string().starts_with("goals/g.toml:3:"), "{e}");
        assert!(src("{{ date }}").check(&params).is_ok());
    }
}
