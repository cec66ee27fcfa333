//! Logins on the test server: the client's login with its auth response recomputed, a
//! synthetic login for a connection picked up mid-stream, COM_CHANGE_USER, and the auth
//! exchange that follows each (AuthSwitchRequest, caching_sha2_password fast and full auth).
//!
//! # What this room is for
//!
//! Production's scramble is worthless on the test server (another nonce, maybe another
//! password): every login is rewritten with the test server's greeting nonce and the password
//! `--mysql-credentials` gives the user there, and the exchange the test server starts is
//! answered by us. The client's own auth continuation toward production is swallowed by the
//! forwarding reader (it is not ours to send).
//!
//! # What it must never do
//!
//! * Expose a password or a scramble: they live in [`AuthExchange`] only while an exchange
//!   is in progress, nothing here prints them, and a given-up session drops them at once.
//! * Send a login before the test server's greeting (its nonce) is known, or while a
//!   picked-up connection still waits for recovered state (its user).
//! * Read a client login it did not see whole: a cut login gives the session up.

use common::control::MysqlPacket;
use common::mysql::auth::{
    encrypt_password, rand_core, AuthPlugin, AuthResponse, Nonce, Password, ServerPublicKey,
    REQUEST_PUBLIC_KEY,
};
use common::mysql::command::ChangeUser;
use common::mysql::handshake::{
    AuthMoreData, AuthSwitchRequest, Capabilities, ClientLogin, FastAuthResult, Greeting,
    HandshakeResponse, MariaCapabilities, NotMirrorable, ReplyPhase, ServerReply,
};
use common::mysql::packet::{write_packet, PacketHeader, HEADER_LEN};

use super::super::Counter;
use super::inject::init_db;
use super::test_side::TestExpect;
use super::{abandon, protocol, push_packet, Abandon, MysqlTransform};
use crate::engine::TransformOutput;

/// utf8mb4_general_ci, what MariaDB Connector/C (sysbench) asks for.
const SYNTHETIC_CHARSET: u8 = 45;
/// What Connector/C announces as its largest packet.
const SYNTHETIC_MAX_PACKET: u32 = 1 << 28;

/// What a synthetic login asks for: the capabilities every client of a pooled connection can
/// be assumed to have used, so its captured commands read the same on the test server.
const SYNTHETIC_CAPS: Capabilities = Capabilities(
    Capabilities::PROTOCOL_41.0
        | Capabilities::SECURE_CONNECTION.0
        | Capabilities::PLUGIN_AUTH.0
        | Capabilities::PLUGIN_AUTH_LENENC_CLIENT_DATA.0
        | Capabilities::MYSQL.0
        | Capabilities::LONG_FLAG.0
        | Capabilities::TRANSACTIONS.0
        | Capabilities::MULTI_RESULTS.0
        | Capabilities::PS_MULTI_RESULTS.0
        | Capabilities::MULTI_STATEMENTS.0,
);

/// How a picked-up client's COM_CHANGE_USER is read: its real capabilities are unknown, these
/// are what every current client negotiates with a current server.
const PICKUP_CLIENT_CAPS: Capabilities = Capabilities(
    Capabilities::PROTOCOL_41.0
        | Capabilities::SECURE_CONNECTION.0
        | Capabilities::PLUGIN_AUTH.0
        | Capabilities::PLUGIN_AUTH_LENENC_CLIENT_DATA.0
        | Capabilities::CONNECT_ATTRS.0
        | Capabilities::CONNECT_WITH_DB.0,
);

pub(super) const NO_CREDENTIALS: Abandon = Abandon {
    counter: Counter::NoCredentials,
    why: "no_credentials",
};

/// The caller's random source, in the shape RSA padding wants.
struct CallerRng<'a>(&'a (dyn Fn(&mut [u8]) -> bool + Send + Sync));

#[derive(Debug, thiserror::Error)]
#[error("the random source failed")]
struct RandomSourceFailed;

