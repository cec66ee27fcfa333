//! The live copier: reads the production interface and drives the mirror with what it
//! captures, sleeping in poll(2) between events.
//!
//! This room owns the live capture and its pacing; everything else (engine, sender, control
//! channel, lookups, status, drain) is the [`Driver`]'s. It holds no TCP logic.

use std::os::fd::AsRawFd;
use std::time::Duration;

use anyhow::Result;
use common::clock::{Instant, MonotonicClock};

use crate::capture::LiveCapture;
use crate::cli::Args;
use crate::driver::{Driver, Plan, Pump};
use crate::status::Snapshot;

/// Packets read from the capture before the loop looks at the control channel again.
const CAPTURE_BUDGET: usize = 512;

/// What the live command line asks the driver for.
pub fn plan(args: &Args) -> Result<Plan> {
    let prod_dsn = match &args.prod_dsn {
        Some(arg) => Some(
            arg.get()
                .map_err(|e| anyhow::anyhow!("--prod-dsn: {e}"))?
                .clone(),
        ),
        None => None,
    };
    Ok(Plan {
        routes: args.routes()?,
        pickup_midstream: !args.no_pickup,
        prod_dsn,
        prod_dsn_wait: Duration::from_millis(args.prod_dsn_wait_ms),
    })
}

pub fn run(args: &Args) -> Result<Snapshot> {
    let clock = MonotonicClock::new();
    let plan = plan(args)?;
    let filter = args.capture_filter()?;
    let buffer = args.capture_buffer_bytes()?;
    let mut capture =
        LiveCapture::open_live(&args.interface, &filter, buffer, args.capture_block_ms)?;
    let routes = plan
        .routes
        .iter()
        .map(|r| format!("port {} to {}", r.prod_port, r.target))
        .collect::<Vec<_>>()
        .join(", ");
    let mut driver = Driver::start(&args.mirror, plan, clock.now())?;
    drop_privileges()?;
    tracing::info!(
        "mirroring {routes} on {} (intercept {}), filter: {filter}",
        args.interface,
        args.mirror.intercept
    );

    loop {
        let now = clock.now();
        // Capture timestamps are wall-clock, the engine's clock monotonic: mapped through
        // their offset now.
        let wall = wall_nanos();
        // Once stopping, nothing new is captured; what is queued still goes out.
        if !driver.poll_stop(now) {
            let drained = capture.drain(CAPTURE_BUDGET, |at, pkt| {
                driver.feed_at(now, capture_time(now, wall, at), pkt)
            });
            if let Err(e) = drained {
                return Err(driver.fail(now, &capture.stats, e));
            }
        }
        if driver.pump(now) == Pump::Done {
            break;
        }
        if driver.status_due(now) {
            capture.refresh_kernel_stats();
            driver.print_status(now, &capture.stats);
        }
        driver.wait(&[capture.as_raw_fd()], driver.next_wake(clock.now()));
    }
    capture.refresh_kernel_stats();
    Ok(driver.finish(&capture.stats))
}

/// Once the capture, the raw socket and the metrics listener are open, the live copier needs no
/// capability at all: reconnecting to intercept, --prod-dsn, reports and SIGHUP reloads are
/// plain sockets and files. Dropped in every thread, with no_new_privs.
fn drop_privileges() -> Result<()> {
    let dropped = ops::privs::drop_all_but(&[]).map_err(|e| {
        anyhow::anyhow!(
            "cannot drop capabilities after opening the capture (refusing to run with more than \
             needed): {e}"
        )
    })?;
    tracing::info!("capabilities dropped: {}", dropped.describe());
    Ok(())
}

/// The wall clock, nanoseconds since the Unix epoch (the capture timestamps' clock).
fn wall_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Capture timestamp `at` (wall clock, ns) on the engine's clock, given that the wall clock
/// read `wall` at `now`. Kept within a second of `now`: a wall-clock step must not turn into a
/// latency.
fn capture_time(now: Instant, wall: u64, at: u64) -> Instant {
    const LIMIT: u64 = 1_000_000_000;
    let n = now.as_nanos();
    let t = if at >= wall {
        n.saturating_add((at - wall).min(LIMIT))
    } else {
        n.saturating_sub((wall - at).min(LIMIT))
    };
    Instant::from_nanos(t)
}
