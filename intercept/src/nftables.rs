//! The nftables rule of on-test-host mode: one table of our own, `ip tcpshadow_intercept`, with
//! one chain on the output hook that sends the test server's replies to mirrored clients
//! (destination in the client pool, source port a mirrored port) to an NFQUEUE.
//!
//! What the room is for: encoding that table as an nf_tables netlink batch, installing it,
//! removing it, and describing it in `nft` syntax for logs and documentation. It must never
//! touch a table that is not ours: everything it does is addressed by the fixed table name,
//! so a user's own rules, firewalld's or Docker's are never read, changed or flushed.
//!
//! Why a table of our own: deleting it removes every trace in one step, also after a crash,
//! and installing is one atomic batch (table, chain, rules), so there is never a
//! half-installed rule set.
//!
//! Why the queue has no `bypass` flag: without a reader the kernel then drops the queued
//! replies (fail closed). With bypass, a crashed intercept would let the replies go out to
//! the network toward the pool addresses.
//!
//! Why NFQUEUE rather than `log group N` + `drop` (NFLOG, no verdicts to send): a drop in the
//! output path is synchronous, the test server's TCP sees the transmit fail (EPERM), does not
//! count the segment as sent and retries it, so the copier's ACKs would be for data the
//! server thinks it never sent. A queued packet counts as sent; our later drop verdict is
//! invisible to TCP.
//!
//! The `queue` expression needs the kernel's nft_queue (module or built in). Kernels without
//! it (like the lab's) still have the iptables NFQUEUE target, which nf_tables can run through
//! nft_compat: [`QueueStatement::XtNfqueue`] is tried when [`QueueStatement::Native`] is
//! refused. `nft list` shows either as `queue num N`.

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::netlink::{
    self, MessageBuf, NetlinkSocket, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL,
    NLM_F_REQUEST,
};

/// Our table (family ip). Fixed, so a restart or `intercept --cleanup` finds what a killed
/// intercept left behind, and it can only ever be ours.
pub const TABLE: &str = "tcpshadow_intercept";
/// Its one chain.
pub const CHAIN: &str = "replies";
/// After conntrack (-200), before NAT (-100) and filter (0) rules: "mangle".
///
/// After conntrack, because conntrack must see the replies: if it saw only the client side
/// of a mirrored connection, the copier's handshake ACK would be INVALID for it, and the
/// common firewall rule `ct state invalid drop` (firewalld, ufw, most examples) would drop it
/// (checked in the lab: with priority -300 not one query was mirrored). Before filter rules,
/// so none of them can drop a reply synchronously (see the module doc) or NAT rewrite it.
pub const PRIORITY: i32 = -150;

// Kernel ABI (include/uapi/linux/netfilter/nfnetlink.h, nf_tables.h, netfilter.h).
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFPROTO_IPV4: u8 = 2;
const AF_UNSPEC: u8 = 0;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_ACCEPT: u32 = 1;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFT_META_L4PROTO: u32 = 16;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_QUEUE_NUM: u16 = 1;
const NFTA_QUEUE_TOTAL: u16 = 2;
const NFTA_TARGET_NAME: u16 = 1;
const NFTA_TARGET_REV: u16 = 2;
const NFTA_TARGET_INFO: u16 = 3;
/// The first 16-byte register; what `nft` itself uses for these matches.
const NFT_REG_1: u32 = 1;
/// libnftnl's rule comment (NFTNL_UDATA_RULE_COMMENT), the TLV `nft` prints as `comment`.
const UDATA_RULE_COMMENT: u8 = 0;

/// How long the kernel may take to answer a batch.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// What is queued: IPv4 TCP from `ports` (and `server`, when set) to `pool`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyRule {
    pub pool: (Ipv4Addr, u8),
    pub ports: Vec<u16>,
    pub server: Option<Ipv4Addr>,
    pub queue: u16,
    /// Shown by `nft list` next to each rule.
    pub comment: String,
}

/// How a rule hands packets to the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueStatement {
    /// nf_tables' own `queue` expression (nft_queue).
    Native,
    /// The iptables NFQUEUE target (revision 1) run by nft_compat.
    XtNfqueue,
}

impl fmt::Display for QueueStatement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QueueStatement::Native => "nft queue",
            QueueStatement::XtNfqueue => "xt NFQUEUE via nft_compat",
        })
    }
}