impl rand_core::TryRng for CallerRng<'_> {
    type Error = RandomSourceFailed;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut b = [0; 4];
        self.try_fill_bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut b = [0; 8];
        self.try_fill_bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        if (self.0)(dst) {
            Ok(())
        } else {
            Err(RandomSourceFailed)
        }
    }
}

impl rand_core::TryCryptoRng for CallerRng<'_> {}

/// An auth exchange with the test server in progress (login or COM_CHANGE_USER).
pub(super) struct AuthExchange {
    /// `None`: the login passed unchanged (no credentials, and configured to allow that).
    password: Option<Password>,
    plugin: AuthPlugin,
    nonce: Nonce,
    /// We asked for the RSA key (caching_sha2_password full auth).
    awaiting_key: bool,
    change_user: bool,
}

/// What the test server's greeting said.
#[derive(Clone, Copy, Debug)]
pub(super) struct TestServer {
    caps: Capabilities,
    /// MariaDB offers COM_STMT_BULK_EXECUTE (an extended capability). One flag, not the
    /// whole set: every session carries this struct (`a_session_in_line_stays_small`).
    bulk_operations: bool,
    plugin: AuthPlugin,
    nonce: Nonce,
}

/// Our session's login on the test server and what it agreed on.
pub(super) struct Login {
    /// The client's login, kept until the test server's greeting lets us rewrite it (boxed, not
    /// a `Vec`: it never grows, and every session carries this in line).
    client_login: Option<Box<[u8]>>,
    server: Option<TestServer>,
    /// The nonce the test server's latest auth exchange used (COM_CHANGE_USER scrambles with
    /// it).
    session_nonce: Option<Nonce>,
    exchange: Option<Box<AuthExchange>>,
    /// The capabilities the client's packets are encoded with.
    client_caps: Capabilities,
    /// The capabilities of our session on the test server (how it reads what we send).
    session_caps: Capabilities,
    sent: bool,
    change_user_in_flight: bool,
    /// The client asked for TLS (its SSLRequest was dropped): its real login comes from the
    /// plaintext capture, numbered 2, with the SSL capability our session must not ask for.
    tls: bool,
    /// A TLS connection picked up midway whose framing is not known yet (see
    /// [`pickup_piece`]).
    tls_wants_header: bool,
}

impl Login {
    pub(super) fn new() -> Self {
        Self {
            client_login: None,
            server: None,
            session_nonce: None,
            exchange: None,
            client_caps: Capabilities::default(),
            session_caps: Capabilities::default(),
            sent: false,
            change_user_in_flight: false,
            tls: false,
            tls_wants_header: false,
        }
    }

    /// Our login went out.
    pub(super) fn sent(&self) -> bool {
        self.sent
    }

    /// An auth exchange (login or COM_CHANGE_USER) is in progress.
    pub(super) fn in_exchange(&self) -> bool {
        self.exchange.is_some()
    }

    /// A COM_CHANGE_USER's exchange is in progress: client commands wait for its end.
    pub(super) fn change_user_in_flight(&self) -> bool {
        self.change_user_in_flight
    }

    /// The reply to a COM_CHANGE_USER started: its exchange is the one followed now.
    pub(super) fn resume_exchange(&mut self, ex: Box<AuthExchange>) {
        self.exchange = Some(ex);
    }

    /// What either side of our session may use.
    pub(super) fn caps_either(&self) -> Capabilities {
        self.client_caps | self.session_caps
    }

    /// The client's login waits for the test server's greeting.
    pub(super) fn client_login_held(&self) -> bool {
        self.client_login.is_some()
    }

    pub(super) fn held_len(&self) -> usize {
        self.client_login.as_ref().map_or(0, |l| l.len())
    }

    /// The session is given up: passwords and the held login go now, not when the engine
    /// drops the session.
    pub(super) fn forget(&mut self) {
        self.exchange = None;
        self.client_login = None;
    }
}

