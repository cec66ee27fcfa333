use super::*;
use proptest::prelude::*;
use WriteKind::*;

fn effect(sql: &str) -> Effect {
    classify(sql.as_bytes()).effect
}

#[track_caller]
fn read(sql: &str) {
    assert_eq!(effect(sql), Effect::Read, "{sql:?}");
}

#[track_caller]
fn write(kind: WriteKind, sql: &str) {
    assert_eq!(effect(sql), Effect::Write(kind), "{sql:?}");
}

#[test]
fn sysbench_statements() {
    for sql in [
        "SELECT c FROM sbtest1 WHERE id=?",
        "SELECT c FROM sbtest1 WHERE id BETWEEN ? AND ?",
        "SELECT SUM(k) FROM sbtest1 WHERE id BETWEEN ? AND ?",
        "SELECT DISTINCT c FROM sbtest1 WHERE id BETWEEN ? AND ? ORDER BY c",
        "BEGIN",
        "COMMIT",
    ] {
        read(sql);
    }
    write(Update, "UPDATE sbtest1 SET k=k+1 WHERE id=?");
    write(Update, "UPDATE sbtest1 SET c=? WHERE id=?");
    write(Delete, "DELETE FROM sbtest1 WHERE id=?");
    write(
        Insert,
        "INSERT INTO sbtest1 (id, k, c, pad) VALUES (?, ?, ?, ?)",
    );
}

#[test]
fn data_changes_and_ddl() {
    write(Replace, "replace into t values (1)");
    write(Insert, "Insert Ignore INTO t SELECT * FROM u");
    write(LoadData, "LOAD DATA LOCAL INFILE '/tmp/x' INTO TABLE t");
    write(LoadData, "load xml infile 'x' into table t");
    write(Admin, "LOAD INDEX INTO CACHE t");
    for sql in [
        "CREATE TABLE t (a int)",
        "CREATE TEMPORARY TABLE t (a int)",
        "create or replace view v as select 1",
        "ALTER TABLE t ADD COLUMN b int",
        "DROP TABLE t",
        "DROP DATABASE d",
        "TRUNCATE t",
        "RENAME TABLE a TO b",
    ] {
        write(Ddl, sql);
    }
    write(Call, "CALL p(1, @x)");
    let calls = Rules {
        allow_calls: true,
        ..Rules::default()
    };
    let e = |sql: &str| classify_with(sql.as_bytes(), &calls).effect;
    assert_eq!(e("CALL p(1, @x)"), Effect::Read);
    assert_eq!(
        e("CALL p(); INSERT INTO t VALUES (1)"),
        Effect::Write(Insert)
    );
    assert_eq!(e("EXECUTE IMMEDIATE 'CALL p()'"), Effect::Read);
    write(Update, "WITH x AS (SELECT 1) UPDATE t JOIN x SET t.a = 1");
    write(
        Delete,
        "WITH RECURSIVE r (n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r WHERE n<3) DELETE FROM t WHERE id IN (SELECT n FROM r)",
    );
    read("WITH x AS (SELECT 1), y AS (SELECT 2) SELECT * FROM x, y");
    read("with x (a) as (select 1) select * from x");
    write(Other, "WITH x AS (SELECT 1)");
}

#[test]
fn locking_reads_and_files() {
    write(LockingRead, "SELECT * FROM t WHERE id=1 FOR UPDATE");
    write(LockingRead, "select * from t for update nowait");
    write(LockingRead, "SELECT * FROM t FOR SHARE");
    write(LockingRead, "SELECT * FROM t LOCK IN SHARE MODE");
    write(
        LockingRead,
        "SELECT * FROM t FOR /* x */ UPDATE SKIP LOCKED",
    );
    write(
        LockingRead,
        "(SELECT * FROM t) UNION (SELECT * FROM u FOR UPDATE)",
    );
    write(
        LockingRead,
        "SET @x = (SELECT a FROM t WHERE id = 1 FOR UPDATE)",
    );
    write(SelectInto, "SELECT * FROM t INTO OUTFILE '/tmp/t.txt'");
    write(SelectInto, "SELECT a INTO DUMPFILE '/tmp/a' FROM t");
    read("SELECT a INTO @a FROM t LIMIT 1");
    read("SELECT 'FOR UPDATE', `for update`, \"into outfile\" FROM t");
    read("SELECT * FROM t -- FOR UPDATE\n WHERE 1");
    read("SELECT * FROM t # FOR UPDATE");
    read("SELECT for_update FROM t");
    write(Other, "SELECT NEXTVAL(s)");
    write(Other, "SELECT NEXT VALUE FOR s");
    write(Other, "DO SETVAL(s, 10)");
    read("SELECT PREVIOUS VALUE FOR s");
    read("SELECT LASTVAL(s)");
}

