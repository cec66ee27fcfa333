// MariaDB Connector/J through HikariCP, server-side prepared statements with the statement
// cache on: the workload of README.md. Connector/J sends a statement's parameter types with
// its first execute only, so a pool open before the copier is the case of issue 18.
import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;

public class Pool {
    static final int ROWS = 20000;

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: Pool HOST USER PASSWORD POOL_SIZE STOP_FILE");
            System.exit(2);
        }
        int size = Integer.parseInt(args[3]);
        Path stop = Path.of(args[4]);
        HikariConfig cfg = new HikariConfig();
        // TSD_JDBC_EXTRA: more URL options, e.g. TLS for issue 21's test.
        String extra = System.getenv().getOrDefault("TSD_JDBC_EXTRA", "");
        cfg.setJdbcUrl("jdbc:mariadb://" + args[0] + ":3306/sbtest"
                + "?useServerPrepStmts=true&cachePrepStmts=true&prepStmtCacheSize=250" + extra);
        cfg.setUsername(args[1]);
        cfg.setPassword(args[2]);
        cfg.setMinimumIdle(size);
        cfg.setMaximumPoolSize(size);
        cfg.setPoolName("tsd");
        HikariDataSource ds = new HikariDataSource(cfg);

        List<Connection> all = new ArrayList<>();
        for (int k = 0; k < size; k++) {
            Connection c = ds.getConnection();
            try (Statement s = c.createStatement()) {
                s.execute("SET @tsd_tag = 'java-" + k + "', @tsd_n = 0");
                s.execute("SET SESSION time_zone = '+08:00'");
            }
            all.add(c);
        }
        for (Connection c : all) {
            c.close();
        }
        System.out.println("pool ready");
        System.out.flush();

        AtomicLong iterations = new AtomicLong();
        List<Thread> workers = new ArrayList<>();
        final Throwable[] failed = new Throwable[1];
        for (int w = 0; w < size; w++) {
            Thread t = new Thread(() -> {
                try {
                    while (!Files.exists(stop)) {
                        long i = iterations.incrementAndGet();
                        try (Connection c = ds.getConnection()) {
                            iteration(c, i);
                        }
                    }
                } catch (Throwable e) {
                    synchronized (failed) {
                        failed[0] = e;
                    }
                    e.printStackTrace();
                    System.exit(1);
                }
            });
            t.start();
            workers.add(t);
        }
        for (Thread t : workers) {
            t.join();
        }
        ds.close();
        System.out.println("done: iterations=" + iterations.get());
    }

    static void iteration(Connection c, long i) throws SQLException {
        ThreadLocalRandom r = ThreadLocalRandom.current();
        try (PreparedStatement ps = c.prepareStatement("SELECT c FROM sbtest1 WHERE id = ?")) {
            for (int n = 0; n < 2; n++) {
                ps.setInt(1, 1 + r.nextInt(ROWS));
                drain(ps.executeQuery());
            }
        }
        try (PreparedStatement ps =
                c.prepareStatement("SELECT SUM(k) FROM sbtest2 WHERE id BETWEEN ? AND ?")) {
            int lo = 1 + r.nextInt(ROWS - 100);
            ps.setInt(1, lo);
            ps.setInt(2, lo + 99);
            drain(ps.executeQuery());
        }
        try (PreparedStatement ps =
                c.prepareStatement("SELECT COUNT(*) FROM tsd_pool WHERE tag = ? AND v > ?")) {
            ps.setString(1, "java-" + r.nextInt(4));
            ps.setDouble(2, r.nextDouble());
            drain(ps.executeQuery());
        }
        c.setAutoCommit(false);
        try (PreparedStatement up = c.prepareStatement("UPDATE sbtest1 SET k = k + 1 WHERE id = ?");
                PreparedStatement ins = c.prepareStatement(
                        "INSERT INTO tsd_pool (tag, n, db, v, at) VALUES "
                                + "(@tsd_tag, @tsd_n, DATABASE(), ?, ?)");
                Statement s = c.createStatement()) {
            up.setInt(1, 1 + r.nextInt(ROWS));
            up.executeUpdate();
            s.execute("SET @tsd_n = @tsd_n + 1");
            ins.setDouble(1, r.nextDouble() * 1000.0);
            ins.setTimestamp(2, new Timestamp(System.currentTimeMillis()));
            ins.executeUpdate();
            c.commit();
        } finally {
            c.setAutoCommit(true);
        }
        if (i % 4 == 0) {
            c.setCatalog("tsd_other");
            try (PreparedStatement ps = c.prepareStatement("SELECT COUNT(*) FROM marks WHERE x < ?")) {
                ps.setLong(1, r.nextLong(100));
                drain(ps.executeQuery());
            }
            c.setCatalog("sbtest");
        }
        if (i % 6 == 0) {
            try (Statement s = c.createStatement()) {
                s.execute(i % 12 == 0 ? "SET SESSION time_zone = 'SYSTEM'"
                        : "SET SESSION time_zone = '+08:00'");
            }
        }
    }

    static void drain(ResultSet rs) throws SQLException {
        try (rs) {
            while (rs.next()) {
                rs.getObject(1);
            }
        }
    }
}
