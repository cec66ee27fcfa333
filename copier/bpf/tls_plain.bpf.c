// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// tls_plain: the plaintext of production's TLS sessions, read where the server's own TLS
// library hands it over (issue 21). Uprobes on SSL_set_fd, SSL_read and SSL_write of the one
// production process (attached to its pid, and filtered by tgid here as well), a uprobe on
// its libc's close() that tells user space when a stream's fd is closed (user space resolves
// fds from /proc, and an fd number is reused at once), and, while streams opened before we
// attached may still show up, a raw tracepoint on sys_enter that learns their socket from the
// syscall their SSL call makes. That tracepoint sends every syscall of the host down the slow
// path while it is attached, so user space attaches it only when such streams can exist and
// drops it when told; without a libc to probe, it also watches close() there.
//
// What it is for: copying, at the return of SSL_read (client -> server) and SSL_write
// (server -> client), the bytes the call moved into a ring buffer, tagged with the SSL object,
// its fd when known, a per-stream generation and the stream offset of the chunk, so that user
// space can rebuild each direction of each session byte for byte and see exactly where bytes
// are missing.
//
// What it must never do: change anything in the traced process (uprobes only read), block or
// loop without a bound, or keep state that can grow without limit (every map is bounded; the
// maps keyed by objects that may die unseen are LRU).
//
// The uprobes are uprobe.multi programs, attached as uprobe_multi links (kernel 6.6+): created
// with CAP_BPF + CAP_PERFMON, where a uprobe perf event scoped to one pid wants CAP_SYS_ADMIN.
//
// The event layout is written down once, in common/src/tls_event.rs; the _Static_asserts at
// the end of this file hold the C struct to the offsets that module tests.

#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>

#define TLS_EVENT_DATA 1
#define TLS_EVENT_STREAM_START 2
#define TLS_EVENT_FD_CLOSED 3

#define TLS_DIR_FROM_CLIENT 0
#define TLS_DIR_FROM_SERVER 1

#define TLS_FLAG_JOINED_MIDWAY 1
#define TLS_FLAG_FD_KNOWN 2

// What the kernel says the stream's fd is (struct tls_sock.kind), told from the server's own
// fd table when the probe learns the fd: a short session may close before user space could
// ever ask /proc.
#define TLS_SOCK_UNKNOWN 0
#define TLS_SOCK_TCP4 1
#define TLS_SOCK_TCP6 2
#define TLS_SOCK_UNIX 3
#define TLS_SOCK_OTHER 4

// include/linux/socket.h, include/uapi/linux/in.h, include/uapi/linux/stat.h: the uapi
// headers here do not all define them for the BPF target.
#define TLS_AF_UNIX 1
#define TLS_AF_INET 2
#define TLS_AF_INET6 10
#define TLS_IPPROTO_TCP 6
#define TLS_S_IFMT 00170000
#define TLS_S_IFSOCK 0140000

// One ring record carries at most this much plaintext: a TLS record's maximum, so that the
// usual SSL_read (one record) is one ring record.
#define TLS_CHUNK_MAX 16384
// Pieces per call: 1024 x 16 KiB = 16 MiB, MySQL's largest packet plus its header. What is
// beyond is counted as truncated (the offsets still advance).
#define TLS_MAX_PIECES 1024

// x86-64 syscall numbers whose first argument is the fd the SSL call reads or writes.
#define NR_read 0
#define NR_write 1
#define NR_close 3
#define NR_readv 19
#define NR_writev 20
#define NR_sendto 44
#define NR_recvfrom 45
#define NR_sendmsg 46
#define NR_recvmsg 47

// The stream's socket as the kernel knows it. Ports in host order; addresses as the kernel
// keeps them (network order), an IPv4 address in the first 4 bytes.
struct tls_sock {
	__u8 kind;
	__u8 reserved;
	__u16 family;
	__u16 local_port;
	__u16 remote_port;
	__u8 local_addr[16];
	__u8 remote_addr[16];
};

struct tls_event_hdr {
	__u8 kind;
	__u8 dir;
	__u16 flags;
	__u32 len;
	__u32 pid;
	__u32 tid;
	__u64 ssl;
	__s32 fd;
	__u32 reserved;
	__u64 generation;
	__u64 offset;
	__u64 time_ns;
	struct tls_sock sock;
};

