//! Prices in US dollars per million tokens: a built-in table for common OpenAI, Anthropic
//! and DeepSeek models, which `[prices."provider:model"]` in the user config extends or
//! overrides; the cost of a usage; and the estimate of a coming request's input tokens that
//! the cost cap is checked against before every model call.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Message, ToolSpec, Usage};

/// What a model charges, in US dollars per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub(crate) input: f64,
    pub(crate) output: f64,
    /// Cached input read back (default: the input price).
    #[serde(default)]
    cache_read: Option<f64>,
    /// Input written to the cache (default: the input price).
    #[serde(default)]
    cache_write: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum PriceError {
    #[error("price of `{model}`: `{key}` is {value}; a price is a number of US dollars, 0 or more")]
    Negative {
        model: String,
        key: &'static str,
        value: f64,
    },
}

const fn p(input: f64, output: f64, cache_read: f64, cache_write: f64) -> Price {
    Price {
        input,
        output,
        cache_read: Some(cache_read),
        cache_write: Some(cache_write),
    }
}

/// The built-in table, by `provider:model` (a longer name such as a dated version matches
/// its prefix: `anthropic:claude-sonnet-4-5-20250929` is `anthropic:claude-sonnet-4-5`).
const TABLE: &[(&str, Price)] = &[
    ("openai:gpt-5", p(1.25, 10.0, 0.125, 1.25)),
    ("openai:gpt-5-mini", p(0.25, 2.0, 0.025, 0.25)),
    ("openai:gpt-5-nano", p(0.05, 0.4, 0.005, 0.05)),
    ("openai:gpt-4.1", p(2.0, 8.0, 0.5, 2.0)),
    ("openai:gpt-4.1-mini", p(0.4, 1.6, 0.1, 0.4)),
    ("openai:gpt-4.1-nano", p(0.1, 0.4, 0.025, 0.1)),
    ("openai:gpt-4o", p(2.5, 10.0, 1.25, 2.5)),
    ("openai:gpt-4o-mini", p(0.15, 0.6, 0.075, 0.15)),
    ("openai:o3", p(2.0, 8.0, 0.5, 2.0)),
    ("openai:o3-mini", p(1.1, 4.4, 0.55, 1.1)),
    ("openai:o4-mini", p(1.1, 4.4, 0.275, 1.1)),
    ("anthropic:claude-opus-4-1", p(15.0, 75.0, 1.5, 18.75)),
    ("anthropic:claude-opus-4", p(15.0, 75.0, 1.5, 18.75)),
    ("anthropic:claude-sonnet-4-5", p(3.0, 15.0, 0.3, 3.75)),
    ("anthropic:claude-sonnet-4", p(3.0, 15.0, 0.3, 3.75)),
    ("anthropic:claude-3-7-sonnet", p(3.0, 15.0, 0.3, 3.75)),
    ("anthropic:claude-haiku-4-5", p(1.0, 5.0, 0.1, 1.25)),
    ("anthropic:claude-3-5-haiku", p(0.8, 4.0, 0.08, 1.0)),
    ("deepseek:deepseek-chat", p(0.27, 1.1, 0.07, 0.27)),
    ("deepseek:deepseek-reasoner", p(0.55, 2.19, 0.14, 0.55)),
];

impl Price {
    fn cache_read(&self) -> f64 {
        self.cache_read.unwrap_or(self.input)
    }

    fn cache_write(&self) -> f64 {
        self.cache_write.unwrap_or(self.input)
    }

    /// What `usage` cost, in US dollars.
    pub(crate) fn cost(&self, usage: &Usage) -> f64 {
        (usage.input_tokens as f64 * self.input
            + usage.output_tokens as f64 * self.output
            + usage.cache_read_tokens as f64 * self.cache_read()
            + usage.cache_write_tokens as f64 * self.cache_write())
            / 1e6
    }

    /// What `tokens` of input cost at the input price.
    pub(crate) fn input_cost(&self, tokens: u64) -> f64 {
        tokens as f64 * self.input / 1e6
    }

    fn validate(&self, model: &str) -> Result<(), PriceError> {
        let fields = [
            ("input", Some(self.input)),
            ("output", Some(self.output)),
            ("cache_read", self.cache_read),
            ("cache_write", self.cache_write),
        ];
        for (key, value) in fields {
            if let Some(value) = value.filter(|v| v.is_nan() || *v < 0.0) {
                return Err(PriceError::Negative {
                    model: model.to_string(),
                    key,
                    value,
                });
            }
        }
        Ok(())
    }
}

/// The built-in table with the user's prices over it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Prices {
    user: BTreeMap<String, Price>,
}

impl Prices {
    /// The table with `user` (from `[prices."provider:model"]`) over the built-in one.
    pub(crate) fn new(user: BTreeMap<String, Price>) -> Result<Prices, PriceError> {
        for (model, price) in &user {
            price.validate(model)?;
        }
        Ok(Prices { user })
    }

    /// The price of `provider:model`, the user's over the built-in table (`lookup`).
    pub(crate) fn get(&self, model: &str) -> Option<Price> {
        lookup(
            model,
            self.user.iter().map(|(m, p)| (m.as_str(), *p)),
            TABLE,
        )
    }
}