impl MysqlTransform {
    pub(super) fn test_greeting(
        &mut self,
        pkt: &MysqlPacket,
        continuation: bool,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        if pkt.head.first() == Some(&0xff) {
            // "Too many connections", "Host is blocked": the test server refused us.
            return Err(abandon(Counter::TestRefused, "test_refused"));
        }
        if continuation || pkt.seq_id != 0 || !pkt.complete() {
            return Err(protocol("test_greeting_unreadable"));
        }
        let g = Greeting::parse(&pkt.head).map_err(|_| protocol("test_greeting_unreadable"))?;
        let nonce =
            Nonce::from_auth_data(&g.nonce()).map_err(|_| protocol("test_greeting_unreadable"))?;
        // A plugin we cannot answer for: offer native; the server switches us if it must.
        let plugin = g
            .auth_plugin
            .and_then(|p| AuthPlugin::from_name(p).ok())
            .unwrap_or(AuthPlugin::MysqlNativePassword);
        self.login.server = Some(TestServer {
            caps: g.capabilities,
            bulk_operations: g
                .mariadb_capabilities()
                .is_some_and(|m| m.contains(MariaCapabilities::STMT_BULK_OPERATIONS)),
            plugin,
            nonce,
        });
        self.test.greeted();
        self.try_login(out)
    }

    /// A packet of an auth exchange (login or COM_CHANGE_USER).
    pub(super) fn auth_packet(
        &mut self,
        pkt: &MysqlPacket,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        let Some(mut ex) = self.login.exchange.take() else {
            return Ok(());
        };
        let reply_seq = pkt.seq_id.wrapping_add(1);
        match ServerReply::classify(&pkt.head, ReplyPhase::Auth) {
            ServerReply::Ok => {
                if ex.change_user {
                    self.login.change_user_in_flight = false;
                } else {
                    self.test.logged_in();
                    self.flush_injections(out)?;
                }
                Ok(())
            }
            ServerReply::Err => Err(abandon(Counter::AuthFailedOnTest, "auth_failed")),
            ServerReply::AuthSwitch => {
                let reply = self.login.auth_switch(&mut ex, pkt, out)?;
                push_packet(reply_seq, reply.as_bytes(), out);
                out.count(Counter::AuthSwitches as usize);
                self.login.exchange = Some(ex);
                Ok(())
            }
            ServerReply::AuthMoreData => {
                self.auth_more_data(&mut ex, pkt, reply_seq, out)?;
                self.login.exchange = Some(ex);
                Ok(())
            }
            _ => Err(protocol("auth_exchange_unreadable")),
        }
    }

    fn auth_more_data(
        &mut self,
        ex: &mut AuthExchange,
        pkt: &MysqlPacket,
        reply_seq: u8,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        if ex.plugin != AuthPlugin::CachingSha2Password {
            return Err(protocol("auth_more_data_unexpected"));
        }
        let more =
            AuthMoreData::parse(&pkt.head).map_err(|_| protocol("auth_more_data_unexpected"))?;
        if !ex.awaiting_key {
            return match more.fast_auth_result() {
                // An OK follows.
                Some(FastAuthResult::Success) => Ok(()),
                Some(FastAuthResult::FullAuthRequired) => {
                    push_packet(reply_seq, &[REQUEST_PUBLIC_KEY], out);
                    ex.awaiting_key = true;
                    out.count(Counter::FullAuthRsa as usize);
                    Ok(())
                }
                None => Err(protocol("auth_more_data_unexpected")),
            };
        }
        let failed = |why| abandon(Counter::FullAuthFailed, why);
        if !pkt.complete() {
            return Err(failed("rsa_key_cut"));
        }
        let key = ServerPublicKey::from_pem(more.data).map_err(|_| failed("rsa_key_unreadable"))?;
        let mut rng = CallerRng(&*self.shared.random);
        let password = ex.password.as_ref().ok_or(NO_CREDENTIALS)?;
        let sealed = encrypt_password(password.as_bytes(), &ex.nonce, &key, &mut rng)
            .map_err(|_| failed("rsa_encrypt_failed"))?;
        push_packet(reply_seq, &sealed, out);
        ex.awaiting_key = false;
        Ok(())
    }

