// Node.js mysql2's pool and execute() (server-side prepared statements, cached per
// connection): the workload of README.md.
'use strict';
const fs = require('fs');
const mysql = require('mysql2/promise');

const ROWS = 20000;
const rand = (n) => Math.floor(Math.random() * n);

async function iteration(c, i) {
  for (let n = 0; n < 2; n++) {
    await c.execute('SELECT c FROM sbtest1 WHERE id = ?', [1 + rand(ROWS)]);
  }
  const lo = 1 + rand(ROWS - 100);
  await c.execute('SELECT SUM(k) FROM sbtest2 WHERE id BETWEEN ? AND ?', [lo, lo + 99]);
  await c.execute('SELECT COUNT(*) FROM tsd_pool WHERE tag = ? AND v > ?', [
    'node-' + rand(4),
    Math.random(),
  ]);
  await c.beginTransaction();
  await c.execute('UPDATE sbtest1 SET k = k + 1 WHERE id = ?', [1 + rand(ROWS)]);
  await c.query('SET @tsd_n = @tsd_n + 1');
  await c.execute(
    'INSERT INTO tsd_pool (tag, n, db, v, at) VALUES ' +
      '(@tsd_tag, @tsd_n, DATABASE(), ?, ?)',
    [Math.random() * 1000.0, new Date()],
  );
  await c.commit();
  if (i % 4 === 0) {
    await c.query('USE tsd_other');
    await c.execute('SELECT COUNT(*) FROM marks WHERE x < ?', [rand(100)]);
    await c.query('USE sbtest');
  }
  if (i % 6 === 0) {
    await c.query(
      i % 12 === 0 ? "SET SESSION time_zone = 'SYSTEM'" : "SET SESSION time_zone = '+08:00'",
    );
  }
}

async function main() {
  if (process.argv.length !== 7) {
    console.error('usage: pool.js HOST USER PASSWORD POOL_SIZE STOP_FILE');
    process.exit(2);
  }
  const [host, user, password, sizeArg, stop] = process.argv.slice(2);
  const size = parseInt(sizeArg, 10);
  const pool = mysql.createPool({
    host,
    port: 3306,
    user,
    password,
    database: 'sbtest',
    connectionLimit: size,
    maxIdle: size,
    idleTimeout: 3600000,
    dateStrings: true,
  });
  const held = [];
  for (let k = 0; k < size; k++) {
    held.push(await pool.getConnection());
  }
  for (let k = 0; k < size; k++) {
    await held[k].query(`SET @tsd_tag = 'node-${k}', @tsd_n = 0`);
    await held[k].query("SET SESSION time_zone = '+08:00'");
  }
  for (const c of held) {
    c.release();
  }
  console.log('pool ready');

  let count = 0;
  const worker = async () => {
    while (!fs.existsSync(stop)) {
      const i = ++count;
      const c = await pool.getConnection();
      try {
        await iteration(c, i);
      } finally {
        c.release();
      }
    }
  };
  const workers = [];
  for (let w = 0; w < size; w++) {
    workers.push(worker());
  }
  try {
    await Promise.all(workers);
  } catch (e) {
    console.error('error:', e);
    process.exit(1);
  }
  await pool.end();
  console.log(`done: iterations=${count}`);
}

main();
