"""mysql-connector-python's own pool, prepared cursors: the workload of README.md.

The pool does not reset a session when a connection is given back (pool_reset_session=False),
as an application that keeps session state on its pooled connections configures it.
"""
import datetime
import os
import random
import sys
import threading

import mysql.connector
import mysql.connector.pooling

ROWS = 20000


def iteration(cnx, i):
    cur = cnx.cursor(prepared=True)
    for _ in range(2):
        cur.execute("SELECT c FROM sbtest1 WHERE id = ?", (random.randint(1, ROWS),))
        cur.fetchall()
    lo = random.randint(1, ROWS - 100)
    cur.execute("SELECT SUM(k) FROM sbtest2 WHERE id BETWEEN ? AND ?", (lo, lo + 99))
    cur.fetchall()
    cur.execute(
        "SELECT COUNT(*) FROM tsd_pool WHERE tag = ? AND v > ?",
        ("python-%d" % random.randrange(4), random.random()),
    )
    cur.fetchall()
    cnx.start_transaction()
    cur.execute("UPDATE sbtest1 SET k = k + 1 WHERE id = ?", (random.randint(1, ROWS),))
    text = cnx.cursor()
    text.execute("SET @tsd_n = @tsd_n + 1")
    cur.execute(
        "INSERT INTO tsd_pool (tag, n, db, v, at) VALUES "
        "(@tsd_tag, @tsd_n, DATABASE(), ?, ?)",
        (random.random() * 1000.0, datetime.datetime.now()),
    )
    cnx.commit()
    if i % 4 == 0:
        text.execute("USE tsd_other")
        cur.execute("SELECT COUNT(*) FROM marks WHERE x < ?", (random.randrange(100),))
        cur.fetchall()
        text.execute("USE sbtest")
    if i % 6 == 0:
        zone = "SYSTEM" if i % 12 == 0 else "+08:00"
        text.execute("SET SESSION time_zone = '%s'" % zone)
    text.close()
    cur.close()


def main():
    if len(sys.argv) != 6:
        sys.exit("usage: pool.py HOST USER PASSWORD POOL_SIZE STOP_FILE")
    host, user, password, size, stop = sys.argv[1:]
    size = int(size)
    pool = mysql.connector.pooling.MySQLConnectionPool(
        pool_name="tsd",
        pool_size=size,
        pool_reset_session=False,
        host=host,
        port=3306,
        user=user,
        password=password,
        database="sbtest",
        autocommit=True,
    )
    held = [pool.get_connection() for _ in range(size)]
    for k, cnx in enumerate(held):
        cur = cnx.cursor()
        cur.execute("SET @tsd_tag = 'python-%d', @tsd_n = 0" % k)
        cur.execute("SET SESSION time_zone = '+08:00'")
        cur.close()
    for cnx in held:
        cnx.close()
    print("pool ready", flush=True)

    count = [0]
    lock = threading.Lock()
    failed = []

    def worker():
        try:
            while not os.path.exists(stop):
                with lock:
                    count[0] += 1
                    i = count[0]
                cnx = pool.get_connection()
                try:
                    iteration(cnx, i)
                finally:
                    cnx.close()
        except Exception as e:  # any error fails the run: production must have none
            failed.append(e)
            print("error: %r" % e, file=sys.stderr, flush=True)
            os._exit(1)

    threads = [threading.Thread(target=worker) for _ in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("done: iterations=%d" % count[0], flush=True)


if __name__ == "__main__":
    main()