    fn password_for(&self, user: &[u8]) -> Option<Password> {
        let user = std::str::from_utf8(user).ok()?;
        self.shared
            .credentials
            .password(user)
            .map(|p| Password::new(p.to_vec()))
    }

    /// The password `user` has on the test server. Without one the session is given up,
    /// unless configured to let such logins pass unchanged (`Ok(None)`): a test server that
    /// does not check passwords (`--skip-grant-tables`) accepts them anyway.
    fn credentials(
        &self,
        user: &[u8],
        out: &mut TransformOutput<'_>,
    ) -> Result<Option<Password>, Abandon> {
        match self.password_for(user) {
            Some(p) => Ok(Some(p)),
            None if self.shared.config.forward_without_credentials => {
                out.count(Counter::AuthForwardedUnchanged as usize);
                Ok(None)
            }
            None => Err(NO_CREDENTIALS),
        }
    }

    /// Sends our login once everything it needs is known.
    pub(super) fn try_login(&mut self, out: &mut TransformOutput<'_>) -> Result<(), Abandon> {
        if self.login.sent || self.dead() {
            return Ok(());
        }
        let Some(server) = self.login.server else {
            return Ok(());
        };
        if self.picked_up() {
            if self.pickup.recovery_deadline().is_some() {
                return Ok(());
            }
            return self.synthetic_login(server, out);
        }
        match self.login.client_login.take() {
            Some(login) => self.rewrite_login(&login, server, out),
            None => Ok(()),
        }
    }

    /// The client's login with the auth response recomputed for the test server.
    fn rewrite_login(
        &mut self,
        login: &[u8],
        server: TestServer,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        let Ok(ClientLogin::Response(r)) = ClientLogin::parse(login) else {
            return Err(protocol("login_unreadable"));
        };
        let password = self.credentials(r.username, out)?;
        // Without PLUGIN_AUTH the server assumes native and cannot switch.
        let plugin = if r.capabilities.contains(Capabilities::PLUGIN_AUTH) {
            server.plugin
        } else {
            AuthPlugin::MysqlNativePassword
        };
        let mut payload = Vec::with_capacity(login.len() + 16);
        match &password {
            Some(password) => {
                let scramble = plugin.scramble(password.as_bytes(), &server.nonce);
                let rewritten = HandshakeResponse {
                    auth_response: scramble.as_bytes(),
                    auth_plugin: r.auth_plugin.map(|_| plugin.name()),
                    ..r
                };
                rewritten
                    .write(&mut payload)
                    .map_err(|_| protocol("login_unencodable"))?;
                out.count(Counter::LoginsRewritten as usize);
            }
            None => payload.extend_from_slice(login),
        }
        // What both sides agreed on decides how the server reads COM_CHANGE_USER.
        self.login.client_caps = r.capabilities & server.caps;
        self.login.session_caps = self.login.client_caps;
        // Where a PREPARE_OK ends depends on DEPRECATE_EOF. Production's greeting is not read
        // whole: assumed to offer what the test server offers (both are current servers).
        let deprecate_eof = self
            .login
            .session_caps
            .contains(Capabilities::DEPRECATE_EOF);
        self.test.set_deprecate_eof(deprecate_eof);
        self.prod.set_deprecate_eof(deprecate_eof);
        self.send_login(&payload, plugin, server.nonce, password, out);
        Ok(())
    }

