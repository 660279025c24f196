package sqltext

import (
	"strings"
	"testing"
)

// TestEndsTx: the statements that would end the handler's transaction are
// found whatever their spelling (case, comments, whitespace, behind other
// statements); the same words inside quoted text, comments or dollar-quoted
// bodies, and ROLLBACK TO a savepoint, are not.
func TestEndsTx(t *testing.T) {
	ends := []string{"COMMIT", "COMMIT AND CHAIN", "COMMIT; BEGIN", "END", "ABORT", "ROLLBACK", "ROLLBACK WORK",
		"ROLLBACK AND CHAIN", "ROLLBACK TRANSACTION", "COMMIT WORK", "END TRANSACTION", "PREPARE TRANSACTION 'x'",
		"SELECT 1; COMMIT", "SELECT ';'; COMMIT", "SELECT $$;$$; COMMIT", "SELECT E'\\';'; COMMIT",
		"SELECT 1 AS a$b$; COMMIT", "SELECT a$$b$$ FROM t; COMMIT", "SELECT 1 AS \u00e9$x$; COMMIT",
		"SELECT 'a\\'; SELECT '; COMMIT; --'"}
	keeps := []string{"SELECT 1", "SELECT 'commit'", "SELECT $$COMMIT$$", "SELECT $a$ ; COMMIT $a$", "ROLLBACK TO SAVEPOINT a",
		"ROLLBACK TO a", "rollback work to savepoint a", "RELEASE SAVEPOINT a", "SAVEPOINT a", `SELECT "commit" FROM t`,
		"SELECT 1 -- ; COMMIT", "SELECT 1 /* ; COMMIT */", "SELECT E'\\'; COMMIT'", "INSERT INTO t VALUES ('a''; COMMIT')",
		"PREPARE p AS SELECT 1", "UPDATE t SET x = 1 WHERE y = 'end'", "BEGIN"}
	spell := []func(string) string{
		func(s string) string { return s },
		strings.ToLower,
		func(s string) string { return "  /* a ; comment */\n\t" + s + " ;" },
		func(s string) string { return "-- line ; COMMIT?\n" + strings.ReplaceAll(s, " ", " \t ") },
		func(s string) string { return strings.ToUpper(s[:1]) + strings.ToLower(s[1:]) },
	}
	for _, f := range spell {
		for _, s := range ends {
			if !EndsTx(f(s)) {
				t.Errorf("EndsTx(%q) = false", f(s))
			}
		}
		for _, s := range keeps {
			if EndsTx(f(s)) {
				t.Errorf("EndsTx(%q) = true", f(s))
			}
		}
	}
}
