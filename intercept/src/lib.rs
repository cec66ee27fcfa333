//! intercept: captures the test server's replies on the assist host (where they die, since the
//! host does not forward) and relays what each copier needs to play its mirrored clients.
//!
//! Rooms: [`capture`] (the capture edge, over [`ops::packet_socket`] or libpcap), [`pump`] (the capture thread's loop), [`sessions`],
//! [`reassembly`] and [`framer`] (the MySQL packets of each reply stream), [`relay`] (who gets
//! which feedback), [`server`] (the copiers' control connections), [`feed`] (writing to one
//! copier without waiting), [`outputs`] (the status line
//! and `--metrics`, for one capture thread or `--workers N`). intercept never sends a
//! packet toward a client or a server; it only listens and talks to copiers.
//!
//! On the test host itself ([`onhost`]), replies come from an NFQUEUE ([`nfqueue`]) that an
//! nftables rule of ours ([`nftables`]) feeds, both spoken over [`netlink`].

pub mod capture;
pub mod cli;
pub mod daemon;
pub mod doctor;
pub mod feed;
pub mod framer;
pub mod metrics;
pub mod netlink;
pub mod nfqueue;
pub mod nftables;
pub mod onhost;
pub mod outputs;
pub mod pump;
pub mod reassembly;
pub mod relay;
pub mod server;
pub mod sessions;
pub mod signals;