    /// A login of our own for a connection whose login we never saw.
    fn synthetic_login(
        &mut self,
        server: TestServer,
        out: &mut TransformOutput<'_>,
    ) -> Result<(), Abandon> {
        let Some(user) = self.pickup.user() else {
            return Err(abandon(
                Counter::PickupNoDefaultUser,
                "pickup_no_default_user",
            ));
        };
        let password = self.credentials(user.as_bytes(), out)?;
        let db = self.pickup.db();
        let want = if db.is_some() {
            SYNTHETIC_CAPS | Capabilities::CONNECT_WITH_DB
        } else {
            SYNTHETIC_CAPS
        };
        let mut caps = want & server.caps;
        if !caps.contains(Capabilities::PROTOCOL_41) {
            return Err(protocol("test_server_too_old"));
        }
        // MariaDB's COM_STMT_BULK_EXECUTE (Connector/J's and Connector/C's batches) is refused
        // on a session that did not ask for it. Asking changes nothing else on the wire, unlike
        // the other extended capabilities (metadata caching, progress reports), which a pooled
        // client may not have had.
        let mut filler = [0; 23];
        if server.bulk_operations {
            caps = Capabilities(caps.0 & !Capabilities::MYSQL.0);
            filler[19..].copy_from_slice(&MariaCapabilities::STMT_BULK_OPERATIONS.0.to_le_bytes());
        }
        let plugin = if caps.contains(Capabilities::PLUGIN_AUTH) {
            server.plugin
        } else {
            AuthPlugin::MysqlNativePassword
        };
        let scramble = password
            .as_ref()
            .map(|p| plugin.scramble(p.as_bytes(), &server.nonce));
        let with_db = caps.contains(Capabilities::CONNECT_WITH_DB);
        let r = HandshakeResponse {
            capabilities: caps,
            max_packet: SYNTHETIC_MAX_PACKET,
            charset: SYNTHETIC_CHARSET,
            filler,
            username: user.as_bytes(),
            auth_response: scramble.as_ref().map_or(&[][..], |s| s.as_bytes()),
            database: db.as_deref().filter(|_| with_db).map(str::as_bytes),
            auth_plugin: caps
                .contains(Capabilities::PLUGIN_AUTH)
                .then_some(plugin.name()),
            attributes: None,
            trailing: &[],
        };
        let mut payload = Vec::new();
        r.write(&mut payload)
            .map_err(|_| protocol("login_unencodable"))?;
        if let Some(db) = db.as_deref().filter(|_| !with_db) {
            // Before any recovered re-prepare: they may name tables of this schema.
            self.inject.push_front(init_db(db.as_bytes()));
            out.count(Counter::InjectedInitDb as usize);
        }
        self.login.session_caps = caps;
        self.login.client_caps = server.caps & PICKUP_CLIENT_CAPS;
        self.send_login(&payload, plugin, server.nonce, password, out);
        self.pickup
            .logged_in_as(user, db.filter(|_| with_db).map(String::into_bytes));
        out.count(Counter::PickupLogins as usize);
        Ok(())
    }

    fn send_login(
        &mut self,
        payload: &[u8],
        plugin: AuthPlugin,
        nonce: Nonce,
        password: Option<Password>,
        out: &mut TransformOutput<'_>,
    ) {
        // The login answers the greeting (seq 0).
        push_packet(1, payload, out);
        self.login.sent = true;
        self.login.session_nonce = Some(nonce);
        self.login.exchange = Some(Box::new(AuthExchange {
            password,
            plugin,
            nonce,
            awaiting_key: false,
            change_user: false,
        }));
        self.test.login_sent();
    }