#[test]
fn reads() {
    for sql in [
        "SHOW TABLES",
        "show global status like 'Com_%'",
        "DESCRIBE t",
        "DESC t",
        "desc select 1",
        "EXPLAIN SELECT * FROM t",
        "EXPLAIN UPDATE t SET a = 1",
        "EXPLAIN FORMAT=JSON DELETE FROM t",
        "EXPLAIN ANALYZE SELECT * FROM t",
        "ANALYZE SELECT * FROM t",
        "ANALYZE FORMAT=JSON SELECT 1",
        "USE sbtest",
        "BEGIN",
        "BEGIN WORK",
        "START TRANSACTION",
        "START TRANSACTION READ WRITE",
        "start transaction with consistent snapshot, read only",
        "COMMIT",
        "COMMIT AND NO CHAIN",
        "ROLLBACK",
        "ROLLBACK TO SAVEPOINT s",
        "SAVEPOINT s",
        "RELEASE SAVEPOINT s",
        "XA START 'x'",
        "XA END 'x'",
        "XA COMMIT 'x' ONE PHASE",
        "HELP 'select'",
        "DO SLEEP(0)",
        "CHECKSUM TABLE t",
        "HANDLER t READ FIRST",
        "UNLOCK TABLES",
        "GET DIAGNOSTICS @n = NUMBER",
        "TABLE t",
        "VALUES (1), (2)",
        "SELECT 1",
        "select/**/1",
        "(((SELECT 1)))",
        "  \n\t /* leading */ -- line\n # hash\n SELECT 1",
        "",
        "   ",
        ";",
        "/* nothing */",
    ] {
        read(sql);
    }
    write(Update, "EXPLAIN ANALYZE UPDATE t SET a = 1");
    write(Delete, "ANALYZE DELETE FROM t");
    write(Insert, "ANALYZE FORMAT=JSON INSERT INTO t VALUES (1)");
    write(Update, "EXPLAIN FORMAT=TREE ANALYZE UPDATE t SET a = 1");
    write(Other, "BEGIN NOT ATOMIC INSERT INTO t VALUES (1); END");
    write(Other, "IF 1 THEN SELECT 1; END IF");
    write(Other, "123");
    write(Other, "'SELECT 1'");
}

#[test]
fn session_and_global_set() {
    for sql in [
        "SET autocommit=0",
        "SET NAMES utf8mb4",
        "SET CHARACTER SET utf8",
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "SET TRANSACTION READ WRITE",
        "set time_zone = '+8:00'",
        "SET @@session.sql_mode = 'ANSI'",
        "SET @@sql_mode = 'ANSI', @a = 1",
        "SET @x = 'GLOBAL'",
        "SET ROLE r",
        "SET STATEMENT max_statement_time=1 FOR SELECT * FROM t",
    ] {
        read(sql);
    }
    write(Admin, "SET GLOBAL max_connections = 10");
    write(Admin, "SET @@GLOBAL.max_connections = 10");
    write(Admin, "SET @@global.x = 1");
    write(Admin, "SET sql_mode = '', GLOBAL max_connections = 10");
    write(Admin, "SET PERSIST max_connections = 10");
    write(
        Admin,
        "SET GLOBAL TRANSACTION ISOLATION LEVEL READ COMMITTED",
    );
    write(Admin, "SET PASSWORD = PASSWORD('x')");
    write(Admin, "SET PASSWORD FOR u = 'x'");
    write(Admin, "SET DEFAULT ROLE r FOR u");
    write(
        Insert,
        "SET STATEMENT max_statement_time=1, sql_mode='' FOR INSERT INTO t VALUES (1)",
    );
    write(Other, "SET STATEMENT max_statement_time=1");
}