struct tls_event {
	struct tls_event_hdr hdr;
	__u8 data[TLS_CHUNK_MAX];
};

#define TLS_CONFIG_CLOSE_IN_SYS_ENTER 1

// What user space sets before loading (.rodata, frozen at load).
struct tls_config {
	__u32 target_tgid;
	// TLS_CONFIG_CLOSE_IN_SYS_ENTER: no libc close() to probe; sys_enter watches close.
	__u32 flags;
};

const volatile struct tls_config cfg = {};

// The few kernel fields the socket walk reads, declared by hand rather than from a generated
// vmlinux.h: preserve_access_index makes every access a CO-RE relocation, which libbpf
// resolves against the running kernel's BTF at load, so the offsets here are only names
// (libbpf ignores the ___tls suffix, and finds fields inside the kernel's anonymous unions).
struct files_struct___tls;
struct task_struct___tls {
	struct files_struct___tls *files;
} __attribute__((preserve_access_index));

struct fdtable___tls;
struct files_struct___tls {
	struct fdtable___tls *fdt;
} __attribute__((preserve_access_index));

struct file___tls;
struct fdtable___tls {
	unsigned int max_fds;
	struct file___tls **fd;
} __attribute__((preserve_access_index));

struct inode___tls {
	unsigned short i_mode;
} __attribute__((preserve_access_index));

struct file___tls {
	void *private_data;
	struct inode___tls *f_inode;
} __attribute__((preserve_access_index));

struct sock___tls;
struct socket___tls {
	struct sock___tls *sk;
} __attribute__((preserve_access_index));

struct in6_addr___tls {
	__u8 s6_addr[16];
} __attribute__((preserve_access_index));

struct sock_common___tls {
	__u32 skc_daddr;
	__u32 skc_rcv_saddr;
	__u16 skc_dport;
	__u16 skc_num;
	unsigned short skc_family;
	struct in6_addr___tls skc_v6_daddr;
	struct in6_addr___tls skc_v6_rcv_saddr;
} __attribute__((preserve_access_index));

struct sock___tls {
	struct sock_common___tls __sk_common;
	__u16 sk_protocol;
} __attribute__((preserve_access_index));

struct stream {
	__u64 generation;
	__u64 off[2];
	__s32 fd;
	__u16 flags;
	__u16 reserved;
	struct tls_sock sock;
};

struct call {
	__u64 ssl;
	__u64 buf;
	__u32 dir;
	__u32 reserved;
};

struct losses {
	__u64 ring_full_records;
	__u64 ring_full_bytes;
	__u64 truncated_bytes;
	__u64 foreign_tgid;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	// User space sets the size before load (TlsProbe's RING_BYTES); this is the default.
	__uint(max_entries, 16 * 1024 * 1024);
} events SEC(".maps");

// SSL object -> stream. LRU: the server frees SSL objects without telling us.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct stream);
} streams SEC(".maps");

// Thread -> the SSL call it is inside. LRU: a thread may die inside a call.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct call);
} calls SEC(".maps");

// fd -> the SSL object whose stream uses it, so that its close can be told to user space:
// user space resolves fds from /proc, and must know when an fd it has not resolved yet may
// already be another connection's. LRU: an fd may go away unseen (dup2 over it, close_range).
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} fds SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct losses);
} loss SEC(".maps");

// A record is assembled here (the stack is 512 bytes), then copied into the ring at its exact
// size: MySQL packets are mostly small, and a fixed-size reservation would waste the ring.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tls_event);
} scratch SEC(".maps");

static __always_inline int ours(__u64 pid_tgid)
{
	return (__u32)(pid_tgid >> 32) == cfg.target_tgid;
}

static __always_inline struct losses *loss_slot(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&loss, &zero);
}

static __always_inline void count_foreign(void)
{
	struct losses *l = loss_slot();
	if (l)
		__sync_fetch_and_add(&l->foreign_tgid, 1);
}