    /// COM_CHANGE_USER (the packet whose head is collected, whole) with its auth response
    /// recomputed for the test server: the rewritten packet, if any, to send instead. The test
    /// server's answer is followed like the login's.
    pub(super) fn rewrite_change_user(
        &mut self,
        h: PacketHeader,
        out: &mut TransformOutput<'_>,
    ) -> Result<Option<Vec<u8>>, Abandon> {
        if self.test.blind() {
            return Err(abandon(Counter::ChangeUser, "change_user_without_framing"));
        }
        let server = self
            .login
            .server
            .ok_or(protocol("change_user_before_login"))?;
        let payload = &self.fwd.head()[HEADER_LEN..];
        if payload.len() < h.len as usize {
            return Err(protocol("change_user_too_long"));
        }
        let cu = ChangeUser::parse(payload, self.login.client_caps)
            .map_err(|_| protocol("change_user_unreadable"))?;
        let password = self.credentials(cu.user, out)?;
        let caps = self.login.session_caps;
        let plugin_auth = caps.contains(Capabilities::PLUGIN_AUTH);
        let plugin = if plugin_auth {
            cu.auth_plugin
                .and_then(|p| AuthPlugin::from_name(p).ok())
                .unwrap_or(server.plugin)
        } else {
            AuthPlugin::MysqlNativePassword
        };
        let nonce = self.login.session_nonce.unwrap_or(server.nonce);
        let rewritten = match &password {
            Some(password) => {
                let scramble = plugin.scramble(password.as_bytes(), &nonce);
                let rewritten = ChangeUser {
                    auth_response: scramble.as_bytes(),
                    auth_plugin: (plugin_auth && cu.charset.is_some()).then_some(plugin.name()),
                    attributes: cu
                        .attributes
                        .filter(|_| caps.contains(Capabilities::CONNECT_ATTRS)),
                    ..cu
                };
                let mut payload = Vec::with_capacity(h.len as usize + 40);
                rewritten
                    .write(caps, &mut payload)
                    .map_err(|_| protocol("change_user_unencodable"))?;
                let mut framed = Vec::with_capacity(payload.len() + HEADER_LEN);
                write_packet(0, &payload, &mut framed);
                Some(framed)
            }
            None => None,
        };
        self.test_owes_client(TestExpect::ChangeUser(Box::new(AuthExchange {
            password,
            plugin,
            nonce,
            awaiting_key: false,
            change_user: true,
        })))?;
        self.login.change_user_in_flight = true;
        Ok(rewritten)
    }
}

impl Login {
    /// The client's login, collected whole by the forwarding reader: kept for the rewrite
    /// (never forwarded as it is).
    /// `tls_plaintext`: TLS sessions are mirrored from their plaintext (an SSLRequest is then
    /// dropped, and `Ok(true)` says the stream turns to ciphertext right after it).
    pub(super) fn keep_client_login(
        &mut self,
        h: PacketHeader,
        payload: &[u8],
        tls_plaintext: bool,
    ) -> Result<bool, Abandon> {
        // Inside TLS the login is the client's second packet (the SSLRequest was the first).
        let login_seq = if self.tls { 2 } else { 1 };
        if h.seq != login_seq || payload.len() < h.len as usize {
            return Err(protocol("login_unreadable"));
        }
        let login = ClientLogin::parse(payload).map_err(|_| protocol("login_unreadable"))?;
        if let ClientLogin::SslRequest(_) = login {
            if tls_plaintext && !self.tls {
                self.tls = true;
                return Ok(true);
            }
        }
        match login.not_mirrorable() {
            // The login inside TLS still says SSL: that is what it was sent over.
            Some(NotMirrorable::Tls) if self.tls && matches!(login, ClientLogin::Response(_)) => {}
            Some(NotMirrorable::Tls) => return Err(abandon(Counter::NotMirrorableTls, "tls")),
            Some(NotMirrorable::Compression) => {
                return Err(abandon(Counter::NotMirrorableCompression, "compression"))
            }
            None => {}
        }
        if !matches!(login, ClientLogin::Response(_)) {
            return Err(protocol("login_unreadable"));
        }
        let mut kept: Box<[u8]> = payload.into();
        if self.tls {
            // Our session with the test server is plain: the login must not ask for TLS (the
            // server would wait for a TLS handshake). The capabilities are its first 4 bytes.
            if let Some(caps) = kept.get_mut(..4) {
                let c = u32::from_le_bytes([caps[0], caps[1], caps[2], caps[3]]);
                caps.copy_from_slice(&(c & !Capabilities::SSL.0).to_le_bytes());
            }
        }
        self.client_login = Some(kept);
        Ok(false)
    }

    /// The session is a TLS one mirrored from its plaintext.
    pub(super) fn is_tls(&self) -> bool {
        self.tls
    }

    /// A picked-up connection turned out to be TLS (its first captured bytes are a record).
    pub(super) fn picked_up_tls(&mut self) {
        self.tls = true;
        self.tls_wants_header = true;
    }

