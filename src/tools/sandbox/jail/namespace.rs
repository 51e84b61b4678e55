//! The run's namespaces over its life: held (its init recorded for the sweep and the
//! cgroup), renewed before and after each try's checks, and, with a network allowlist,
//! the proxy that is the only way out of them.

use super::*;

impl Jail {
    /// Serve the allowlist on the namespace's loopback and point every jailed process at it;
    /// without it the network is off.
    pub(super) fn start_proxy(
        &mut self,
        listener: Option<OwnedFd>,
        list: Vec<crate::tools::sandbox::HostPattern>,
    ) {
        let started = listener
            .ok_or_else(|| std::io::Error::other("no listening socket"))
            .and_then(|l| Proxy::start(l, list));
        let proxy = match started {
            Ok(p) => p,
            Err(e) => {
                self.missing.push(format!(
                    "the network allowlist's proxy could not start ({e}): the network is off"
                ));
                self.network = Network::Off;
                return;
            }
        };
        let url = OsString::from(format!("http://127.0.0.1:{}", proxy.port()));
        // Nothing bypasses the proxy: there is no other way out of the namespace anyway.
        self.env.retain(|(k, _)| {
            let k = k.to_string_lossy().to_ascii_lowercase();
            !k.ends_with("_proxy")
        });
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
            self.env.push((k.into(), url.clone()));
            self.env.push((k.to_ascii_lowercase().into(), url.clone()));
        }
        self.env.push(("NO_PROXY".into(), OsString::new()));
        self.env.push(("no_proxy".into(), OsString::new()));
        self.proxy = Some(proxy);
    }

    /// Tell each request the proxy refuses to `f` (the run's events).
    pub(crate) fn on_refusal(&self, f: impl Fn(String) + Send + Sync + 'static) {
        if let Some(p) = &self.proxy {
            p.on_refusal(Box::new(f));
        }
    }

    /// Know `ns` as this run's: its init is never swept as an orphan, and the run folder
    /// names it for the sweep after a `sup` that was killed. The namespace's inode is reused
    /// once it is gone: its init (pid and start time) tells this namespace from a later one
    /// with the same number.
    pub(super) fn hold(&self, ns: &PidNs) {
        let init = ns.init();
        if let Ok(mut inits) = INITS.lock() {
            inits.push(init);
        }
        let start = start_time(init).unwrap_or_default();
        let _ = std::fs::write(
            self.run_dir.join(JAIL),
            format!("{} {} {init} {start}\n", ns.id.0, ns.id.1),
        );
        if let Some(l) = &self.limits {
            l.hold(init);
        }
    }

    /// End the run's PID namespace, and with it every process in it (MCP servers and what
    /// they started included), and put a fresh one in its place: before a try's checks, so
    /// that they run in a jail of their own that holds nothing of the agent's, and after
    /// them, for the next try. A run without a PID namespace has nothing to renew.
    pub(crate) fn renew(&self) -> Result<(), SandboxError> {
        let mut ns = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mut old) = ns.take() else {
            return Ok(());
        };
        if let Ok(mut inits) = INITS.lock() {
            inits.retain(|i| *i != old.init());
        }
        let mounted = old.mnt_ns.is_some();
        // The network namespace of an allowlist stays, with the proxy's socket in it: the
        // fresh PID namespace's processes join it as the old one's did.
        let net = old.net_ns.take();
        // Waits for the init, which the kernel lets end only once every member has.
        drop(old);
        let mut fresh = self.fresh_namespace(false).map_err(|e| {
            SandboxError::Setup(format!("cannot make the run a fresh PID namespace: {e}"))
        })?;
        // A run whose mount namespace did not work has its commands make none.
        if !mounted {
            fresh.mnt_ns = None;
        }
        fresh.net_ns = net;
        self.hold(&fresh);
        *ns = Some(fresh);
        Ok(())
    }

    /// A new PID namespace for the run, with the jail's mounts made once by its init (its
    /// commands join them).
    /// With `net`, a network namespace of its own too (see `PidNs::new`).
    pub(super) fn fresh_namespace(&self, net: bool) -> std::io::Result<PidNs> {
        let mounts = || {
            hide_behind_read_only_mounts(&self.binds, None, true, &self.hides, &self.empty, true)
        };
        PidNs::new(Some(&mounts), net)
    }

    /// The current namespace's id and init, for the sweep.
    pub(super) fn current(&self) -> Option<((u64, u64), i32)> {
        let ns = self.ns.lock().unwrap_or_else(|e| e.into_inner());
        ns.as_ref().map(|n| (n.id, n.init()))
    }
}