fn pool_mask(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p => u32::MAX << (32 - u32::from(p.min(32))),
    }
}

impl ReplyRule {
    /// The rule set in `nft -f` syntax: what the log shows and what a person can compare with
    /// `nft list table ip tcpshadow_intercept`.
    pub fn describe(&self) -> String {
        let (net, prefix) = self.pool;
        let mut rules = String::new();
        for port in &self.ports {
            let server = self
                .server
                .map(|s| format!("ip saddr {s} "))
                .unwrap_or_default();
            rules.push_str(&format!(
                "\t\tip daddr {net}/{prefix} {server}tcp sport {port} counter queue num {} comment \"{}\"\n",
                self.queue, self.comment
            ));
        }
        format!(
            "table ip {TABLE} {{\n\tchain {CHAIN} {{\n\t\ttype filter hook output priority {PRIORITY}; policy accept;\n{rules}\t}}\n}}"
        )
    }
}

/// Adds one `NFTA_LIST_ELEM { name, data { ... } }` expression.
fn expr(b: &mut MessageBuf, name: &str, data: impl FnOnce(&mut MessageBuf)) {
    let elem = b.nest(NFTA_LIST_ELEM);
    b.put_str(NFTA_EXPR_NAME, name);
    let d = b.nest(NFTA_EXPR_DATA);
    data(b);
    b.end_nest(d);
    b.end_nest(elem);
}

fn data_value(b: &mut MessageBuf, ty: u16, value: &[u8]) {
    let n = b.nest(ty);
    b.put(NFTA_DATA_VALUE, value);
    b.end_nest(n);
}

fn cmp_eq(b: &mut MessageBuf, value: &[u8]) {
    expr(b, "cmp", |b| {
        b.put_u32_be(NFTA_CMP_SREG, NFT_REG_1);
        b.put_u32_be(NFTA_CMP_OP, NFT_CMP_EQ);
        data_value(b, NFTA_CMP_DATA, value);
    });
}

fn payload(b: &mut MessageBuf, base: u32, offset: u32, len: u32) {
    expr(b, "payload", |b| {
        b.put_u32_be(NFTA_PAYLOAD_DREG, NFT_REG_1);
        b.put_u32_be(NFTA_PAYLOAD_BASE, base);
        b.put_u32_be(NFTA_PAYLOAD_OFFSET, offset);
        b.put_u32_be(NFTA_PAYLOAD_LEN, len);
    });
}

/// The expressions of one rule: `meta l4proto tcp ip daddr POOL [ip saddr S] tcp sport P
/// counter queue num N`.
fn rule_expressions(b: &mut MessageBuf, rule: &ReplyRule, port: u16, stmt: QueueStatement) {
    let list = b.nest(NFTA_RULE_EXPRESSIONS);
    expr(b, "meta", |b| {
        b.put_u32_be(NFTA_META_DREG, NFT_REG_1);
        b.put_u32_be(NFTA_META_KEY, NFT_META_L4PROTO);
    });
    cmp_eq(b, &[libc::IPPROTO_TCP as u8]);
    // Destination address: IPv4 header offset 16.
    payload(b, NFT_PAYLOAD_NETWORK_HEADER, 16, 4);
    let (net, prefix) = rule.pool;
    let mask = pool_mask(prefix);
    if mask != u32::MAX {
        expr(b, "bitwise", |b| {
            b.put_u32_be(NFTA_BITWISE_SREG, NFT_REG_1);
            b.put_u32_be(NFTA_BITWISE_DREG, NFT_REG_1);
            b.put_u32_be(NFTA_BITWISE_LEN, 4);
            data_value(b, NFTA_BITWISE_MASK, &mask.to_be_bytes());
            data_value(b, NFTA_BITWISE_XOR, &[0; 4]);
        });
    }
    cmp_eq(b, &(u32::from(net) & mask).to_be_bytes());
    if let Some(server) = rule.server {
        // Source address: offset 12.
        payload(b, NFT_PAYLOAD_NETWORK_HEADER, 12, 4);
        cmp_eq(b, &server.octets());
    }
    // Source port: the transport header's first two bytes.
    payload(b, NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2);
    cmp_eq(b, &port.to_be_bytes());
    expr(b, "counter", |_| {});
    match stmt {
        QueueStatement::Native => expr(b, "queue", |b| {
            b.put_u16_be(NFTA_QUEUE_NUM, rule.queue);
            b.put_u16_be(NFTA_QUEUE_TOTAL, 1);
            // No NFTA_QUEUE_FLAGS: no bypass, no fanout (see the module doc).
        }),
        QueueStatement::XtNfqueue => expr(b, "target", |b| {
            b.put_str(NFTA_TARGET_NAME, "NFQUEUE");
            b.put_u32_be(NFTA_TARGET_REV, 1);
            // struct xt_NFQ_info_v1 { __u16 queuenum; __u16 queues_total; } in host order,
            // padded to XT_ALIGN (8), the size nft_compat checks.
            let mut info = [0u8; 8];
            info[0..2].copy_from_slice(&rule.queue.to_ne_bytes());
            info[2..4].copy_from_slice(&1u16.to_ne_bytes());
            b.put(NFTA_TARGET_INFO, &info);
        }),
    }
    b.end_nest(list);
}

