//! `sup service install|uninstall`: the daemon as a service that survives a reboot. On
//! Linux a systemd unit (`Restart=on-failure`, absolute paths, `ExecReload` sending SIGHUP,
//! `KillMode=mixed` with a stop timeout longer than `--grace`), enabled with `--now` where
//! `systemctl` exists; on macOS a launchd agent. With `--store` the daemon joins the fleet:
//! a store URL without a password goes in the unit; one with a password goes in the secrets
//! file (mode 600) that the unit reads, never in the unit, which anyone may read.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Subcommand;

use super::{Ending, Fail};

const UNIT: &str = "sup.service";
const LABEL: &str = "dev.sup.daemon";

/// What the service's stop timeout adds to `--grace`: time to record and exit.
const STOP_MARGIN: Duration = Duration::from_secs(30);

#[derive(Subcommand, Debug)]
pub(crate) enum Action {
    /// Write the service, then enable and start it.
    Install {
        /// The folder of goal files (made absolute).
        #[arg(long, default_value = "goals")]
        goals: PathBuf,
        /// A unit of the user's own systemd (the default unless run as root).
        #[arg(long, conflicts_with = "system")]
        user: bool,
        /// A system unit in /etc/systemd/system (the default as root).
        #[arg(long)]
        system: bool,
        /// The daemon's --grace at shutdown; the stop timeout is longer.
        #[arg(long, default_value = "30s", value_parser = super::duration)]
        grace: Duration,
        /// The daemon's --max-concurrent: goals running at once at most.
        #[arg(long, default_value_t = 4)]
        max_concurrent: usize,
        /// Write the service file only: do not enable or start it.
        #[arg(long)]
        no_enable: bool,
        /// Print the service file and change nothing.
        #[arg(long)]
        print: bool,
    },
    /// Stop and disable the service and remove its file.
    Uninstall {
        #[arg(long, conflicts_with = "system")]
        user: bool,
        #[arg(long)]
        system: bool,
        /// Remove the file only: do not call systemctl.
        #[arg(long)]
        no_enable: bool,
    },
}

/// What the service runs.
pub(crate) struct Spec {
    exe: PathBuf,
    goals: PathBuf,
    home: PathBuf,
    grace: Duration,
    max_concurrent: usize,
    system: bool,
    /// Variables passed on from the installing shell (`SUP_MODEL`, …), never secrets.
    env: Vec<(String, String)>,
    /// An optional file of secrets (`OPENAI_API_KEY=…`) the service reads.
    env_file: PathBuf,
    /// The OS user a system unit runs as.
    run_as: Option<String>,
    /// A fleet's store URL that carries a password: it lives in `env_file`, not in the unit.
    store_in_env_file: bool,
}

/// One word of an `ExecStart=` line, quoted when needed; `%` and `$` taken literally.
fn unit_word(s: &str) -> String {
    let s = s.replace('%', "%%").replace('$', "$$");
    if s.chars()
        .any(|c| c.is_whitespace() || c == '"' || c == '\'' || c == '\\')
    {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        s
    }
}

fn args(spec: &Spec) -> Vec<String> {
    vec![
        spec.exe.display().to_string(),
        "daemon".into(),
        "--goals".into(),
        spec.goals.display().to_string(),
        "--grace".into(),
        format!("{}s", spec.grace.as_secs().max(1)),
        "--max-concurrent".into(),
        spec.max_concurrent.to_string(),
    ]
}