// What fd `fd` of the current process is: current task -> files -> fdt -> fd[fd] -> file ->
// private_data (struct socket) -> sk -> __sk_common. Told here, when the probe learns the fd,
// because the fd is certainly the stream's own at that moment; by the time user space could
// read /proc a short session may be gone, or its number another connection's. Every read is
// a probe read that zeroes on failure, so a torn or odd walk says UNKNOWN (user space then
// falls back to /proc), never a wrong socket: fd[fd] is read only below max_fds, and a file
// is taken as a socket only when its inode says S_IFSOCK.
static __always_inline void tell_socket(__u32 fd, struct tls_sock *out)
{
	struct tls_sock t = {};
	struct task_struct___tls *task = (struct task_struct___tls *)bpf_get_current_task();
	struct fdtable___tls *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt)
		goto done;
	unsigned int max = BPF_CORE_READ(fdt, max_fds);
	struct file___tls **table = BPF_CORE_READ(fdt, fd);
	if (fd >= max || !table)
		goto done;
	struct file___tls *file = 0;
	if (bpf_probe_read_kernel(&file, sizeof(file), &table[fd]) != 0 || !file)
		goto done;
	unsigned short mode = BPF_CORE_READ(file, f_inode, i_mode);
	if (mode == 0)
		goto done;
	if ((mode & TLS_S_IFMT) != TLS_S_IFSOCK) {
		// An SSL object over a pipe or a file: nothing a packet mirror could play.
		t.kind = TLS_SOCK_OTHER;
		goto done;
	}
	struct socket___tls *sock = (struct socket___tls *)BPF_CORE_READ(file, private_data);
	if (!sock)
		goto done;
	struct sock___tls *sk = BPF_CORE_READ(sock, sk);
	if (!sk)
		goto done;
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	t.family = family;
	if (family == TLS_AF_UNIX) {
		t.kind = TLS_SOCK_UNIX;
		goto done;
	}
	if (family != TLS_AF_INET && family != TLS_AF_INET6) {
		// AF_UNSPEC (0) is what a failed read gives too: leave it unknown.
		if (family != 0)
			t.kind = TLS_SOCK_OTHER;
		goto done;
	}
	if (BPF_CORE_READ(sk, sk_protocol) != TLS_IPPROTO_TCP) {
		t.kind = TLS_SOCK_OTHER;
		goto done;
	}
	t.local_port = BPF_CORE_READ(sk, __sk_common.skc_num);
	t.remote_port = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	if (family == TLS_AF_INET) {
		__u32 local = BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr);
		__u32 remote = BPF_CORE_READ(sk, __sk_common.skc_daddr);
		__builtin_memcpy(t.local_addr, &local, 4);
		__builtin_memcpy(t.remote_addr, &remote, 4);
		t.kind = TLS_SOCK_TCP4;
	} else if (bpf_core_field_exists(sk->__sk_common.skc_v6_daddr)) {
		// A kernel without IPv6 has no such fields, and no such sockets either: the guard
		// lets the program load there (the branch is removed at load).
		BPF_CORE_READ_INTO(&t.local_addr, sk, __sk_common.skc_v6_rcv_saddr);
		BPF_CORE_READ_INTO(&t.remote_addr, sk, __sk_common.skc_v6_daddr);
		t.kind = TLS_SOCK_TCP6;
	}
done:
	*out = t;
}

/* The reader (the copier's capture loop) is woken only once this much waits in the ring: it
 * drains the ring at every turn of its loop anyway, before each capture batch (a turn at least
 * every capture block timeout while there is traffic), and a wakeup per record cost it more
 * than everything else it does per query (measured: 32% of its samples in the scheduler). */
#define TLS_WAKE_BYTES (256 * 1024)

static __always_inline __u64 wake_flags(void)
{
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= TLS_WAKE_BYTES ? BPF_RB_FORCE_WAKEUP
									       : BPF_RB_NO_WAKEUP;
}