#[test]
fn administration() {
    for sql in [
        "GRANT SELECT ON *.* TO u",
        "REVOKE ALL ON *.* FROM u",
        "FLUSH PRIVILEGES",
        "KILL 5",
        "KILL QUERY 5",
        "LOCK TABLES t READ",
        "OPTIMIZE TABLE t",
        "ANALYZE TABLE t",
        "ANALYZE NO_WRITE_TO_BINLOG TABLE t",
        "REPAIR TABLE t",
        "CHECK TABLE t",
        "INSTALL SONAME 'x'",
        "UNINSTALL PLUGIN x",
        "RESET MASTER",
        "PURGE BINARY LOGS TO 'x'",
        "CHANGE MASTER TO MASTER_HOST='x'",
        "START SLAVE",
        "STOP SLAVE",
        "SHUTDOWN",
        "BINLOG 'x'",
    ] {
        write(Admin, sql);
    }
    write(Ddl, "CREATE USER u IDENTIFIED BY 'x'");
    write(Other, "START something");
    write(Other, "FOO BAR");
}

#[test]
fn several_statements_write_if_any_does() {
    read("SELECT 1; SELECT 2;");
    read("BEGIN; SELECT 1; COMMIT");
    write(Insert, "SELECT 1; INSERT INTO t VALUES (1)");
    write(
        Delete,
        "BEGIN; DELETE FROM t; INSERT INTO t VALUES (1); COMMIT",
    );
    read("SELECT ';DELETE FROM t;'");
    read("SELECT 1 /* ; DELETE FROM t */");
    read("SELECT `a;DELETE FROM t` FROM t");
    read("SELECT 1 -- ; DELETE FROM t");
    // Statements whose readers look ahead must not swallow the next statement.
    write(
        Insert,
        "PREPARE r FROM 'SELECT 1'; INSERT INTO t VALUES (1)",
    );
    for first in [
        "PREPARE",
        "PREPARE s FROM",
        "EXECUTE",
        "EXECUTE IMMEDIATE",
        "LOAD",
    ] {
        // A write already; the statement after it is still read.
        let c = classify(format!("{first};DEALLOCATE PREPARE n").as_bytes());
        assert!(!c.effect.is_read(), "{first}");
        assert_eq!(
            c.names.last(),
            Some(&NameUse::Deallocate {
                name: b"n".to_vec()
            }),
            "{first}"
        );
    }
    write(
        Insert,
        "EXECUTE IMMEDIATE 'SELECT 1';INSERT INTO t VALUES (1)",
    );
    write(Insert, "DEALLOCATE PREPARE;INSERT INTO t VALUES (1)");
    write(Insert, "DEALLOCATE;INSERT INTO t VALUES (1)");
    write(Insert, "EXPLAIN FORMAT;INSERT INTO t VALUES (1)");
    write(Insert, "EXPLAIN FORMAT=;INSERT INTO t VALUES (1)");
    write(Insert, "ANALYZE FORMAT=;INSERT INTO t VALUES (1)");
    write(Insert, "SET STATEMENT x=1 FOR;INSERT INTO t VALUES (1)");
    write(Insert, "BEGIN;INSERT INTO t VALUES (1)");
    write(Delete, "SELECT 1 --; DELETE FROM t");
    write(Delete, "SELECT 1 #\n; DELETE FROM t");
}

