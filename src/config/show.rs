//! How `--print-config` shows each effective value.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::{
    Isolation, Keep, McpServer, OnInterrupt, Overlap, RawCheck, RawTool, RuleLists, UnknownPrice,
};
use crate::approval::Mode;
use crate::tools::sandbox::Policy;

/// A value as `--print-config` shows it.
pub(super) trait Show {
    fn show(&self) -> String;
}

impl<T: Show> Show for Option<T> {
    fn show(&self) -> String {
        self.as_ref().map_or_else(|| "—".into(), Show::show)
    }
}

impl<T: Show> Show for Vec<T> {
    fn show(&self) -> String {
        format!(
            "[{}]",
            self.iter().map(Show::show).collect::<Vec<_>>().join(", ")
        )
    }
}

impl<T: Show> Show for BTreeMap<String, T> {
    fn show(&self) -> String {
        let items: Vec<String> = self
            .iter()
            .map(|(k, v)| format!("{k} = {}", v.show()))
            .collect();
        format!("{{{}}}", items.join(", "))
    }
}

impl<T: Show> Show for Spanned<T> {
    fn show(&self) -> String {
        self.get_ref().show()
    }
}

impl Show for Duration {
    fn show(&self) -> String {
        humantime::format_duration(*self).to_string()
    }
}

impl Show for (String, String) {
    fn show(&self) -> String {
        format!("{}={}", self.0, self.1)
    }
}

macro_rules! show_debug {
    ($($t:ty),*) => {$(
        impl Show for $t {
            fn show(&self) -> String {
                format!("{self:?}")
            }
        }
    )*};
}

show_debug!(
    String, u32, u64, usize, bool, f64, PathBuf, RawCheck, RawTool
);

/// A value as it is written in a file: the word of an enum, a table as inline JSON.
macro_rules! show_serde {
    ($($t:ty),*) => {$(
        impl Show for $t {
            fn show(&self) -> String {
                match serde_json::to_value(self) {
                    Ok(serde_json::Value::String(s)) => s,
                    Ok(v) => v.to_string(),
                    Err(_) => String::new(),
                }
            }
        }
    )*};
}

show_serde!(
    Mode,
    Overlap,
    Isolation,
    Keep,
    OnInterrupt,
    crate::model::prices::Price
);

impl Show for crate::tools::sandbox::Network {
    fn show(&self) -> String {
        use crate::tools::sandbox::Network;
        match self {
            Network::On => "true".into(),
            Network::Off => "false".into(),
            Network::Allow(l) => format!(
                "[{}]",
                l.iter()
                    .map(|p| format!("{:?}", p.to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl Show for Policy {
    fn show(&self) -> String {
        self.name().to_string()
    }
}

impl Show for UnknownPrice {
    fn show(&self) -> String {
        match self {
            UnknownPrice::Allow => "allow",
            UnknownPrice::Refuse => "refuse",
        }
        .to_string()
    }
}

impl Show for RuleLists {
    fn show(&self) -> String {
        let lists = [
            ("allow", &self.allow),
            ("ask", &self.ask),
            ("deny", &self.deny),
        ];
        let set: Vec<String> = lists
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(k, l)| format!("{k} {}", l.join(", ")))
            .collect();
        if set.is_empty() {
            "—".into()
        } else {
            set.join(" · ")
        }
    }
}

impl Show for McpServer {
    fn show(&self) -> String {
        let mut argv = self.command.clone();
        argv.extend(self.args.iter().cloned());
        format!("{}={}", self.name, argv.join(" "))
    }
}

impl Show for crate::notify::RawNotify {
    fn show(&self) -> String {
        match (&self.webhook, &self.command) {
            (Some(url), _) => format!("webhook {url}"),
            (None, Some(argv)) => format!("command {}", argv.join(" ")),
            (None, None) => "—".into(),
        }
    }
}

impl Show for crate::model::windows::ModelInfo {
    fn show(&self) -> String {
        match self.context_window {
            Some(n) => format!("context_window {n}"),
            None => "—".into(),
        }
    }
}
