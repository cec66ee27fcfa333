//! The builders: from validated settings to the session engines a driver runs.
//!
//! # What this room is for
//!
//! [`engine_config`] (one route's engine configuration), [`build_fleet`] (every engine of a
//! plan: one per route and `--multiply` copy, each with its slice of `--client-ip-pool`) and
//! [`build_engine`] (one engine, with the MySQL layer for `--protocol mysql`). `cli` uses
//! `engine_config` to check a set-up before anything starts; `driver` builds its fleet here.
//!
//! # What it must never do
//!
//! * Depend on the command-line parser (`cli`) or on the driver: it takes
//!   [`MirrorSettings`] and a [`Plan`], and returns engines.
//! * Open sockets or start threads: reading `--mysql-credentials` and opening `/dev/urandom`
//!   (the MySQL layer's random bytes) is all the I/O it does.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::credentials::Credentials;
use crate::engine::{Engine, EngineConfig, Fleet};
use crate::mysql::{MysqlConfig, MysqlFactory, RandomBytes, ReportHooks};
use crate::settings::{MirrorSettings, Plan, Protocol, Route};

/// Every engine of `plan`: one per route and `--multiply` copy, each with its own slice of
/// `--client-ip-pool`.
pub fn build_fleet(
    args: &MirrorSettings,
    plan: &Plan,
    recovery_wait: Option<Duration>,
    report: Option<ReportHooks>,
) -> Result<Fleet> {
    build_fleet_for(args, plan, recovery_wait, report, (0, 1))
}

/// [`build_fleet`] for capture worker `worker.0` of `worker.1`.
pub fn build_fleet_for(
    args: &MirrorSettings,
    plan: &Plan,
    recovery_wait: Option<Duration>,
    report: Option<ReportHooks>,
    worker: (u32, u32),
) -> Result<Fleet> {
    let Some(first) = plan.routes.first() else {
        bail!("nothing to mirror: give --port and --target (or --map)");
    };
    let template = engine_config(args, *first, plan.pickup_midstream);
    let routes: Vec<_> = plan
        .routes
        .iter()
        .map(|r| (r.prod_port, r.target))
        .collect();
    let mysql = match args.protocol {
        Protocol::Tcp => None,
        Protocol::Mysql => Some(mysql_factory(args, recovery_wait, report)?),
    };
    let copies = args.multiply.max(1);
    if args.read_only {
        tracing::info!(
            "--read-only: commands that write are not mirrored (CALL {})",
            if args.read_only_allow_calls {
                "is"
            } else {
                "neither"
            }
        );
    }
    let mut fleet = Fleet::for_worker(
        &template,
        &routes,
        args.multiply,
        worker,
        |cfg| match &mysql {
            // Engines are route by route, the copies of a route next to each other.
            Some(f) => {
                let copy = cfg.pool_slice.0 % copies;
                // --tee: observations name their target, so the report keeps A and B apart
                // (and counts production's side once, from the first).
                let target = match args.tee {
                    true => args
                        .target
                        .iter()
                        .position(|t| *t == cfg.target)
                        .unwrap_or(0),
                    false => 0,
                };
                let f = f.clone().for_copy(copy).for_target(target as u32);
                Engine::with_transform(cfg, Box::new(f))
            }
            None => Engine::new(cfg),
        },
    )?;
    if args.target.len() > 1 {
        // Several --target: each connection of their port goes to one of them (placement), or
        // with --tee to each of them.
        let mut ports: Vec<u16> = plan
            .routes
            .iter()
            .filter(|r| args.target.contains(&r.target))
            .map(|r| r.prod_port)
            .collect();
        ports.dedup();
        for port in ports {
            match args.tee {
                true => fleet.tee(port, &args.target),
                false => fleet.spread(port, &args.target),
            }
        }
    }
    Ok(fleet)
}

/// The engine configuration of one route.
pub fn engine_config(args: &MirrorSettings, route: Route, pickup_midstream: bool) -> EngineConfig {
    let mut cfg = EngineConfig::new(route.prod_port, route.target);
    cfg.client_ip_pool = args.client_ip_pool;
    cfg.sample = args.sample;
    cfg.mss = args.mss;
    cfg.delayed_ack = Duration::from_millis(u64::from(args.delayed_ack_ms));
    cfg.pickup_midstream = pickup_midstream;
    cfg.max_sessions = args.max_sessions;
    let budget = args.memory_budget();
    cfg.max_memory = budget.sessions();
    cfg.max_session_buffer = budget.session_buffer(1);
    cfg
}

/// The engine for `--protocol`: plain TCP, or with the MySQL layer rewriting logins and
/// statement ids. `recovery_wait`: with `--prod-dsn`, how long a picked-up connection waits
/// (its commands held) for its state.
pub fn build_engine(
    args: &MirrorSettings,
    cfg: EngineConfig,
    recovery_wait: Option<Duration>,
) -> Result<Engine> {
    if args.protocol == Protocol::Tcp {
        return Ok(Engine::new(cfg));
    }
    let factory = mysql_factory(args, recovery_wait, None)?;
    Ok(Engine::with_transform(cfg, Box::new(factory)))
}

fn mysql_factory(
    args: &MirrorSettings,
    recovery_wait: Option<Duration>,
    report: Option<ReportHooks>,
) -> Result<MysqlFactory> {
    let credentials = match &args.mysql_credentials {
        Some(path) => crate::credentials::load(path)?,
        None => {
            tracing::warn!(
                "no --mysql-credentials: logins are forwarded unchanged, so they only succeed on a \
                 test server that does not check passwords (--skip-grant-tables)"
            );
            Credentials::default()
        }
    };
    if let Some(user) = &args.mysql_default_user {
        if credentials.password(user).is_none() {
            bail!("--mysql-default-user {user:?} has no line in --mysql-credentials");
        }
    }
    let config = MysqlConfig {
        default_user: args.mysql_default_user.clone(),
        default_db: args.mysql_default_db.clone(),
        forward_without_credentials: args.mysql_credentials.is_none(),
        recovery_wait,
        read_only: args.read_only,
        allow_calls: args.read_only_allow_calls,
        report,
        tls_plaintext: args.tls_plaintext,
        // Commands held for the test server count toward the session's queue cap anyway.
        max_held_bytes: args.memory_budget().session_buffer(1),
        ..MysqlConfig::default()
    };
    Ok(MysqlFactory::new(config, Arc::new(credentials), urandom()?))
}

/// Random bytes for caching_sha2 full authentication (RSA-OAEP padding), from the kernel.
fn urandom() -> Result<RandomBytes> {
    let file = std::fs::File::open("/dev/urandom").context("cannot open /dev/urandom")?;
    Ok(Arc::new(move |buf: &mut [u8]| {
        use std::io::Read;
        (&file).read_exact(buf).is_ok()
    }))
}
