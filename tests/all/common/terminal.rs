//! `sup` on a pseudo-terminal that is its controlling terminal, for the approval prompt: the
//! child, the terminal's writer, and a `Screen` of everything it has printed.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Env, Killed, SpawnKilled, eventually};

/// Everything the terminal has shown so far, as bytes (a read may end inside a character).
#[derive(Clone)]
pub struct Screen(Arc<Mutex<Vec<u8>>>);

impl Screen {
    pub fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Wait until `what` has been shown `count` times; the text shown by then.
    pub fn wait_for(&self, what: &str, count: usize) -> String {
        eventually(
            Duration::from_secs(20),
            &format!("{count}× {what:?}"),
            || {
                let text = self.text();
                (text.matches(what).count() >= count).then_some(text)
            },
        )
    }

    /// Wait for the approval prompt; the text shown by then.
    pub fn prompt(&self) -> String {
        self.wait_for("Allow?", 1)
    }
}

/// Run `sup ARGS` (approval mode from the goal or flags, not the harness's `auto`) on a new
/// pseudo-terminal that is its controlling terminal and its stdin and stderr.
pub fn on_a_terminal(env: &Env, args: &[String]) -> (Killed, std::fs::File, Screen) {
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut cmd = env.sup();
    cmd.env_remove("SUP_APPROVAL")
        .args(args)
        .stdin(slave.try_clone().unwrap())
        .stdout(Stdio::piped())
        .stderr(slave.try_clone().unwrap());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn_killed();
    drop(slave);
    let master = std::fs::File::from(pty.master);
    let mut reader = master.try_clone().unwrap();
    let screen = Screen(Arc::new(Mutex::new(Vec::new())));
    let sink = screen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.0.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    (child, master, screen)
}

/// `run work --model script:SCRIPT`, as terminal arguments.
pub fn run_args(script: &std::path::Path) -> Vec<String> {
    vec![
        "run".into(),
        "work".into(),
        "--model".into(),
        format!("script:{}", script.display()),
    ]
}