static __always_inline void emit_head(__u8 kind, __u64 pid_tgid, __u64 ssl, struct stream *s)
{
	struct tls_event_hdr h = {};
	h.kind = kind;
	h.flags = s->flags;
	h.pid = pid_tgid >> 32;
	h.tid = (__u32)pid_tgid;
	h.ssl = ssl;
	h.fd = s->fd;
	h.generation = s->generation;
	h.time_ns = bpf_ktime_get_ns();
	h.sock = s->sock;
	if (bpf_ringbuf_output(&events, &h, sizeof(h), wake_flags()) != 0) {
		struct losses *l = loss_slot();
		if (l)
			__sync_fetch_and_add(&l->ring_full_records, 1);
	}
}

static __always_inline void emit_start(__u64 pid_tgid, __u64 ssl, struct stream *s)
{
	emit_head(TLS_EVENT_STREAM_START, pid_tgid, ssl, s);
}

SEC("uprobe.multi")
int BPF_KPROBE(ssl_set_fd, void *ssl, int fd)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!ours(pid_tgid)) {
		count_foreign();
		return 0;
	}
	__u64 key = (__u64)ssl;
	struct stream s = {};
	// The time of the start tells this stream from an earlier one of the same SSL object
	// (the server's allocator reuses addresses): two starts of one object cannot share a
	// nanosecond.
	s.generation = bpf_ktime_get_ns();
	s.fd = fd;
	s.flags = TLS_FLAG_FD_KNOWN;
	if (fd >= 0)
		tell_socket((__u32)fd, &s.sock);
	bpf_map_update_elem(&streams, &key, &s, BPF_ANY);
	__u32 f = fd;
	bpf_map_update_elem(&fds, &f, &key, BPF_ANY);
	emit_start(pid_tgid, key, &s);
	return 0;
}

static __always_inline int enter(void *ssl, void *buf, __u32 dir)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!ours(pid_tgid)) {
		count_foreign();
		return 0;
	}
	__u64 key = (__u64)ssl;
	if (!bpf_map_lookup_elem(&streams, &key)) {
		// A stream that began before we attached (no SSL_set_fd seen): its offsets start
		// here, and its fd comes from the syscall this call makes (on_sys_enter).
		struct stream s = {};
		s.generation = bpf_ktime_get_ns();
		s.fd = -1;
		s.flags = TLS_FLAG_JOINED_MIDWAY;
		bpf_map_update_elem(&streams, &key, &s, BPF_NOEXIST);
		struct stream *now = bpf_map_lookup_elem(&streams, &key);
		if (now)
			emit_start(pid_tgid, key, now);
	}
	__u32 tid = (__u32)pid_tgid;
	struct call c = {};
	c.ssl = key;
	c.buf = (__u64)buf;
	c.dir = dir;
	bpf_map_update_elem(&calls, &tid, &c, BPF_ANY);
	return 0;
}

struct piece_ctx {
	__u64 buf;
	__u64 remaining;
	__u64 offset;
	__u64 pid_tgid;
	__u64 ssl;
	__u64 generation;
	__u64 time_ns;
	__s32 fd;
	__u16 flags;
	__u8 dir;
	struct tls_sock sock;
};

static int emit_piece(__u32 index, struct piece_ctx *p)
{
	__u64 n = p->remaining;
	if (n == 0)
		return 1;
	if (n > TLS_CHUNK_MAX)
		n = TLS_CHUNK_MAX;
	__u64 at = p->offset;
	__u64 from = p->buf;
	p->buf += n;
	p->offset += n;
	p->remaining -= n;

	__u32 zero = 0;
	struct tls_event *e = bpf_map_lookup_elem(&scratch, &zero);
	struct losses *l = loss_slot();
	if (!e)
		return 1;
	e->hdr.kind = TLS_EVENT_DATA;
	e->hdr.dir = p->dir;
	e->hdr.flags = p->flags;
	e->hdr.len = n;
	e->hdr.pid = p->pid_tgid >> 32;
	e->hdr.tid = (__u32)p->pid_tgid;
	e->hdr.ssl = p->ssl;
	e->hdr.fd = p->fd;
	e->hdr.reserved = 0;
	e->hdr.generation = p->generation;
	e->hdr.offset = at;
	e->hdr.time_ns = p->time_ns;
	e->hdr.sock = p->sock;
	// n <= TLS_CHUNK_MAX, said again in a form the verifier keeps through the copy.
	n &= (TLS_CHUNK_MAX * 2 - 1);
	if (n > TLS_CHUNK_MAX)
		return 1;
	if (bpf_probe_read_user(e->data, n, (void *)from) != 0 ||
	    bpf_ringbuf_output(&events, e, sizeof(e->hdr) + n, wake_flags()) != 0) {
		// Not emitted, but the offset has advanced: user space sees the hole.
		if (l) {
			__sync_fetch_and_add(&l->ring_full_records, 1);
			__sync_fetch_and_add(&l->ring_full_bytes, n);
		}
	}
	return 0;
}

