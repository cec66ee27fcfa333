-- The A/B experiments' table (issue 22): 20,000 orders whose result sets carry TIMESTAMP
-- columns, in the spirit of the queries of ../shared/background (a server with
-- time_zone=SYSTEM converts each TIMESTAMP it returns through the C library's time zone code),
-- with two secondary indexes so an experiment can take one away on one server.
-- Deterministic: every server that runs this holds the same rows. Load it on each server
-- (`lab.sh sql HOST "$(cat ab-schema.sql)"`) before mirroring; ab.lua is the load.
CREATE TABLE IF NOT EXISTS sbtest.tsd_orders (
    id INT UNSIGNED NOT NULL PRIMARY KEY,
    customer_id INT UNSIGNED NOT NULL,
    status TINYINT UNSIGNED NOT NULL,
    amount DECIMAL(10, 2) NOT NULL,
    created_at TIMESTAMP NOT NULL DEFAULT '2026-01-01 00:00:00',
    updated_at TIMESTAMP NOT NULL DEFAULT '2026-01-01 00:00:00',
    note VARCHAR(64) NOT NULL,
    KEY idx_customer (customer_id),
    KEY idx_created (created_at)
) ENGINE = InnoDB;
-- Explicit UTC for the literal timestamps below, whatever the server's time_zone: the same
-- instants on every server.
SET time_zone = '+00:00';
-- MariaDB stops a recursive CTE after 1,000 iterations by default.
SET max_recursive_iterations = 100000;
INSERT IGNORE INTO sbtest.tsd_orders
WITH RECURSIVE seq (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < 20000)
SELECT n, n % 2000, n % 5, (n * 7919 % 100000) / 100,
       TIMESTAMP '2026-01-01 00:00:00' + INTERVAL n * 37 SECOND,
       TIMESTAMP '2026-01-01 00:00:00' + INTERVAL n * 41 SECOND,
       CONCAT('order ', n)
FROM seq;
ANALYZE TABLE sbtest.tsd_orders;
