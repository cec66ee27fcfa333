use super::*;

fn fp(sql: &str) -> String {
    fingerprint(sql.as_bytes()).0
}

fn tr(sql: &str) -> Traits {
    traits(sql.as_bytes())
}

#[test]
fn sysbench_statements() {
    assert_eq!(
        fp("SELECT c FROM sbtest3 WHERE id=?"),
        "select c from sbtest3 where id=?"
    );
    assert_eq!(
        fp("SELECT c FROM sbtest1 WHERE id BETWEEN ? AND ? ORDER BY c"),
        "select c from sbtest1 where id between ? and ? order by c"
    );
    assert_eq!(
        fp("SELECT DISTINCT c FROM sbtest2 WHERE id BETWEEN 5 AND 104 ORDER BY c"),
        "select distinct c from sbtest2 where id between ? and ? order by c"
    );
    assert_ne!(
        fp("SELECT c FROM sbtest1 WHERE id=?"),
        fp("SELECT c FROM sbtest3 WHERE id=?")
    );
}

#[test]
fn literals_become_placeholders() {
    assert_eq!(
        fp("select * from t where a = 'x''y' and b=\"q\\\"z\" and c = -1.5e3 and d=0x1F and e = x'AB' and f=b'01' and g = _utf8mb4'h' and h=N'n' and i = TRUE"),
        "select * from t where a = ? and b=? and c = ? and d=? and e = ? and f=? and g = ? and h=? and i = ?"
    );
    assert_eq!(fp("select a-1, a - 1, -1"), "select a-?, a - ?, ?");
    assert_eq!(
        fp("select * from t where d > '2024-01-01 10:00:00'"),
        "select * from t where d > ?"
    );
    assert_eq!(
        fp("select 1abc, t1.c2 from t1"),
        "select 1abc, t1.c2 from t1"
    );
    assert_eq!(fp("select .5, 3."), "select ?, ?");
    assert_eq!(
        fp("select * from t where a is null"),
        "select * from t where a is null"
    );
}

#[test]
fn lists_collapse() {
    assert_eq!(
        fp("SELECT * FROM t WHERE id IN (1, 2,3) AND x NOT IN ('a')"),
        "select * from t where id in(?+) and x not in(?+)"
    );
    assert_eq!(
        fp("select * from t where id in (select id from u)"),
        "select * from t where id in (select id from u)"
    );
    assert_eq!(
        fp("INSERT INTO t (a,b) VALUES (1,'x'),(2, NULL), (-3,'z')"),
        "insert into t (a,b) values(?+)"
    );
    assert_eq!(
        fp("insert into t values (1,2) on duplicate key update a=values(a)"),
        "insert into t values(?+) on duplicate key update a=values(a)"
    );
    assert_eq!(
        fp("insert into t values (now(), 1)"),
        "insert into t values (now(), ?)"
    );
    // Cut short in the middle of the list.
    assert_eq!(
        fp("insert into t values (1,2),(3,"),
        "insert into t values(?+)"
    );
    assert_eq!(
        fp("select * from t where id in (1,2,3"),
        "select * from t where id in(?+)"
    );
}

#[test]
fn comments_whitespace_case_quotes() {
    assert_eq!(
        fp("  SELECT /* hi */ `C`,\n\t`odd name`  FROM `Sbtest1` -- trailing\n WHERE id=1 # more\n;"),
        "select c, `odd name` from sbtest1 where id=?"
    );
    assert_eq!(
        fp("SELECT /*!40001 SQL_NO_CACHE */ * FROM t"),
        "select sql_no_cache * from t"
    );
    assert_eq!(fp("SELECT /*+ MAX_EXECUTION_TIME(1) */ 1"), "select ?");
    assert_eq!(fp("select 1; select 2;"), "select ?; select ?");
    assert_eq!(fp("USE Sbtest"), "use sbtest");
    assert_eq!(fp("CALL proc(1, 'a')"), "call proc");
}