fn nft_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

/// A batch being built: the messages between BATCH_BEGIN and BATCH_END, and what each
/// acknowledged message was (for error messages).
pub struct Batch {
    buf: MessageBuf,
    seq: u32,
    acked: Vec<(u32, String)>,
}

impl Batch {
    pub fn new(first_seq: u32) -> Self {
        let mut buf = MessageBuf::new();
        let m = buf.begin(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, first_seq);
        buf.nfgen(AF_UNSPEC, NFNL_SUBSYS_NFTABLES);
        buf.end(m);
        Batch {
            buf,
            seq: first_seq.wrapping_add(1),
            acked: Vec::new(),
        }
    }

    fn msg(&mut self, ty: u16, flags: u16, what: String, body: impl FnOnce(&mut MessageBuf)) {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let m = self
            .buf
            .begin(nft_type(ty), NLM_F_REQUEST | NLM_F_ACK | flags, seq);
        self.buf.nfgen(NFPROTO_IPV4, 0);
        body(&mut self.buf);
        self.buf.end(m);
        self.acked.push((seq, what));
    }

    /// Deletes our table and everything in it.
    pub fn delete_table(&mut self) {
        self.msg(
            NFT_MSG_DELTABLE,
            0,
            format!("delete table ip {TABLE}"),
            |b| b.put_str(NFTA_TABLE_NAME, TABLE),
        );
    }

    /// Creates our table, its chain and one rule per port. EXCL: fails if the table exists
    /// (another intercept installed it since we looked), instead of adding a second set of
    /// rules to it.
    pub fn install(&mut self, rule: &ReplyRule, stmt: QueueStatement) {
        self.msg(
            NFT_MSG_NEWTABLE,
            NLM_F_CREATE | NLM_F_EXCL,
            format!("add table ip {TABLE}"),
            |b| b.put_str(NFTA_TABLE_NAME, TABLE),
        );
        self.msg(
            NFT_MSG_NEWCHAIN,
            NLM_F_CREATE | NLM_F_EXCL,
            format!("add chain ip {TABLE} {CHAIN} (hook output priority {PRIORITY})"),
            |b| {
                b.put_str(NFTA_CHAIN_TABLE, TABLE);
                b.put_str(NFTA_CHAIN_NAME, CHAIN);
                let hook = b.nest(NFTA_CHAIN_HOOK);
                b.put_u32_be(NFTA_HOOK_HOOKNUM, NF_INET_LOCAL_OUT);
                b.put_u32_be(NFTA_HOOK_PRIORITY, PRIORITY as u32);
                b.end_nest(hook);
                b.put_u32_be(NFTA_CHAIN_POLICY, NF_ACCEPT);
                b.put_str(NFTA_CHAIN_TYPE, "filter");
            },
        );
        for &port in &rule.ports {
            self.msg(
                NFT_MSG_NEWRULE,
                NLM_F_CREATE | NLM_F_APPEND,
                format!("add rule for tcp sport {port} ({stmt})"),
                |b| {
                    b.put_str(NFTA_RULE_TABLE, TABLE);
                    b.put_str(NFTA_RULE_CHAIN, CHAIN);
                    rule_expressions(b, rule, port, stmt);
                    let comment = rule.comment.as_bytes();
                    let n = comment.len().min(200);
                    let mut udata = vec![UDATA_RULE_COMMENT, (n + 1) as u8];
                    udata.extend_from_slice(&comment[..n]);
                    udata.push(0);
                    b.put(NFTA_RULE_USERDATA, &udata);
                },
            );
        }
    }

