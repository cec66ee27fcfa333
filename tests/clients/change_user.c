/* A real MariaDB Connector/C client for the lab tests: logs in, queries, switches user with
 * COM_CHANGE_USER (mysql_change_user), queries again, resets the connection
 * (COM_RESET_CONNECTION) and queries once more. Prints one line per result.
 *
 * usage: change_user HOST PORT USER PASSWORD DB USER2 PASSWORD2
 */
#include <mysql.h>
#include <stdio.h>
#include <stdlib.h>

static int query(MYSQL *m, const char *sql) {
    if (mysql_query(m, sql)) {
        fprintf(stderr, "%s: %s\n", sql, mysql_error(m));
        return 1;
    }
    MYSQL_RES *res = mysql_store_result(m);
    if (res) {
        MYSQL_ROW row;
        while ((row = mysql_fetch_row(res)))
            printf("%s\n", row[0] ? row[0] : "NULL");
        mysql_free_result(res);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: change_user HOST PORT USER PASSWORD DB USER2 PASSWORD2\n");
        return 2;
    }
    MYSQL *m = mysql_init(NULL);
    if (!mysql_real_connect(m, argv[1], argv[3], argv[4], argv[5], (unsigned)atoi(argv[2]), NULL, 0)) {
        fprintf(stderr, "connect: %s\n", mysql_error(m));
        return 1;
    }
    if (query(m, "SELECT CONCAT('first ', CURRENT_USER())")) return 1;
    if (mysql_change_user(m, argv[6], argv[7], argv[5])) {
        fprintf(stderr, "change_user: %s\n", mysql_error(m));
        return 1;
    }
    if (query(m, "SELECT CONCAT('second ', CURRENT_USER())")) return 1;
    if (mysql_reset_connection(m)) {
        fprintf(stderr, "reset_connection: %s\n", mysql_error(m));
        return 1;
    }
    if (query(m, "SELECT CONCAT('third ', CURRENT_USER())")) return 1;
    mysql_close(m);
    return 0;
}
