package mysql

import (
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// TestNewRefusesMisconfiguration: bad options fail at construction with
// store.ErrInvalid, before any I/O.
func TestNewRefusesMisconfiguration(t *testing.T) {
	db, _ := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none") // never connected
	defer db.Close()
	for name, opts := range map[string][]Option{
		"empty table":       {WithTable("")},
		"long table":        {WithTable(strings.Repeat("t", 49))},
		"NUL in table":      {WithTable("a\x00b")},
		"trailing space":    {WithTable("records ")},
		"zero sweep batch":  {WithSweepBatch(0)},
		"negative body cap": {WithMaxBody(-1)},
		"zero poll":         {WithPollInterval(0, time.Second)},
		"max below first":   {WithPollInterval(time.Second, time.Millisecond)},
	} {
		if _, err := New(db, opts...); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: New = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := New(nil); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("New(nil) = %v, want ErrInvalid", err)
	}
	s, err := New(db, WithTable("odd`name"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Table() != "`odd``name`" {
		t.Errorf("Table() = %s, want the name quoted with its backtick doubled", s.Table())
	}
}

// TestClaimArgsMatchPlaceholders: the claim statement gets exactly one argument
// per placeholder (a mistake here would be a syntax error only at run time).
func TestClaimArgsMatchPlaceholders(t *testing.T) {
	st := newStatements("`t`")
	args := claimArgs(nil, nil, nil, nil, 0, 0)
	if n := strings.Count(st.claim, "?"); n != len(args) {
		t.Fatalf("claim statement has %d placeholders, claimArgs gives %d", n, len(args))
	}
	if n := strings.Count(st.complete, "?"); n != len(completeArgs(store.ID{}, store.Token{}, store.Response{}, 0)) {
		t.Fatalf("complete statement has %d placeholders", n)
	}
}

// TestMigrationSQL renders the table name into every statement.
func TestMigrationSQL(t *testing.T) {
	s, err := New(&sql.DB{}, WithTable("app_records"))
	if err != nil {
		t.Fatal(err)
	}
	got := s.MigrationSQL()
	if !strings.Contains(got, "CREATE TABLE IF NOT EXISTS `app_records`") || strings.Contains(got, "{{") {
		t.Fatalf("MigrationSQL:\n%s", got)
	}
}