/// The systemd unit.
pub(crate) fn unit(spec: &Spec) -> String {
    let exec: Vec<String> = args(spec).iter().map(|a| unit_word(a)).collect();
    let mut env = vec![format!("SUP_HOME={}", spec.home.display())];
    env.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
    let env: String = env
        .iter()
        .map(|e| format!("Environment={}\n", unit_word(e)))
        .collect();
    let workdir = spec.goals.parent().unwrap_or(&spec.goals);
    let store_note = if spec.store_in_env_file {
        format!(
            "# SUP_STORE (its URL carries a password) is in {}.\n",
            spec.env_file.display()
        )
    } else {
        String::new()
    };
    let user = spec
        .run_as
        .as_ref()
        .map(|u| format!("User={u}\n"))
        .unwrap_or_default();
    format!(
        "# Written by `sup service install`; remove it with `sup service uninstall`.\n\
         [Unit]\n\
         Description=sup daemon: scheduled goals from {goals}\n\
         After=network-online.target\n\
         Wants=network-online.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={exec}\n\
         ExecReload=/bin/kill -HUP $MAINPID\n\
         {env}\
         {store_note}\
         EnvironmentFile=-{env_file}\n\
         WorkingDirectory={workdir}\n\
         {user}\
         Restart=on-failure\n\
         RestartSec=5\n\
         KillMode=mixed\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec={stop}\n\
         \n\
         [Install]\n\
         WantedBy={wanted}\n",
        goals = spec.goals.display(),
        exec = exec.join(" "),
        env_file = unit_word(&spec.env_file.display().to_string()),
        workdir = unit_word(&workdir.display().to_string()),
        stop = (spec.grace + STOP_MARGIN).as_secs(),
        wanted = if spec.system {
            "multi-user.target"
        } else {
            "default.target"
        },
    )
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The launchd agent (macOS).
pub(crate) fn plist(spec: &Spec) -> String {
    let program: String = args(spec)
        .iter()
        .map(|a| format!("    <string>{}</string>\n", xml(a)))
        .collect();
    let mut env = vec![("SUP_HOME".to_string(), spec.home.display().to_string())];
    env.extend(spec.env.iter().cloned());
    let env: String = env
        .iter()
        .map(|(k, v)| format!("    <key>{}</key><string>{}</string>\n", xml(k), xml(v)))
        .collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
         <plist version=\"1.0\">\n<dict>\n\
         \x20 <key>Label</key><string>{LABEL}</string>\n\
         \x20 <key>ProgramArguments</key>\n  <array>\n{program}  </array>\n\
         \x20 <key>EnvironmentVariables</key>\n  <dict>\n{env}  </dict>\n\
         \x20 <key>WorkingDirectory</key><string>{workdir}</string>\n\
         \x20 <key>RunAtLoad</key><true/>\n\
         \x20 <key>KeepAlive</key><dict><key>SuccessfulExit</key><false/></dict>\n\
         \x20 <key>ExitTimeOut</key><integer>{stop}</integer>\n\
         \x20 <key>StandardErrorPath</key><string>{log}</string>\n\
         </dict>\n</plist>\n",
        workdir = xml(&spec
            .goals
            .parent()
            .unwrap_or(&spec.goals)
            .display()
            .to_string()),
        stop = (spec.grace + STOP_MARGIN).as_secs(),
        log = xml(&spec.home.join("daemon.log").display().to_string()),
    )
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

fn config_home() -> Result<PathBuf, Fail> {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .ok_or_else(|| Fail::usage(anyhow!("neither XDG_CONFIG_HOME nor HOME is set")))
}

/// Where the service file goes.
fn service_path(system: bool) -> Result<PathBuf, Fail> {
    if cfg!(target_os = "macos") {
        let home =
            std::env::var_os("HOME").ok_or_else(|| Fail::usage(anyhow!("HOME is not set")))?;
        return Ok(PathBuf::from(home).join(format!("Library/LaunchAgents/{LABEL}.plist")));
    }
    Ok(if system {
        PathBuf::from("/etc/systemd/system").join(UNIT)
    } else {
        config_home()?.join("systemd/user").join(UNIT)
    })
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Run a service manager command; its failure says what to run by hand.
fn manage(program: &str, args: &[&str]) -> Result<(), Fail> {
    let shown = format!("{program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .status()
        .with_context(|| format!("cannot run `{shown}`"))
        .map_err(Fail::usage)?;
    if status.success() {
        Ok(())
    } else {
        Err(Fail {
            ending: Ending::ChecksFailed,
            error: anyhow!(
                "`{shown}` failed ({status}); the service file is written, run it by hand"
            ),
        })
    }
}

fn absolute(p: &Path) -> Result<PathBuf, Fail> {
    std::fs::canonicalize(p)
        .with_context(|| format!("the goals folder {} does not exist", p.display()))
        .map_err(Fail::usage)
}

/// Whether a store URL carries a password (`postgres://user:secret@…` or `?password=…`).
fn has_password(url: &str) -> Result<bool, Fail> {
    let cfg: tokio_postgres::Config = url.parse().map_err(|e| {
        Fail::usage(anyhow!(
            "--store is not a PostgreSQL URL ({e}); write postgres://USER@HOST:PORT/DATABASE"
        ))
    })?;
    Ok(cfg.get_password().is_some())
}

/// Set `key=value` in the secrets file (or, with no value, take `key` out of it), created or
/// kept at mode 600; other lines stay. Returns whether the file changed.
fn put_secret(path: &Path, key: &str, value: Option<&str>) -> Result<bool, Fail> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create {}", dir.display()))
            .map_err(Fail::usage)?;
    }
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut text: String = old
        .lines()
        .filter(|l| !l.trim_start().starts_with(&format!("{key}=")))
        .map(|l| format!("{l}\n"))
        .collect();
    match value {
        Some(v) => text.push_str(&format!("{key}={v}\n")),
        // Nothing to take out: the file stays as it is (or absent).
        None if text.len() == old.len() => return Ok(false),
        None => {}
    }
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        // An existing file keeps its mode when opened; make it private too.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(text.as_bytes())
    };
    write()
        .with_context(|| format!("cannot write {}", path.display()))
        .map_err(Fail::usage)?;
    Ok(true)
}