static __always_inline int leave(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!ours(pid_tgid))
		return 0;
	__u32 tid = (__u32)pid_tgid;
	struct call *c = bpf_map_lookup_elem(&calls, &tid);
	if (!c)
		return 0;
	struct call call = *c;
	bpf_map_delete_elem(&calls, &tid);
	long ret = PT_REGS_RC(ctx);
	// SSL_read/SSL_write return an int: > 0 is the count of bytes moved.
	int moved = (int)ret;
	if (moved <= 0)
		return 0;
	struct stream *s = bpf_map_lookup_elem(&streams, &call.ssl);
	if (!s)
		return 0;
	__u32 dir = call.dir & 1;
	struct piece_ctx p = {};
	p.buf = call.buf;
	p.remaining = (__u64)moved;
	// One thread at a time uses an SSL object (OpenSSL forbids concurrent use), so a plain
	// read-then-write of the offset is enough.
	if (dir == TLS_DIR_FROM_CLIENT) {
		p.offset = s->off[0];
		s->off[0] += (__u64)moved;
	} else {
		p.offset = s->off[1];
		s->off[1] += (__u64)moved;
	}
	p.pid_tgid = pid_tgid;
	p.ssl = call.ssl;
	p.generation = s->generation;
	p.time_ns = bpf_ktime_get_ns();
	p.fd = s->fd;
	p.flags = s->flags;
	p.dir = dir;
	p.sock = s->sock;
	__u64 pieces = ((__u64)moved + TLS_CHUNK_MAX - 1) / TLS_CHUNK_MAX;
	if (pieces > TLS_MAX_PIECES)
		pieces = TLS_MAX_PIECES;
	bpf_loop(pieces, emit_piece, &p, 0);
	if (p.remaining > 0) {
		struct losses *l = loss_slot();
		if (l)
			__sync_fetch_and_add(&l->truncated_bytes, p.remaining);
	}
	return 0;
}

SEC("uprobe.multi")
int BPF_KPROBE(ssl_read_enter, void *ssl, void *buf, int num)
{
	return enter(ssl, buf, TLS_DIR_FROM_CLIENT);
}

SEC("uretprobe.multi")
int ssl_read_leave(struct pt_regs *ctx)
{
	return leave(ctx);
}

SEC("uprobe.multi")
int BPF_KPROBE(ssl_write_enter, void *ssl, const void *buf, int num)
{
	return enter(ssl, (void *)buf, TLS_DIR_FROM_SERVER);
}

SEC("uretprobe.multi")
int ssl_write_leave(struct pt_regs *ctx)
{
	return leave(ctx);
}

// The user registers the syscall was made with; uapi's x86-64 pt_regs has the kernel's
// layout, so rdi is the first argument.
static __always_inline int first_arg_fd(struct bpf_raw_tracepoint_args *ctx, __u32 *fd)
{
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	unsigned long v = 0;
	if (bpf_probe_read_kernel(&v, sizeof(v), &regs->rdi) != 0 || v > 0x7fffffff)
		return -1;
	*fd = (__u32)v;
	return 0;
}

// A stream's fd is being closed: tell user space (the fd may be reused at once).
static __always_inline int on_close(__u32 fd, __u64 pid_tgid)
{
	__u64 *sslp = bpf_map_lookup_elem(&fds, &fd);
	if (!sslp)
		return 0;
	__u64 ssl = *sslp;
	bpf_map_delete_elem(&fds, &fd);
	struct stream *s = bpf_map_lookup_elem(&streams, &ssl);
	struct stream gone = {};
	if (!s || s->fd != (__s32)fd) {
		// The object has moved on to another fd (or was evicted): still say which fd closed.
		gone.fd = fd;
		gone.flags = TLS_FLAG_FD_KNOWN;
		s = &gone;
	}
	emit_head(TLS_EVENT_FD_CLOSED, pid_tgid, ssl, s);
	return 0;
}