    /// A picked-up TLS connection still looks for its framing.
    pub(super) fn tls_wants_header(&self) -> bool {
        self.tls_wants_header
    }

    /// Framing found (see [`pickup_piece`]).
    pub(super) fn tls_framed(&mut self) {
        self.tls_wants_header = false;
    }
    fn auth_switch(
        &mut self,
        ex: &mut AuthExchange,
        pkt: &MysqlPacket,
        out: &mut TransformOutput<'_>,
    ) -> Result<AuthResponse, Abandon> {
        let unsupported = || abandon(Counter::UnsupportedAuthPlugin, "unsupported_auth_plugin");
        let (plugin, data) = if pkt.complete() {
            let sw = AuthSwitchRequest::parse(&pkt.head).map_err(|_| unsupported())?;
            (
                AuthPlugin::from_name(sw.plugin).map_err(|_| unsupported())?,
                Some(sw.data),
            )
        } else {
            // intercept cut the packet (its --mysql-head, after a connection's first packets):
            // name the plugin from what is shown; MariaDB and MySQL switch with the session's
            // nonce, so assume it.
            let shown = pkt.head.get(1..).unwrap_or(&[]);
            let name = shown.split(|&b| b == 0).next().unwrap_or(&[]);
            let named_whole = name.len() < shown.len();
            let mut candidates = [
                AuthPlugin::MysqlNativePassword,
                AuthPlugin::CachingSha2Password,
            ]
            .into_iter()
            .filter(|p| {
                if named_whole {
                    p.name() == name
                } else {
                    p.name().starts_with(name)
                }
            });
            let plugin = match (candidates.next(), candidates.next()) {
                (Some(p), None) if !name.is_empty() => p,
                _ => return Err(unsupported()),
            };
            out.count(Counter::AuthSwitchNonceAssumed as usize);
            (plugin, None)
        };
        let nonce = match data {
            Some(d) => Nonce::from_auth_data(d).map_err(|_| protocol("auth_switch_unreadable"))?,
            None => self.session_nonce.unwrap_or(ex.nonce),
        };
        ex.plugin = plugin;
        ex.nonce = nonce;
        ex.awaiting_key = false;
        self.session_nonce = Some(nonce);
        let password = ex.password.as_ref().ok_or(NO_CREDENTIALS)?;
        Ok(plugin.scramble(password.as_bytes(), &nonce))
    }
}

/// What the first pieces of a picked-up TLS connection's plaintext are. Production's server
/// reads a packet's header, then exactly its body (MariaDB's and MySQL's net layers): the probe
/// may join between the two, when the header read was already under way (an idle pooled
/// connection waits inside it), and the first piece it sees is then a body alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PickupPiece {
    /// A command's header alone: framing starts with it.
    Header,
    /// A whole command packet.
    Whole,
    /// A command's body alone, its header read before the probe: the header it had (its
    /// length, id 0) goes before it.
    Body([u8; HEADER_LEN]),
    /// Nothing a command starts with: passed over (a loss).
    Unknown,
}

pub(super) fn pickup_piece(piece: &[u8], plausible: impl Fn(&[u8]) -> bool) -> PickupPiece {
    if piece.len() == HEADER_LEN && piece[3] == 0 {
        return PickupPiece::Header;
    }
    if let Some(h) = PacketHeader::parse(piece) {
        if h.seq == 0 && h.len as usize + HEADER_LEN == piece.len() && plausible(piece) {
            return PickupPiece::Whole;
        }
    }
    let len = piece.len();
    if len > 0 && len < 1 << 24 {
        let l = (len as u32).to_le_bytes();
        let header = [l[0], l[1], l[2], 0];
        let mut head = [0u8; HEADER_LEN + 1];
        head[..HEADER_LEN].copy_from_slice(&header);
        head[HEADER_LEN] = piece[0];
        if plausible(&head) {
            return PickupPiece::Body(header);
        }
    }
    PickupPiece::Unknown
}
