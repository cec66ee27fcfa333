-- The A/B experiments' load (issue 22): sysbench script over sbtest.tsd_orders (ab-schema.sql).
-- Five prepared statements, each result set carrying TIMESTAMP columns:
--   point    by primary key                                   45 %
--   customer by customer_id: uses idx_customer                 5 %
--   range    a primary-key range of 50 rows                   20 %
--   status   per-status counts over a primary-key range       15 %
--   recent   by created_at, ordered: uses idx_created         15 %
-- so dropping one index on test B slows exactly the statements that use it. The customer
-- lookup is rare on purpose: without its index it scans the table (about 1.5 ms here), and a
-- test B busy scanning would slow everything else on it too, on a machine of two cores (at 15 %
-- of 400 events/s the other four came out 1.3-1.45x slower on B). A comparison that must tell
-- it apart needs its runs long enough for some 800 of them (tests/tests/ab.rs: 40 s at 400/s).
-- Run: sysbench /path/ab.lua --mysql-host=... --threads=8 --time=20 run (lab.sh load --test PATH).

local ROWS = 20000
local CUSTOMERS = 2000
-- 2026-01-01 00:00:00 UTC, ab-schema.sql's first instant.
local EPOCH = 1767225600

function thread_init()
    drv = sysbench.sql.driver()
    con = drv:connect()
    stmts = {}
    params = {}
    local function prep(name, sql, n)
        stmts[name] = con:prepare(sql)
        params[name] = {}
        for i = 1, n do
            params[name][i] = stmts[name]:bind_create(sysbench.sql.type.INT)
        end
        stmts[name]:bind_param(unpack(params[name]))
    end
    prep("point", "SELECT id, customer_id, status, amount, created_at, updated_at FROM tsd_orders WHERE id = ?", 1)
    prep("customer", "SELECT id, status, amount, created_at, updated_at FROM tsd_orders WHERE customer_id = ?", 1)
    prep("range", "SELECT id, created_at, updated_at FROM tsd_orders WHERE id BETWEEN ? AND ?", 2)
    prep("status", "SELECT status, COUNT(*), MIN(created_at), MAX(updated_at) FROM tsd_orders WHERE id BETWEEN ? AND ? GROUP BY status ORDER BY status", 2)
    prep("recent", "SELECT id, customer_id, created_at FROM tsd_orders WHERE created_at >= FROM_UNIXTIME(?) ORDER BY created_at LIMIT 20", 1)
end

local function run(name, a, b)
    params[name][1]:set(a)
    if b ~= nil then
        params[name][2]:set(b)
    end
    stmts[name]:execute()
end

function event()
    local r = sysbench.rand.uniform(1, 100)
    if r <= 45 then
        run("point", sysbench.rand.uniform(1, ROWS))
    elseif r <= 50 then
        run("customer", sysbench.rand.uniform(0, CUSTOMERS - 1))
    elseif r <= 70 then
        local lo = sysbench.rand.uniform(1, ROWS - 50)
        run("range", lo, lo + 49)
    elseif r <= 85 then
        local lo = sysbench.rand.uniform(1, ROWS - 500)
        run("status", lo, lo + 499)
    else
        run("recent", EPOCH + sysbench.rand.uniform(0, ROWS * 37))
    end
end

function thread_done()
    for _, s in pairs(stmts) do
        s:close()
    end
    con:disconnect()
end