#[test]
fn limit_and_order() {
    assert_eq!(
        fp("select * from t order by a ASC, b DESC limit 10, 20"),
        "select * from t order by a, b desc limit ?"
    );
    assert_eq!(
        fp("select * from t limit 5 offset 10"),
        "select * from t limit ?"
    );
    assert!(tr("select * from t limit 5").nondeterministic);
    assert!(!tr("select * from t order by a limit 5").nondeterministic);
    assert!(tr("select * from t order by a").ordered);
    assert!(!tr("select * from t where id in (select id from u order by x)").ordered);
    assert!(!tr("select c from t where id=1").ordered);
    // Found by proptest: a CALL after a statement with ORDER BY left the scan early and lost
    // the trait, and a quoted identifier glued to `call` changed meaning on a second pass.
    let sql = b" order by a asc;`id`call p(";
    let (once, t1) = fingerprint(sql);
    let (twice, t2) = fingerprint(once.as_bytes());
    assert_eq!((once.as_str(), t1.ordered), (twice.as_str(), t2.ordered));
    assert_eq!(fp("select  limit 1, 2,'str'"), "select limit ?");
    // Found by proptest: a signed value after the swallowed ones.
    assert_eq!(fp(" limit 1, 2,/* c */-1"), "limit ?");
    assert_eq!(fp(" limit 1,-1"), "limit ?");
    assert_eq!(
        fp("select @@v`id`values (call p("),
        "select @@v id values (call p("
    );
    assert_eq!(fp("`id`0x1f"), "id ?");
    assert_eq!(
        fp("select `1e5`, `c`, t.`c` from `t`"),
        "select `1e5`, c, t.c from t"
    );
    assert_eq!(fp("select 1,-1"), "select ?,?");
    assert_eq!(fp(";;"), "");
    assert_eq!(fp(" in (-1;"), fp(&fp(" in (-1;")));
    assert_eq!(fp("select 1;; ;select 2;;"), "select ?;select ?");
}

#[test]
fn nondeterminism() {
    for sql in [
        "select now()",
        "SELECT NOW ( )",
        "select current_timestamp",
        "select rand() from t",
        "select uuid()",
        "select @@timestamp",
        "select @@session.tx_read_only",
        "select connection_id()",
        "show processlist",
        "select * from information_schema.processlist",
        "insert into t values (uuid_short())",
    ] {
        assert!(tr(sql).nondeterministic, "{sql}");
    }
    for sql in [
        "select c from sbtest1 where id=?",
        "select now from t",
        "select @x",
        "select 'now()'",
    ] {
        assert!(!tr(sql).nondeterministic, "{sql}");
    }
}

#[test]
fn masking_keeps_the_shape() {
    assert_eq!(
        mask_literals(
            b"SELECT c FROM `sbtest1` WHERE id IN (1, 2) AND k = 'secret'  /* x */ AND n=-5"
        ),
        "SELECT c FROM `sbtest1` WHERE id IN (?, ?) AND k = ? AND n=?"
    );
    assert_eq!(mask_literals(b"a - 1"), "a - ?");
    assert_eq!(mask_literals(b"`unterminated"), "`unterminated");
}

#[test]
fn statements_that_may_carry_credentials_are_recognised() {
    for sql in [
        "CREATE USER 'u'@'%' IDENTIFIED BY 'hunter2'",
        "alter user u identified with mysql_native_password as '*ABC'",
        "GRANT ALL ON *.* TO u IDENTIFIED BY 'x'",
        "create user u identified via ed25519 using PASSWORD('x')",
        "SET PASSWORD FOR 'u'@'%' = 'hash'",
        "set password = password('x')",
        "SELECT OLD_PASSWORD('x')",
        "CHANGE MASTER TO MASTER_HOST='h', MASTER_PASSWORD='x'",
        "CREATE SERVER s FOREIGN DATA WRAPPER mysql OPTIONS (USER 'u', PASSWORD 'x')",
        "select aes_encrypt(c, 'key') from t",
        "/* x */ Set   Password=Password('x')",
    ] {
        assert!(holds_secrets(sql.as_bytes()), "{sql}");
    }
    for sql in [
        "SELECT c FROM sbtest1 WHERE id = 'PASSWORD'",
        "select `password` from users where id = 1",
        "select 1 -- identified by",
        "INSERT INTO t VALUES ('identified by x')",
        "",
        "'unterminated password",
    ] {
        assert!(!holds_secrets(sql.as_bytes()), "{sql}");
    }
}