/// `sup service`; a fleet's store URL (`--store`, `SUP_STORE`) is passed on to the daemon.
pub(crate) fn service(action: Action, store: Option<&str>) -> Result<Ending, Fail> {
    match action {
        Action::Install {
            goals,
            user,
            system,
            grace,
            max_concurrent,
            no_enable,
            print,
        } => {
            let system = system || (!user && is_root());
            let goals = absolute(&goals)?;
            let home = crate::store::home();
            std::fs::create_dir_all(&home)
                .with_context(|| format!("cannot create SUP_HOME {}", home.display()))
                .map_err(Fail::usage)?;
            let home = absolute(&home)?;
            let env_file = if system {
                PathBuf::from("/etc/sup/env")
            } else {
                config_home()?.join("sup/env")
            };
            let secret_store = match store {
                Some(url) => has_password(url)?,
                None => false,
            };
            let mut passed: Vec<(String, String)> = ["SUP_MODEL", "SUP_APPROVAL", "SUP_CONFIG"]
                .iter()
                .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
                .filter(|(_, v)| !v.is_empty())
                .collect();
            // launchd has no secrets file: the URL goes in the agent, written mode 600.
            if let Some(url) = store.filter(|_| !secret_store || cfg!(target_os = "macos")) {
                passed.push(("SUP_STORE".into(), url.to_string()));
            }
            let spec = Spec {
                exe: std::env::current_exe()
                    .context("cannot find the sup binary")
                    .map_err(Fail::usage)?,
                goals,
                home,
                grace,
                max_concurrent,
                system,
                env: passed,
                env_file,
                run_as: system
                    .then(|| {
                        std::env::var("SUDO_USER")
                            .or_else(|_| std::env::var("USER"))
                            .ok()
                    })
                    .flatten()
                    .filter(|u| u != "root"),
                store_in_env_file: secret_store && !cfg!(target_os = "macos"),
            };
            let text = if cfg!(target_os = "macos") {
                plist(&spec)
            } else {
                unit(&spec)
            };
            if print {
                print!("{text}");
                if spec.store_in_env_file {
                    eprintln!(
                        "install would put SUP_STORE (its URL carries a password) in {} (mode 600)",
                        spec.env_file.display()
                    );
                }
                return Ok(Ending::Achieved);
            }
            // The secrets file overrides the unit: it holds SUP_STORE only when the URL has a
            // password, so a store given otherwise (or none) is not overridden by an old one.
            if let (Some(url), true) = (store, spec.store_in_env_file) {
                put_secret(&spec.env_file, "SUP_STORE", Some(url))?;
                println!(
                    "the store URL carries a password: SUP_STORE is in {} (mode 600), not in \
                     the unit",
                    spec.env_file.display()
                );
            } else if !cfg!(target_os = "macos") && put_secret(&spec.env_file, "SUP_STORE", None)? {
                println!(
                    "took the SUP_STORE of an earlier install out of {}",
                    spec.env_file.display()
                );
            }
            let path = service_path(system)?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))
                    .map_err(Fail::usage)?;
            }
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))
                .map_err(Fail::usage)?;
            if secret_store && cfg!(target_os = "macos") {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .with_context(|| format!("cannot make {} private", path.display()))
                    .map_err(Fail::usage)?;
            }
            println!("wrote {}", path.display());
            println!(
                "secrets for the service (OPENAI_API_KEY=…) go in {} (mode 600)",
                spec.env_file.display()
            );
            if no_enable {
                return Ok(Ending::Achieved);
            }
            if cfg!(target_os = "macos") {
                let p = path.display().to_string();
                manage("launchctl", &["load", "-w", &p])?;
            } else if on_path("systemctl") {
                let scope: &[&str] = if system { &[] } else { &["--user"] };
                manage("systemctl", &[scope, &["daemon-reload"]].concat())?;
                manage("systemctl", &[scope, &["enable", "--now", UNIT]].concat())?;
                println!("enabled and started {UNIT}");
            } else {
                println!("no systemctl here: start the daemon with the unit's ExecStart line");
            }
            Ok(Ending::Achieved)
        }
        Action::Uninstall {
            user,
            system,
            no_enable,
        } => {
            let system = system || (!user && is_root());
            let path = service_path(system)?;
            if !path.exists() {
                return Err(Fail::usage(anyhow!(
                    "no service file at {}; nothing to uninstall",
                    path.display()
                )));
            }
            if !no_enable {
                if cfg!(target_os = "macos") {
                    let p = path.display().to_string();
                    manage("launchctl", &["unload", "-w", &p])?;
                } else if on_path("systemctl") {
                    let scope: &[&str] = if system { &[] } else { &["--user"] };
                    manage("systemctl", &[scope, &["disable", "--now", UNIT]].concat())?;
                }
            }
            std::fs::remove_file(&path)
                .with_context(|| format!("cannot remove {}", path.display()))
                .map_err(Fail::usage)?;
            if !no_enable && !cfg!(target_os = "macos") && on_path("systemctl") {
                let scope: &[&str] = if system { &[] } else { &["--user"] };
                manage("systemctl", &[scope, &["daemon-reload"]].concat())?;
            }
            println!("removed {}", path.display());
            Ok(Ending::Achieved)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            exe: "/usr/bin/sup".into(),
            goals: "/srv/my goals".into(),
            home: "/var/lib/sup".into(),
            grace: Duration::from_secs(45),
            max_concurrent: 2,
            system: false,
            env: vec![("SUP_MODEL".into(), "openai:gpt-4o-mini".into())],
            env_file: "/home/u/.config/sup/env".into(),
            run_as: None,
            store_in_env_file: false,
        }
    }

    #[test]
    fn the_plist_runs_the_daemon_and_restarts_on_failure() {
        let p = plist(&spec());
        assert!(p.contains("<string>/srv/my goals</string>"), "{p}");
        assert!(p.contains("<key>SuccessfulExit</key><false/>"), "{p}");
        assert!(p.contains("<integer>75</integer>"), "{p}");
    }

    #[test]
    fn unit_words_with_spaces_are_quoted() {
        assert_eq!(unit_word("/srv/my goals"), "\"/srv/my goals\"");
        assert_eq!(unit_word("50%"), "50%%");
    }
}
