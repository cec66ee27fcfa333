/* A pooled MariaDB Connector/C connection for the lab tests: logs in and prepares an INSERT,
 * waits (as a pool's idle connection does) until the file GO exists, then executes the
 * statement once with an array of three rows, which Connector/C sends as one
 * COM_STMT_BULK_EXECUTE when the server offers it. It stays connected a few seconds more, as a
 * pooled connection would, then closes.
 *
 * usage: pooled_bulk HOST PORT USER PASSWORD DB GO
 */
#include <mysql.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: pooled_bulk HOST PORT USER PASSWORD DB GO\n");
        return 2;
    }
    MYSQL *m = mysql_init(NULL);
    if (!mysql_real_connect(m, argv[1], argv[3], argv[4], argv[5], (unsigned)atoi(argv[2]), NULL, 0)) {
        fprintf(stderr, "connect: %s\n", mysql_error(m));
        return 1;
    }
    MYSQL_STMT *st = mysql_stmt_init(m);
    const char *sql = "INSERT INTO tsd_bulk (id) VALUES (?)";
    if (mysql_stmt_prepare(st, sql, (unsigned long)strlen(sql))) {
        fprintf(stderr, "prepare: %s\n", mysql_stmt_error(st));
        return 1;
    }
    printf("prepared, waiting for %s\n", argv[6]);
    fflush(stdout);
    while (access(argv[6], F_OK) != 0)
        usleep(100 * 1000);

    int ids[3] = {1, 2, 3};
    unsigned int rows = 3;
    MYSQL_BIND bind;
    memset(&bind, 0, sizeof bind);
    bind.buffer_type = MYSQL_TYPE_LONG;
    bind.buffer = ids;
    if (mysql_stmt_attr_set(st, STMT_ATTR_ARRAY_SIZE, &rows) || mysql_stmt_bind_param(st, &bind) ||
        mysql_stmt_execute(st)) {
        fprintf(stderr, "bulk execute: %s\n", mysql_stmt_error(st));
        return 1;
    }
    printf("inserted %llu rows\n", (unsigned long long)mysql_stmt_affected_rows(st));
    fflush(stdout);
    sleep(3);
    mysql_stmt_close(st);
    mysql_close(m);
    return 0;
}