    /// The batch, closed with BATCH_END.
    pub fn finish(mut self) -> (Vec<u8>, Vec<(u32, String)>) {
        let m = self.buf.begin(NFNL_MSG_BATCH_END, NLM_F_REQUEST, self.seq);
        self.buf.nfgen(AF_UNSPEC, NFNL_SUBSYS_NFTABLES);
        self.buf.end(m);
        (self.buf.as_bytes().to_vec(), self.acked)
    }
}

/// Why talking to nf_tables failed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error(
        "cannot open a netfilter netlink socket ({0}); is this a Linux kernel with nf_tables?"
    )]
    Socket(io::Error),
    #[error("cannot talk to nf_tables: {0}")]
    Io(io::Error),
    #[error("nf_tables refused `{what}`: {err}")]
    Refused { what: String, err: io::Error },
}

impl NftError {
    /// The errno of a refusal, when it is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NftError::Refused { err, .. } => err.raw_os_error(),
            _ => None,
        }
    }
}

/// Our table's lifecycle in the kernel.
pub struct Nftables {
    sock: NetlinkSocket,
    seq: u32,
}

impl Nftables {
    pub fn open() -> Result<Self, NftError> {
        let sock = NetlinkSocket::open(libc::NETLINK_NETFILTER).map_err(NftError::Socket)?;
        Ok(Nftables {
            sock,
            seq: netlink::initial_seq(),
        })
    }

    fn run(&mut self, batch: Batch) -> Result<(), NftError> {
        let (bytes, acked) = batch.finish();
        let seqs: Vec<u32> = acked.iter().map(|(s, _)| *s).collect();
        self.seq = self.seq.wrapping_add(seqs.len() as u32 + 2);
        let codes = self
            .sock
            .transact(&bytes, &seqs, ANSWER_TIMEOUT)
            .map_err(NftError::Io)?;
        for ((_, what), code) in acked.into_iter().zip(codes) {
            if code != 0 {
                return Err(NftError::Refused {
                    what,
                    err: io::Error::from_raw_os_error(-code),
                });
            }
        }
        Ok(())
    }