/// The entry of `provider:model` in `user` over `table`: an exact name first, the user's
/// before the table's; else the longest entry of either that the name starts with, then `-`
/// or `@` (`…-20250929`, `…-latest`). Prices and context windows are looked up so.
pub(crate) fn lookup<'a, T: Copy>(
    model: &str,
    user: impl Iterator<Item = (&'a str, T)> + Clone,
    table: &'a [(&'a str, T)],
) -> Option<T> {
    let exact = |(m, _): &(&str, T)| *m == model;
    if let Some((_, v)) = user.clone().find(exact) {
        return Some(v);
    }
    if let Some((_, v)) = table.iter().copied().find(exact) {
        return Some(v);
    }
    let prefixed = |(m, _): &(&str, T)| {
        model
            .strip_prefix(m)
            .is_some_and(|rest| rest.starts_with('-') || rest.starts_with('@'))
    };
    // `max_by_key` keeps the last of equals: the table goes first so that the user's wins.
    table
        .iter()
        .copied()
        .chain(user)
        .filter(prefixed)
        .max_by_key(|(m, _)| m.len())
        .map(|(_, v)| v)
}

/// Bytes of the tool specs a provider is sent, roughly: names, descriptions, schemas. With
/// `Conversation::bytes`, the size of a request.
pub(crate) fn tool_bytes(tools: &[ToolSpec]) -> usize {
    tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.input_schema.to_string().len())
        .sum()
}

/// Bytes of one message's text; a conversation keeps their sum.
pub(crate) fn message_bytes(m: &Message) -> usize {
    match m {
        Message::System { content } | Message::User { content } => content.len(),
        Message::Assistant {
            text,
            tool_calls,
            reasoning,
        } => {
            text.len()
                + reasoning.as_ref().map_or(0, String::len)
                + tool_calls
                    .iter()
                    .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                    .sum::<usize>()
        }
        Message::Tool { results } => results
            .iter()
            .map(|r| r.call_id.len() + r.content.len())
            .sum(),
    }
}

/// Estimates the input tokens of the coming request: the input the provider reported for
/// the last request, plus a token per 4 bytes added since; before any report, a token per
/// 4 bytes of the whole request.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct InputEstimate {
    /// (input tokens reported for the last request, its size in bytes)
    last: Option<(u64, usize)>,
}

impl InputEstimate {
    pub(crate) fn tokens(&self, bytes_now: usize) -> u64 {
        match self.last {
            Some((tokens, bytes)) => tokens + (bytes_now.saturating_sub(bytes) as u64).div_ceil(4),
            None => (bytes_now as u64).div_ceil(4),
        }
    }

    /// Tokens a byte of the request is, from the last report (else a token per 4 bytes).
    pub(crate) fn per_byte(&self) -> f64 {
        match self.last {
            Some((tokens, bytes)) if bytes > 0 => tokens as f64 / bytes as f64,
            _ => 0.25,
        }
    }

    /// Like `tokens`, but what was added since the last report counts at that report's tokens
    /// per byte (at least a token per 4 bytes): for the context window, where an estimate
    /// too low is a request the server refuses.
    pub(crate) fn scaled(&self, bytes_now: usize) -> u64 {
        match self.last {
            Some((tokens, bytes)) => {
                let new = bytes_now.saturating_sub(bytes) as f64 * self.per_byte().max(0.25);
                tokens + new.ceil() as u64
            }
            None => (bytes_now as u64).div_ceil(4),
        }
    }

    /// The request was rewritten to `bytes_now` bytes: what the last report says is scaled to
    /// it, so the estimate shrinks with the conversation.
    pub(crate) fn rewritten(&mut self, bytes_now: usize) {
        if self.last.is_some() {
            let tokens = (self.per_byte() * bytes_now as f64).ceil() as u64;
            self.last = Some((tokens, bytes_now));
        }
    }

    /// The provider's report for a request of `bytes` bytes.
    pub(crate) fn reported(&mut self, usage: &Usage, bytes: usize) {
        let input = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens;
        if input > 0 {
            self.last = Some((input, bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_names_match_their_prefix_and_user_prices_win() {
        let mut user = BTreeMap::new();
        user.insert(
            "openai:gpt-4o".to_string(),
            Price {
                input: 1.0,
                output: 2.0,
                cache_read: None,
                cache_write: None,
            },
        );
        let prices = Prices::new(user).unwrap();
        assert_eq!(prices.get("openai:gpt-4o").unwrap().input, 1.0);
        assert_eq!(prices.get("openai:gpt-4o-mini").unwrap().input, 0.15);
        // A dated name of a model both tables list takes the user's price, not the table's.
        assert_eq!(prices.get("openai:gpt-4o-2024-08-06").unwrap().input, 1.0);
        assert_eq!(
            prices
                .get("anthropic:claude-sonnet-4-5-20250929")
                .unwrap()
                .output,
            15.0
        );
        assert!(prices.get("ollama:llama3").is_none());
        assert!(prices.get("openai:gpt-4oops").is_none());
    }

    #[test]
    fn cost_counts_every_kind_of_token() {
        let price = p(1.0, 2.0, 0.5, 4.0);
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            cache_read_tokens: 2_000_000,
            cache_write_tokens: 1_000_000,
        };
        assert!((price.cost(&usage) - 8.0).abs() < 1e-9);
    }

    #[test]
    fn negative_prices_are_refused() {
        let mut user = BTreeMap::new();
        user.insert("x:y".to_string(), p(-1.0, 1.0, 1.0, 1.0));
        assert!(Prices::new(user).is_err());
    }

    #[test]
    fn the_estimate_grows_with_what_was_added() {
        let mut e = InputEstimate::default();
        assert_eq!(e.tokens(400), 100);
        e.reported(
            &Usage {
                input_tokens: 500,
                ..Usage::default()
            },
            400,
        );
        assert_eq!(e.tokens(800), 600);
    }
}