#[test]
fn quoting_is_read_both_ways_when_it_matters() {
    // With NO_BACKSLASH_ESCAPES the string ends at the backslash and a DELETE follows.
    write(Delete, r"SELECT 'a\'; DELETE FROM t; -- '");
    // Without it the string holds everything: still a write in one reading.
    write(Delete, r"SELECT 'a\\'; DELETE FROM t; -- '");
    read(r"SELECT 'it''s', 'a\'b', 'c\\'");
    read(r#"SELECT "say ""hi""", "x\"y""#);
    read("SELECT 'unterminated");
    read("SELECT `unterminated");
    read("SELECT 1 /* unterminated");
}

#[test]
fn executable_comments_are_read_both_ways() {
    read("/*!40101 SET NAMES utf8 */");
    read("SELECT /*! SQL_NO_CACHE */ 1");
    read("SELECT /*+ MAX_EXECUTION_TIME(1) */ 1");
    write(LockingRead, "SELECT * FROM t /*!50000 FOR UPDATE */");
    write(Insert, "/*!50000 INSERT INTO t VALUES (1) */");
    write(Insert, "/*M!100100 INSERT INTO t VALUES (1) */");
    // As code a SELECT, as a comment (a server older than the version) a DELETE.
    write(
        Delete,
        "/*!99999 SELECT 1 FROM t WHERE 1 OR */ DELETE FROM t",
    );
    // A plain comment that mentions the marker is not one.
    read("SELECT 1 /* not /*! executable */");
    write(Delete, "/*! DELETE FROM t");
}

#[test]
fn keywords_ignore_case_and_odd_bytes() {
    write(Insert, "iNsErT into t values (1)");
    read("sElEcT 1");
    read("SELECT '\u{00e9}t\u{00e9}' FROM t\u{00e9}");
    assert_eq!(classify(b"SELECT \xff\xfe FROM t").effect, Effect::Read);
    assert_eq!(
        classify(b"\xffINSERT").effect,
        Effect::Write(Other),
        "a word starting with a non-ASCII byte is not a keyword"
    );
    assert_eq!(classify(b"\x00SELECT 1").effect, Effect::Write(Other));
    assert_eq!(classify(b"SELECT 1\x00").effect, Effect::Read);
}

#[test]
fn sql_prepared_statements() {
    let c = classify(b"PREPARE s FROM 'SELECT * FROM t WHERE id = ?'");
    assert_eq!(c.effect, Effect::Read);
    assert_eq!(
        c.names,
        vec![NameUse::Prepare {
            name: b"s".to_vec(),
            effect: Effect::Read
        }]
    );
    let c = classify(b"PREPARE `My``S` FROM 'INSERT INTO t VALUES (?)'");
    assert_eq!(c.effect, Effect::Write(Insert));
    assert_eq!(
        c.names,
        vec![NameUse::Prepare {
            name: b"my`s".to_vec(),
            effect: Effect::Write(Insert)
        }]
    );
    write(Other, "PREPARE s FROM @sql");
    write(Other, "PREPARE s FROM 'SEL' 'ECT 1'");
    write(Update, r"PREPARE s FROM 'UPDATE t SET c = \'x\''");
    write(Update, "PREPARE s FROM 'UPDATE t SET c = ''x'''");
    read("PREPARE s FROM 'SELECT ''FOR UPDATE'''");
    write(Delete, "EXECUTE IMMEDIATE 'DELETE FROM t'");
    read("EXECUTE IMMEDIATE 'SELECT ?' USING 1");
    write(Other, "EXECUTE IMMEDIATE CONCAT('SELECT ', 1)");

    // EXECUTE follows what the caller kept off, and PREPAREs earlier in the same text.
    let skipped = |n: &[u8]| (n == b"w").then_some(Update);
    let rules = Rules {
        skipped: &skipped,
        ..Rules::default()
    };
    let e = |sql: &str| classify_with(sql.as_bytes(), &rules).effect;
    assert_eq!(e("EXECUTE r USING @a"), Effect::Read);
    assert_eq!(e("EXECUTE W USING @a"), Effect::Write(Update));
    assert_eq!(
        e("PREPARE w FROM 'SELECT 1'; EXECUTE w"),
        Effect::Read,
        "re-prepared as a read"
    );
    assert_eq!(
        e("PREPARE r FROM 'DELETE FROM t'; SELECT 1; EXECUTE r"),
        Effect::Write(Delete)
    );
    let c = classify_with(b"DEALLOCATE PREPARE w; DROP PREPARE `x`", &rules);
    assert_eq!(c.effect, Effect::Read);
    assert_eq!(
        c.names,
        vec![
            NameUse::Deallocate {
                name: b"w".to_vec()
            },
            NameUse::Deallocate {
                name: b"x".to_vec()
            }
        ]
    );
}

#[test]
fn nesting_is_bounded() {
    let deep = "EXPLAIN ANALYZE ".repeat(10_000) + "SELECT 1";
    assert_eq!(effect(&deep), Effect::Write(Other));
    let deep = "SET STATEMENT a=1 FOR ".repeat(10_000) + "SELECT 1";
    assert_eq!(effect(&deep), Effect::Write(Other));
    let mut quoted = "SELECT 1".to_string();
    for _ in 0..20 {
        quoted = format!("PREPARE s FROM '{}'", quoted.replace('\'', "''"));
    }
    assert_eq!(effect(&quoted), Effect::Write(Other));
    let ok = "EXPLAIN ANALYZE ".repeat(3) + "SELECT 1";
    assert_eq!(effect(&ok), Effect::Read);
}

#[test]
fn transaction_starts() {
    for sql in [
        "BEGIN",
        "begin work",
        "  /* pool */ START TRANSACTION READ ONLY",
        "start transaction with consistent snapshot",
        "XA START 'x'",
        "BEGIN;",
    ] {
        assert!(starts_transaction(sql.as_bytes()), "{sql}");
    }
    for sql in [
        "BEGIN NOT ATOMIC SELECT 1; END",
        "COMMIT",
        "SELECT 'BEGIN'",
        "SET autocommit=0",
        "",
        "START SLAVE",
        "XA END 'x'",
    ] {
        assert!(!starts_transaction(sql.as_bytes()), "{sql}");
    }
}

#[test]
fn kinds_have_distinct_names() {
    let names: std::collections::HashSet<_> = WriteKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(names.len(), WriteKind::ALL.len());
    assert_eq!(Update.to_string(), "update");
}

/// Bytes that look like SQL: keywords, quotes, comment markers, separators and junk.
fn sqlish() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"SELECT ".to_vec()),
        Just(b"INSERT ".to_vec()),
        Just(b"FOR UPDATE ".to_vec()),
        Just(b"PREPARE s FROM '".to_vec()),
        Just(b"EXECUTE s".to_vec()),
        Just(b"EXPLAIN ANALYZE ".to_vec()),
        Just(b"SET STATEMENT x=1 FOR ".to_vec()),
        Just(b"WITH ".to_vec()),
        Just(b"/*!".to_vec()),
        Just(b"/*M!1".to_vec()),
        Just(b"*/".to_vec()),
        Just(b"-- ".to_vec()),
        Just(b"#".to_vec()),
        Just(b"'".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"`".to_vec()),
        Just(b"\\".to_vec()),
        Just(b";".to_vec()),
        Just(b"(".to_vec()),
        Just(b")".to_vec()),
        Just(b"@@global.".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..8),
    ];
    proptest::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #[test]
    fn never_panics_on_any_bytes(sql in proptest::collection::vec(any::<u8>(), 0..512)) {
        let skipped = |n: &[u8]| (n.len() == 1).then_some(Other);
        let rules = Rules { allow_calls: sql.len() % 2 == 0, skipped: &skipped };
        let c = classify_with(&sql, &rules);
        // A prefix that writes stays a write when more statements follow.
        if !c.effect.is_read() {
            let mut more = sql.clone();
            more.extend_from_slice(b";\nSELECT 1");
            let _ = classify(&more);
        }
    }

    #[test]
    fn never_panics_on_sqlish_bytes(sql in sqlish()) {
        let _ = classify(&sql);
    }

    #[test]
    fn a_writing_statement_after_unquoted_ones_is_found(
        words in proptest::collection::vec(
            prop_oneof![
                Just("SELECT"), Just("FOR"), Just("UPDATE"), Just("("), Just(")"), Just(";"),
                Just("WITH"), Just("SET"), Just("STATEMENT"), Just("PREPARE"), Just("EXECUTE"),
                Just("x"), Just("1"), Just(","), Just("="),
            ],
            0..30,
        ),
        w in 0usize..4,
    ) {
        let writes = [
            "INSERT INTO t VALUES (1)",
            "DELETE FROM t",
            "SELECT * FROM t FOR UPDATE",
            "SET GLOBAL x = 1",
        ];
        let sql = format!("{} ; {}", words.join(" "), writes[w]);
        prop_assert!(!classify(sql.as_bytes()).effect.is_read(), "{}", sql);
    }
}
