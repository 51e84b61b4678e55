//! Which process is on the other end of a connection from this machine, and whether `sup`
//! started it. A run's commands may reach the console (the network is on by default); they
//! may look at pages, but a sign-in or any other state-changing request from a process that
//! `sup` started (or from one that cannot be identified) is refused, so the agent cannot
//! answer its own approvals. The client socket is found in `/proc/net/tcp{,6}` (its local
//! address is the peer's, its remote ours), its holders by `socket:[INODE]` among
//! `/proc/*/fd`, and each holder's parent chain is walked: a process that lives in a run's
//! jail (a PID namespace other than the console's own, by `/proc/PID/ns/pid`: a copy of
//! the binary under any name is no exception), an ancestor that runs this very binary (same
//! file, by device and inode; by name where the kernel hides the file of a non-dumpable
//! process), or any process of the chain that started with `SUP_RUN_ID`, is `sup`'s.
//! Orphans outside a jail are re-parented to `sup` (a subreaper), so double forks still
//! lead there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;

use crate::tools::sandbox::{ns_of, parent_of, run_of};

/// Both ends of an accepted connection, as the server sees them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Conn {
    pub(crate) peer: SocketAddr,
    pub(crate) local: Option<SocketAddr>,
}

/// Who sent a request.
#[derive(Debug, PartialEq)]
pub(crate) enum Peer {
    /// From another machine (no socket of this machine has its address).
    Remote,
    /// A process of this machine outside `sup`'s tree.
    Outside,
    /// Process `pid` (`comm`), whose ancestor or itself (`by`) is `sup`'s.
    Sup { pid: i32, comm: String, by: String },
    /// From this machine, but no process holding the socket could be read.
    Unknown(String),
}

/// `addr` without an IPv4-mapped IPv6 wrapping.
fn plain(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), addr.port()),
            None => addr,
        },
        IpAddr::V4(_) => addr,
    }
}

/// `0100007F:1F90` (`/proc/net/tcp`: the address's bytes as host-order words, then the port).
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(
            u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
                .ok()?
                .to_ne_bytes(),
        )
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(plain(SocketAddr::new(ip, port)))
}

/// The inode of the socket in `table` (a `/proc/net/tcp{,6}` text) whose local address is
/// `peer` and remote `ours`: 0 when its process has closed it already.
fn socket_inode(table: &str, peer: SocketAddr, ours: SocketAddr) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && parse_addr(f[1]) == Some(peer) && parse_addr(f[2]) == Some(ours))
            .then(|| f[9].parse().ok())
            .flatten()
    })
}

fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The processes with `socket:[inode]` open, and whether any `fd` folder could not be read.
fn holders(inode: u64) -> (Vec<i32>, bool) {
    let want = format!("socket:[{inode}]");
    let mut found = Vec::new();
    let mut hidden = false;
    for pid in pids() {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            hidden = true;
            continue;
        };
        if fds
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .any(|l| l.as_os_str() == want.as_str())
        {
            found.push(pid);
        }
    }
    (found, hidden)
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default()
}

/// Why process `pid` counts as `sup`'s own, if it does.
fn sups(pid: i32, me: (u64, u64), my_comm: &str) -> Option<String> {
    let theirs = ns_of(pid);
    if theirs.is_some() && theirs != ns_of(std::process::id() as i32) {
        return Some(format!(
            "process {pid} lives in a run's jail (its own PID namespace)"
        ));
    }
    match std::fs::metadata(format!("/proc/{pid}/exe")) {
        Ok(m) if (m.dev(), m.ino()) == me => return Some(format!("process {pid} runs sup")),
        Ok(_) => {}
        // The kernel hides the file of a non-dumpable process, as `sup` makes itself.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && comm(pid) == my_comm => {
            return Some(format!("process {pid} is named {my_comm}"));
        }
        Err(_) => {}
    }
    run_of(pid).map(|_| format!("process {pid} started with SUP_RUN_ID"))
}

/// Who is on the other end of a connection from `peer` to `ours`.
pub(crate) fn identify(peer: SocketAddr, ours: SocketAddr) -> Peer {
    let (peer, ours) = (plain(peer), plain(ours));
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .find_map(|t| socket_inode(&t, peer, ours));
    let Some(inode) = inode else {
        return if peer.ip().is_loopback() {
            Peer::Unknown(format!("no socket of this machine is {peer}"))
        } else {
            Peer::Remote
        };
    };
    if inode == 0 {
        return Peer::Unknown(format!("the process at {peer} closed its socket already"));
    }
    let (found, hidden) = holders(inode);
    if found.is_empty() {
        return Peer::Unknown(if hidden {
            format!("the process that holds {peer} is not readable by sup")
        } else {
            format!("no process holds {peer} any more")
        });
    }
    let Ok(me) = std::fs::metadata("/proc/self/exe") else {
        return Peer::Unknown("sup cannot read its own /proc/self/exe".into());
    };
    let me = (me.dev(), me.ino());
    let my_comm = comm(std::process::id() as i32);
    for pid in found {
        let mut p = pid;
        // A chain ends at pid 1; a cycle cannot happen, but a bound costs nothing.
        for _ in 0..4096 {
            if let Some(by) = sups(p, me, &my_comm) {
                return Peer::Sup {
                    pid,
                    comm: comm(pid),
                    by,
                };
            }
            match parent_of(p) {
                Some(pp) if pp > 0 && pp != p => p = pp,
                _ => break,
            }
        }
    }
    Peer::Outside
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_proc_net_tcp() {
        let v4: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let hex = format!("{:08X}:1F90", u32::from_ne_bytes([127, 0, 0, 1]));
        assert_eq!(parse_addr(&hex), Some(v4));
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:8080".parse().unwrap();
        assert_eq!(plain(mapped), v4);
        let one: SocketAddr = "[::1]:80".parse().unwrap();
        let words: String = (0..4)
            .map(|i| {
                let mut b = [0u8; 4];
                b.copy_from_slice(&Ipv6Addr::LOCALHOST.octets()[i * 4..i * 4 + 4]);
                format!("{:08X}", u32::from_ne_bytes(b))
            })
            .collect();
        assert_eq!(parse_addr(&format!("{words}:0050")), Some(one));
        let ours: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let ours_hex = format!("{:08X}:0050", u32::from_ne_bytes([127, 0, 0, 1]));
        let table = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             0: {hex} {ours_hex} 01 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
        );
        assert_eq!(socket_inode(&table, v4, ours), Some(4242));
        assert_eq!(socket_inode(&table, ours, v4), None);
        // Closed by its process (FIN_WAIT, TIME_WAIT): still this machine's, held by none.
        let closed = table.replace(" 4242 1", " 0 1");
        assert_eq!(socket_inode(&closed, v4, ours), Some(0));
    }
}