#[test]
fn digest_ids_are_stable() {
    // Fixed values: a change here changes every digest id users have recorded.
    let a = digest_id("query", b"select ?");
    assert_eq!(a, digest_id("query", b"select ?"));
    assert_ne!(a, digest_id("stmt_execute", b"select ?"));
    assert_eq!(digest_hex(0xab), "00000000000000ab");
    assert_eq!(digest_hex(a).len(), 16);
    // FNV-1a 64 of the empty string is its offset basis.
    assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
}

#[test]
fn payload_hash_ignores_cuts() {
    let data: Vec<u8> = (0..100u8).collect();
    let whole = PayloadHasher::hash(&data);
    for cut in 0..data.len() {
        for cut2 in cut..data.len() {
            let mut h = PayloadHasher::new();
            h.update(&data[..cut]);
            h.update(&data[cut..cut2]);
            h.update(&data[cut2..]);
            assert_eq!(h.finish(), whole);
        }
    }
    assert_ne!(PayloadHasher::hash(b"ab"), PayloadHasher::hash(b"ab\0"));
    assert_ne!(PayloadHasher::hash(b""), PayloadHasher::hash(b"\0"));
}

#[test]
fn row_checksums_order() {
    let rows = [
        PayloadHasher::hash(b"a"),
        PayloadHasher::hash(b"b"),
        PayloadHasher::hash(b"b"),
    ];
    let mut fwd = RowChecksum::default();
    let mut rev = RowChecksum::default();
    for h in rows {
        fwd.add(h);
    }
    for h in rows.iter().rev() {
        rev.add(*h);
    }
    assert!(fwd.same(&rev, false));
    assert!(!fwd.same(&rev, true));
    let mut fewer = RowChecksum::default();
    fewer.add(rows[0]);
    fewer.add(rows[1]);
    assert!(!fwd.same(&fewer, false));
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn sqlish() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(&b"select "[..]),
            Just(&b"SELECT "[..]),
            Just(&b" in ("[..]),
            Just(&b"values ("[..]),
            Just(&b"),("[..]),
            Just(&b"'str'"[..]),
            Just(&b"\"q\\\"\""[..]),
            Just(&b"`id`"[..]),
            Just(&b"/*! 1 */"[..]),
            Just(&b"/* c */"[..]),
            Just(&b"-- x\n"[..]),
            Just(&b"#\n"[..]),
            Just(&b"-1"[..]),
            Just(&b"0x1f"[..]),
            Just(&b"b'01'"[..]),
            Just(&b"@@v"[..]),
            Just(&b" limit 1, 2"[..]),
            Just(&b" order by a asc"[..]),
            Just(&b"null"[..]),
            Just(&b";"[..]),
            Just(&b"?"[..]),
            Just(&b","[..]),
            Just(&b")"[..]),
            Just(&b"call p("[..]),
            Just(&b" "[..]),
            Just(&b"sbtest1"[..]),
        ];
        proptest::collection::vec(
            prop_oneof![
                3 => piece.prop_map(<[u8]>::to_vec),
                1 => proptest::collection::vec(any::<u8>(), 0..6),
            ],
            0..24,
        )
        .prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn never_panics_and_is_idempotent(sql in sqlish()) {
            let (once, t1) = fingerprint(&sql);
            let (twice, t2) = fingerprint(once.as_bytes());
            // Only valid UTF-8 survives a round trip through a String unchanged.
            if std::str::from_utf8(&sql).is_ok() {
                prop_assert_eq!(&twice, &once, "input {:?}", String::from_utf8_lossy(&sql));
                prop_assert_eq!(t1.ordered, t2.ordered);
            }
            let _ = mask_literals(&sql);
            prop_assert!(once.len() <= sql.len() + 8 * (sql.len() / 2 + 1));
        }

        #[test]
        fn arbitrary_bytes_never_panic(sql in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = fingerprint(&sql);
            let m = mask_literals(&sql);
            prop_assert!(m.len() <= 3 * sql.len() + 1);
        }

        #[test]
        fn hash_is_cut_independent(data in proptest::collection::vec(any::<u8>(), 0..64), cuts in proptest::collection::vec(0usize..64, 0..5)) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort_unstable();
            let mut h = PayloadHasher::new();
            let mut at = 0;
            for c in cuts {
                h.update(&data[at..c]);
                at = c;
            }
            h.update(&data[at..]);
            prop_assert_eq!(h.finish(), PayloadHasher::hash(&data));
        }
    }
}