// The server's libc close(): a stream's fd, before the kernel frees its number.
SEC("uprobe.multi")
int BPF_KPROBE(libc_close, int fd)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!ours(pid_tgid) || fd < 0)
		return 0;
	return on_close((__u32)fd, pid_tgid);
}

// Every syscall of the host passes here: the tgid test comes first and is all most pay.
SEC("raw_tracepoint/sys_enter")
int sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	if (!ours(pid_tgid))
		return 0;
	long id = (long)ctx->args[1];
	if (id == NR_close) {
		__u32 fd;
		if ((cfg.flags & TLS_CONFIG_CLOSE_IN_SYS_ENTER) && first_arg_fd(ctx, &fd) == 0)
			return on_close(fd, pid_tgid);
		return 0;
	}
	switch (id) {
	case NR_read:
	case NR_write:
	case NR_readv:
	case NR_writev:
	case NR_sendto:
	case NR_recvfrom:
	case NR_sendmsg:
	case NR_recvmsg:
		break;
	default:
		return 0;
	}
	__u32 tid = (__u32)pid_tgid;
	struct call *c = bpf_map_lookup_elem(&calls, &tid);
	if (!c)
		return 0;
	struct stream *s = bpf_map_lookup_elem(&streams, &c->ssl);
	if (!s || (s->flags & TLS_FLAG_FD_KNOWN))
		return 0;
	__u32 fd;
	if (first_arg_fd(ctx, &fd) != 0)
		return 0;
	s->fd = (__s32)fd;
	s->flags |= TLS_FLAG_FD_KNOWN;
	// Inside the stream's own read or write: the fd is certainly its socket now.
	tell_socket(fd, &s->sock);
	__u64 ssl = c->ssl;
	bpf_map_update_elem(&fds, &fd, &ssl, BPF_ANY);
	return 0;
}

// The layout common/src/tls_event.rs decodes (TLS_EVENT_HEADER_LEN and the field offsets there).
_Static_assert(sizeof(struct tls_event_hdr) == 96, "tls_event header size");
_Static_assert(__builtin_offsetof(struct tls_event_hdr, len) == 4, "len offset");
_Static_assert(__builtin_offsetof(struct tls_event_hdr, pid) == 8, "pid offset");
_Static_assert(__builtin_offsetof(struct tls_event_hdr, ssl) == 16, "ssl offset");
_Static_assert(__builtin_offsetof(struct tls_event_hdr, fd) == 24, "fd offset");
_Static_assert(__builtin_offsetof(struct tls_event_hdr, generation) == 32, "generation offset");
_Static_assert(__builtin_offsetof(struct tls_event_hdr, offset) == 40, "offset offset");
_Static_assert(__builtin_offsetof(struct tls_event_hdr, time_ns) == 48, "time offset");
_Static_assert(__builtin_offsetof(struct tls_event_hdr, sock) == 56, "sock offset");
_Static_assert(sizeof(struct tls_sock) == 40, "tls_sock size");
_Static_assert(__builtin_offsetof(struct tls_sock, family) == 2, "sock family offset");
_Static_assert(__builtin_offsetof(struct tls_sock, local_port) == 4, "sock local_port offset");
_Static_assert(__builtin_offsetof(struct tls_sock, remote_port) == 6, "sock remote_port offset");
_Static_assert(__builtin_offsetof(struct tls_sock, local_addr) == 8, "sock local_addr offset");
_Static_assert(__builtin_offsetof(struct tls_sock, remote_addr) == 24, "sock remote_addr offset");
_Static_assert(sizeof(struct losses) == 32, "losses layout (copier/src/tls/probe.rs)");
_Static_assert(sizeof(struct tls_config) == 8, "config layout (copier/src/tls/probe.rs)");

// The helpers that read user and kernel memory are the kernel's GPL-only ones; the file is
// dual-licensed so that the kernel may load it and the project keep its own license.
char LICENSE[] SEC("license") = "GPL";
