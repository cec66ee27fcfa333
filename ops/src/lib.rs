//! Operations glue shared by the copier and intercept daemons, kept out of their packet paths.
//!
//! [`config`]: `--config FILE` (TOML) whose keys are the daemons' long flags, and
//! `--print-config`. [`reload`]: SIGHUP re-reads the config file and applies what can change
//! in a running daemon (the log filter), naming what needs a restart. [`check`]: the doctor's
//! findings and how they are printed. [`host`]: facts about this host (sysctls, capabilities,
//! interfaces, clock, conntrack). [`arp`]: who answers ARP for an address on a segment.
//! [`privs`]: dropping capabilities once the privileged sockets are open. [`sched`]: the
//! packet path's scheduling priority (`--capture-priority`). [`secret`]: the control
//! channel's `--secret-file` and random nonces. [`packet_socket`]: a plain `AF_PACKET`
//! capture socket, with [`sockopt`] for its options. [`nowait`]: one send or receive on a
//! stream socket that does not wait.

pub mod arp;
pub mod check;
pub mod config;
pub mod host;
pub mod nowait;
pub mod packet_socket;
pub mod privs;
pub mod reload;
pub mod sched;
pub mod secret;
pub mod sockopt;
