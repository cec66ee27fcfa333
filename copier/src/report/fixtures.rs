//! A hand-made, realistic report: a 30 s sysbench `oltp_read_only` mirror in which the test
//! server lost `sbtest3`'s primary key, `sbtest4` lost rows and `sbtest2` lost its grant,
//! plus a hostile statement. For renderer tests, the HTML screenshot test and docs; never
//! used by the daemon.

use std::collections::BTreeMap;

use super::{DigestReport, Latency, Mismatch, QpsPoint, Report, Totals, SCHEMA};

/// A deterministic pseudo-random sequence (xorshift), so the fixture is the same every run.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Roughly log-normal latencies around `median_us`.
    fn latency(&mut self, median_us: u64) -> u64 {
        let u = (self.next() % 10_000) as f64 / 10_000.0;
        let v = (self.next() % 10_000) as f64 / 10_000.0;
        let z = (u + v - 1.0) * 2.2;
        let tail = if self.next().is_multiple_of(100) {
            6.0
        } else {
            1.0
        };
        ((median_us as f64) * z.exp() * tail).max(1.0) as u64
    }
}

fn latency(noise: &mut Noise, n: usize, median_us: u64) -> Latency {
    let samples: Vec<u64> = (0..n).map(|_| noise.latency(median_us)).collect();
    Latency::from_samples(&samples)
}

#[allow(clippy::too_many_arguments)]
fn digest(
    noise: &mut Noise,
    id: &str,
    command: &str,
    fingerprint: &str,
    example: &str,
    count: u64,
    prod_us: u64,
    test_us: u64,
) -> DigestReport {
    // Latency from a few thousand samples: enough for the shape, cheap to build.
    let n = count.min(4000) as usize;
    let mut prod = latency(noise, n, prod_us);
    let mut test = latency(noise, n, test_us);
    prod.count = count;
    test.count = count;
    DigestReport {
        id: id.into(),
        fingerprint: fingerprint.into(),
        command: command.into(),
        count,
        prod,
        test,
        rows_prod: count,
        rows_test: count,
        bytes_prod: count * 190,
        bytes_test: count * 190,
        example: example.into(),
        ..DigestReport::default()
    }
}

/// See the module documentation.
pub fn sample_report() -> Report {
    let mut noise = Noise(0x9E37_79B9_7F4A_7C15);
    let mut digests = Vec::new();
    for (i, table) in ["sbtest1", "sbtest2", "sbtest3", "sbtest4"]
        .iter()
        .enumerate()
    {
        let slow = *table == "sbtest3";
        let f = |us: u64| if slow { us * 40 } else { us + us / 20 };
        let id = |k: u64| format!("{:016x}", 0x3a5f_0000_0000_0000u64 + (i as u64) * 16 + k);
        digests.push(digest(
            &mut noise,
            &id(1),
            "stmt_execute",
            &format!("SELECT c FROM {table} WHERE id=?"),
            &format!("SELECT c FROM {table} WHERE id=?"),
            120_000,
            180,
            f(180),
        ));
        digests.push(digest(
            &mut noise,
            &id(2),
            "stmt_execute",
            &format!("SELECT c FROM {table} WHERE id BETWEEN ? AND ?"),
            &format!("SELECT c FROM {table} WHERE id BETWEEN ? AND ?"),
            12_000,
            420,
            f(420),
        ));
        digests.push(digest(
            &mut noise,
            &id(3),
            "stmt_execute",
            &format!("SELECT SUM(k) FROM {table} WHERE id BETWEEN ? AND ?"),
            &format!("SELECT SUM(k) FROM {table} WHERE id BETWEEN ? AND ?"),
            12_000,
            390,
            f(390),
        ));
        digests.push(digest(
            &mut noise,
            &id(4),
            "stmt_execute",
            &format!("SELECT DISTINCT c FROM {table} WHERE id BETWEEN ? AND ? ORDER BY c"),
            &format!("SELECT DISTINCT c FROM {table} WHERE id BETWEEN ? AND ? ORDER BY c"),
            12_000,
            610,
            f(610),
        ));
    }
    // sbtest2: SELECT revoked on test.
    for d in digests
        .iter_mut()
        .filter(|d| d.fingerprint.contains("sbtest2"))
    {
        d.test_errors = BTreeMap::from([(1142, d.count)]);
        d.rows_test = 0;
        d.test = Latency {
            count: d.count,
            ..latency(&mut noise, 2000, 90)
        };
        d.mismatch_examples.push(Mismatch {
            kind: "error".into(),
            prod: format!("rows={}", 1),
            test: "ERR 1142".into(),
            example: d.fingerprint.clone(),
        });
    }
    // sbtest4: 100 rows deleted on test.
    for d in digests
        .iter_mut()
        .filter(|d| d.fingerprint.contains("sbtest4"))
    {
        d.row_mismatches = d.count / 100;
        d.rows_test = d.rows_prod - d.row_mismatches;
        d.mismatch_examples.push(Mismatch {
            kind: "rows".into(),
            prod: "rows=100".into(),
            test: "rows=97".into(),
            example: d.example.replace('?', "5021"),
        });
    }
    let mut begin = digest(
        &mut noise,
        "0b1e5ac0ffee0001",
        "query",
        "BEGIN",
        "BEGIN",
        12_000,
        60,
        64,
    );
    begin.rows_prod = 0;
    begin.rows_test = 0;
    digests.push(begin);
    let mut now = digest(
        &mut noise,
        "0b1e5ac0ffee0002",
        "query",
        "SELECT NOW(), RAND()",
        "SELECT NOW(), RAND()",
        300,
        70,
        72,
    );
    now.nondeterministic = true;
    digests.push(now);
    let mut hostile = digest(
        &mut noise,
        "0b1e5ac0ffee0003",
        "query",
        "SELECT ? FROM `t<script>alert(1)</script>` WHERE a=? AND \"b\"<>'&amp;'",
        "SELECT '</td><script>alert(\"x\")</script>' FROM `t<script>alert(1)</script>` \
         WHERE a=1 AND \"b\"<>'&amp;' \u{1b}[31m",
        5,
        300,
        310,
    );
    hostile.prod_errors = BTreeMap::from([(1146, 5)]);
    hostile.test_errors = BTreeMap::from([(1146, 5)]);
    digests.push(hostile);

    let commands: u64 = digests.iter().map(|d| d.count).sum();
    let qps = (0..30)
        .map(|t| {
            let base = 21_000 + noise.next() % 1200;
            // The test server falls a little behind while it scans sbtest3.
            let lag = if (8..14).contains(&t) { 1900 } else { 0 };
            QpsPoint {
                t_s: t,
                prod: base,
                test: base - lag + noise.next() % 300,
            }
        })
        .collect();
    let totals = Totals {
        commands,
        compared: commands - 42,
        prod_errors: 5,
        test_errors: digests.iter().map(|d| d.error_totals().1).sum(),
        row_mismatches: digests.iter().map(|d| d.row_mismatches).sum(),
        result_mismatches: 0,
        nondeterministic: 300,
        not_compared: 42,
    };
    Report {
        schema: SCHEMA.into(),
        generated_unix_ms: 1_767_225_630_000,
        started_unix_ms: 1_767_225_600_000,
        duration_s: 30.0,
        copier_version: "0.1.0".into(),
        prod: "198.18.0.2:3306".into(),
        target: "198.18.0.3:3306".into(),
        compare_results: false,
        literals: true,
        totals,
        qps,
        digests,
        resources: Vec::new(),
        ..Default::default()
    }
}