    /// Deletes our table if it exists; whether it did.
    pub fn remove(&mut self) -> Result<bool, NftError> {
        let mut batch = Batch::new(self.seq);
        batch.delete_table();
        match self.run(batch) {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Installs `rule` with the native queue expression, or through nft_compat where the
    /// kernel has no nft_queue. Returns which one took.
    pub fn install(&mut self, rule: &ReplyRule) -> Result<QueueStatement, NftError> {
        let mut last = None;
        for stmt in [QueueStatement::Native, QueueStatement::XtNfqueue] {
            let mut batch = Batch::new(self.seq);
            batch.install(rule, stmt);
            match self.run(batch) {
                Ok(()) => return Ok(stmt),
                // ENOENT/EOPNOTSUPP: this kernel lacks the expression (the kernel loads
                // modules itself and replays the batch, so this is final).
                Err(e) if matches!(e.errno(), Some(libc::ENOENT | libc::EOPNOTSUPP)) => {
                    last = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(NftError::Io(io::Error::other("no queue statement tried"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{attrs, messages, nfgen, Attr};

    fn rule() -> ReplyRule {
        ReplyRule {
            pool: (Ipv4Addr::new(198, 19, 5, 0), 24),
            ports: vec![3306, 3307],
            server: None,
            queue: 36524,
            comment: "tcpshadow test".into(),
        }
    }

    /// The kernel ABI numbers we spell out match the ones the libc crate knows.
    #[test]
    fn constants_match_libc() {
        assert_eq!(i32::from(NFNL_SUBSYS_NFTABLES), libc::NFNL_SUBSYS_NFTABLES);
        assert_eq!(i32::from(NFNL_MSG_BATCH_BEGIN), libc::NFNL_MSG_BATCH_BEGIN);
        assert_eq!(i32::from(NFNL_MSG_BATCH_END), libc::NFNL_MSG_BATCH_END);
        assert_eq!(i32::from(NFT_MSG_NEWTABLE), libc::NFT_MSG_NEWTABLE);
        assert_eq!(i32::from(NFT_MSG_DELTABLE), libc::NFT_MSG_DELTABLE);
        assert_eq!(i32::from(NFT_MSG_NEWCHAIN), libc::NFT_MSG_NEWCHAIN);
        assert_eq!(i32::from(NFT_MSG_NEWRULE), libc::NFT_MSG_NEWRULE);
        assert_eq!(i32::from(NFPROTO_IPV4), libc::NFPROTO_IPV4);
        assert_eq!(NF_INET_LOCAL_OUT as i32, libc::NF_INET_LOCAL_OUT);
        assert_eq!(PRIORITY, libc::NF_IP_PRI_MANGLE);
        const { assert!(libc::NF_IP_PRI_CONNTRACK < PRIORITY && PRIORITY < libc::NF_IP_PRI_NAT_DST) };
        assert_eq!(NF_ACCEPT as i32, libc::NF_ACCEPT);
        assert_eq!(NFT_META_L4PROTO as i32, libc::NFT_META_L4PROTO);
        assert_eq!(NFT_CMP_EQ as i32, libc::NFT_CMP_EQ);
        assert_eq!(
            NFT_PAYLOAD_NETWORK_HEADER as i32,
            libc::NFT_PAYLOAD_NETWORK_HEADER
        );
        assert_eq!(
            NFT_PAYLOAD_TRANSPORT_HEADER as i32,
            libc::NFT_PAYLOAD_TRANSPORT_HEADER
        );
        assert_eq!(NFT_REG_1 as i32, libc::NFT_REG_1);
    }

    #[test]
    fn the_description_is_nft_syntax_naming_everything() {
        let d = rule().describe();
        assert!(d.starts_with("table ip tcpshadow_intercept {"), "{d}");
        assert!(
            d.contains("type filter hook output priority -150; policy accept;"),
            "{d}"
        );
        assert!(
            d.contains("ip daddr 198.19.5.0/24 tcp sport 3306 counter queue num 36524"),
            "{d}"
        );
        assert!(d.contains("tcp sport 3307"), "{d}");
        assert!(!d.contains("bypass"), "{d}");
        let with_server = ReplyRule {
            server: Some(Ipv4Addr::new(198, 18, 5, 3)),
            ..rule()
        }
        .describe();
        assert!(with_server.contains("ip saddr 198.18.5.3 tcp sport 3306"));
    }

    fn expr_names(rule_attrs: &[u8]) -> Vec<(String, Vec<Attr<'_>>)> {
        let mut out = Vec::new();
        for a in attrs(rule_attrs).map(Result::unwrap) {
            if a.ty != NFTA_RULE_EXPRESSIONS {
                continue;
            }
            for elem in attrs(a.data).map(Result::unwrap) {
                let parts: Vec<_> = attrs(elem.data).map(Result::unwrap).collect();
                let name = parts.iter().find(|p| p.ty == NFTA_EXPR_NAME).unwrap();
                let data = parts.iter().find(|p| p.ty == NFTA_EXPR_DATA).unwrap();
                let name = String::from_utf8(name.data.split_last().unwrap().1.to_vec()).unwrap();
                out.push((name, attrs(data.data).map(Result::unwrap).collect()));
            }
        }
        out
    }

    #[test]
    fn the_install_batch_is_framed_and_acked_message_by_message() {
        let mut batch = Batch::new(100);
        batch.delete_table();
        batch.install(&rule(), QueueStatement::Native);
        let (bytes, acked) = batch.finish();
        let msgs: Vec<_> = messages(&bytes).map(Result::unwrap).collect();
        let types: Vec<u16> = msgs.iter().map(|m| m.header.ty).collect();
        assert_eq!(
            types,
            vec![
                NFNL_MSG_BATCH_BEGIN,
                nft_type(NFT_MSG_DELTABLE),
                nft_type(NFT_MSG_NEWTABLE),
                nft_type(NFT_MSG_NEWCHAIN),
                nft_type(NFT_MSG_NEWRULE),
                nft_type(NFT_MSG_NEWRULE),
                NFNL_MSG_BATCH_END,
            ]
        );
        // Consecutive sequence numbers; every message but begin/end asks for an ack.
        let seqs: Vec<u32> = msgs.iter().map(|m| m.header.seq).collect();
        assert_eq!(seqs, (100..107).collect::<Vec<_>>());
        assert_eq!(
            acked.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            (101..106).collect::<Vec<_>>()
        );
        assert!(msgs[1..6].iter().all(|m| m.header.flags & NLM_F_ACK != 0));
        // The batch messages address the nftables subsystem in their nfgenmsg.
        assert_eq!(nfgen(msgs[0].payload).unwrap().1, NFNL_SUBSYS_NFTABLES);
        assert_eq!(nfgen(msgs[2].payload).unwrap().0, NFPROTO_IPV4);
        // The new table is exclusive: a second set of rules is never appended to a live one.
        assert!(msgs[2].header.flags & NLM_F_EXCL != 0);
    }

    #[test]
    fn a_rule_matches_tcp_pool_and_port_then_queues_without_bypass() {
        let mut batch = Batch::new(1);
        batch.install(&rule(), QueueStatement::Native);
        let (bytes, _) = batch.finish();
        let msgs: Vec<_> = messages(&bytes).map(Result::unwrap).collect();
        let rule_msg = msgs
            .iter()
            .find(|m| m.header.ty == nft_type(NFT_MSG_NEWRULE))
            .unwrap();
        let (_, _, rest) = nfgen(rule_msg.payload).unwrap();
        let exprs = expr_names(rest);
        let names: Vec<&str> = exprs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            vec!["meta", "cmp", "payload", "bitwise", "cmp", "payload", "cmp", "counter", "queue"]
        );
        let value = |attrs: &[Attr<'_>], ty: u16| -> Vec<u8> {
            let nest = attrs.iter().find(|a| a.ty == ty).unwrap();
            crate::netlink::attrs(nest.data)
                .next()
                .unwrap()
                .unwrap()
                .data
                .to_vec()
        };
        assert_eq!(value(&exprs[1].1, NFTA_CMP_DATA), vec![6]);
        assert_eq!(
            value(&exprs[3].1, NFTA_BITWISE_MASK),
            vec![255, 255, 255, 0]
        );
        assert_eq!(value(&exprs[4].1, NFTA_CMP_DATA), vec![198, 19, 5, 0]);
        assert_eq!(value(&exprs[6].1, NFTA_CMP_DATA), 3306u16.to_be_bytes());
        let queue = &exprs[8].1;
        let num = queue.iter().find(|a| a.ty == NFTA_QUEUE_NUM).unwrap();
        assert_eq!(num.data, 36524u16.to_be_bytes());
        assert!(
            queue.iter().all(|a| a.ty != 3),
            "no NFTA_QUEUE_FLAGS: no bypass"
        );
        // The comment `nft list` shows.
        let udata = attrs(rest)
            .map(Result::unwrap)
            .find(|a| a.ty == NFTA_RULE_USERDATA)
            .unwrap();
        assert_eq!(udata.data[0], UDATA_RULE_COMMENT);
        assert_eq!(&udata.data[2..2 + 14], b"tcpshadow test");
    }

    #[test]
    fn the_compat_target_carries_the_queue_number_in_host_order() {
        let mut batch = Batch::new(1);
        let one = ReplyRule {
            pool: (Ipv4Addr::new(10, 1, 2, 3), 32),
            ports: vec![3306],
            ..rule()
        };
        batch.install(&one, QueueStatement::XtNfqueue);
        let (bytes, _) = batch.finish();
        let msgs: Vec<_> = messages(&bytes).map(Result::unwrap).collect();
        let rule_msg = msgs
            .iter()
            .find(|m| m.header.ty == nft_type(NFT_MSG_NEWRULE))
            .unwrap();
        let (_, _, rest) = nfgen(rule_msg.payload).unwrap();
        let exprs = expr_names(rest);
        // A /32 needs no mask.
        assert!(exprs.iter().all(|(n, _)| n != "bitwise"));
        let (name, target) = exprs.last().unwrap();
        assert_eq!(name, "target");
        let info = target.iter().find(|a| a.ty == NFTA_TARGET_INFO).unwrap();
        assert_eq!(info.data.len(), 8);
        assert_eq!(info.data[0..2], 36524u16.to_ne_bytes());
        assert_eq!(info.data[2..4], 1u16.to_ne_bytes());
        let name = target.iter().find(|a| a.ty == NFTA_TARGET_NAME).unwrap();
        assert_eq!(name.data, b"NFQUEUE\0");
    }

    #[test]
    fn masks() {
        assert_eq!(pool_mask(24), 0xffff_ff00);
        assert_eq!(pool_mask(32), u32::MAX);
        assert_eq!(pool_mask(8), 0xff00_0000);
        assert_eq!(pool_mask(0), 0);
    }
}
